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
another job's.

A process in no job's cgroup (sites that track jobs without cgroups:
ProctrackType=proctrack/linuxproc or pgid) is the job of the slurmstepd
above it (its PPid chain, as Slurm's linuxproc tracks it; under pgid, its
process group's too); one reparented to init stays in no job."""

from __future__ import annotations

import errno
import os

from gpugate.errors import ParseError
from gpugate.model.facts import ProbeFailure
from gpugate.model.jobfacts import CONSTRAINED, GpuProcess, JobProcesses
from gpugate.parsers.cgroup import constrain_devices, slurm_job

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
    # In no job's cgroup (proctrack/linuxproc or pgid: no job cgroups): the job of the slurmstepd above it,
    # which lives while that job runs.
    pgid = None
    by_parent, seen = {}, {}  # seen: what was read of each process, once for all pids
    for pid in [p for p, o in owners.items() if o is None]:
        if pgid is None:
            pgid = proctrack(os.path.dirname(proc)) == "proctrack/pgid"
        by_parent[pid] = owners[pid] = _by_ancestry(proc, pid, pgid, seen)
    others = {o for p, o in owners.items() if isinstance(o, int) and o != job and p not in by_parent}
    running = _running_jobs(proc) if others else set()
    out = []
    for pid, owner in owners.items():
        if owner is _GONE:
            out.append(GpuProcess(pid, gone=True))
        elif isinstance(owner, int) and pid in by_parent:
            out.append(GpuProcess(pid, owner, True))  # its slurmstepd was alive as it was read
        elif isinstance(owner, int):
            out.append(GpuProcess(pid, owner, running if isinstance(running, ProbeFailure) else owner in running))
        else:
            out.append(GpuProcess(pid, owner))
    return JobProcesses(job, tuple(out))


def _owner(proc: str, pid: int) -> Any:
    """The job in pid's cgroup, None, _GONE, or a ProbeFailure."""
    try:
        text = _read(proc, pid, "cgroup").decode("utf-8", "replace")
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ESRCH):
            return _GONE  # it exited after the GPUs were read
        return ProbeFailure("processes", "error", "/proc/%d/cgroup: %s" % (pid, exc.strerror or exc))
    try:
        return slurm_job(text)
    except ParseError as exc:
        return ProbeFailure("processes", "error", "pid %d: %s" % (pid, exc))


def _by_ancestry(proc: str, pid: int, pgid: bool, seen: dict) -> Any:
    """The job of the slurmstepd above pid (gpugate.parsers.proctree), None
    where none is (reparented to init: a leftover, as Slurm's linuxproc
    tracking sees it), _GONE, or a ProbeFailure.  Under proctrack/pgid an
    orphan still in its step's process group is that step's (Slurm signals
    the group): the group's leader, the step's first task, is walked too."""
    from gpugate.parsers.proctree import ancestry_job, stat_pgrp

    owner = _stat(proc)

    def parent(p):
        if ("parent", p) not in seen:
            seen["parent", p] = _parent(proc, p)
        return seen["parent", p]

    def stepd(p):
        if ("stepd", p) not in seen:
            seen["stepd", p] = _stepd_job(proc, p, owner)
        return seen["stepd", p]

    try:
        if parent(pid) is None:
            return _GONE  # it exited after its cgroup was read
        job = ancestry_job(pid, parent, stepd)
        if job is None and pgid:
            try:
                group = stat_pgrp(_read(proc, pid, "stat").decode("ascii", "replace"))
            except FileNotFoundError:
                return _GONE
            if group not in (pid, 0, 1):
                job = ancestry_job(group, parent, stepd)
    except ParseError as exc:
        return ProbeFailure("processes", "error", "pid %d: %s" % (pid, exc))
    except OSError as exc:
        return ProbeFailure("processes", "error", "pid %d's ancestry: %s" % (pid, exc.strerror or exc))
    return job


def _read(proc: str, pid: int, name: str) -> bytes:
    """/proc/<pid>/<name> of the node root's process table, never through a
    link (a kernel's /proc/<pid> is none; a copied root's may lead out)."""
    from gpugate.safety.safeio import read_capped

    fd = os.open(os.path.join(proc, "%d" % int(pid)), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return read_capped(name, _CAP, follow=False, dir_fd=fd)
    finally:
        os.close(fd)


def _parent(proc: str, pid: int) -> Optional[int]:
    """pid's parent, or None when pid has exited (ENOENT, ESRCH); other errors raise."""
    from gpugate.parsers.proctree import status_fields

    try:
        text = _read(proc, pid, "status")
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ESRCH):
            return None
        raise
    return status_fields(text.decode("utf-8", "replace"))[0]


def _stepd_job(proc: str, pid: int, owner: Optional[int]) -> Optional[int]:
    """The job Slurm's slurmstepd at pid is for (comm slurmstepd, real uid
    root's), or None for any other process; ParseError when Slurm's
    slurmstepd has a title that names no job (unknown, never "no job")."""
    from gpugate.parsers.proctree import status_fields, step_job

    try:
        if _read(proc, pid, "comm").strip() != _STEPD.encode() or \
                status_fields(_read(proc, pid, "status").decode("utf-8", "replace"))[1] != owner:
            return None
        cmdline = _read(proc, pid, "cmdline")
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ESRCH):
            return None  # exited meanwhile: its children were reparented
        raise
    job = step_job(cmdline)
    if job is None:
        raise ParseError("slurmstepd pid %d: its title names no job: %r" % (pid, cmdline[:80]))
    return job


def _stat(proc: str) -> Optional[int]:
    try:
        return os.stat(proc).st_uid  # root on a node; whoever made a simulated node's
    except OSError:
        return None


def _running_jobs(proc: str, strict: bool = False) -> Any:
    """The jobs with a live slurmstepd; a ProbeFailure when /proc cannot be
    listed (``strict``: or a slurmstepd's job cannot be told)."""
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
            if job is None:  # no job cgroups (proctrack/linuxproc, pgid): its title names its job
                from gpugate.parsers.proctree import step_job

                job = step_job(_read(proc, int(name), "cmdline"))
        except OSError:  # ended meanwhile
            continue
        if isinstance(job, int):
            jobs.add(job)
        elif strict and isinstance(job, ProbeFailure):  # root's slurmstepd whose cgroup cannot be read: unknown
            return job
    return jobs


def running_jobs(proc: str) -> Any:
    """The jobs with a live slurmstepd on this node (Slurm's own view of who
    runs here: gpugate.preflight.environment), or a ProbeFailure, also when
    one slurmstepd's job cannot be told."""
    return _running_jobs(proc, strict=True)


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
    finding), naming slurm.conf's ProctrackType where it is not
    proctrack/cgroup (the epilog tells a job's processes by their
    slurmstepd then); a ProbeFailure when cgroup.conf cannot be read."""
    from gpugate.safety.safeio import read_capped

    for rel in CGROUP_CONF:
        try:
            text = read_capped(os.path.join(root, rel), _CAP).decode("utf-8", "replace")
        except FileNotFoundError:
            continue
        except OSError as exc:
            return ProbeFailure("cgroup.conf", "error", "/%s: %s" % (rel, exc.strerror or exc))
        if not constrain_devices(text):
            return "not constrained: ConstrainDevices=no in /" + rel + _tracking(root)
        return _task_plugin(root, os.path.dirname(rel))
    return "not constrained: no cgroup.conf (/%s)" % ", /".join(CGROUP_CONF) + _tracking(root)


def _slurm_conf(root: str, name: str) -> Any:
    """(name's value, the slurm.conf it was read from) of the first slurm.conf
    beside a cgroup.conf place; (None, None) where none is read."""
    from gpugate.parsers.cgroup import conf_value
    from gpugate.safety.safeio import read_capped

    for rel in (os.path.join(os.path.dirname(c), "slurm.conf") for c in CGROUP_CONF):
        try:
            return conf_value(read_capped(os.path.join(root, rel), 4 << 20).decode("utf-8", "replace"), name), rel
        except OSError:
            continue
    return None, None


def proctrack(root: str) -> Optional[str]:
    """slurm.conf's ProctrackType, lower case (None: no slurm.conf read, or not set)."""
    value = _slurm_conf(root, "ProctrackType")[0]
    return value.strip().lower() if value else None


def _tracking(root: str) -> str:
    value, rel = _slurm_conf(root, "ProctrackType")
    if value is None or value.strip().lower() == "proctrack/cgroup":
        return ""
    return "; ProctrackType=%s in /%s (no job cgroups: a job's process is told by the slurmstepd above it)" \
        % (value[:40], rel)


def _task_plugin(root: str, conf_dir: str) -> str:
    """ConstrainDevices works through task/cgroup: a slurm.conf beside
    cgroup.conf whose TaskPlugin lacks it confines nothing.  No TaskPlugin
    line read (an Include, no file): said constrained, as cgroup.conf says."""
    from gpugate.parsers.cgroup import conf_value
    from gpugate.safety.safeio import read_capped

    rel = os.path.join(conf_dir, "slurm.conf")
    try:
        plugins = conf_value(read_capped(os.path.join(root, rel), 4 << 20).decode("utf-8", "replace"), "TaskPlugin")
    except OSError:
        plugins = None
    if plugins is not None and "task/cgroup" not in plugins.lower().split(","):
        return "not constrained: TaskPlugin=%s (no task/cgroup) in /%s" % (plugins[:80], rel) + _tracking(root)
    return CONSTRAINED


def node_facts(root: str, mode: str, nvml: Any, amd: Any, job: Optional[str]) -> dict:
    """The NodeFacts fields this module reads for a mode: the health
    check's job_devices; the epilog's gpu_processes, where a process is on
    the GPUs it read (the job's own, gpugate.node.epilog)."""
    from gpugate.model.facts import failed

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
