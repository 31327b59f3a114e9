"""Who owns a drain, and what gpugate may do about it.  Pure functions.

The reason text is the only mark of ownership (ReasonUser is root for every
root process), so: never overwrite or clear a reason without gpugate's tag;
never replace our reason with a milder one (acute before budgeted, then by
class); never touch the sweep's own
reasons (rma, rollout) from a node-side check.
"""

from __future__ import annotations


from gpugate.model import reason as reasons
from gpugate.model.findings import EVENTS, RMA, ROLLOUT, is_acute, severity
from gpugate.core.record import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Iterable, Optional

NONE = "none"  # nothing to do
DRAIN = "drain"  # not drained: drain with our reason
UPDATE = "update"  # drained by us, findings changed: replace our reason
UNDRAIN = "undrain"  # drained by us for a self-clearing class, fit again
KEEP_ADMIN = "keep_admin"  # drained by someone else: hands off
KEEP = "keep"  # drained by us; leave it (sweep's job, or a more severe class)
UNKNOWN = "unknown"  # Slurm does not list the node: nothing can be applied
SWEEP_OWNED = (RMA, ROLLOUT)
REBOOTED = " : reboot complete"  # what slurmctld appends once `scontrol reboot` is done


@dataclass(frozen=True)
class Decision:
    """What to do with the node in Slurm, and why."""

    kind: str
    reason: Optional[str] = None
    why: str = ""


def decide(node, verdict, tag: str, self_clearing: Iterable[str]) -> Decision:
    """node: a NodeState (or None when Slurm does not know it)."""
    if node is None:
        return Decision(UNKNOWN, why="Slurm does not list this node (SLURMD_NODENAME vs NodeName?)")
    ours = reasons.parse(node.reason, tag) if node.reason else None
    sweeps = _sweep_owned(ours)
    if not node.drain:
        if sweeps and not verdict.fit:
            # DOWN after the sweep's `scontrol reboot nextstate=DOWN`: the
            # sweep drains it again when slurmd is back, with its own reason.
            return Decision(KEEP, why="the sweep has this node (%s)" % ours.text[:60])
        if node.reason and ours is None and not verdict.fit:
            # e.g. DOWN with an admin's or Slurm's reason: DRAIN would replace it.
            return Decision(KEEP_ADMIN, why="someone else's reason on the node: %r" % node.reason[:80])
        if verdict.fit:
            return Decision(NONE)
        return Decision(DRAIN, verdict.reason, "unfit")
    if ours is None:
        return Decision(KEEP_ADMIN, why="drained by someone else: %r" % (node.reason or "(no reason)")[:80])
    if sweeps:
        return Decision(KEEP, why="the sweep has this node (%s)" % ours.text[:60])
    if verdict.fit:
        if ours.cls in tuple(self_clearing):
            return Decision(UNDRAIN, why="fit again; %s clears itself" % ours.cls)
        return Decision(KEEP, why="fit now, but %s waits for the sweep's verification" % ours.cls)
    if node.reason == verdict.reason:
        return Decision(NONE, why="already drained with this reason")
    if severity(verdict.cls, verdict.acute) < severity(ours.cls, reasons.acute(ours)):
        # An acute reason outranks a budgeted one of any class, so Slurm's
        # copy keeps telling the drain budget what this drain is.
        return Decision(KEEP, why="keeping the more severe %s reason" % ours.cls)
    reason = with_events_kept(ours, verdict, tag)
    if reason == node.reason:
        return Decision(NONE, why="already drained for these findings and the events seen before")
    return Decision(UPDATE, reason, "findings changed")


def with_events_kept(ours, verdict, tag: str) -> str:
    """The verdict's reason, plus the events (findings.EVENTS) our reason
    names that the verdict does not: seen once, they would otherwise go
    from the reason at the next check while another finding stands.  Only
    within one class, and only acute ones: a reason's first finding and
    class still say what the drain counts as (reason.acute).  Not after
    `scontrol reboot` completed: the reboot was their repair."""
    if ours.cls != verdict.cls or ours.text.endswith(REBOOTED):
        return verdict.reason
    # Findings compared as the reason shows them (sanitized, cut): an event
    # read back from Slurm is never taken for a new one.  Two Xids of one
    # GPU are two events.
    seen = {reasons.render_finding(f) for f in verdict.findings}
    kept = []
    for f in ours.findings:
        shown = reasons.render_finding(f)
        if f.component in EVENTS and is_acute(ours.cls, f.component) and shown not in seen:
            kept.append(f)
            seen.add(shown)
    if not kept:
        return verdict.reason
    if not ours.more and seen == {reasons.render_finding(f) for f in ours.findings}:
        return ours.text  # the same findings: no write for their order alone
    return reasons.render(tag, verdict.cls, tuple(verdict.findings) + tuple(kept))


def _sweep_owned(ours) -> bool:
    """An escalation or rollout reason, or the sweep's work reason (sweep=...)."""
    if ours is None:
        return False
    return ours.cls in SWEEP_OWNED or (ours.first is not None and ours.first.component == "sweep")
