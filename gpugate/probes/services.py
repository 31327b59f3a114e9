"""Whether the NVIDIA daemons run.

The kernel's process table first: /proc/PID/comm, confirmed by the
program name in /proc/PID/cmdline.  It answers with or without systemd
(slurmd in a container, as under Kubernetes, has no systemctl) and costs no
tool.  systemd is asked only where it is the init (/run/systemd/system, the
test of sd_booted(3)) and the process table does not show the daemon: a
unit may start it under another name, and only systemd says "failed".
A pidfile (/var/run/nvidia-persistenced/nvidia-persistenced.pid) would add
nothing: its pid is read in the same process table.
"""

from __future__ import annotations

import os

from gpugate.model.facts import DAEMONS as PROCESS, NOT_RUNNING, UNCHECKED, ProbeFailure

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Any, Callable, Dict, Mapping

NONE = "none"  # [services] ROLE = "none": the site says not to read it
_COMM = 15  # TASK_COMM_LEN - 1: /proc/PID/comm keeps this much of the name


def running(root: str, names) -> Any:
    """The program names among ``names`` that have a live process under
    root's /proc; a ProbeFailure when /proc cannot be listed."""
    proc = os.path.join(root, "proc")
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError as exc:
        return ProbeFailure("services", "missing" if isinstance(exc, FileNotFoundError) else "error",
                            "/proc: %s" % (exc.strerror or exc))
    by_comm = {name[:_COMM]: name for name in names}
    found = set()
    for pid in pids:
        comm = _read(os.path.join(proc, pid, "comm")).strip()
        name = by_comm.get(comm)
        if name is None or name in found:
            continue
        # comm is truncated and any process may set it: the program it runs says.
        # A zombie (exited, not reaped) has an empty cmdline: not running.
        argv0 = _read(os.path.join(proc, pid, "cmdline")).split("\0", 1)[0]
        if os.path.basename(argv0) == name:
            found.add(name)
            if len(found) == len(by_comm):
                break
    return found


def _read(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            return handle.read(4096).decode("utf-8", "replace")
    except OSError:  # the process ended meanwhile, or hides its files
        return ""


def systemd_is_init(root: str) -> bool:
    return os.path.isdir(os.path.join(root, "run", "systemd", "system"))


def read(units: Mapping[str, str], root: str, ask_systemd: Callable[[str], Any]) -> Dict[str, Any]:
    """role -> "active" | systemd's state | NOT_RUNNING | ProbeFailure
    (UNCHECKED where gpugate.toml says "none").  ask_systemd(unit): the
    `systemctl is-active` answer."""
    wanted = {role: unit for role, unit in units.items() if unit != NONE}
    out: Dict[str, Any] = {role: ProbeFailure("services", UNCHECKED, '[services] %s = "none"' % role)
                           for role in units if role not in wanted}
    if not wanted:
        return out
    seen = running(root, {PROCESS[role] for role in wanted if role in PROCESS})
    systemd = systemd_is_init(root)
    for role, unit in wanted.items():
        if not isinstance(seen, ProbeFailure) and PROCESS.get(role) in seen:
            out[role] = "active"
        elif systemd:
            state = ask_systemd(unit)
            missing = isinstance(state, ProbeFailure) and state.kind == "missing"
            out[role] = (seen if isinstance(seen, ProbeFailure) else NOT_RUNNING) if missing else state
        else:
            out[role] = seen if isinstance(seen, ProbeFailure) else NOT_RUNNING
    return out
