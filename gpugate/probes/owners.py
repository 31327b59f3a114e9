"""Whose are the processes on the GPUs: the Slurm job in each one's cgroup
(/proc/PID/cgroup), and whether that job still runs here; and whether
Slurm confines jobs to their GPUs at all (cgroup.conf).

A job runs on this node while a slurmstepd of it lives: slurmstepd puts
itself in its step's cgroup (cgroup v2: job_N/step_S/slurm; v1:
proctrack/cgroup's freezer job_N/step_S) and stays until the step's
processes are gone.  The job's cgroup directory alone would not do: an
unkillable process of a job that ended keeps its cgroup in place.  The
slurmstepd is found in the process table (comm "slurmstepd", real uid
root's, the owner of /proc itself), read only when a GPU process is
another job's."""

from __future__ import annotations

import errno
import os

from ..errors import ParseError
from ..facts import ProbeFailure
from ..jobfacts import CONSTRAINED, GpuProcess, JobProcesses
from ..parsers.cgroup import constrain_devices, slurm_job

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Any, Iterable, Optional

_GONE = object()
_CAP = 64 << 10
_STEPD = "slurmstepd"
# Where slurmd reads cgroup.conf: beside slurm.conf, or a configless slurmd's cache (22.05+).
CGROUP_CONF = ("etc/slurm/cgroup.conf", "run/slurm/conf/cgroup.conf")


def read(root: str, pids: Iterable[int], job: Optional[int]) -> JobProcesses:
    """job: the job the epilog ends.  Each pid's owner; the process table
    is read for slurmstepds only when some pid is another job's."""
    proc = os.path.join(root, "proc")
    if not os.path.isdir(os.path.join(proc, "1")):  # no /proc: every pid would look gone
        fail = ProbeFailure("processes", "missing", "%s: no process table" % proc)
        return JobProcesses(job, tuple(GpuProcess(pid, fail) for pid in sorted(set(pids))))
    owners = {pid: _owner(proc, pid) for pid in sorted(set(pids))}
    others = {o for o in owners.values() if isinstance(o, int) and o != job}
    running = _running_jobs(proc) if others else set()
    out = []
    for pid, owner in owners.items():
        if owner is _GONE:
            out.append(GpuProcess(pid, gone=True))
        elif isinstance(owner, int):
            out.append(GpuProcess(pid, owner, running if isinstance(running, ProbeFailure) else owner in running))
        else:
            out.append(GpuProcess(pid, owner))
    return JobProcesses(job, tuple(out))


def _owner(proc: str, pid: int) -> Any:
    """The job in pid's cgroup, None, _GONE, or a ProbeFailure."""
    from ..safeio import read_capped

    try:
        text = read_capped(os.path.join(proc, str(pid), "cgroup"), _CAP).decode("utf-8", "replace")
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ESRCH):
            return _GONE  # it exited after the GPUs were read
        return ProbeFailure("processes", "error", "/proc/%d/cgroup: %s" % (pid, exc.strerror or exc))
    try:
        return slurm_job(text)
    except ParseError as exc:
        return ProbeFailure("processes", "error", "pid %d: %s" % (pid, exc))


def _running_jobs(proc: str) -> Any:
    """The jobs with a live slurmstepd; a ProbeFailure when /proc cannot be listed."""
    try:
        names = [n for n in os.listdir(proc) if n.isdigit()]
        owner = os.stat(proc).st_uid  # root on a node; whoever made a simulated node's
    except OSError as exc:
        return ProbeFailure("processes", "error", "%s: %s" % (proc, exc.strerror or exc))
    jobs = set()
    for name in names:
        try:
            with open(os.path.join(proc, name, "comm"), "rb") as handle:
                if handle.read(64).strip() != _STEPD.encode():
                    continue
            if _real_uid(os.path.join(proc, name, "status")) != owner:
                continue  # any process may call itself slurmstepd: only root's is Slurm's
            job = _owner(proc, int(name))
        except OSError:  # ended meanwhile
            continue
        if isinstance(job, int):
            jobs.add(job)
    return jobs


def _real_uid(path: str) -> Optional[int]:
    """/proc/PID/status's real uid: not the owner of /proc/PID (the
    effective uid: root's for a setuid program a user runs, through a link
    named slurmstepd) nor of its files (root's once it is non-dumpable)."""
    with open(path, "rb") as handle:
        for line in handle.read(8192).split(b"\n"):
            if line.startswith(b"Uid:"):
                fields = line.split()
                return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return None


def job_devices(root: str) -> Any:
    """"constrained" where cgroup.conf says ConstrainDevices=yes; else
    "not constrained: <why>" (a fact to show once, in the audit: never a
    finding); a ProbeFailure when the file cannot be read."""
    from ..safeio import read_capped

    for rel in CGROUP_CONF:
        try:
            text = read_capped(os.path.join(root, rel), _CAP).decode("utf-8", "replace")
        except FileNotFoundError:
            continue
        except OSError as exc:
            return ProbeFailure("cgroup.conf", "error", "/%s: %s" % (rel, exc.strerror or exc))
        if not constrain_devices(text):
            return "not constrained: ConstrainDevices=no in /" + rel
        return _task_plugin(root, os.path.dirname(rel))
    return "not constrained: no cgroup.conf (/%s)" % ", /".join(CGROUP_CONF)


def _task_plugin(root: str, conf_dir: str) -> str:
    """ConstrainDevices works through task/cgroup: a slurm.conf beside
    cgroup.conf whose TaskPlugin lacks it confines nothing.  No TaskPlugin
    line read (an Include, no file): said constrained, as cgroup.conf says."""
    from ..parsers.cgroup import conf_value
    from ..safeio import read_capped

    rel = os.path.join(conf_dir, "slurm.conf")
    try:
        plugins = conf_value(read_capped(os.path.join(root, rel), 4 << 20).decode("utf-8", "replace"), "TaskPlugin")
    except OSError:
        plugins = None
    if plugins is not None and "task/cgroup" not in plugins.lower().split(","):
        return "not constrained: TaskPlugin=%s (no task/cgroup) in /%s" % (plugins[:80], rel)
    return CONSTRAINED


def node_facts(root: str, mode: str, nvml: Any, amd: Any, job: Optional[str]) -> dict:
    """The NodeFacts fields this module reads for a mode: the health
    check's job_devices; the epilog's gpu_processes, where a process is on
    the GPUs it read (the job's own, gpugate.node.epilog)."""
    from ..facts import failed

    if mode == "healthcheck":
        return {"job_devices": job_devices(root)}
    if mode != "epilog":
        return {}
    if amd is not None:
        pids = amd.kfd_processes if not failed(amd) else ()
    else:
        gpus = nvml.gpus if nvml is not None and not failed(nvml) else ()
        pids = tuple(p for g in gpus if isinstance(g.processes, tuple) for p in g.processes)
    if not isinstance(pids, tuple) or not pids:
        return {}
    number = int(job) if job and job.isdigit() and job.isascii() and len(job) <= 10 else None
    return {"gpu_processes": read(root, pids, number)}
