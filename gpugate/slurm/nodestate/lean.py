"""The budget keeper's view of the fleet (issue 48): a Fleet holds a
record only for the nodes that can decide anything, every other node
counted in its partitions' sizes alone.

A node decides for the keeper when its Comment holds a published span
(gpugate.slurm.pending's opening mark: the node may be planned on, or held
as unverified) or when it is drained (it may count in a budget:
gpugate.budget.rules.counted).  Any other node is neither planned on, held nor
counted: the keeper needs only how many nodes each of its partitions holds.
A fleet of 100,000 healthy nodes is then 100,000 names counted, not
100,000 records; a fleet-wide event (every node published) makes one
record per node.

The keeper's own read, `scontrol show node`'s text, is
gpugate.slurm.nodestate.show_fleet; of_states makes a Fleet of any
backend's full read.  Here too: the collector paused while a fleet is
read or decided on, and a record made at once (_made)."""

from typing import Dict, Mapping

from gpugate.slurm.nodestate.record import NodeState
from gpugate.slurm.pending import OPEN

__all__ = ["Fleet", "deciding", "of_states"]


class Fleet:
    """states: name -> NodeState of the nodes that decide (see the module
    doc); sizes: partition -> how many nodes it holds, every node counted;
    nodes: how many nodes the fleet holds."""

    __slots__ = ("states", "sizes", "nodes")

    def __init__(self, states: Dict[str, NodeState], sizes: Dict[str, int], nodes: int):
        self.states, self.sizes, self.nodes = states, sizes, nodes


def deciding(state: NodeState) -> bool:
    return "DRAIN" in state.flags or (bool(state.comment) and OPEN in state.comment)


def of_states(states: Mapping[str, NodeState]) -> Fleet:
    """The Fleet of a full read (any backend's nodes())."""
    sizes: Dict[str, int] = {}
    kept = {}
    for name, state in states.items():
        for part in state.partitions:
            sizes[part] = sizes.get(part, 0) + 1
        if deciding(state):
            kept[name] = state
    return Fleet(kept, sizes, len(states))


class paused_gc:
    """The cyclic garbage collector paused while a fleet is read or decided
    on: 100,000 records are made and none is garbage, yet Python's
    collector walks all that is alive, time and again, as they are made
    (a third of the keeper's run).  Restored as it was, even on error."""

    def __enter__(self):
        import gc

        self.was = gc.isenabled()
        gc.disable()
        return self

    def __exit__(self, *exc):
        if self.was:
            import gc

            gc.enable()
        return False


# A record's fields as NodeState's own __init__ leaves them: a dict whose keys are shared
# by every record (a key-sharing table: 136 bytes where a dict written out is 296).
_FIELDS = NodeState("", "", frozenset(), "", None, "", ()).__dict__


def _made(name, state, flags, reason, reason_time, reason_user, partitions, comment, _new=object.__new__,
          _set=object.__setattr__, _fields=_FIELDS.copy):
    """NodeState(name, state, ...), faster: its __init__ sets each field in
    turn past the frozen __setattr__; here a copy of a record's fields is
    filled and set as its __dict__ at once (the same record: it compares,
    hashes and prints the same; tests/test_keeper_lean.py compares the two)."""
    fields = _fields()
    fields["name"] = name
    fields["state"] = state
    fields["flags"] = flags
    fields["reason"] = reason
    fields["reason_time"] = reason_time
    fields["reason_user"] = reason_user
    fields["partitions"] = partitions
    fields["comment"] = comment
    made = _new(NodeState)
    _set(made, "__dict__", fields)
    return made
