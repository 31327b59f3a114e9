"""The pools a held node counts in, remembered by the keeper (issue 45, item 4).

On Kubernetes a node's pool is a label (``[kubernetes] pool_label``), and
anyone who may patch Nodes changes labels.  Before, a held node that lost
its label left its pool's count: (size 6, allowance 1, gpu01 drained)
became (5, 1, none), and the next keeper run drained gpu02, past the
budget.  The keeper now remembers, on its Lease beside its other memory
(gpugate.budget.memory), every pool each node held for a budgeted finding
(gpugate.budget.rules.counted) was counted in, and counts it in all of them, and
in any it is labelled into since, until it is returned.  A node that left
the keeper's read (its node_selector label removed) is read on its own and
still counted while held; one deleted is forgotten.

Slurm's partitions are slurm.conf's, not a tenant's to change: the keeper
keeps no pools there (None), and nothing here runs.  Pure."""

from typing import Dict, Mapping, Optional, Tuple

from gpugate.budget.rules import counted
from gpugate.core.record import replace

Pools = Dict[str, Tuple[str, ...]]  # node -> every pool it was counted in while held


def absent(fleet, pools: Optional[Mapping[str, Tuple[str, ...]]]):
    """The remembered nodes the read holds no record of: returned (in
    service now), or out of the read (deleted, or no longer selected).
    Each is read on its own (Fleet keeps only the nodes that decide)."""
    return sorted(n for n in pools or () if n not in fleet.states)


def count_held(fleet, pools: Optional[Mapping[str, Tuple[str, ...]]], tag: str, alone: Mapping[str, object] = None):
    """``fleet`` (gpugate.slurm.nodestate.lean.Fleet) with every remembered
    node that is still counted in the budget made a member of each pool it
    was counted in (its current labels kept too), the pools' sizes grown to
    match.  alone: name -> NodeState (or None: gone) of the absent() nodes,
    each read on its own; one held there is added to the fleet."""
    if not pools:
        return fleet
    from gpugate.slurm.nodestate.lean import Fleet

    states, sizes, nodes = dict(fleet.states), dict(fleet.sizes), fleet.nodes
    for name, was in pools.items():
        state, listed = states.get(name), name in states
        if state is None:
            state = (alone or {}).get(name)
        if state is None or not counted(state, tag):
            continue  # returned, deleted, or held for something the budget does not count: forgotten
        now = set(state.partitions)
        grown = now | set(was)
        for part in (grown - now) if listed else grown:  # a node out of the read counts in no size yet
            sizes[part] = sizes.get(part, 0) + 1
        nodes += 0 if listed else 1
        states[name] = replace(state, partitions=tuple(sorted(grown))) if grown != now else state
    return Fleet(states, sizes, nodes)


def remember(states: Mapping[str, object], tag: str, returned=()) -> Pools:
    """The pools to remember after a run: every node the budget counts
    (its pools as count_held() grew them), but those ``returned`` (given
    back by this run)."""
    return {n: tuple(s.partitions) for n, s in states.items()
            if n not in returned and s.partitions and counted(s, tag)}


def encode(pools: Mapping[str, Tuple[str, ...]]) -> Dict[str, list]:
    """As stored: pool -> its remembered nodes (a pool's name once, not once a node)."""
    out: Dict[str, list] = {}
    for name, parts in sorted(pools.items()):
        for part in parts:
            out.setdefault(part, []).append(name)
    return out


def decode(data) -> Pools:
    """encode()'s inverse; {} for anything not of its shape (nothing remembered: as before)."""
    if not isinstance(data, dict):
        return {}
    out: Dict[str, set] = {}
    for part, names in data.items():
        if isinstance(part, str) and part and isinstance(names, list):
            for name in names:
                if isinstance(name, str) and name:
                    out.setdefault(name, set()).add(part)
    return {n: tuple(sorted(p)) for n, p in out.items()}


__all__ = ["Pools", "absent", "count_held", "remember", "encode", "decode"]
