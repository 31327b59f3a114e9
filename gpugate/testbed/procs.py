"""The rig's processes: free ports, the installed slurmd's release, the
installed entry points, and pids checked before they are signalled."""

import os
import re
import socket
import subprocess
import sysconfig
from typing import Dict, List, Tuple

from gpugate.errors import GpugateError

SBIN = "/usr/sbin"
BIN = "/usr/bin"
ENTRY_POINTS = ("healthcheck", "prolog", "epilog")


class ClusterError(GpugateError):
    pass


def installed_entry_point(mode: str) -> str:
    """The gpugate-<mode> script pip installed next to this interpreter."""
    path = os.path.join(sysconfig.get_path("scripts"), "gpugate-" + mode)
    if not os.access(path, os.X_OK):
        raise ClusterError("%s is missing: install gpugate with pip (pip install .) first" % path)
    return path


def free_ports(count: int) -> List[int]:
    """``count`` consecutive free loopback ports (slurmd ports must not clash).
    They are searched in GPUGATE_TESTBED_PORTS ("FIRST-LAST", default
    17000-29999): test runs side by side on one loopback (pytest-xdist
    workers) each take a range of their own, so two clusters starting at once
    never pick the same block between the check and slurmctld's bind."""
    first, last = _port_range(os.environ.get("GPUGATE_TESTBED_PORTS", ""))
    for base in range(first, last - count + 2, 50):
        ports = list(range(base, base + count))
        if all(_port_free(p) for p in ports):
            return ports
    raise ClusterError("no %d free consecutive ports on 127.0.0.1 in %d-%d" % (count, first, last))


def _port_range(text: str) -> Tuple[int, int]:
    if not text.strip():
        return 17000, 29999
    match = re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", text)
    first, last = (int(match.group(1)), int(match.group(2))) if match else (0, 0)
    if not 1024 <= first <= last <= 65535:
        raise ClusterError("GPUGATE_TESTBED_PORTS=%r: want FIRST-LAST within 1024-65535" % text)
    return first, last


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


_VERSIONS: Dict[str, Tuple[int, ...]] = {}


def slurm_version(slurmd: str = SBIN + "/slurmd") -> Tuple[int, ...]:
    """(major, minor) of the installed slurmd, from ``slurmd -V`` ("slurm 24.11.5");
    the configuration this cluster writes differs between releases."""
    if slurmd not in _VERSIONS:
        result = subprocess.run([slurmd, "-V"], capture_output=True, text=True, timeout=30,
                                stdin=subprocess.DEVNULL, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        match = re.search(r"(\d+)\.(\d+)", result.stdout)
        if result.returncode != 0 or not match:
            raise ClusterError("cannot read the Slurm version from `%s -V`: %s"
                               % (slurmd, (result.stdout + result.stderr).strip()[:200]))
        _VERSIONS[slurmd] = (int(match.group(1)), int(match.group(2)))
    return _VERSIONS[slurmd]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours counts as gone
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _is_ours(pid: int, what: str) -> bool:
    """A pid file can outlive its process: only signal the daemon it names."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            cmdline = handle.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return False
    return what.split("-")[0] in cmdline
