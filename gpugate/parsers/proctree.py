"""Which Slurm job a process is in by its ancestry, where Slurm tracks jobs
without cgroups (slurm.conf ProctrackType=proctrack/linuxproc or
proctrack/pgid): the job of the first slurmstepd above it.

Slurm 25.11 src/plugins/proctrack/linuxproc/kill_tree.c find_ancestor()
walks /proc/PID/stat's parent pids up to a process whose cmdline starts
with "slurmstepd", and gives up at pid 1: a process reparented to init is
no step's.  slurmstepd titles itself (src/common/setproctitle.c,
slurmstepd.c _set_job_log_prefix) ``slurmstepd: [<step id>]``, the step id
as log.c log_build_step_id_str() writes it: ``201.0``, ``201.batch``,
``201.extern``, ``201.interactive``, ``201.TDB``, a heterogeneous
component's ``201.0+1``, a step manager's ``[201.batch stepmgr]``; the job's
namespace holder (job_container, slurmstepd.c _process_cmdline) is
``slurmstepd: [201:namespace]``.  proctrack/pgid tracks a step by its
process group, whose leader is the step's first task (mgr.c setpgid).

Pure: text in, numbers out; the walk takes its reads as functions.
"""

import re
from typing import Callable, Optional, Tuple

from gpugate.errors import ParseError

MAX_DEPTH = 1024  # ancestors read at most (~60 ms); deeper (or a loop) is unknown: real chains are tens
_MAX_JOB = 0xFFFFFFFD  # Slurm's job ids are uint32; the top values are NO_VAL and friends
_STEP = r"(?:[0-9]+|batch|extern|interactive|TDB)(?:\+[0-9]+)?(?: stepmgr)?"
_TITLE = re.compile(r"slurmstepd: \[([1-9][0-9]{0,9})(?:\.%s|:namespace)\]\Z" % _STEP)


def status_fields(text: str) -> Tuple[int, int]:
    """(PPid, real uid) of a /proc/PID/status; ParseError when either is missing."""
    ppid = uid = None
    for line in text.split("\n"):
        key, _, rest = line.partition(":")
        fields = rest.split()
        if key == "PPid" and len(fields) == 1 and fields[0].isdigit() and fields[0].isascii():
            ppid = int(fields[0])
        elif key == "Uid" and fields and fields[0].isdigit() and fields[0].isascii():
            uid = int(fields[0])
    if ppid is None or uid is None:
        raise ParseError("/proc/PID/status: no %s line" % ("PPid" if ppid is None else "Uid"))
    return ppid, uid


def stat_pgrp(text: str) -> int:
    """The process group of a /proc/PID/stat (after the last ")": comm may hold anything)."""
    fields = text.rpartition(")")[2].split()
    if len(fields) < 3 or not fields[2].isdigit() or not fields[2].isascii():
        raise ParseError("/proc/PID/stat: no process group")
    return int(fields[2])


def step_job(cmdline: bytes) -> Optional[int]:
    """The job a slurmstepd's title names, or None: setproctitle pads the
    title with NULs (or spaces) to the length of its argv."""
    title = cmdline.split(b"\0", 1)[0].rstrip(b" ").decode("ascii", "replace")
    m = _TITLE.match(title)
    if m is None:
        return None
    job = int(m.group(1))
    return job if job <= _MAX_JOB else None


def ancestry_job(pid: int, parent: Callable[[int], Optional[int]],
                 stepd_job: Callable[[int], Optional[int]], depth: int = MAX_DEPTH) -> Optional[int]:
    """The job of the nearest slurmstepd above pid, or None where the chain
    reaches init (pid 1, or 0: a kernel thread's) or breaks (an ancestor
    exited meanwhile: its children were reparented; find_ancestor gives up
    there too).  parent(p): p's parent pid, None when p is gone;
    stepd_job(p): the job p's title names when p is Slurm's slurmstepd, else
    None (it raises ParseError for Slurm's slurmstepd with a title naming no
    job).  Raises ParseError on a loop or a chain deeper than depth: unknown,
    never "no job"."""
    seen = {pid}
    current = parent(pid)
    while current is not None and current > 1:
        if current in seen:
            raise ParseError("its ancestry loops at pid %d" % current)
        if len(seen) > depth:
            raise ParseError("more than %d ancestors" % depth)
        seen.add(current)
        job = stepd_job(current)
        if job is not None:
            return job
        current = parent(current)
    return None
