"""The budget keeper's read of the fleet (gpugate.keeper.run, issue 48): sinfo's
text (SINFO_TEXT_ARGV), with a record made only for the nodes that can
decide anything, every other node counted in its partitions' sizes alone.

A node decides for the keeper when its Comment holds a published span
(gpugate.slurm.pending's opening mark: the node may be planned on, or held
as unverified) or when it is drained (it may count in a budget:
gpugate.budget.rules.counted).  Any other node is neither planned on, held nor
counted: the keeper needs only how many nodes each of its partitions holds.
A fleet of 100,000 healthy nodes is then 100,000 dict entries, not 100,000
records; a fleet-wide event (every node published) makes one record per
node, as before.

What it reads is what parse_nodes_text reads, line for line: the plain
shape (every line a record, each node's lines the same but for the
partition, every name and partition a valid one) is read here in one pass
over the lines, a chunk at a time (a node's lines grouped as sinfo --Node
prints them, together; merged by name when apart);
anything else (a reason on several lines, a node printed with different
states, a bad name, state or time) is read by parse_nodes_text itself,
which says what it says of it (ParseError, and nothing else, for what it
refuses).  tests/test_keeper_lean.py compares the two on generated fleets."""

from collections import Counter
from itertools import repeat
from typing import Dict, Mapping

from gpugate.slurm.pending import OPEN

_OPEN = OPEN
from gpugate.slurm.nodestate.fields import _NOT_IN_NAMES, _name
from gpugate.slurm.nodestate.record import NodeState, _parse_state, _without_stale_reason
from gpugate.slurm.nodestate.text import _text_time, parse_nodes_text

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
    fleet = _records(_runs(text))
    if fleet is _APART:  # a node's lines apart (not sinfo's order): merged by name, compared as text
        fleet = _records(_merged(text))
    return fleet


_APART = object()


def _records(groups):
    """The Fleet of [name, the line after its partition, its partitions...]
    each node's, made as they come (each line's text let go once read);
    _APART when a name comes twice, None when a name is not a plain one."""
    states: Dict[str, NodeState] = {}
    names = []  # a name twice is found once all are read (one set made in C, not a lookup a node)
    seen_name = names.append
    combos = []  # each node's partitions
    combo = combos.append
    words, stamps = {}, {"Unknown": None}  # state text -> (base, flags); time text -> its time
    shared = {}.setdefault
    for seen in groups:
        name = seen[0]
        seen_name(name)
        state_text, stamp, user, tail = seen[1].split("|", 3)
        parsed = words.get(state_text)
        if parsed is None:
            parsed = words[state_text] = _parse_state(state_text, None, "sinfo text (%s)" % name)
        if len(seen) == 3:
            parts = (seen[2],)
        elif len(seen) == 4 and seen[2] < seen[3]:
            parts = (seen[2], seen[3])
        else:
            parts = tuple(sorted(set(seen[2:])))
        parts = shared(parts, parts)  # one tuple for the nodes of the same partitions
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
    unique = set(names)
    if len(unique) != len(names):
        return _APART
    names_text = "".join(names)
    if "" in unique or not names_text.isprintable() or _NOT_IN_NAMES.search(names_text):
        return None  # parse_nodes_text reads such a line as a reason's continuation
    sizes: Dict[str, int] = {}
    for parts, count in Counter(combos).items():  # a fleet has few distinct ones
        for part in parts:
            if part not in sizes:
                sizes[part] = 0
                _name(part, "sinfo text", "partition name")
            sizes[part] += count
    return Fleet(states, sizes, len(names))


_CHUNK = 1 << 20  # characters of text split into lines at a time: the lines are grouped while in cache


def _lines(text: str):
    """Each chunk's lines: the text's lines (the final newline ends the last
    one), split a chunk at a time: no list of every line is held."""
    if not text:
        return
    pos, stop = 0, len(text) - 1 if text.endswith("\n") else len(text)
    while pos >= 0:
        cut = text.find("\n", pos + _CHUNK, stop)
        yield text[pos:cut if cut >= 0 else stop].split("\n")
        pos = cut + 1 if cut >= 0 else -1


def _runs(text: str):
    """[name, the line after its partition, its partitions...] for each run
    of adjacent lines of one node (sinfo --Node prints a node's lines
    together), as each run ends.  ValueError when a line is not a record
    (fewer than three fields: a reason's next line, a blank one; the full
    reader reads the text) or a node's adjacent lines differ beyond the
    partition (the full reader compares)."""
    group = None
    cur = cur_rest = None
    for lines in _lines(text):
        for name, part, rest in map(str.split, lines, repeat("|"), repeat(2)):
            if name == cur:
                if rest != cur_rest:
                    raise ValueError("node %r printed twice with different text" % name)
                group.append(part)
                continue
            if group is not None:
                yield group
            group = [name, rest, part]
            cur, cur_rest = name, rest
    if group is not None:
        yield group


def _merged(text: str):
    """_runs' groups, a node's lines merged by name wherever they are."""
    first = {}
    for lines in _lines(text):
        for name, part, rest in map(str.split, lines, repeat("|"), repeat(2)):
            seen = first.get(name)
            if seen is None:
                first[name] = [name, rest, part]
            elif seen[1] == rest:
                seen.append(part)
            else:
                raise ValueError("node %r printed twice with different text" % name)
    return first.values()


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
