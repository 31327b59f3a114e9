"""A simulated node's Slurm jobs, as the epilog sees them: each GPU
process's /proc/PID/cgroup in Slurm's layout (v2 or v1), a slurmstepd per
running job with the job's task (a shell) under it, each process's parent
and process group (/proc/PID/status PPid, /proc/PID/stat), and
/etc/slurm/cgroup.conf (and slurm.conf's ProctrackType where not cgroup).

Keys (`gpugate sim set`): slurm.jobs=201,203|none (the jobs running here),
slurm.process.<pid>=<job>|orphan:<job>|none (that job's process: in its
cgroup, under its task while it runs; orphan: reparented to init, still in
its cgroup and process group; none: no job's), slurm.cgroup=v2|v1,
slurm.constrain_devices=yes|no|absent, slurm.proctrack=cgroup|linuxproc|pgid
(not cgroup: no job cgroups, every process in slurmd's)."""

from typing import Any, Dict, Tuple

from gpugate.errors import ConfigError
from gpugate.sim.values import parse_int

KEYS = ("slurm.jobs", "slurm.process.<pid>", "slurm.cgroup", "slurm.constrain_devices", "slurm.proctrack")
_STEPD_PID = 3000  # the first running job's slurmstepd
_TASK_PID = 3100  # its task, the batch script's shell: the GPU processes' parent and process group leader
_TRACKING = ("cgroup", "linuxproc", "pgid")
_UID = 1000  # the jobs' user (v1 paths name it)
_V1 = ("12:devices", "7:freezer", "4:memory")


def known(key: str) -> bool:
    parts = key.split(".")
    return key in KEYS or len(parts) == 3 and parts[:2] == ["slurm", "process"] and parts[2].isdigit()


def _slurm(model: Dict[str, Any]) -> Dict[str, Any]:
    # A node made before these keys: no jobs, cgroup v2, devices constrained (as most GPU sites run).
    return model.get("slurm") or {"jobs": [], "processes": {}, "cgroup": "v2", "constrain_devices": "yes"}


def set_key(model: Dict[str, Any], key: str, value: str) -> None:
    slurm = model["slurm"] = _slurm(model)
    none = value.lower() in ("none", "")
    if key == "slurm.jobs":
        slurm["jobs"] = [] if none else sorted({parse_int(j) for j in value.split(",") if j})
    elif key.startswith("slurm.process."):
        pid = key.rsplit(".", 1)[1]
        slurm["processes"].pop(pid, None)
        orphans = slurm["orphans"] = [p for p in slurm.get("orphans", ()) if p != pid]
        if not none:
            slurm["processes"][pid] = parse_int(value[len("orphan:"):] if value.startswith("orphan:") else value)
            if value.startswith("orphan:"):
                orphans.append(pid)
    elif value not in _CHOICES[key]:
        raise ConfigError("%s: expected one of %s, got %r" % (key, "/".join(_CHOICES[key]), value))
    else:
        slurm[key.split(".", 1)[1]] = value


_CHOICES = {"slurm.cgroup": ("v1", "v2"), "slurm.constrain_devices": ("yes", "no", "absent"),
            "slurm.proctrack": _TRACKING}


def cgroup(model: Dict[str, Any], job: Any, step: str = "0", stepd: bool = False) -> str:
    """/proc/PID/cgroup of a process in that job (None: in no job), as Slurm lays it out."""
    v1 = _slurm(model)["cgroup"] == "v1"
    if job is not None and _slurm(model).get("proctrack", "cgroup") != "cgroup":  # no job cgroups: slurmd's
        return "0::/system.slice/slurmd.service\n" if not v1 else "".join(
            "%s:/system.slice/slurmd.service\n" % h for h in _V1 + ("1:name=systemd",))
    if job is None:  # a login session's process
        session = "/user.slice/user-%d.slice/session-4.scope" % _UID
        if not v1:
            return "0::%s\n" % session
        return "".join("%s:%s\n" % (h, "/" if h == "12:devices" else session) for h in _V1) + \
            "1:name=systemd:%s\n" % session
    if v1:  # proctrack/cgroup puts the slurmstepd in its step's freezer cgroup
        path = "/slurm/uid_%d/job_%d/step_%s" % (_UID, job, step)
        lines = ("7:freezer:%s\n" % path) if stepd else "".join("%s:%s/task_0\n" % (h, path) for h in _V1)
        return lines + "1:name=systemd:/system.slice/slurmd.service\n"
    return "0::/system.slice/slurmstepd.scope/job_%d/step_%s/%s\n" % (job, step, "slurm" if stepd else "user/task_0")


def processes(model: Dict[str, Any]) -> Dict[int, Tuple[str, str, str, Any, int, int]]:
    """{pid: (comm, cmdline, cgroup, real uid, parent pid, process group)}:
    the GPUs' processes (NVIDIA's and AMD's: the jobs' user's), one
    slurmstepd per running job (uid None: root's, the owner of the node's
    /proc; reparented to init, as slurmd starts it) and its task, the GPU
    processes' parent while their job runs."""
    slurm = _slurm(model)
    gpus = list((model.get("nvml") or {}).get("gpus") or ()) + list((model.get("amd") or {}).get("gpus") or ())
    out = {}
    tasks = {}
    for i, job in enumerate(slurm["jobs"]):
        stepd, tasks[job] = _STEPD_PID + i, _TASK_PID + i
        out[stepd] = ("slurmstepd", "slurmstepd: [%d.batch]\0" % job, cgroup(model, job, "batch", True), None, 1, stepd)
        out[tasks[job]] = ("bash", "/bin/bash\0/var/spool/slurmd/job%d/slurm_script\0" % job,
                           cgroup(model, job, "batch"), _UID, stepd, tasks[job])
    for gpu in gpus:
        for entry in gpu.get("processes") or ():
            pid = int(entry["pid"] if isinstance(entry, dict) else entry)
            job = slurm["processes"].get(str(pid))
            orphan = str(pid) in slurm.get("orphans", ())
            parent = tasks[job] if job in tasks and not orphan else 1
            out[pid] = ("python3", "python3\0train.py\0", cgroup(model, job), _UID, parent, tasks.get(job, pid))
    return out


def slurm_conf(model: Dict[str, Any]) -> Any:
    """/etc/slurm/slurm.conf's text where ProctrackType is not cgroup (a node's
    own slurm.conf is not modelled otherwise), or None."""
    tracking = _slurm(model).get("proctrack", "cgroup")
    return None if tracking == "cgroup" else "ProctrackType=proctrack/%s\n" % tracking


def cgroup_conf(model: Dict[str, Any]) -> Any:
    """/etc/slurm/cgroup.conf's text, or None (absent)."""
    value = _slurm(model)["constrain_devices"]
    if value == "absent":
        return None
    return "CgroupPlugin=autodetect\nConstrainCores=yes\nConstrainDevices=%s\n" % value
