"""Whose are the processes on a job's GPUs (the epilog's facts).

Where Slurm does not confine a job to its GPUs (cgroup.conf
ConstrainDevices=no), or GPUs are shared (gres/shard, MPS), another job's
process may sit on this job's GPU: it is that job's, not a leftover.
gpugate.probes.owners fills these records, gpugate.judges.leftover reads
them."""

from __future__ import annotations

from gpugate.core.record import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Any, Optional, Tuple

CONSTRAINED = "constrained"  # NodeFacts.job_devices: cgroup.conf ConstrainDevices=yes


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    # int: the Slurm job whose cgroup holds it; None: in no job;
    # ProbeFailure: its /proc/PID/cgroup could not be read or parsed.
    job: Any = None
    # That job still has a slurmstepd on this node: bool, or ProbeFailure
    # (the process table could not be read); None where job is no int.
    running: Any = None
    gone: bool = False  # exited before its cgroup was read: holds nothing now


@dataclass(frozen=True)
class JobProcesses:
    """job: the job this epilog ends (SLURM_JOB_ID; None outside one)."""

    job: Optional[int]
    processes: Tuple[GpuProcess, ...] = ()

    def owner(self, pid: int) -> Optional[GpuProcess]:
        return next((p for p in self.processes if p.pid == pid), None)
