"""Findings from amdgpu kernel-log events (gpugate.vendors.amd.parse_kernlog): the
XidEvents of kind "amdgpu" in facts.xids.  Pure: policy and facts in,
findings out.

One component, ``amdgpu_event`` (the pin component ``amdgpu`` is the driver's
version), its observed value the event and what it names:

    gpugate: health amdgpu_event:gpu3=ue umc (want none)
    gpugate: health amdgpu_repeat:gpu0=ring_timeout >=3 (want < 3 in 86400s)

How many (errors, pages, timeouts, resets) is in the finding's detail, never in
the reason: a reason changes only when the finding does (each change is a
write to slurmctld, and a new published comment goes to the back of the
budget keeper's oldest-first queue).

======================== ====== ============ =========================================
event                    class  action       when
======================== ====== ============ =========================================
ue, de, ue_event, poison health reset_gpu    a fresh one (uncorrectable RAS error,
                                             deferred error, poison consumed; an ACA
                                             bank is ue/de by its STATUS bits)
reset_failed,            health reboot       a fresh one (the driver could not
ring_reset_failed                            recover the GPU, or one ring of it)
init_failed              broken reboot       a fresh one (the driver failed at probe)
bad_page_threshold       health rma          a fresh one (retired pages reached the
                                             driver's threshold: the board is done)
ring_timeout             health reset_gpu    ring_timeout_max of them on one GPU within
                                             xid_window_seconds, one of them fresh (a
                                             job's hang is not yet a GPU fault)
gpu_reset                health reboot       gpu_reset_events_max "GPU reset begin!" on
                                             one GPU in the window, one of them fresh
ce, aca, reset_ok,       -      -            recorded only (aca: the banks' header,
vram_lost, vm_fault                          vm_fault: gpugate.judges.apprepeat's)
======================== ====== ============ =========================================

The two rates are component ``amdgpu_repeat``, budgeted (the others are acute).
An event [health] amdgpu_events does not name is recorded, never a finding.
Fresh means after the kernel-log cursor, as for Xids (gpugate.judges.xids):
an admin's resume sticks until a new event arrives.
"""

from __future__ import annotations

from gpugate.model.findings import BROKEN, HEALTH, REBOOT, RESET_GPU, RMA_ACTION, Finding

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Dict, List, Tuple

COMPONENT = "amdgpu_event"
# Rates (ring timeouts, GPU resets): budgeted, as NVIDIA's application Xids
# repeated (xid_repeat): one user's job array hanging on many nodes at once
# must not drain them all outside the drain budget.
REPEAT = "amdgpu_repeat"
# event -> (class, action) for the events that drain on one fresh occurrence.
ON_ONE = {
    "ue": (HEALTH, RESET_GPU),
    "de": (HEALTH, RESET_GPU),
    "ue_event": (HEALTH, RESET_GPU),
    "poison": (HEALTH, RESET_GPU),
    "reset_failed": (HEALTH, REBOOT),
    "ring_reset_failed": (HEALTH, REBOOT),
    "init_failed": (BROKEN, REBOOT),
    "bad_page_threshold": (HEALTH, RMA_ACTION),
}
# event -> (the HealthPolicy field of its per-GPU maximum in the window, action).
RATES = {
    "ring_timeout": ("ring_timeout_max", RESET_GPU),
    "gpu_reset": ("gpu_reset_events_max", REBOOT),
}
_COUNTS = ("ue", "de", "poison")  # their xid is an error count: the observed value sums it
_DETAIL = 120


def judge(policy, facts) -> List[Finding]:
    events = facts.xids
    if not isinstance(events, tuple):
        return []  # a kernel log that could not be read is gpugate.judges.xids' probe finding
    wanted = set(policy.amdgpu_events)
    groups: Dict[Tuple, list] = {}
    for event in events:
        if event.kind != "amdgpu":
            continue
        name, _, sub = event.where.partition(":")
        if name not in wanted or not (name in ON_ONE and event.fresh or name in RATES):
            continue
        device = (event.gpu if event.gpu is not None else -1, event.pci_bus_id if event.gpu is None else "")
        key = device + (name, sub if name in ON_ONE else "")
        groups.setdefault(key, []).append(event)
    out = []
    for key in sorted(groups, key=lambda k: (k[0], k[1], _order(k[2]))):  # stable: blocks in log order
        finding = _finding(policy, key, groups[key])
        if finding is not None:
            out.append(finding)
    return out


def _finding(policy, key, group):
    gpu, bus, name, sub = key
    gpu = None if gpu < 0 else gpu
    last = group[-1]
    where = (" " + bus) if gpu is None and bus else ""
    if name in ON_ONE:
        cls, action = ON_ONE[name]
        observed = name + (" " + sub if sub else "")
        detail = _detail(last)
        if name in _COUNTS:
            total = sum(e.xid for e in group)
            detail = ("%d errors: %s" % (total, detail)) if total > 1 else detail
        return Finding(cls, COMPONENT, observed + where, "none", action, gpu=gpu, detail=detail[:_DETAIL])
    field, action = RATES[name]
    most = getattr(policy, field)
    if len(group) < most or not any(e.fresh for e in group):
        return None
    window = "%gs" % policy.xid_window_seconds if policy.xid_window_seconds else "this boot"
    expected = ("none in %s" if most <= 1 else "< %d in %%s" % most) % window
    detail = "%d in the window: %s" % (len(group), _detail(last))
    observed = name if most <= 1 else "%s >=%d" % (name, most)  # the count: in the detail
    return Finding(HEALTH, REPEAT, observed + where, expected, action, gpu=gpu, detail=detail[:_DETAIL])


def _order(name: str) -> int:
    names = tuple(ON_ONE) + tuple(RATES)
    return names.index(name) if name in names else len(names)


def _detail(event) -> str:
    return ("%s: %s" % (event.pci_bus_id, event.text) if event.pci_bus_id else event.text)[:_DETAIL]
