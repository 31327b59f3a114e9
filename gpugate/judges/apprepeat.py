"""A GPU's own history of the application's Xids (pure; gpugate.node.xidhistory
keeps it in the state directory).

The catalog blames Xids 13, 31, 43 and 94 on the application (restart it),
so one never drains.  A bad GPU hides there.  As NVIDIA NVSentinel's
analyzer, the place decides, not the count: the same GPU (its PCI bus id:
the slot, whatever the index) showing them in ``[health] xid_app_jobs_max``
jobs of different users within ``xid_app_window_seconds`` is a ``health
xid_repeat`` finding (its first rung: a GPU reset and the deep diagnostic,
gpugate.sweep.plan), ``xid_repeat:gpu2=xids in >=3 jobs``: which Xids, how
many jobs and whose are in its detail, so its reason (and the comment it
publishes) changes only when the finding does.  What never counts:

- one job twice: a crash loop inside one job (60 Xids, eight ranks dying
  together) is one entry, the job's, with its Xids;
- one Xid twice: each kernel-log record counts once, for the job whose GPU
  it was on (the job's own GPUs, SLURM_JOB_GPUS); overlapping jobs on other
  GPUs of a shared node never claim it, and an Xid on a GPU no finished job
  held counts for no job;
- one user alone: their jobs' Xids on one GPU, however many, are their
  application's (the same user's jobs are one witness);
- a user whose faults follow them across this node's GPUs where no other
  user's jobs show any on those GPUs: the application's, not the GPU's
  (said in the detail).  Where other users' jobs show faults on one of
  those GPUs too, that user's jobs count there like anyone's (issue 44,
  item 6: setting them aside for the whole window hid a fault several
  GPUs share).

The same faults on several GPUs in jobs of several users are one fault of
the node (an NVSwitch, a PCIe switch, the baseboard): where two or more
GPUs each reach the limit and at least two users' faults span them, one
``health xid_repeat`` finding for the node names them all,
``xid_repeat=xids on gpus 2+5 of >=2 users`` (no GPU: the sweep's reset
rung resets every GPU, and the verification runs the deep diagnostic on
all).  ``xid_app_jobs_max`` is 0 (off) or 2 at the least (gpugate.
baseline_schema): one job is one user's.

Only the epilog records (it knows the job, its user: SLURM_JOB_UID, and its
GPUs; its Xids are those since the job's prolog); the epilog and the health
check judge the record, so a drain does not lift between jobs.  Budgeted,
not acute: a user's broken application run as a job array crashes on the
GPUs of many nodes; the drain budget bounds that.

The record is bounded by jobs, not events: per GPU at most MAX_JOBS jobs
and, per user, as many as the limit needs (one user's flood of short jobs
cannot push the other users' entries out), each job one entry of at most
MAX_XIDS distinct Xids; at most MAX_GPUS GPUs; nothing older than the
window.  A GPU's entries are cleared (``clear``) when its deep diagnostic
passed, and when the node was returned to service by someone who may
(gpugate.node.xidhistory)."""

from __future__ import annotations

from gpugate.model.facts import failed
from gpugate.model.findings import HEALTH, RESET_GPU, Finding

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Dict, Iterable, List, Optional, Sequence

MAX_GPUS = 64
MAX_JOBS = 64  # jobs kept per GPU (the limit is at most 50)
MAX_XIDS = 8  # distinct Xids kept per job
MAX_SEEN = 128  # kernel-log records per GPU already counted: one Xid counts once
MAX_JOB = 64  # characters of a job id kept
MAX_USER = 16  # characters of a uid kept
_COUNT_CAP = 10 ** 6
VM_FAULT = -1  # an amdgpu VM page fault in the record (NVIDIA's codes are positive)


def app_event(event) -> bool:
    """An application fault of the job on its GPU: NVIDIA's application
    Xids, amdgpu's VM page faults (gpugate.vendors.amd.parse_kernlog)."""
    from gpugate.vendors.nvidia.xidcatalog import APP_XIDS

    if event.kind == "amdgpu":
        return event.where.split(":", 1)[0] == "vm_fault"
    return event.kind == "xid" and event.xid in APP_XIDS


def _code(event) -> int:
    return VM_FAULT if event.kind == "amdgpu" else event.xid


def record(history: Optional[dict], facts, job: str, user: str, gpus: Optional[Sequence[int]], now: float,
           policy) -> dict:
    """The history with this job's fresh application Xids on its own GPUs
    (host indices; None: unknown, nothing recorded) added, and entries
    older than the window dropped."""
    window = policy.xid_app_window_seconds
    table = _load(history, now, window)
    events = facts.xids
    if job and gpus is not None and isinstance(events, tuple):
        mine = set(gpus)
        job, user = str(job)[:MAX_JOB], (str(user)[:MAX_USER] or "?" + str(job)[:MAX_JOB])
        for event in events:
            if not (event.fresh and app_event(event) and event.gpu in mine and event.pci_bus_id):
                continue
            gpu = table.setdefault(event.pci_bus_id, {"jobs": {}, "seen": []})
            key = _key(event)
            if key is not None and key in gpu["seen"]:
                continue  # counted already, for the job that ended first
            if key is not None:
                gpu["seen"] = (gpu["seen"] + [key])[-MAX_SEEN:]
            entry = gpu["jobs"].get(job) or [now, user, [], 0]
            xids = sorted(set(entry[2]) | {_code(event)})[:MAX_XIDS]
            gpu["jobs"][job] = [now, entry[1], xids, min(entry[3] + 1, _COUNT_CAP)]
    per_user = max(_limit(policy), 1)
    out = {}
    for bus, gpu in table.items():
        jobs = _bounded(gpu["jobs"], per_user)
        if jobs:
            out[bus] = {"jobs": jobs, "seen": gpu["seen"][-MAX_SEEN:]}
    newest = sorted(out, key=lambda bus: -max(e[0] for e in out[bus]["jobs"].values()))[:MAX_GPUS]
    result = {"gpus": {bus: out[bus] for bus in sorted(newest)}}
    marks = _marks(history)
    if marks:
        result["drained"] = {bus: t for bus, t in marks.items() if bus in result["gpus"]}
    return result


def _key(event) -> Optional[str]:
    """One kernel-log record: its sequence number, with its time (a reboot
    starts the numbers again)."""
    if event.seq is None:
        return None
    return "%d@%d" % (event.seq, int(event.timestamp or 0))


def _bounded(jobs: Dict[str, list], per_user: int) -> Dict[str, list]:
    """Newest first: at most ``per_user`` jobs of each user, MAX_JOBS in all."""
    kept: Dict[str, list] = {}
    users: Dict[str, int] = {}
    for job, entry in sorted(jobs.items(), key=lambda kv: (-kv[1][0], kv[0])):
        if len(kept) >= MAX_JOBS:
            break
        if users.get(entry[1], 0) >= per_user:
            continue
        users[entry[1]] = users.get(entry[1], 0) + 1
        kept[job] = entry
    return dict(sorted(kept.items()))


def _load(history: Optional[dict], now: float, window: float) -> Dict[str, dict]:
    """{bus: {"jobs": {job: [t, user, xids, n]}, "seen": [key]}}, well-formed
    and within the window only (anything else in the file is dropped)."""
    out: Dict[str, dict] = {}
    gpus = (history or {}).get("gpus") if isinstance(history, dict) else None
    for bus, gpu in (gpus.items() if isinstance(gpus, dict) else ()):
        if not isinstance(gpu, dict) or not isinstance(gpu.get("jobs"), dict):
            continue  # the old per-event list: no users, no GPUs of the job; starts again
        jobs = {str(job): e for job, e in gpu["jobs"].items() if _entry(e) and 0 <= now - e[0] < window}
        seen = [k for k in gpu.get("seen") or () if isinstance(k, str)][-MAX_SEEN:]
        out[str(bus)] = {"jobs": jobs, "seen": seen}
    return out


def _entry(e) -> bool:
    return (isinstance(e, list) and len(e) == 4 and isinstance(e[0], (int, float)) and isinstance(e[1], str)
            and isinstance(e[2], list) and all(isinstance(x, int) for x in e[2]) and isinstance(e[3], int))


def _marks(history) -> Dict[str, float]:
    marks = history.get("drained") if isinstance(history, dict) else None
    return {str(b): t for b, t in marks.items() if isinstance(t, (int, float))} if isinstance(marks, dict) else {}


def _limit(policy) -> int:
    """The jobs a GPU needs (0: off); never below 2, whatever the policy
    says: one job is one user's (the schema refuses 1)."""
    limit = int(policy.xid_app_jobs_max or 0)
    return max(limit, 2) if limit > 0 else 0


def _found(history: Optional[dict], now: float, policy) -> list:
    """[(buses, {job: entry} counted, users, how many users' faults span
    several of the buses)]: one per GPU whose application Xids came from at
    least the limit's jobs of two users or more, except that such GPUs
    sharing the faults of two users or more are one entry, the node's
    (buses: more than one)."""
    limit = _limit(policy)
    if not limit:
        return []
    table = _load(history, now, policy.xid_app_window_seconds)
    users = {bus: {e[1] for e in gpu["jobs"].values()} for bus, gpu in table.items()}
    # Two users at the least on the GPU: a user whose faults follow them
    # across GPUs no other user's jobs show faults on is alone on each (set
    # aside); where other users' jobs show faults too, theirs and its count.
    flagged = [bus for bus in sorted(table) if len(table[bus]["jobs"]) >= limit and len(users[bus]) >= 2]
    group = {bus: bus for bus in flagged}

    def root(bus: str) -> str:
        while group[bus] != bus:
            bus = group[bus]
        return bus

    for i, one in enumerate(flagged):
        for other in flagged[i + 1:]:
            if len(users[one] & users[other]) >= 2:  # several users' faults span both: one fault
                group[root(other)] = root(one)
    parts: Dict[str, List[str]] = {}
    for bus in flagged:
        parts.setdefault(root(bus), []).append(bus)
    out = []
    for buses in sorted(parts.values()):
        counted: Dict[str, list] = {}
        for bus in buses:
            for job, e in table[bus]["jobs"].items():
                seen = counted.get(job)
                counted[job] = e if seen is None else [max(seen[0], e[0]), seen[1], sorted(set(seen[2]) | set(e[2])),
                                                       min(seen[3] + e[3], _COUNT_CAP)]
        spanning = {u for u in set().union(*(users[b] for b in buses)) if sum(u in users[b] for b in buses) > 1}
        out.append((tuple(buses), counted, sorted({e[1] for e in counted.values()}), len(spanning)))
    return out


def _aside(history: Optional[dict], now: float, policy) -> Dict[str, List[str]]:
    """{user: buses}: the users whose faults follow them across GPUs no
    other user's jobs show faults on (the application's, not counted)."""
    table = _load(history, now, policy.xid_app_window_seconds)
    places: Dict[str, set] = {}
    for bus, gpu in table.items():
        for entry in gpu["jobs"].values():
            places.setdefault(entry[1], set()).add(bus)
    return {user: sorted(buses) for user, buses in places.items()
            if len(buses) > 1 and not any(u != user and buses & b for u, b in places.items())}


def judge(history: Optional[dict], facts, now: float, policy) -> List[Finding]:
    """One finding per GPU whose application Xids came from enough jobs of
    different users within the window, one for the node where such GPUs
    share the faults of several users."""
    index = _indexes(facts)
    hours = policy.xid_app_window_seconds / 3600.0
    limit = _limit(policy)
    found = _found(history, now, policy)
    aside = _aside(history, now, policy) if found else {}
    out = []
    for buses, counted, users, spanning in found:
        xids = sorted({x for e in counted.values() for x in e[2]})
        vm = set(xids) == {VM_FAULT}
        said = "+".join("vm_fault" if x == VM_FAULT else str(x) for x in xids)
        what = "vm_faults" if vm else "xids"
        who = "jobs %s of users %s" % (", ".join(sorted(counted)[-10:]), ", ".join(_user(u) for u in users[-10:]))
        # Which faults and how many jobs: in the detail.  The reason names the
        # finding only, so it changes when the finding does, not at each job
        # (a new published comment goes to the back of the keeper's queue).
        if len(buses) == 1:
            gpu, observed = index.get(buses[0]), "%s in >=%d jobs" % (what, limit)
            detail = ("%s in %d jobs on GPU %s: %s (the application's Xids on the same GPU for different users: "
                      "the GPU's; reset it and run the deep diagnostic)"
                      % (said if vm else "xid " + said, len(counted), buses[0], who))
        else:
            buses = tuple(sorted(buses, key=lambda b: (index.get(b, 1 << 20), b)))  # by index where known
            names = [str(index[b]) if b in index else b[5:] if b.startswith("0000:") else b for b in buses]
            gpu, observed = None, "%s on gpus %s of >=2 users" % (what, "+".join(names))
            detail = ("%s on %d GPUs (%s) in %d jobs of %d users, %d of them with faults on several of these GPUs: "
                      "%s (the same faults on several GPUs for different users: the node's, a shared NVSwitch, "
                      "PCIe switch or baseboard; reset every GPU and run the deep diagnostic)"
                      % (said if vm else "xid " + said, len(buses), ", ".join(buses), len(counted), len(users),
                         spanning, who))
        if aside:
            detail += "; not counted, the application's (their Xids follow them across GPUs no other user's " \
                      "jobs show any on): " + "; ".join(
                          "user %s on %s" % (_user(u), ", ".join(aside[u][:4])) for u in sorted(aside)[:3])
        out.append(Finding(HEALTH, "xid_repeat", observed, "< %d jobs within %gh" % (limit, hours), RESET_GPU,
                           gpu=gpu, detail=detail))
    return out


def _user(user: str) -> str:
    return "unknown (job %s)" % user[1:] if user.startswith("?") else user


def standing(history: Optional[dict], now: float, policy) -> List[str]:
    """The PCI bus ids of the GPUs the history holds a finding for (a
    node's finding: all the GPUs it names)."""
    return sorted(bus for found in _found(history, now, policy) for bus in found[0])


def clear(history: Optional[dict], buses: Optional[Iterable[str]] = None, before: Optional[float] = None) -> dict:
    """The history without these GPUs' entries (every GPU's: None), or
    only those recorded at or before ``before``; their marks go too."""
    gpus = dict((history or {}).get("gpus") or {}) if isinstance(history, dict) else {}
    wanted = set(gpus) if buses is None else set(buses)
    out = {}
    for bus, gpu in gpus.items():
        if bus not in wanted or not isinstance(gpu, dict) or not isinstance(gpu.get("jobs"), dict):
            out[bus] = gpu
            continue
        jobs = {j: e for j, e in gpu["jobs"].items() if before is not None and _entry(e) and e[0] > before}
        if jobs:
            out[bus] = dict(gpu, jobs=jobs)
        elif gpu.get("seen"):
            out[bus] = {"jobs": {}, "seen": gpu["seen"]}  # a record counted stays counted
    result = {"gpus": out}
    marks = {b: t for b, t in _marks(history).items() if b not in wanted}
    if marks:
        result["drained"] = marks
    return result


def mark_drained(history: Optional[dict], buses: Iterable[str], now: float) -> dict:
    """The history with these GPUs marked: their finding was seen drained."""
    out = dict(history or {"gpus": {}})
    marks = _marks(history)
    for bus in buses:
        marks.setdefault(bus, now)
    out["drained"] = marks
    return out


def marked(history: Optional[dict]) -> Dict[str, float]:
    return _marks(history)


def _indexes(facts) -> Dict[str, int]:
    """PCI bus id as the kernel prints it ("0000:3a:00") -> the GPU's index
    (NVML's; on AMD nodes its place in PCI order, as amd-smi's)."""
    nvml, amd = facts.nvml, getattr(facts, "amd", None)
    out = {}
    if nvml is not None and not failed(nvml):
        for gpu in nvml.gpus:
            if isinstance(gpu.pci_bus_id, str):
                out[gpu.pci_bus_id.lower()[4:-2]] = gpu.index
    if amd is not None and not failed(amd):
        for gpu in amd.gpus:
            out.setdefault(gpu.bdf.lower()[:-2], gpu.index)
    return out


__all__ = ["record", "judge", "standing", "clear", "mark_drained", "marked", "app_event"]
