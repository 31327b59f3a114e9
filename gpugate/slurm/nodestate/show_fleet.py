"""The budget keeper's read of the fleet (issue 48): `scontrol show node`'s
text, every node (SCONTROL_TEXT_ARGV), read as gpugate.slurm.nodestate.lean
reads sinfo's: a record made only for the nodes that can decide, every
other node counted in its partitions' sizes alone.

Why not sinfo: ``sinfo --Node`` files each (node, partition) in a list it
searches from the start for every node (``_insert_node_ptr`` in Slurm's
src/sinfo/sinfo.c, every release), so its own time grows with the square
of the fleet: 13.6 s at 8,000 nodes on 25.11, minutes at 30,000, past the
keeper's run at 10,000 (bench/bench_fleet_read.py).  scontrol prints each
node's record as it comes (slurm_sprint_node_table), from the same two
RPCs (the node table, the partitions that fill its Partitions line):
0.07 s at 8,000 nodes.

The form read is the multi-line one: each record is its ``NodeName=``
line, then lines of fields three spaces in (``line_end`` in
src/api/node_info.c), and a blank line.  ``State=`` starts a line,
``Partitions=NAMES `` one, ``Reason=TEXT [USER@EPOCH]`` one (its further
lines ten spaces in), ``Comment=TEXT`` one, and Reason always comes
before Comment.  What is refused (ParseError: the caller reads the fleet
the full way, JSON): any line break that does not begin such a line (a
value holding one), a reason of several lines, a record without exactly
one State line, a Partitions or Reason line after the Comment line, a
reason time not in epoch seconds (the caller sets SLURM_TIME_FORMAT=%s),
a name twice, a name or partition that is not one plain word.  A value
holding a line break followed by three spaces and a field of the same
kind cannot be told from a field by text alone; the checks above refuse
every such field gpugate reads, and a comment cut at its first line
break by such a line still carries its span's proof, which is checked as
ever (only root and SlurmUser can write a Comment or Reason)."""

from collections import Counter
from typing import Dict

from gpugate.errors import ParseError
from gpugate.slurm.nodestate.fields import _NOT_IN_NAMES, _name, _show
from gpugate.slurm.nodestate.lean import Fleet, _made, paused_gc
from gpugate.slurm.nodestate.record import _IN_SERVICE_BASES, _OUT_OF_SERVICE_FLAGS, _parse_state
from gpugate.slurm.nodestate.show_text import _ANY_TAIL, _REASON_TAIL  # one node's reader: the same reason line
from gpugate.slurm.pending import OPEN

__all__ = ["read_show_text"]

_NONE = "No nodes in the system"


def read_show_text(text: str) -> Fleet:
    """The Fleet in `scontrol show node`'s text; ParseError (and nothing
    else) for what it refuses (see the module doc)."""
    if not isinstance(text, str):
        raise ParseError("scontrol show node: expected text, got %s" % type(text).__name__)
    with paused_gc():
        try:
            return _read(text)
        except ParseError:
            raise
        except Exception as exc:  # noqa: BLE001 - a slip here is a refusal, never a wrong fleet
            raise ParseError("scontrol show node: cannot read the text (%s: %s)" % (type(exc).__name__, exc)) from None


def _read(text: str) -> Fleet:
    if not text or text.strip() == _NONE:
        return Fleet({}, {}, 0)
    if not text.startswith("NodeName=") or not text.endswith("\n\n"):
        raise ParseError("scontrol show node: the text does not start with a record and end with a blank line: "
                         "%s" % _show(text[:40]))
    states: Dict[str, object] = {}
    names = []
    seen_name = names.append
    combos = []
    combo = combos.append
    words, tuples = {}, {}  # state text -> (base, flags); Partitions' text -> its names, sorted
    find, starts = text.find, text.startswith
    at, last = 0, len(text) - 2
    while at < last:
        end = find("\n\nNodeName=", at)  # this record's end (a long needle: searched in strides)
        if end < 0:
            end = last
        cut = find(" ", at + 9, end)
        name = text[at + 9:cut]
        seen_name(name)
        s = find("\n   State=", cut, end) + 10
        if s < 10:
            raise ParseError("scontrol show node %s: no State line in its record" % _show(name))
        e = find(" ", s, end)
        state_text = text[s:e]
        parsed = words.get(state_text)
        if parsed is None:
            parsed = words[state_text] = _parse_state(state_text, None, "scontrol show node %s" % name)
        # Partitions is the line after State's (or after NextState's, when a
        # reboot is asked): looked for there only, never further on, where a
        # value's line break could have made one.
        p = find("\n", e, end)
        if starts("\n   NextState=", p):
            p = find("\n", p + 1, end)
        if starts("\n   Partitions=", p):
            p += 15
            parts = text[p:find(" ", p, end)]
        else:
            p, parts = -1, ""
        combo(parts)
        mark = find(OPEN, p if p > 0 else e, end)
        if mark >= 0 or "DRAIN" in parsed[1]:
            split = tuples.get(parts)
            if split is None:
                split = tuples[parts] = tuple(sorted(set(parts.split(",")))) if parts else ()
            state = _record(text, name, parsed, split, e, mark, end)
            if state is not None:
                states[name] = state
        at = end + 2
    unique = set(names)
    if len(unique) != len(names):
        raise ParseError("scontrol show node: a node printed twice")
    names_text = "".join(names)
    if "" in unique or not names_text.isprintable() or _NOT_IN_NAMES.search(names_text):
        for name in names:
            _name(name, "scontrol show node")
    sizes: Dict[str, int] = {}
    for parts, nodes in Counter(combos).items():  # a fleet has few distinct ones
        for part in set(parts.split(",")) if parts else ():
            if part not in sizes:
                sizes[part] = 0
                _name(part, "scontrol show node", "partition name")
            sizes[part] += nodes
    return Fleet(states, sizes, len(names))


# The lines sprint prints after Comment's (src/api/node_info.c, 22.05 to 26.05).
_AFTER_COMMENT = tuple("\n   %s=" % key for key in (
    "Extra", "InstanceId", "InstanceType", "ReservationName", "TLSCertTokenSet", "Topology", "Parameters"))


def _record(text, name, parsed, partitions, e, mark, end):
    """The NodeState of a node that may decide (drained, or an opening mark
    after its State line, at ``mark``), from its record's Reason and
    Comment lines; None when it does not decide after all (the mark was not
    in its comment).  e: the end of its State value; end: its record's end.
    The Comment line is looked for back from the mark (a node's span opens
    its comment); a Reason line is read only where Slurm's reason stands (a
    node out of service: in service, it is a leftover)."""
    find, rfind = text.find, text.rfind
    c = rfind("\n   Comment=", e, mark) if mark >= 0 else -1
    if c < 0:
        c = find("\n   Comment=", e, end)
    base, flags = parsed
    reason, when, user = "", None, ""
    if base not in _IN_SERVICE_BASES or flags & _OUT_OF_SERVICE_FLAGS:
        r = rfind("\n   Reason=", e, c) if c >= 0 else find("\n   Reason=", e, end)
        if r >= 0:
            r += 11
            stop = find("\n", r, end + 1)
            if text.startswith("\n    ", stop):
                raise ParseError("scontrol show node %s: a reason of several lines" % _show(name))
            reason = text[r:stop]
            tail = _REASON_TAIL.search(reason)
            if tail:
                reason, user, when = reason[:tail.start()], tail.group(1), int(tail.group(2))
            elif _ANY_TAIL.search(reason):
                raise ParseError("scontrol show node %s: the reason's time is not in epoch seconds "
                                 "(SLURM_TIME_FORMAT=%%s)" % _show(name))
    comment, ours = "", False
    if c >= 0:
        c += 12
        stop = find("\n", c, end + 1)
        if stop != end and not text.startswith(_AFTER_COMMENT, stop):
            raise ParseError("scontrol show node %s: its comment holds a line break" % _show(name))
        comment = text[c:stop]
        ours = c <= mark < stop or (mark >= 0 and OPEN in comment)
    if not ours and "DRAIN" not in flags:
        return None
    return _made(name, base, flags, reason, when, user, partitions, comment)
