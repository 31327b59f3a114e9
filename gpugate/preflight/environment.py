"""Is this node fit to join the run across a job's nodes?  Its environment
as the run needs it, checked before it joins (docs/explanation/reliability.md):

- the node is the job's alone, in Slurm's own view: no slurmstepd of
  another job in its process table (another job's load on the node or its
  link would slow the run), and, where slurmd says so (23.02+), the job
  holds its nodes alone (``--exclusive``: gpugate.preflight.select.
  exclusive; ``--exclusive=user`` lets the same user's CPU-only job share
  the node);
- free space in /dev/shm (NCCL's shared-memory transport extends files
  there) and /tmp, as much as ``[preflight] shm_free_mb`` and
  ``tmp_free_mb`` ask: an earlier job of the user can leave either full.

A node that fails is *undecided*, said so, and never a suspect: the run
across the job's nodes does not run, so no node can be pinned for what a
job's user left or runs.  The job itself runs (its own problem)."""

import os
from typing import Iterable, Mapping, Optional, Tuple

from gpugate.model.facts import ProbeFailure, failed

UNFIT = "unfit_env"  # a Member's ``own`` when its environment failed (gpugate.preflight.cross)
_MIB = 1 << 20


def judge(alone: Tuple[Optional[bool], str], jobs, job: str, free: Iterable[Tuple[str, object, int]]) -> str:
    """Why the environment is not fit ("" when it is).  Pure.  ``alone``:
    select.exclusive's answer (None where slurmd says nothing); ``jobs``:
    the jobs with a slurmstepd on the node, or a ProbeFailure; ``free``:
    (path, free bytes or a ProbeFailure, MiB wanted)."""
    if alone[0] is False:
        return "the node is not the job's alone (%s; submit with --exclusive)" % alone[1]
    if failed(jobs):
        return "the jobs on the node cannot be told: %s" % jobs.describe()[:160]
    others = sorted(j for j in jobs if str(j) != job)
    if others:
        return "job%s %s run%s on the node too" % ("s" if len(others) > 1 else "",
                                                   ",".join(str(j) for j in others[:4]),
                                                   "" if len(others) > 1 else "s")
    for path, have, want in free:
        if failed(have):
            return "%s cannot be read: %s" % (path, have.describe()[:160])
        if have < want * _MIB:
            return "%s has %d MiB free (want %d: [preflight] %s)" % (
                path, have // _MIB, want, "shm_free_mb" if path == "/dev/shm" else "tmp_free_mb")
    return ""


def check(settings, node: str, env: Mapping[str, str]) -> str:
    """This node's environment for the job in ``env`` (the prolog's), judged."""
    from gpugate.probes.owners import running_jobs
    from gpugate.preflight.select import exclusive

    root = settings.node_root(node)
    cfg = settings.preflight
    free = [(path, _free(os.path.join(root, path.lstrip("/"))), int(cfg[key]))
            for path, key in (("/dev/shm", "shm_free_mb"), ("/tmp", "tmp_free_mb")) if int(cfg[key]) > 0]
    return judge(exclusive(env), running_jobs(os.path.join(root, "proc")),
                 env.get("SLURM_JOB_ID", ""), free)


def _free(path: str):
    """Bytes an unprivileged writer may still use there (f_bavail: a job's
    user writes as themselves), or a ProbeFailure."""
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return ProbeFailure("environment", "error", "%s: %s" % (path, exc.strerror or exc))
    return st.f_bavail * st.f_frsize
