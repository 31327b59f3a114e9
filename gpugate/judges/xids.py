"""`health` from the kernel log: Xids (by gpugate.vendors.nvidia.xidcatalog's policy),
NVSwitch SXids and GPUs that fell off the bus (amdgpu events are
gpugate.vendors.amd.judge_events').

Fresh events (after the kernel-log cursor) drain on their own.  Non-fatal
NVLink sub-events (Xid 144-150) and non-fatal SXids are expected now and then
on a healthy fabric: they drain only when a device shows ``xid_nonfatal_max``
of them within ``xid_window_seconds``, and one of them is fresh (so an admin's
resume sticks until a new one arrives)."""

from __future__ import annotations

from gpugate.model.facts import ProbeFailure
from gpugate.model.findings import HEALTH, INVESTIGATE, PROBE, REBOOT, Finding
from gpugate.core.lazyre import IGNORECASE, Lazy
from gpugate.judges.common import probe_finding

# The first severity word: "Fatal", "Non-fatal" (SXid), "Nonfatal"/"nonfatal" (Xid 144-150).
_SEVERITY = Lazy(r"\b(non-?fatal|fatal)\b", IGNORECASE)
_RECOVERY_TO = Lazy(r"\bto 0x([0-9a-f]{1,8})\b", IGNORECASE)
_DETAIL = 120


def judge(policy, facts):
    events, lost = facts.xids, lost_finding(facts)
    if isinstance(events, ProbeFailure):
        return [probe_finding("xid", events)] + lost
    if events:
        events = [e for e in events if e.kind != "amdgpu"]  # AMD's: gpugate.vendors.amd.judge_events
    if not events:
        return lost  # the healthy path: gpugate.vendors.nvidia.xidcatalog stays unloaded
    from gpugate.vendors.nvidia.xidcatalog import NVLINK_XIDS

    out, counted = [], {}
    # The driver prints Xid 79 and "fallen off the bus" together: one finding.
    xid79 = {e.pci_bus_id for e in events if e.fresh and e.kind == "xid" and e.xid == 79}
    for event in events:
        if event.kind == "fallen_off_bus":
            if event.fresh and event.pci_bus_id not in xid79:
                out.append(Finding(HEALTH, "fallen_off_bus", event.pci_bus_id, "on the bus", REBOOT,
                                   gpu=event.gpu, detail=event.text[:_DETAIL]))
        elif event.kind == "sxid":
            if not fatal(event.text):
                counted.setdefault((event.where, "sxid"), []).append(event)
            elif event.fresh:
                out.append(Finding(HEALTH, "sxid", "%s %d fatal" % (_switch(event), event.xid), "none", REBOOT,
                                   detail=_detail(event)))
        elif event.xid in policy.drain_xids:
            out += _xid(policy, event, counted, event.xid in NVLINK_XIDS)
    for (_, kind), group in sorted(counted.items(), key=lambda kv: str(kv[0])):
        if len(group) >= policy.xid_nonfatal_max and any(e.fresh for e in group):
            out.append(_rate(policy, kind, group))
    return out + lost


def lost_finding(facts) -> list:
    """Kernel-log records lost before gpugate read them (issue 33): no finding
    where a job runs.  A job's user can flood the ring on any node at will;
    the follower's journal (gpugate.probes.gpujournal) holds the GPU records
    the ring lost, and what was lost is a metric, a log field and a status
    column (facts.kernel_log_lost, kernel_log_follower), never a drain nor a
    share of the drain budget.  Only the sweep's verification (mode verify:
    the node is drained, no job's user runs there) holds a node out of
    service for records lost that no follower read either: it must not
    RESUME a node with an Xid unseen since its repair."""
    lost, cover = facts.kernel_log_lost, facts.kernel_log_follower
    if facts.mode != "verify" or not isinstance(lost, dict) or (isinstance(cover, dict) and cover.get("covered")):
        return []
    count = lost.get("records")
    if isinstance(count, int):
        observed = "lost %d records seq %s-%s" % (count, lost.get("first"), lost.get("last"))
    else:
        observed = "lost records while reading"  # EPIPE at the start of a boot's first read: no count
    return [Finding(PROBE, "kernel_log", observed, "none lost", INVESTIGATE,
                    detail="kernel log records overwritten before gpugate or its follower read them: "
                           "an Xid among them went unseen")]


def fatal(text: str) -> bool:
    """Fatal unless the line says non-fatal: an unknown severity is not good news."""
    match = _SEVERITY.search(text[:80])
    return not (match and match.group(1).lower().startswith("non"))


def recovery_target(text: str):
    """Xid 154's new recovery action (an int), or None when the text does not say."""
    match = _RECOVERY_TO.search(text)
    return int(match.group(1), 16) if match else None


def _xid(policy, event, counted, nvlink):
    from gpugate.vendors.nvidia.xidcatalog import RECOVERY_TARGETS, RECOVERY_XID

    if nvlink and not fatal(event.text):
        counted.setdefault((event.gpu if event.gpu is not None else event.pci_bus_id, event.xid), []).append(event)
        return []
    if not event.fresh:
        return []
    action = policy.xid_action(event.xid)
    if event.xid == RECOVERY_XID:
        target = recovery_target(event.text)
        if target == 0:
            return []  # changed to 0x0 (None): the GPU recovered
        # An explicit [health.xid_actions] "154" wins; else the action the driver names.
        if str(RECOVERY_XID) not in policy.xid_actions:
            action = RECOVERY_TARGETS.get(target) or action
    return [Finding(HEALTH, "xid", str(event.xid), "none", action, gpu=event.gpu, detail=_detail(event))]


def _rate(policy, kind, group):
    last = group[-1]
    window = "%gs" % policy.xid_window_seconds if policy.xid_window_seconds else "this boot"
    if kind == "sxid":
        # The limit, not the count, in the reason: it changes only when the
        # finding does, not at each SXid (each change is a write to slurmctld).
        observed = "%s %d non-fatal >=%d" % (_switch(last), last.xid, policy.xid_nonfatal_max)
        return Finding(HEALTH, "sxid", observed, "< %d in %s" % (policy.xid_nonfatal_max, window), REBOOT,
                       detail=("%d non-fatal: " % len(group) + _detail(last))[:_DETAIL])
    # Observed stays the bare Xid code: the sweep reads it back (gpugate.sweep.plan).
    return Finding(HEALTH, "xid", str(last.xid), "< %d non-fatal in %s" % (policy.xid_nonfatal_max, window),
                   policy.xid_action(last.xid), gpu=last.gpu,
                   detail=("%d non-fatal: " % len(group) + _detail(last))[:_DETAIL])


def _switch(event) -> str:
    name = event.where or ""
    return name.replace("nvidia-", "") or event.pci_bus_id


def _detail(event) -> str:
    where = event.where if event.kind == "xid" and event.where else ""
    if event.kind == "sxid":
        where = event.pci_bus_id
    return ("%s: %s" % (where, event.text) if where else event.text)[:_DETAIL]
