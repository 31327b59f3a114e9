"""The fleet drain budget: how many nodes of each partition gpugate may keep
drained for non-acute classes (drift, probe by default).  Pure: Slurm's node
states in, a decision out.

A wrong pin pushed to every node makes every node "unfit" at once; the
budget caps what that costs.  Acute classes (health, broken) always drain.

Every node decides for itself, and many decide at the same moment, so the
rule is a ranking every node computes the same way from Slurm's view: the
nodes drained for budgeted classes, oldest reason first (then by name), and
the first ``allowance`` of them keep their drain.  A node ranked beyond it
gives its drain back (see gpugate.node.act)."""

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Tuple

from . import reason as reasons

__all__ = ["Use", "allowance", "counted", "usage", "admit", "keep", "active", "fleet_usage"]


@dataclass(frozen=True)
class Use:
    """One partition's budget: its size, how many nodes gpugate may hold
    drained for budgeted classes, and those drained now (rank order)."""

    partition: str
    size: int
    allowance: int
    drained: Tuple[str, ...]

    @property
    def spent(self) -> bool:
        return len(self.drained) >= self.allowance


def active(share: float, classes: Iterable[str], cls: Optional[str]) -> bool:
    """Does the budget apply to a drain of class ``cls``?  A share of 1 (all
    of a partition) switches it off, and with it the controller reads."""
    return share < 1 and cls in tuple(classes)


def allowance(size: int, share: float) -> int:
    """At least one node: a small partition can still drain a drifted node."""
    return max(1, int(math.floor(size * share + 1e-9)))


def counted(state, tag: str, classes: Iterable[str]) -> bool:
    """Drained by gpugate for a budgeted class (the sweep's work reasons keep
    the class the node was drained for, so they count too)."""
    if not state.drain or not state.reason:
        return False
    ours = reasons.parse(state.reason, tag)
    return ours is not None and ours.cls in tuple(classes)


def _rank_key(state):
    # Unknown reason times rank last: such a node never pushes out another.
    return (state.reason_time if state.reason_time is not None else math.inf, state.name)


def usage(states: Mapping[str, object], tag: str, classes: Iterable[str], share: float,
          partitions: Optional[Iterable[str]] = None):
    """partition -> Use, for every partition (or the given ones)."""
    classes = tuple(classes)
    wanted = None if partitions is None else set(partitions)
    members = {}
    for state in states.values():
        for part in state.partitions:
            if wanted is None or part in wanted:
                members.setdefault(part, []).append(state)
    result = {}
    for part, nodes in sorted(members.items()):
        drained = sorted((s for s in nodes if counted(s, tag, classes)), key=_rank_key)
        result[part] = Use(part, len(nodes), allowance(len(nodes), share), tuple(s.name for s in drained))
    return result


def _describe(use: Use, share: float, classes) -> str:
    return "drain budget of partition %s spent: %d of %d nodes drained for %s (%g%% of %d)" % (
        use.partition, len(use.drained), use.allowance, "/".join(classes), share * 100, use.size)


def admit(node: str, states: Mapping[str, object], tag: str, classes: Iterable[str],
          share: float) -> Tuple[bool, str]:
    """Before draining ``node``: (True, "") when every partition it is in has
    room for one more; else (False, why)."""
    classes = tuple(classes)
    me = states.get(node)
    if me is None:
        return True, ""
    for use in usage(states, tag, classes, share, me.partitions).values():
        others = [n for n in use.drained if n != node]
        if len(others) >= use.allowance:
            return False, _describe(use, share, classes)
    return True, ""


def keep(node: str, states: Mapping[str, object], tag: str, classes: Iterable[str],
         share: float) -> Tuple[bool, str]:
    """After draining ``node``: may it keep the drain?  False when, in any of
    its partitions, it ranks beyond the allowance (others drained first)."""
    classes = tuple(classes)
    me = states.get(node)
    if me is None:
        return True, ""
    for use in usage(states, tag, classes, share, me.partitions).values():
        if node in use.drained and use.drained.index(node) >= use.allowance:
            return False, _describe(use, share, classes)
    return True, ""


def fleet_usage(settings, states: Mapping[str, object]):
    """partition -> Use under the site's configuration; None when the budget
    is switched off (max_share 1 or no classes)."""
    cfg = settings.drain_budget
    if not active(float(cfg["max_share"]), cfg["classes"], next(iter(cfg["classes"]), None)):
        return None
    return usage(states, settings.reason_tag, cfg["classes"], float(cfg["max_share"]))
