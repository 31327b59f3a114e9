"""A process on a job's GPU after the job (the epilog) is a leftover only
when no running job owns it: one in another job's cgroup while that job
still runs here is that job's (GPUs not confined per job, or shared).
One in this job's cgroup, in no job's, or in a job that has ended is a
leftover; one that exited meanwhile holds nothing.  Pure."""

from __future__ import annotations

from gpugate.model.facts import failed
from gpugate.model.jobfacts import JobProcesses

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Any, Sequence, Tuple


def leftovers(pids: Sequence[int], owners: Any) -> Tuple[Tuple[int, ...], Any]:
    """(the leftover pids, the first owner that could not be told): owners
    is NodeFacts.gpu_processes.  Without it (facts of an older gpugate, no
    process table read) every pid is a leftover, as before: unknown is
    never "another job's"."""
    if not isinstance(owners, JobProcesses):
        return tuple(pids), None
    left, unknown = [], None
    for pid in pids:
        owner = owners.owner(pid)
        if owner is None:
            left.append(pid)  # not looked at
        elif owner.gone:
            continue
        elif failed(owner.job) or failed(owner.running):
            unknown = unknown or (owner.job if failed(owner.job) else owner.running)
        elif owner.job is None or owner.job == owners.job or owner.running is not True:
            left.append(pid)
    return tuple(left), unknown
