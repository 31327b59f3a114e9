"""The fleet drain budget: how many nodes of each partition gpugate may keep
drained for budgeted findings.  Pure: Slurm's node states in, a decision out.

A wrong pin, GPU count or service pushed to every node makes every node
"unfit" at once; the budget caps what that costs.  A finding is budgeted
unless it is acute (gpugate.model.findings.ACUTE: Xid, ECC, a lost GPU, a failing
stack...), whatever its class: every comparison with a file is budgeted.

A node never reads the fleet: it publishes a budgeted finding on its own
Slurm record, and one keeper (gpugate.keeper.run, `gpugate budget`) decides:
``plan`` drains the published nodes, oldest first, while every partition
of the node has room.  The ranking that settles two keepers deciding at
once is Slurm's view: the nodes drained for budgeted classes, oldest
reason first (then by name); the first ``allowance`` of them keep their
drain, and ``over`` names the newer ones a keeper gives back.

On Kubernetes a node may be held for one GPU alone (a DeviceTaintRule,
gpugate.kube.dra): its state carries ``share`` (k/n for k of its n GPUs
held, gpugate.kube.gpushare) and counts that much of a node; every other
state counts 1.  The allowance stays whole nodes; what is held is the sum
of the shares, and a node drains only where its own share still fits.
With every share 1 (Slurm) the decisions are the whole-node ones."""

import math
from typing import Iterable, Mapping, Optional, Tuple

from gpugate.model import reason as reasons
from gpugate.model.findings import CHECK_CLASSES, RMA, Finding, is_acute
from gpugate.core.record import dataclass

__all__ = ["Use", "allowance", "applies", "switched_on", "counted", "escalation_mark", "rma_budgeted", "usage",
           "fleet_usage",
           "Plan", "published", "plan", "over"]

@dataclass(frozen=True)
class Use:
    """One partition's budget: its size, how many nodes gpugate may hold
    drained for budgeted classes, and those drained now (rank order)."""

    partition: str
    size: int
    allowance: int
    drained: Tuple[str, ...]
    held: float = -1.0  # the nodes' worth held: the sum of their shares (-1: one each, len(drained))

    @property
    def weight(self) -> float:
        return float(len(self.drained)) if self.held < 0 else self.held

    @property
    def spent(self) -> bool:
        return self.weight >= self.allowance - EPS


# Shares are k/n: sums of them compared with this much slack (8 x 1/8 is 1).
EPS = 1e-9


def share_of(state) -> float:
    """How much of a node this state's hold takes: 1, or k/n where k of its
    n GPUs are held alone (Kubernetes, gpugate.kube.gpushare)."""
    return getattr(state, "share", 1.0)


def weigh(states) -> float:
    """The nodes' worth of these states' holds (never more than 1 a node)."""
    return float(sum(min(1.0, share_of(s)) for s in states))


def switched_on(share: float) -> bool:
    """A share of 1 (all of a partition) switches the budget off, and with
    it the controller reads before a drain."""
    return share < 1


def applies(verdict) -> bool:
    """Does the budget apply to this verdict's drain?  To every unfit verdict
    without an acute finding."""
    return not verdict.fit and not verdict.acute


def allowance(size: int, share: float) -> int:
    """At least one node: a small partition can still drain a drifted node."""
    return max(1, int(math.floor(size * share + 1e-9)))


def counted(state, tag: str) -> bool:
    """Drained by gpugate for budgeted findings.  The sweep's work reasons
    (class kept, findings not) count too, and so does an escalation (rma)
    a budgeted finding caused: it holds the node's capacity for good
    (issue 33).  Rollouts are the sweep's own decisions and do not."""
    if not state.drain or not state.reason:
        return False
    ours = reasons.parse(state.reason, tag)
    if ours is not None and ours.cls == RMA:
        return rma_budgeted(ours)
    return ours is not None and ours.cls in CHECK_CLASSES and not reasons.acute(ours)


# An rma reason caused by budgeted findings leads with this finding, e.g.
# ``gpugate: rma budgeted=health xid_repeat (want counted); xid_repeat:gpu2=...``
# (the class and component it was drained for are lost in rma's findings).
MARK = "budgeted"
_NOT_CAUSES = ("repeat", "sweep", MARK)  # the sweep's own notes in a reason, never a cause


def escalation_mark(found, budgeted: bool = False) -> Optional[Finding]:
    """The finding an escalation for ``found`` (findings with their own
    classes) leads with when none of them is acute (or ``budgeted``: known
    to be), else None: an acute hardware finding escalates outside the budget."""
    if not budgeted and any(f.acute for f in found):
        return None
    cause = next((f for f in found if f.component not in _NOT_CAUSES), None)
    if cause is None:
        observed = "unknown"
    else:  # a failed proof (smoke=, verify=) is the sweep's own rma finding: its name says it
        observed = cause.component if cause.cls == RMA else "%s %s" % (cause.cls, cause.component)
    return Finding(RMA, MARK, observed, "counted", "rma")


def rma_budgeted(parsed) -> bool:
    """Was this rma caused by budgeted findings?  Marked ones say so.  An
    unmarked one (an acute escalation, or an older release's reason) is
    acute when a finding it shows is acute in some class (``rma xid:gpu3=79``);
    anything else (``verify=failed``, ``smoke=...``, a pin) is counted:
    unknown only ever makes the budget stricter."""
    shown = [f for f in parsed.findings if f.component not in _NOT_CAUSES]
    if any(f.component == MARK for f in parsed.findings):
        return True
    return not any(is_acute(cls, f.component) for f in shown for cls in CHECK_CLASSES)


def _rank_key(state):
    # Unknown reason times rank last: such a node never pushes out another.
    return (state.reason_time if state.reason_time is not None else math.inf, state.name)


def usage(states: Mapping[str, object], tag: str, share: float,
          partitions: Optional[Iterable[str]] = None, sizes: Optional[Mapping[str, int]] = None):
    """partition -> Use, for every partition (or the given ones).  sizes:
    partition -> its nodes, when ``states`` holds only the nodes that can
    decide (the keeper's read, gpugate.slurm.nodestate.lean): the others
    are neither published nor drained, and count in the sizes alone."""
    wanted = None if partitions is None else set(partitions)
    members = {part: [] for part in sizes or () if wanted is None or part in wanted}
    for state in states.values():
        for part in state.partitions:
            if wanted is None or part in wanted:
                members.setdefault(part, []).append(state)
    result = {}
    for part, nodes in sorted(members.items()):
        drained = sorted((s for s in nodes if counted(s, tag)), key=_rank_key)
        size = len(nodes) if sizes is None else sizes[part]
        whole = all(share_of(s) >= 1 for s in drained)
        result[part] = Use(part, size, allowance(size, share), tuple(s.name for s in drained),
                           -1.0 if whole else weigh(drained))
    return result


def _within(names, shares: Mapping[str, float], limit: int) -> int:
    """How many of ``names`` (rank order) fit in ``limit`` nodes' worth."""
    if not shares:
        return min(limit, len(names))
    total = 0.0
    for i, name in enumerate(names):
        total += min(1.0, shares.get(name, 1.0))
        if total > limit + EPS:
            return i
    return len(names)


def _spent(use: Use, taken, share: float, shares: Optional[Mapping[str, float]] = None) -> str:
    """Why a node is held: what was counted, said as it is (never "3 of 2",
    issue 25): the nodes that hold the budget, and any drained beyond it
    (a share lowered since, or two keepers' race before it is given back).
    shares: node -> its share where less than a node (GPUs held alone)."""
    cut = _within(taken, shares or {}, use.allowance)
    holders, beyond = taken[:cut], taken[cut:]
    worth = "%d" % len(holders)
    if shares and any(n in shares for n in holders):
        worth = "%.3g" % sum(min(1.0, shares.get(n, 1.0)) for n in holders)
        holders = ["%s (%.3g)" % (n, shares[n]) if n in shares else n for n in holders]
    why = "drain budget of partition %s spent: %s of %d nodes (%g%% of %d) drained for budgeted findings: %s" % (
        use.partition, worth, use.allowance, share * 100, use.size,
        ", ".join(holders[:4]) + (" and %d more" % (len(holders) - 4) if len(holders) > 4 else ""))
    if beyond:
        why += "; %d more drained beyond it: %s" % (
            len(beyond), ", ".join(beyond[:4]) + (" and %d more" % (len(beyond) - 4) if len(beyond) > 4 else ""))
    return why


def fleet_usage(settings, states: Mapping[str, object]):
    """partition -> Use under the site's configuration; None when the budget
    is switched off (max_share 1)."""
    share = float(settings.drain_budget["max_share"])
    return usage(states, settings.reason_tag, share) if switched_on(share) else None


# --------------------------------------------------------------------------
# The keeper's decision (gpugate.keeper.run): nodes publish budgeted findings on
# their own Slurm record (gpugate.slurm.pending); one keeper drains them.
# --------------------------------------------------------------------------

@dataclass(frozen=True)
class Plan:
    """One keeper run's decision: the published nodes to drain now (oldest
    published first) with their reasons, and the published nodes held, why."""

    drain: Tuple[Tuple[str, str], ...]
    held: Mapping[str, str]
    uses: Mapping[str, Use]


def published(state, tag: str, memo: Optional[dict] = None, spans: Optional[Mapping[str, object]] = None):
    """The budgeted gpugate reason a node published (a Pending), or None:
    a comment that does not carry one of gpugate's budgeted reasons is
    nobody's business here.  memo: reason -> budgeted?, shared by the calls
    of one decision (a wrong pin gives 100,000 nodes one reason).  spans:
    node -> the span its comment reads as (pending.read), already read by
    the keeper's screen (gpugate.budget.proofs); a node not in it has none."""
    if spans is not None:
        seen = spans.get(state.name)
    elif not state.comment:
        return None
    else:
        from gpugate.slurm import pending

        seen = pending.read(state.comment)
    if seen is None:
        return None
    return seen if _budgeted(seen.reason, tag, {} if memo is None else memo) else None


def _budgeted(reason: str, tag: str, memo: dict) -> bool:
    """Is this published reason a budgeted gpugate one?  memo: as published's."""
    budgeted = memo.get(reason)
    if budgeted is None:
        ours = reasons.parse(reason, tag)
        budgeted = memo[reason] = ours is not None and ours.cls in CHECK_CLASSES and not reasons.acute(ours)
    return budgeted


def plan(states: Mapping[str, object], tag: str, share: float, sizes: Optional[Mapping[str, int]] = None,
         spans: Optional[Mapping[str, object]] = None) -> Plan:
    """Which published nodes to drain so that no partition goes beyond its
    allowance: a node drains only when every partition it is in has room.
    Nodes already drained (by anyone), or holding a reason that is not
    gpugate's (DOWN with an admin's or Slurm's: a DRAIN would replace it;
    gpugate's own, left after a RESUME, may be replaced), or in no
    partition, are never drained by the keeper.  sizes, spans: as usage's
    and published's."""
    uses = usage(states, tag, share, sizes=sizes)
    room = {p: u.allowance - u.weight for p, u in uses.items()}
    taken = {p: list(u.drained) for p, u in uses.items()}  # rank order, then this run's drains
    shares = {n: share_of(s) for n, s in states.items() if share_of(s) < 1}  # GPUs held alone: less than a node
    waiting, memo = [], {}
    for state in states.values():
        seen = published(state, tag, memo, spans)
        if seen is not None and not state.drain:
            waiting.append((seen.since, state.name, seen.reason, state))
    waiting.sort(key=lambda w: (w[0], w[1]))
    drain, held, spent = [], {}, {}
    for _since, name, reason, state in waiting:
        if state.reason and reasons.parse(state.reason, tag) is None:
            held[name] = "Slurm holds a reason on the node that is not gpugate's: %r" % state.reason[:80]
            continue
        if not state.partitions:
            held[name] = "in no partition: no drain budget to count it in"
            continue
        need = shares.get(name, 1.0)
        full = None
        for part in state.partitions:
            if room[part] < need - EPS:
                full = part
                break
        if full is not None:
            why = spent.get((full, len(taken[full])))
            if why is None:  # once per partition and count: a full one stays full
                why = spent[full, len(taken[full])] = _spent(uses[full], taken[full], share, shares)
            held[name] = why
            continue
        for part in state.partitions:
            room[part] -= need
            taken[part].append(name)
        drain.append((name, reason))
    return Plan(tuple(drain), held, uses)


def over(states: Mapping[str, object], tag: str, share: float, since: float,
         sizes: Optional[Mapping[str, int]] = None) -> Tuple[str, ...]:
    """After a keeper wrote: the keeper drains ranked beyond a partition's
    allowance (newest first out) that were stamped at or after ``since``.
    Two keepers that decided at once drain the same budget twice; each
    reads again after writing and gives back exactly these (the same set
    for both: the ranking is Slurm's reason times, then names).  Older
    drains are never given back (an allowance that shrank is not a race).
    sizes: as usage's."""
    undo = set()
    for use in usage(states, tag, share, sizes=sizes).values():
        shares = {n: share_of(states[n]) for n in use.drained} if use.held >= 0 else {}
        for name in use.drained[_within(use.drained, shares, use.allowance):]:
            state = states[name]
            seen = published(state, tag)
            if (seen is not None and seen.reason == state.reason and state.reason_time is not None
                    and state.reason_time >= since):
                undo.add(name)
    return tuple(sorted(undo))


# --------------------------------------------------------------------------
# The preflight allowance: a pin by the run across a job's nodes is budgeted
# (a job's user can slow a shared link), and bounded per partition and hour
# besides, so no run of jobs takes more than a few nodes an hour that way.
# --------------------------------------------------------------------------
