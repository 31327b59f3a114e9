"""RMA never bypasses the budget (issue 33): the gate an escalation caused
by budgeted findings must pass.  Pure: the sweep's snapshot in, a decision
out; the planner (plan.py) and the engine (engine._escalate) ask the same.

An rma holds a node's capacity until a human acts, so it is the one drain
that a budgeted finding must not be able to repeat: a job user's three
5-second jobs (an application Xid each: ``xid_repeat``) drained a node
within the budget, the sweep escalated it, the budget was free again, and
the next node followed.  Now an rma whose cause was budgeted is counted by
the drain budget (gpugate.budget.rules.counted) and an escalation for budgeted
findings happens only while, in every partition of the node,

* the rma nodes of budgeted cause stay within the drain budget's
  allowance (when the budget is on), and
* the nodes that can come back to service (members less those in rma and
  those out for other reasons) stay at or above the sweep's floor.

Otherwise it is deferred: the node stays drained, with the sweep's work
reason ``sweep=rma deferred`` (counted by the budget, like any work reason)
and the findings it would have been escalated for, and every later sweep
asks again.  An acute finding escalates at once, outside the budget."""

from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from gpugate.budget import rules as budget
from gpugate.model import reason as reasons
from gpugate.model.findings import CHECK_CLASSES, DRIFT, RMA, Finding
from gpugate.core.record import replace

DEFERRED = "rma deferred"  # the observed value of the work reason's sweep finding
_WANT = "room in budget and floor"


def deferred(ours) -> bool:
    """Is this gpugate reason an escalation the sweep deferred?"""
    first = ours.first if ours is not None else None
    return first is not None and first.component == "sweep" and first.observed.startswith(DEFERRED)


def deferred_reason(tag: str, cls: str, found: Sequence[Finding]) -> str:
    """The reason a deferred node carries: the class it was drained for,
    the sweep's note first (so it reads as budgeted, never acute), then
    what it would be escalated for."""
    cls = cls if cls in CHECK_CLASSES else DRIFT  # a rollout's node: versions
    note = Finding(cls, "sweep", DEFERRED, _WANT, "")
    shown = [replace(f, cls=cls) for f in found if f.component not in ("sweep", budget.MARK)]
    text = reasons.render(tag, cls, [note])
    for count in range(len(shown), 0, -1):  # as many as fit, the note always first
        parts = [reasons.render_finding(f) for f in shown[:count]]
        parts += ["+%d more" % (len(shown) - count)] if count < len(shown) else []
        candidate = "; ".join([text] + parts)
        if len(candidate) <= reasons.MAX_BYTES:
            return candidate
    return text


def cause(ours) -> List[Finding]:
    """The findings a deferred reason holds (what to escalate for); none for any other reason."""
    return [f for f in ours.findings if f.component != "sweep"] if deferred(ours) else []


def decide(gate: Callable[[], "Gate"], items: Sequence[tuple]) -> Dict[str, Tuple[Optional[Finding], Optional[str]]]:
    """Escalations decided together, ``items`` (name, ours: its gpugate
    reason, found: the findings with their own classes, partitions) in age
    order -> name: (the mark its rma leads with, None when acute; why it
    waits, None when it goes).  Acute ones always go, and first: the room
    they take is not given to one of budgeted cause.  ``gate`` is read only
    when one of budgeted cause is among them."""
    out = {name: (None, None) for name, ours, found, _ in items if not budgeted(ours, found)}
    rest = [item for item in items if item[0] not in out]
    if rest:
        room = gate()
        for name, _, _, partitions in items:
            if name in out:
                room.take(name, partitions, held=False)
        for name, ours, found, partitions in rest:
            why = room.refuse(partitions)
            if why is None:
                room.take(name, partitions)
            out[name] = (budget.escalation_mark(found, budgeted=deferred(ours)), why)
    return out


def budgeted(ours, found: Sequence[Finding]) -> bool:
    """Would this escalation need the gate's room (see decide)?"""
    return budget.escalation_mark(found, budgeted=deferred(ours)) is not None


class Gate:
    """Room for escalations of budgeted cause, per partition, taken as they
    are granted (one plan or one engine call decides several nodes)."""

    def __init__(self, views: Iterable, share: float, floors: Mapping[str, int]):
        self.share = share
        self.floors = floors
        self.members: Dict[str, int] = {}
        self.out: Dict[str, int] = {}  # in rma (any cause) or out for others: not coming back by itself
        self.held: Dict[str, List[str]] = {}  # rma of budgeted cause
        for view in views:
            ours = view.ours
            rma = ours is not None and ours.cls == RMA
            for part in view.partitions:
                self.members[part] = self.members.get(part, 0) + 1
                if rma or view.out_for_others:
                    self.out[part] = self.out.get(part, 0) + 1
                if rma and budget.rma_budgeted(ours):
                    self.held.setdefault(part, []).append(view.name)

    def refuse(self, partitions: Sequence[str]) -> Optional[str]:
        """Why an escalation of budgeted cause must wait, or None."""
        for part in partitions:
            members = self.members.get(part, 0)
            held = self.held.get(part, [])
            if budget.switched_on(self.share) and len(held) + 1 > budget.allowance(members, self.share):
                return ("drain budget of partition %s: %d of %d node(s) already in rma for budgeted findings (%s)"
                        % (part, len(held), budget.allowance(members, self.share), ", ".join(sorted(held)[:4])))
            floor = self.floors.get(part, 0)
            if members - self.out.get(part, 0) - 1 < floor:
                return ("partition %s at its floor: %d of %d must be able to return to service, %d in rma or out "
                        "for other reasons" % (part, floor, members, self.out.get(part, 0)))
        return None

    def take(self, name: str, partitions: Sequence[str], held: bool = True) -> None:
        for part in partitions:
            if held:
                self.held.setdefault(part, []).append(name)
            self.out[part] = self.out.get(part, 0) + 1
