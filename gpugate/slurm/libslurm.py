"""One node's record in one RPC: libslurm's ``slurm_load_node_single``
(REQUEST_NODE_INFO_SINGLE), the read `sinfo -n` makes, without the
partition read that sinfo and pyslurm's ``Node.load`` add, and without
scontrol's whole node table (issue 34; Slurm 25.11's src/sinfo/sinfo.c,
src/scontrol/info_node.c).

It never runs in gpugate's own process: libslurm retries an absent
slurmctld for minutes inside one call, exits the process on a slurm.conf it
cannot read, and a library whose structures differ could crash.  The
command backend runs this file, ``python -I -S .../libslurm.py LIBRARY NODE``
(``command``), through gpugate.safety.runner (a deadline, its process group
killed); the pyslurm worker calls ``read_node`` on the library pyslurm
loaded.  The file imports the standard library only, so the child starts
without site (-S: 20 ms less a read, no .pth file run).

The answer is ``slurm_sprint_node_table``'s text, as `scontrol show node
NAME` prints the same record (less its Partitions line: slurmctld does not
send partitions), in both forms, multi-line and one line; the caller parses
it (gpugate.slurm.nodestate.show_text).  Of libslurm's ABI only this is
assumed: node_info_msg_t begins ``{time_t last_update; uint32_t
record_count; node_info_t *node_array;}`` (slurm.h, 20.02 .. 26.05), and
the six calls below with their signatures.  A library without them fails
here, and the caller reads the node the older way (two RPCs)."""

import ctypes
import json
import os
import sys
from typing import List, Optional, Tuple

# slurm.h: SHOW_ALL (nodes of hidden partitions too, as `sinfo --all`) and
# SHOW_MIXED (MIXED for a node partly allocated, as scontrol and sinfo ask).
SHOW_ALL, SHOW_MIXED = 1 << 0, 1 << 3

# Exit codes of main(): what the parent tells apart.
FOUND, MISSING, RPC_FAILED, UNUSABLE = 0, 3, 4, 5

# Where a site's libslurm lies, below the prefix its commands are in: the
# library scontrol itself runs on first (libslurmfull, in pkglibdir: Debian's
# slurm-wlm, RPM and source builds' slurm), then the public one.
_MULTIARCH = ("x86_64-linux-gnu", "aarch64-linux-gnu", "powerpc64le-linux-gnu")
_FULL = ["lib/%s/slurm-wlm/libslurmfull.so" % a for a in _MULTIARCH] + [
    "lib64/slurm/libslurmfull.so", "lib/slurm/libslurmfull.so"] + [
    "lib/%s/slurm/libslurmfull.so" % a for a in _MULTIARCH]
_PUBLIC = ["lib64/libslurm.so", "lib/libslurm.so"] + ["lib/%s/libslurm.so" % a for a in _MULTIARCH]


def candidates(bin_dir: str) -> List[str]:
    """Paths to try, in order, for the Slurm whose commands are in bin_dir."""
    prefix = os.path.dirname(os.path.normpath(bin_dir)) or "/"
    return [os.path.join(prefix, rel) for rel in _FULL + _PUBLIC]


class Unusable(Exception):
    """No libslurm this host may load: the caller reads the older way."""


def open_library(bin_dir: str, configured: str = "") -> Tuple[int, str]:
    """(fd, path) of the library to load, after gpugate.safety.trust's walk (the
    child loads the very file checked, /proc/self/fd/N); Unusable when
    none is there, or the one there is not root's alone."""
    from gpugate.safety import trust

    problems = []
    for path in [configured] if configured else candidates(bin_dir):
        try:
            return trust.open_file(path, "Slurm library"), path
        except FileNotFoundError:
            continue
        except (trust.Untrusted, OSError) as exc:
            problems.append(str(exc)[:200])
    if problems:
        raise Unusable("; ".join(problems))
    raise Unusable("no libslurm at %s" % (configured or "%s/lib*/ beside %s (set [slurm] library)"
                                          % (os.path.dirname(os.path.normpath(bin_dir)), bin_dir)))


class _NodeInfoMsg(ctypes.Structure):
    _fields_ = [("last_update", ctypes.c_long), ("record_count", ctypes.c_uint32),
                ("node_array", ctypes.c_void_p)]


def bind(lib) -> None:
    """Declare the calls used (AttributeError: the library lacks one)."""
    lib.slurm_init.argtypes, lib.slurm_init.restype = [ctypes.c_char_p], None
    lib.slurm_load_node_single.argtypes = [ctypes.POINTER(ctypes.POINTER(_NodeInfoMsg)), ctypes.c_char_p,
                                           ctypes.c_uint16]
    lib.slurm_load_node_single.restype = ctypes.c_int
    lib.slurm_sprint_node_table.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.slurm_sprint_node_table.restype = ctypes.c_void_p  # an xmalloc'd string: freed below
    lib.slurm_xfree.argtypes, lib.slurm_xfree.restype = [ctypes.POINTER(ctypes.c_void_p)], None
    lib.slurm_free_node_info_msg.argtypes = [ctypes.POINTER(_NodeInfoMsg)]
    lib.slurm_free_node_info_msg.restype = None
    lib.slurm_strerror.argtypes, lib.slurm_strerror.restype = [ctypes.c_int], ctypes.c_char_p


def read_node(lib, name: str) -> Tuple[int, object]:
    """(FOUND, [multi-line text, one-line text]), (MISSING, None) or
    (RPC_FAILED, why).  SLURM_TIME_FORMAT should be "%s" (epoch seconds in
    the reason's [user@time])."""
    resp = ctypes.POINTER(_NodeInfoMsg)()
    ctypes.set_errno(0)
    rc = lib.slurm_load_node_single(ctypes.byref(resp), name.encode("utf-8", "surrogateescape"),
                                    SHOW_ALL | SHOW_MIXED)
    if rc != 0:
        code = ctypes.get_errno()
        why = (lib.slurm_strerror(code) or b"").decode("utf-8", "replace") or "error %d" % code
        # slurmctld's answer for a name it has no node of (Slurm 23.02+; 22.05 answers no record).
        return (MISSING, None) if "Invalid node name" in why else (RPC_FAILED, why)
    if not resp:
        return RPC_FAILED, "slurm_load_node_single answered nothing"
    try:
        count = resp.contents.record_count
        if count == 0 or not resp.contents.node_array:
            return MISSING, None
        if count != 1:
            return RPC_FAILED, "%d records for one node" % count
        texts = []
        for one_liner in (0, 1):
            out = lib.slurm_sprint_node_table(resp.contents.node_array, one_liner)
            if not out:
                return RPC_FAILED, "slurm_sprint_node_table returned nothing"
            try:
                texts.append(ctypes.string_at(out).decode("utf-8", "replace"))
            finally:
                lib.slurm_xfree(ctypes.byref(ctypes.c_void_p(out)))
        return FOUND, texts
    finally:
        lib.slurm_free_node_info_msg(resp)


def loaded_library() -> Optional[str]:
    """The libslurm this process has loaded (the pyslurm worker's), from
    /proc/self/maps; None when there is none."""
    try:
        with open("/proc/self/maps") as handle:
            for line in handle:
                path = line.rstrip("\n").split(None, 5)[-1] if line.count(" ") >= 5 else ""
                base = os.path.basename(path)
                if base.startswith(("libslurm.so", "libslurmfull.so")):
                    return path
    except OSError:
        return None
    return None


def command(python: str, library: str, node: str) -> List[str]:
    """The child's argv: this very file (the one gpugate imported), isolated
    (-I: no PYTHON* variables, no script directory on sys.path) and without
    site (-S)."""
    return [python, "-I", "-S", os.path.abspath(__file__), library, node]


def main(argv: List[str]) -> int:
    """python -I -S libslurm.py LIBRARY NODE: the node's texts
    as JSON on stdout (exit FOUND), or MISSING, RPC_FAILED, UNUSABLE with
    why on stderr.  The library path was trust-checked by the caller."""
    if len(argv) != 3:
        print("usage: python -I -S libslurm.py LIBRARY NODE", file=sys.stderr)
        return 2
    answers = os.dup(1)
    os.dup2(2, 1)  # whatever libslurm prints goes to stderr, never into the answer
    try:
        # RTLD_GLOBAL: Slurm's plugins (auth_munge.so, ...) take slurm_conf
        # and the rest from the global namespace, as in scontrol.
        lib = ctypes.CDLL(argv[1], mode=ctypes.RTLD_GLOBAL, use_errno=True)
        bind(lib)
    except (OSError, AttributeError) as exc:
        print("libslurm unusable: %s" % exc, file=sys.stderr)
        return UNUSABLE
    lib.slurm_init(None)  # SLURM_CONF from the environment, as the commands
    code, value = read_node(lib, argv[2])
    if code == FOUND:
        with os.fdopen(answers, "w") as out:
            json.dump({"text": value[0], "oneline": value[1]}, out)
    elif code == RPC_FAILED:
        print(value, file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
