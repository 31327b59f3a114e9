"""Slurm calls gpugate makes in its own process or worker, in the words of
the command that does the same, appended to GPUGATE_SLURM_TRACE beside
what the test cluster's scontrol/sinfo shims log: one trace reads the same
whichever backend made the calls."""

import os
import stat
from typing import List, Sequence

from gpugate.slurm.jobs import sbatch_argv


def append(words: Sequence[str]) -> None:
    """One call (a command's words) to GPUGATE_SLURM_TRACE, where it is set."""
    path = os.environ.get("GPUGATE_SLURM_TRACE", "")
    if path:
        write(path, [" ".join(words)])


def write(path: str, lines: List[str]) -> None:
    # A path from the environment, appended to as root: never through a
    # symlink someone planted there, never into a FIFO or someone else's file.
    text = "".join("%s %s\n" % (os.environ.get("SLURMD_NODENAME", ""), words)
                   for words in lines).encode("utf-8", "replace")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                     0o600)
    except OSError:
        return  # a trace is for reading along, never a reason to fail a call
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
            os.write(fd, text)
    except OSError:
        pass
    finally:
        os.close(fd)


def in_scontrol_words(op: str, args: tuple) -> List[str]:
    if op == "nodes":
        return ["scontrol show node" + (" " + args[0] if args[0] else "")]
    if op == "own_record":
        return ["libslurm show node %s" % args[0]]
    if op == "update_nodes":
        names, state, reason = args
        return ["scontrol update NodeName=%s State=%s%s" % (names, state, "" if reason is None else
                                                             " Reason=" + reason)]
    if op == "set_comment":
        return ["scontrol update NodeName=%s Comment=%s" % args]
    if op == "reservations":
        return ["scontrol show reservation --oneliner"]
    if op == "reserve":
        duration = "%d" % args[2] if len(args) > 2 else "365-00:00:00"
        return ["scontrol create reservation ReservationName=%s Nodes=%s StartTime=now Duration=%s "
                "Users=root Flags=MAINT,IGNORE_JOBS" % (args[0], args[1], duration)]
    if op == "update_reservation":
        return ["scontrol update ReservationName=%s Nodes=%s" % args]
    if op == "unreserve":
        return ["scontrol delete ReservationName=%s" % args]
    if op == "submit":
        spec = dict(args[0])
        return ["sbatch " + " ".join(sbatch_argv({"name": spec["name"], "reservation": spec["reservation"],
                                                  "node": spec["nodes"], "minutes": spec["minutes"],
                                                  "output": spec["output"], "extra": spec["extra"],
                                                  "wrap": spec["script"].split("\n", 1)[1].strip()}))]
    if op == "jobs":
        return ["scontrol show job --oneliner %s" % job for job in args[0]]
    if op == "cancel":
        return ["scancel %s" % " ".join(args[0])] if args[0] else []
    if op == "jobs_now":
        return ["squeue --all"]
    return ["pyslurm %s %r" % (op, args)]
