"""A GPU's own history of the application's Xids (pure; gpugate.node.xidhistory
keeps it in the state directory).

The catalog blames Xids 13, 31, 43 and 94 on the application (restart it),
so one never drains.  A bad GPU hides there: the same GPU (its PCI bus id:
the slot, whatever the index) showing them in ``[health] xid_app_jobs_max``
different jobs within ``xid_app_window_seconds`` is a ``health
xid_repeat`` finding naming the count, the Xids and the jobs.  One job's
burst (a crash loop inside one job, eight ranks dying together) is one job
and never drains.

Only the epilog records (it knows the job: SLURM_JOB_ID, and its Xids are
those since the job's prolog); the epilog and the health check both judge
the record, so a drain does not lift between jobs.  Budgeted, not acute: a
user's broken application submitted as a job array crashes on the GPUs of
many nodes, each in many jobs; the drain budget bounds that.  The record
is bounded: at most MAX_GPUS GPUs, MAX_ENTRIES entries each, none older
than the window."""

from __future__ import annotations

from ..facts import failed
from ..findings import HEALTH, RESET_GPU, Finding

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Dict, List, Optional

MAX_GPUS = 64
MAX_ENTRIES = 50
MAX_JOB = 64  # characters of a job id kept


def record(history: Optional[dict], facts, job: str, now: float, policy) -> dict:
    """The history with this job's fresh application Xids added, and
    entries older than the window dropped."""
    from ..xidcatalog import APP_XIDS

    gpus: Dict[str, list] = {}
    for bus, entries in ((history or {}).get("gpus") or {}).items():
        if isinstance(entries, list):
            gpus[str(bus)] = [e for e in entries if _entry(e) and 0 <= now - e[0] < policy.xid_app_window_seconds]
    events = facts.xids
    if job and isinstance(events, tuple):
        for event in events:
            if event.fresh and event.kind == "xid" and event.xid in APP_XIDS and event.pci_bus_id:
                gpus.setdefault(event.pci_bus_id, []).append([now, str(job)[:MAX_JOB], event.xid])
    kept = {bus: entries[-MAX_ENTRIES:] for bus, entries in gpus.items() if entries}
    newest = sorted(kept, key=lambda bus: -kept[bus][-1][0])[:MAX_GPUS]
    return {"gpus": {bus: kept[bus] for bus in sorted(newest)}}


def _entry(e) -> bool:
    return (isinstance(e, list) and len(e) == 3 and isinstance(e[0], (int, float)) and isinstance(e[1], str)
            and isinstance(e[2], int))


def judge(history: Optional[dict], facts, now: float, policy) -> List[Finding]:
    """One finding per GPU whose application Xids came from enough
    different jobs within the window."""
    limit = policy.xid_app_jobs_max
    if not limit or not isinstance(history, dict):
        return []
    index = _indexes(facts)
    out = []
    for bus, entries in sorted((history.get("gpus") or {}).items()):
        recent = [e for e in entries if _entry(e) and 0 <= now - e[0] < policy.xid_app_window_seconds] \
            if isinstance(entries, list) else []
        jobs = sorted({e[1] for e in recent})
        if len(jobs) < limit:
            continue
        xids = sorted({e[2] for e in recent})
        hours = policy.xid_app_window_seconds / 3600.0
        out.append(Finding(HEALTH, "xid_repeat", "xid %s in %d jobs" % ("+".join(map(str, xids)), len(jobs)),
                           "< %d jobs within %gh" % (limit, hours), RESET_GPU, gpu=index.get(bus),
                           detail="GPU %s: jobs %s (the application's Xids, in different jobs: the GPU's)"
                           % (bus, ", ".join(jobs[-10:]))))
    return out


def _indexes(facts) -> Dict[str, int]:
    """PCI bus id as the kernel prints it ("0000:3a:00") -> NVML's index."""
    nvml = facts.nvml
    out = {}
    if nvml is not None and not failed(nvml):
        for gpu in nvml.gpus:
            if isinstance(gpu.pci_bus_id, str):
                out[gpu.pci_bus_id.lower()[4:-2]] = gpu.index
    return out


__all__ = ["record", "judge"]
