"""The budget keeper's read of the fleet (gpugate.keeper, issue 48): sinfo's
text (SINFO_TEXT_ARGV), with a record made only for the nodes that can
decide anything, every other node counted in its partitions' sizes alone.

A node decides for the keeper when its Comment holds a published span
(gpugate.slurm.pending's opening mark: the node may be planned on, or held
as unverified) or when it is drained (it may count in a budget:
gpugate.budget.counted).  Any other node is neither planned on, held nor
counted: the keeper needs only how many nodes each of its partitions holds.
A fleet of 100,000 healthy nodes is then 100,000 dict entries, not 100,000
records; a fleet-wide event (every node published) makes one record per
node, as before.

What it reads is what parse_nodes_text reads, line for line: the plain
shape (every line a record, each node's lines the same but for the
partition, every name and partition a valid one) is read here in one pass;
anything else (a reason on several lines, a node printed with different
states, a bad name, state or time) is read by parse_nodes_text itself,
which says what it says of it (ParseError, and nothing else, for what it
refuses).  tests/test_keeper_lean.py compares the two on generated fleets."""

from collections import Counter
from itertools import repeat
from typing import Dict, Mapping

from ..pending import OPEN

_OPEN = OPEN
from .fields import _NOT_IN_NAMES, _name
from .record import NodeState, _parse_state, _without_stale_reason
from .text import _text_time, parse_nodes_text

__all__ = ["Fleet", "deciding", "of_states", "read_text"]


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


def read_text(text: str) -> Fleet:
    """The Fleet in sinfo's text; ParseError (and nothing else) when
    parse_nodes_text refuses it."""
    with paused_gc():
        try:
            fleet = _plain(text) if isinstance(text, str) else None
        except Exception:  # noqa: BLE001 - not the plain shape: the full reader says what it is
            fleet = None
        return fleet if fleet is not None else of_states(parse_nodes_text(text))


def _plain(text: str):
    """The Fleet when every line is a plain record, else None."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline
    first = {}  # name -> [the line after its partition, its partition, its further partitions...]
    # A line of fewer than three fields (a reason's next line, a blank one)
    # does not unpack: ValueError, and the full reader reads the text.
    for name, part, rest in map(str.split, lines, repeat("|"), repeat(2)):
        seen = first.get(name)
        if seen is None:
            first[name] = [rest, part]
        elif seen[0] == rest:
            seen.append(part)
        else:
            return None  # printed twice with different text: the full reader compares
    del lines
    names = "".join(first)
    if "" in first or not names.isprintable() or _NOT_IN_NAMES.search(names):
        return None  # parse_nodes_text reads such a line as a reason's continuation
    states: Dict[str, NodeState] = {}
    combos = []  # each node's partitions
    combo = combos.append
    words, stamps = {}, {"Unknown": None}  # state text -> (base, flags); time text -> its time
    for name, seen in first.items():
        state_text, stamp, user, tail = seen[0].split("|", 3)
        parsed = words.get(state_text)
        if parsed is None:
            parsed = words[state_text] = _parse_state(state_text, None, "sinfo text (%s)" % name)
        if len(seen) == 2:
            parts = (seen[1],)
        elif len(seen) == 3 and seen[1] < seen[2]:
            parts = (seen[1], seen[2])
        else:
            parts = tuple(sorted(set(seen[1:])))
        combo(parts)
        when = stamps.get(stamp, stamps)
        if when is stamps:
            when = stamps[stamp] = _text_time(stamp, "sinfo text (%s)" % name)
        if _OPEN in tail or "DRAIN" in parsed[1]:
            comment, sep, reason = tail.partition("\x1f")  # _comment_and_reason's, inline
            if not sep:
                comment, reason = "", tail
            elif comment == "(null)":
                comment = ""
            if "DRAIN" in parsed[1] or _OPEN in comment:  # else the mark was in the reason: a node like any other
                if reason == "none":
                    reason = ""
                state = _made(name, parsed[0], parsed[1], reason, when, "" if user == "Unknown" else user, parts,
                              comment)
                states[name] = _without_stale_reason(state) if reason else state
    sizes: Dict[str, int] = {}
    for parts, count in Counter(combos).items():  # a fleet has few distinct ones
        for part in parts:
            if part not in sizes:
                sizes[part] = 0
                _name(part, "sinfo text", "partition name")
            sizes[part] += count
    return Fleet(states, sizes, len(first))


def _made(name, state, flags, reason, reason_time, reason_user, partitions, comment, _new=object.__new__,
          _set=object.__setattr__):
    """NodeState(name, state, ...), a third faster: its __init__ sets each
    field in turn past the frozen __setattr__; here its __dict__ at once
    (the same record: it compares, hashes and prints the same;
    tests/test_keeper_lean.py compares the two)."""
    made = _new(NodeState)
    _set(made, "__dict__", {"name": name, "state": state, "flags": flags, "reason": reason,
                            "reason_time": reason_time, "reason_user": reason_user, "partitions": partitions,
                            "comment": comment})
    return made
