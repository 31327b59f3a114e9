"""Repeat offenders: pure functions of a node's history in the journal.

The sweep records when it returned a node to service and for which
components it had been drained (``resumed``), when it finds the node drained
by gpugate again (``redrained``), when it escalates it (``escalated``) and
when an admin clears the record (``forgiven``).  A node drained again for a
component it was returned to service for ``limit`` times within ``window``
seconds is escalated to ``rma`` instead of being worked on once more: a
part that keeps failing is cheaper to replace than to keep repairing.
"""

from typing import Dict, FrozenSet, Iterable, Mapping, Optional, Sequence, Tuple

from gpugate.model import reason as reasons
from gpugate.model.findings import RMA, ROLLOUT, USER_CAUSED
from gpugate.core.record import dataclass

RESUMED, REDRAINED, ESCALATED, FORGIVEN = "resumed", "redrained", "escalated", "forgiven"
KINDS = (RESUMED, REDRAINED, ESCALATED, FORGIVEN)


@dataclass(frozen=True)
class Event:
    node: str
    kind: str
    at: float  # epoch seconds
    components: FrozenSet[str] = frozenset()
    detail: str = ""


@dataclass(frozen=True)
class Repeat:
    component: str
    count: int  # returns to service for it within the window
    times: Tuple[float, ...]  # when, newest first


def components(ours: Optional[reasons.ParsedReason]) -> FrozenSet[str]:
    """What a gpugate reason drained the node for.  The sweep's own work
    reason (``sweep=...``) and rollouts (planned, not a fault) count for
    nothing; neither does an escalation, nor a finding a job's user can
    cause (findings.USER_CAUSED: a pin by a preflight across nodes, an
    application's Xids): returned to service for those alone, a node is
    never a repeat offender, so an rma needs hardware evidence."""
    if ours is None or ours.cls in (ROLLOUT, RMA):
        return frozenset()
    return frozenset(f.component for f in ours.findings
                     if f.component not in ("sweep", "repeat") and f.component not in USER_CAUSED)


def since_forgiven(events: Sequence[Event]) -> Tuple[Event, ...]:
    """The events after the admin last cleared the node (all, if never)."""
    events = sorted(events, key=lambda e: e.at)
    cleared = max((i for i, e in enumerate(events) if e.kind == FORGIVEN), default=-1)
    return tuple(events[cleared + 1:])


def counts(events: Sequence[Event], now: float, window: float) -> Dict[str, Tuple[float, ...]]:
    """component -> when the node was returned to service for it within the
    window and since it was last forgiven, newest first."""
    out: Dict[str, list] = {}
    for event in since_forgiven(events):
        if event.kind == RESUMED and now - window <= event.at <= now:
            for component in event.components:
                out.setdefault(component, []).append(event.at)
    return {c: tuple(sorted(times, reverse=True)) for c, times in out.items()}


def repeat_of(current: Iterable[str], events: Sequence[Event], now: float, limit: int,
              window: float) -> Optional[Repeat]:
    """The component the node is drained for now that it was already
    returned to service for ``limit`` times within the window, or None.
    ``limit`` 0 switches escalation for repeats off."""
    if limit <= 0:
        return None
    found = counts(events, now, window)
    hits = [Repeat(c, len(found[c]), found[c]) for c in sorted(set(current)) if len(found.get(c, ())) >= limit]
    return max(hits, key=lambda r: (r.count, r.times[0]), default=None)


RUNG_RESET, RUNG_REBOOT = "reset", "reboot"


def rung_of(event: Event) -> str:
    """How a ``resumed`` event's repair was done ("rung=reset" in its detail), "" when not said."""
    for word in event.detail.split():
        if word.startswith("rung="):
            return word[5:]
    return ""


def rungs_within(current: Iterable[str], events: Sequence[Event], now: float, window: float) -> Tuple[str, ...]:
    """The rungs (oldest first) of the returns to service within the window,
    since last forgiven, for a component the node is drained for now: the
    ladder (plan._ladder) climbs past a rung that did not hold."""
    current = set(current)
    return tuple(rung_of(e) for e in since_forgiven(events)
                 if e.kind == RESUMED and now - window <= e.at <= now and e.components & current)


def ladder_spent(current: Iterable[str], events: Sequence[Event], now: float, window: float) -> bool:
    """Back within the window after a GPU reset and then a reboot: every rung was tried."""
    rungs = rungs_within(current, events, now, window)
    return RUNG_RESET in rungs and RUNG_REBOOT in rungs[rungs.index(RUNG_RESET):]


def escalated(events: Sequence[Event]) -> bool:
    """Escalated since last forgiven (and not returned to service since)."""
    kinds = [e.kind for e in since_forgiven(events) if e.kind in (ESCALATED, RESUMED)]
    return bool(kinds) and kinds[-1] == ESCALATED


def offenders(history: Mapping[str, Sequence[Event]], now: float, limit: int, window: float,
              at_least: int = 2) -> Dict[str, dict]:
    """For `gpugate status`: nodes returned to service ``at_least`` times for
    one component within the window, or escalated as repeats."""
    out = {}
    for node, events in history.items():
        is_escalated = escalated(events) and any(e.kind == ESCALATED and e.detail.startswith("repeat")
                                                 for e in since_forgiven(events))
        # An escalated node stays listed after its window has passed: it is still out.
        found = counts(events, now, float("inf") if is_escalated else window)
        # The same pick as repeat_of: most returns, the newest, then by name.
        worst = max(sorted(found.items()), key=lambda kv: (len(kv[1]), kv[1][0]), default=None)
        if worst is None or (len(worst[1]) < at_least and not is_escalated):
            continue
        out[node] = {"component": worst[0], "count": len(worst[1]), "last": list(worst[1][:3]),
                     "limit": limit, "escalated": is_escalated,
                     "next_drain_escalates": limit > 0 and len(worst[1]) >= limit and not is_escalated}
    return out


def finding_text(repeat: Repeat, window: float, limit: int) -> Tuple[str, str]:
    """(observed, expected) of the ``repeat`` finding an escalated reason leads with."""
    return "%s %dx in %s" % (repeat.component, repeat.count, span(window)), "under %d" % limit


def span(seconds: float) -> str:
    seconds = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return "%d%s" % (seconds // size, unit)
    return "%ds" % seconds
