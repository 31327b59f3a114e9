"""A simulated change lands after the checks reading the node.  ``save``
makes each change as a new generation of the node's files, and a run reads
the one it began with (gpugate.model.simview), so no run sees half a change (one
driver loaded, another on disk: "broken module").  A save first waits,
bounded, for the gpugate runs reading that node (health check, prolog,
epilog: they carry SLURMD_NODENAME) to end: the check in flight judges the node as it
was and its verdict lands before the change, the next check's after it."""

import os
import time
from typing import List, Set

# A hung check must not stall the simulation for ever; but a check on a
# loaded CI machine took over 5 s, the change landed mid-read, and the node
# was drained "broken module" (loaded one driver, another on disk) for a
# change the model makes at once.  A check ends within its own time
# budget: waiting up to 30 s waits it out.
QUIET_SECONDS = 30.0


def runs_for(node: str) -> List[int]:
    """Pids of gpugate runs for ``node``, this process and its parents aside."""
    marker = b"SLURMD_NODENAME=" + node.encode() + b"\0"
    mine = lineage()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in mine:
            continue
        try:
            with open("/proc/%s/environ" % entry, "rb") as handle:
                if marker not in handle.read() + b"\0":
                    continue
            with open("/proc/%s/cmdline" % entry, "rb") as handle:
                if not _is_gpugate(handle.read().split(b"\0")):
                    continue
            with open("/proc/%s/stat" % entry, "rb") as handle:
                if handle.read().rsplit(b") ", 1)[1][:1] == b"Z":
                    continue  # ended, not yet reaped
        except (OSError, IndexError):
            continue
        found.append(int(entry))
    return found


def wait_quiet(node: str, timeout: float = QUIET_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while runs_for(node) and time.monotonic() < deadline:
        time.sleep(0.02)


def _is_gpugate(argv: List[bytes]) -> bool:
    """An entry point (gpugate-healthcheck, -prolog, -epilog) or `python -m
    gpugate`; not slurmd, whose own environment names the node too."""
    return any(os.path.basename(arg).startswith(b"gpugate-") for arg in argv[:3]) or (
        b"-m" in argv and argv[argv.index(b"-m") + 1:][:1] == [b"gpugate"])


def lineage() -> Set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            with open("/proc/%d/stat" % pid, "rb") as handle:
                pid = int(handle.read().rsplit(b") ", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return pids
