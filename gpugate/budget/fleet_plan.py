"""The budget keeper's plan (gpugate.keeper.run): budget.rules.plan's
rule, for a fleet-wide event (100,000 nodes published at once) read as
the keeper reads the fleet (gpugate.slurm.nodestate.lean): usage counted
over the drained nodes alone, only the published nodes looked at for a
place in the queue, each distinct reason and set of partitions judged
once, and once every partition of the queue is full, the rest held at
once.  tests/test_keeper_lean.py compares it with plan on generated
fleets."""

from operator import itemgetter
from typing import Mapping

from gpugate.budget.rules import EPS, Plan, _budgeted, _spent, reasons, share_of, usage

__all__ = ["plan_published"]


def plan_published(states: Mapping[str, object], tag: str, share: float, sizes: Mapping[str, int],
                   spans: Mapping[str, object]) -> Plan:
    """plan(states, tag, share, sizes, spans), for the keeper's fleet-wide
    events: usage counted over the drained nodes alone, and only the nodes
    in ``spans`` looked at for a place in the queue (published's rule: no
    other node has one), each distinct reason judged once.  The same Plan
    where ``states`` is keyed by node name and every partition of its
    nodes is in ``sizes`` (the keeper's read: gpugate.slurm.nodestate.lean);
    tests/test_keeper_lean.py compares the two on generated fleets.  Each
    record is read once; the verdict of a set of partitions is remembered
    until one of them fills (100,000 nodes held look up one)."""
    drained, waiting, memo, get = {}, [], {}, spans.get
    queue = waiting.append
    for name, state in states.items():  # the drained nodes, and the queue
        if "DRAIN" in state.flags:
            drained[name] = state
            continue
        seen = get(name)
        if seen is not None:
            ours = memo.get(seen.reason)
            if ours is None:
                ours = _budgeted(seen.reason, tag, memo)
            if ours:
                queue((seen.since, name, seen.reason, state.reason, state.partitions, share_of(state)))
    uses = usage(drained, tag, share, sizes=sizes)
    room = {p: u.allowance - u.weight for p, u in uses.items()}
    taken = {p: list(u.drained) for p, u in uses.items()}
    shares = {n: share_of(s) for n, s in drained.items() if share_of(s) < 1}
    shares.update((w[1], w[5]) for w in waiting if w[5] < 1)
    waiting.sort()  # by time published, then name: no two alike
    # full: no whole node fits (a node's share of GPUs held alone may still)
    drain, held, spent, full = [], {}, {}, {p for p, n in room.items() if n < 1 - EPS}
    foreign = {"": ""}  # Slurm's reason -> why it holds the node ("": gpugate's, or none)
    verdicts = {}  # partitions -> why a whole node in them is held now ("": room in all); forgotten when one fills
    rooms = (room, spent, uses, taken, share, shares)
    queued = {part for parts in set(map(itemgetter(4), waiting)) for part in parts}  # every partition of the queue
    if queued <= full and _all_held(waiting, held, foreign, verdicts, tag, rooms):
        waiting = ()  # full before any drain (a later run of an event): each node held at once
    for _since, name, reason, text, parts, need in waiting:
        why = foreign.get(text)
        if why is None:
            why = foreign[text] = _foreign(text, tag)
        if not why:
            why = verdicts.get(parts) if need >= 1 else None
            if why is None:
                why = _room(parts, need, *rooms)
                if need >= 1:
                    verdicts[parts] = why
            if not why:
                filled = False
                for part in parts:
                    room[part] -= need
                    taken[part].append(name)
                    if room[part] < 1 - EPS and part not in full:
                        full.add(part)
                        verdicts.clear()
                        filled = True
                if need < 1:  # a spent partition's count grew: its reason is said anew
                    verdicts.clear()
                drain.append((name, reason))
                if filled and queued <= full and _all_held(waiting[len(drain) + len(held):], held, foreign,
                                                           verdicts, tag, rooms):
                    break  # every partition of the queue full: the rest held at once
                continue
        held[name] = why
    return Plan(tuple(drain), held, uses)


def _foreign(text: str, tag: str) -> str:
    """Why Slurm's reason on a node holds it ("": gpugate's, or none)."""
    return "" if reasons.parse(text, tag) is not None else (
        "Slurm holds a reason on the node that is not gpugate's: %r" % text[:80])


def _room(parts, need, room, spent, uses, taken, share, shares) -> str:
    """Why a node of this need in these partitions is held now ("": room in
    all of them); said once per partition and count (a full one stays full)."""
    why = "" if parts else "in no partition: no drain budget to count it in"
    for part in parts:
        if room[part] < need - EPS:
            why = spent.get((part, len(taken[part])))
            if why is None:
                why = spent[part, len(taken[part])] = _spent(uses[part], taken[part], share, shares)
            break
    return why


def _all_held(left, held, foreign, verdicts, tag, rooms) -> bool:
    """plan_published's queue (``left``) once every partition in it is
    full: where all are whole nodes, none can drain any more, so each is
    held as the loop would hold it, the verdict of each distinct (Slurm's
    reason, partitions, need) said once and the nodes held at once
    (100,000 nodes held look up a few); True.  False (nothing done) where
    a node's share of its GPUs (less than a node) is among them: it may
    still fit."""
    if left and min(map(itemgetter(5), left)) < 1:
        return False
    keys = list(map(itemgetter(3, 4, 5), left))
    said = {}
    for text, parts, need in set(keys):
        why = foreign.get(text)
        if why is None:
            why = foreign[text] = _foreign(text, tag)
        if not why:
            why = verdicts.get(parts)
            if why is None:
                why = verdicts[parts] = _room(parts, need, *rooms)
        said[text, parts, need] = why
    held.update(zip(map(itemgetter(1), left), map(said.__getitem__, keys)))
    return True
