"""The budget keeper's read of the fleet (issue 48): `scontrol show node`'s
text, every node (SCONTROL_TEXT_ARGV), read as the keeper's Fleet
(gpugate.slurm.nodestate.lean): a record made only for the nodes that can
decide, every other node counted in its partitions' sizes alone.

Why not sinfo: ``sinfo --Node`` files each (node, partition) in a list it
searches from the start for every node (``_insert_node_ptr`` in Slurm's
src/sinfo/sinfo.c, every release), so its own time grows with the square
of the fleet: 13.6 s at 8,000 nodes on 25.11, 72.6 s at 16,000, past the
keeper's run at about 10,000 (bench/bench_fleet_read.py).  scontrol prints
each node's record as it comes (slurm_sprint_node_table), from the same
two RPCs (the node table, the partitions that fill its Partitions line):
0.12 s at 16,000 nodes.

The form read is the multi-line one (src/api/node_info.c): each record is
its ``NodeName=`` line, lines of fields three spaces in, and a blank line.
Where sprint puts what the keeper reads: ``State=`` starts a line, which
ends with ``MCS_label=``; ``Partitions=NAMES `` is the line after it (or
after ``NextState=``); ``CurrentWatts=`` starts the power line, always
printed; after it only 22.05's sensors line or 24.11's empty one, then
``Reason=TEXT [USER@EPOCH]`` (its further lines ten spaces in), then
``Comment=TEXT``, then only Extra, InstanceId, ReservationName, the TLS
certificate's, Topology and Parameters lines.

Values are text others wrote, and a line break in one makes a line of
its own: an admin's (Comment, Reason, Extra, features), and a job's
user's (its MCS label, copied onto the node it runs on with MCSPlugin
mcs/label).  Such a line is never read as a field; the record is refused
(ParseError: the caller reads the fleet the full way, JSON) when it makes
a second State line, a Partitions or power line after the State line
other than where sprint prints them (one before it, in an admin's features,
is never read), or, on a node the keeper reads in full, any line
after the power line that is not the next one sprint may print there
(a second Reason or Comment, a Reason after the Comment, a comment over
several lines, a mark after the comment), or a reason over several lines
where the reason is read (out of service).  Refused too: a
reason time not in epoch seconds (the caller sets SLURM_TIME_FORMAT=%s),
a name twice, a name or partition that is not one plain word, no text at
all.  What text alone cannot tell: a whole record an admin wrote into a
value after a node's power line (a node that is not there, counted in
its partitions); only root and SlurmUser write those values.

How (bench/bench_budget.py): a text whose every record is as sprint
prints it, with no value over two lines, is read in one step, a split
made in C (_at_once), its records then looked at in one plain loop; any
other is read record by record (_by_record: the same match from each
record's State line where it holds, else line by line), so one admin's
comment over two lines costs a second pass, never a wrong read."""

from collections import Counter
from typing import Dict

from gpugate.errors import ParseError
from gpugate.slurm.nodestate.fields import _NOT_IN_NAMES, _name, _show
from gpugate.slurm.nodestate.lean import _FIELDS, Fleet, _made, paused_gc
from gpugate.slurm.nodestate.record import _IN_SERVICE_BASES, _OUT_OF_SERVICE_FLAGS, NodeState, _parse_state
from gpugate.slurm.nodestate.show_text import _ANY_TAIL, _REASON_TAIL  # one node's reader: the same reason line
from gpugate.slurm.pending import OPEN

__all__ = ["read_show_text"]

_NONE = "No nodes in the system"
_SET = object.__setattr__  # past the record's frozen __setattr__, as lean._made


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
    if not text.startswith("NodeName=") and text.strip() == _NONE:  # (strip copies: never a fleet's records)
        return Fleet({}, {}, 0)
    if not text.startswith("NodeName=") or not text.endswith("\n\n"):
        raise ParseError("scontrol show node: the text does not start with a record and end with a blank line: "
                         "%s" % _show(text[:40]))
    states: Dict[str, object] = {}
    words, tuples = {}, {}  # state text -> (base, flags); Partitions' text -> its names, sorted
    pieces = _at_once(text)
    if pieces is None:  # a record not as sprint prints it: each read apart (_by_record)
        names, combos = [], []
        _by_record(text, states, names.append, combos.append, words, tuples)
    else:
        names, combos = pieces[1::7], pieces[3::7]  # (None: no Partitions line)
        _from_pieces(pieces, states, words, tuples)
    unique = set(names)
    if len(unique) != len(names):
        raise ParseError("scontrol show node: a node printed twice")
    names_text = "".join(names)
    if "" in unique or not names_text.isprintable() or _NOT_IN_NAMES.search(names_text):
        for name in names:
            _name(name, "scontrol show node")
    sizes: Dict[str, int] = {}
    for parts, nodes in Counter(combos).items():  # a fleet has few distinct ones
        for part in set(parts.split(",")) if parts else ():  # (None: no Partitions line)
            if part not in sizes:
                sizes[part] = 0
                _name(part, "scontrol show node", "partition name")
            sizes[part] += nodes
    return Fleet(states, sizes, len(names))


def _from_pieces(pieces, states, words, tuples) -> None:
    """The records _at_once read, in one plain loop: the state words and
    partitions of each distinct text read once; a record made for each
    node that decides (drained, or an opening mark after its power line,
    where _at_once's lines hold no "[" but the Reason's, the Comment's and
    those after it)."""
    names, texts = pieces[1::7], pieces[2::7]
    for state_text in set(texts):  # a fleet has few distinct ones
        words[state_text] = _parse_state(state_text, None, "scontrol show node %s" % names[texts.index(state_text)])
    new, fields = object.__new__, _FIELDS.copy
    for name, state_text, parts, reason_line, comment, rest in zip(names, texts, pieces[3::7], pieces[4::7],
                                                                    pieces[5::7], pieces[6::7]):
        base, flags = words[state_text]
        if "DRAIN" in flags or (comment is not None and OPEN in comment) or (
                reason_line is not None and OPEN in reason_line) or OPEN in rest:
            split = tuples.get(parts)
            if split is None:
                split = tuples[parts] = tuple(sorted(set(parts.split(",")))) if parts else ()
            if reason_line is None and not rest:  # _judge's case with nothing to check or read: _made's, inline
                made = fields()
                made["name"], made["state"], made["flags"], made["partitions"] = name, base, flags, split
                made["comment"] = comment or ""
                record = new(NodeState)
                _SET(record, "__dict__", made)
                states[name] = record
                continue
            state = _judge(name, (base, flags), split, reason_line, False, comment,
                           rest.split("\n")[:-1] if rest else ())
            if state is not None:
                states[name] = state


def _by_record(text, states, seen_name, combo, words, tuples) -> None:
    """Each record read apart: as _at_once reads it where it is as sprint
    prints it (the same match, from its State line), else line by line
    (_slowly)."""
    find, fast = text.find, _fast()
    at, last = 0, len(text) - 2
    while at < last:
        cut = find(" ", at + 9)
        name = text[at + 9:cut]
        seen_name(name)
        s = find("\n   State=", cut) + 4
        m = fast(text, s) if s > 3 else None
        if m is not None and find("\n\nNodeName=", cut, s) < 0:  # the record as sprint prints it: one step
            state_text, parts, _, reason_line, comment, rest = m.groups()
            parsed = words.get(state_text) or words.setdefault(
                state_text, _parse_state(state_text, None, "scontrol show node %s" % name))
            combo(parts or "")
            end = m.end() - 1
            if "DRAIN" in parsed[1] or find(OPEN, m.start(3), end) >= 0:
                split = (tuples.get(parts) or tuples.setdefault(parts, tuple(sorted(set(parts.split(","))))) if parts
                         else ())
                state = _judge(name, parsed, split, reason_line, False, comment, rest.split("\n")[:-1] if rest
                               else ())
                if state is not None:
                    states[name] = state
            at = end + 1
            continue
        end = find("\n\nNodeName=", at)  # this record's end (a long needle: searched in strides)
        if end < 0:
            end = last
        at = _slowly(text, name, cut, end, words, tuples, combo, states) + 2


def _slowly(text, name, cut, end, words, tuples, combo, states) -> int:
    """One record that is not as sprint prints it (a value with a line
    break, a reason over several lines), read line by line up to ``end``
    (the next record's blank line): its State, Partitions and power lines
    each found once where sprint prints them, else ParseError."""
    find, starts = text.find, text.startswith
    s = find("\n   State=", cut, end) + 10
    e = find(" ", s, end)
    if s < 10 or e < 0 or find("\n   State=", e, end) >= 0:
        raise ParseError("scontrol show node %s: not one State line in its record" % _show(name))
    state_text = text[s:e]
    parsed = words.get(state_text)
    if parsed is None:
        parsed = words[state_text] = _parse_state(state_text, None, "scontrol show node %s" % name)
    # Partitions: the line after State's (or after NextState's, when a
    # reboot is asked), and no other line of the record.
    p = find("\n", e, end)
    if starts("\n   NextState=", p):
        p = find("\n", p + 1, end)
    if starts("\n   Partitions=", p):
        p += 15
        q = find(" ", p, end)
        parts = text[p:q]
    else:
        q, parts = e, ""
    if find("\n   Partitions=", q, end) >= 0:
        raise ParseError("scontrol show node %s: a Partitions line where sprint prints none" % _show(name))
    combo(parts)
    w = find("\n   CurrentWatts=", q, end)
    if w < 0 or find("\n   CurrentWatts=", w + 17, end) >= 0:
        raise ParseError("scontrol show node %s: not one power line in its record" % _show(name))
    if find(OPEN, w, end) >= 0 or "DRAIN" in parsed[1]:  # a span opens after the power line, or not at all
        split = tuples.get(parts)
        if split is None:
            split = tuples[parts] = tuple(sorted(set(parts.split(",")))) if parts else ()
        state = _judge(name, parsed, split, *_tail(text, w, end))
        if state is not None:
            states[name] = state
    return end


# The lines sprint may print after Comment's (src/api/node_info.c, 22.05 to
# 26.05), each at most once; before Reason's, after the power line, only
# 22.05's sensors line and 24.11's empty one.
_AFTER_COMMENT = ("   Extra=", "   InstanceId=", "   InstanceType=", "   ReservationName=", "   TLSCertTokenSet=",
                  "   Topology=", "   Parameters=")


def _tail(text, w, end):
    """The lines after the power line (at ``w``) up to ``end``, as sprint
    prints them there: (the Reason line, whether further reason lines
    follow it, the Comment line, the lines after).  None for a line not
    printed."""
    nl = text.find("\n", w + 1, end)
    lines = text[nl + 1:end].split("\n") if nl >= 0 else ()
    i, count = 0, len(lines)
    while i < count and (lines[i] == "   " or lines[i].startswith("   ExtSensors")):
        i += 1
    reason_line = comment = None
    several = False
    if i < count and lines[i].startswith("   Reason="):
        reason_line, i = lines[i][10:], i + 1
        while i < count and lines[i].startswith("          "):  # the reason's further lines (strtok_r's)
            several, i = True, i + 1
    if i < count and lines[i].startswith("   Comment="):
        comment, i = lines[i][11:], i + 1
    return reason_line, several, comment, lines[i:]


def _judge(name, parsed, partitions, reason_line, several, comment, rest):
    """The NodeState of a node that may decide (drained, or an opening mark
    after its power line), from what follows that line (_tail's): the lines
    after Comment's must be those sprint may print there (see the module
    doc), else ParseError.  None when it does not decide after all (the
    mark was not in its comment).  A Reason is kept only where Slurm's
    reason stands (a node out of service: in service, it is a leftover,
    read or not, even over several lines)."""
    if rest and (not all(map(str.startswith, rest, [_AFTER_COMMENT] * len(rest)))
                 or len({line[:line.index("=")] for line in rest}) != len(rest) or any(OPEN in line for line in rest)):
        raise ParseError("scontrol show node %s: a line after its power line that sprint does not print there "
                         "(a value with a line break: %s)" % (_show(name), _show(rest[0][:40])))
    base, flags = parsed
    reason, when, user = "", None, ""
    if reason_line is not None and (base not in _IN_SERVICE_BASES or flags & _OUT_OF_SERVICE_FLAGS):
        if several:  # printed without its empty lines: not the reason as it stands
            raise ParseError("scontrol show node %s: a reason of several lines" % _show(name))
        tail = _REASON_TAIL.search(reason_line)
        if tail:
            reason, user, when = reason_line[:tail.start()], tail.group(1), int(tail.group(2))
        elif _ANY_TAIL.search(reason_line):
            raise ParseError("scontrol show node %s: the reason's time is not in epoch seconds "
                             "(SLURM_TIME_FORMAT=%%s)" % _show(name))
        else:
            reason = reason_line
    if "DRAIN" not in flags and (comment is None or OPEN not in comment):
        return None
    return _made(name, base, flags, reason, when, user, partitions, comment or "")


_PATTERNS = []


def _patterns():
    """(the match of a record as sprint prints it, from its State line:
    _by_record's; the split of a whole text of such records: _at_once's).
    The split's repeats are possessive where Python has them (3.11+): a
    line taken is never given back, which spares the engine its
    bookkeeping (a quarter of the split's time).  A match either way is
    the same match (a greedy repeat tries the possessive's path first);
    where a possessive one finds none, the text is read record by record."""
    if not _PATTERNS:
        import re
        import sys

        other = r"   (?!State=|Partitions=|CurrentWatts=|NextState=|Reason=|Comment=)[^\n]*~\n"
        after = "|".join(a.strip(" =") for a in _AFTER_COMMENT)
        state = (r"State=([^ \n]+~) [^\n]*~\n(?:   NextState=[^\n]*~\n)?~(?:   Partitions=([^ \n]*~) \n)?~"
                 r"(?:" + other + r")*~")
        tail = (r"(?:   (?:ExtSensors[^\n\[]*~)?~\n)*~(?:   Reason=([^\n]*~)\n)?~(?:   Comment=([^\n]*~)\n)?~"
                r"((?:   (?:" + after + r")=[^\n]*~\n)*~)\n(?=NodeName=|\Z)")
        _PATTERNS.append(re.compile((state + r"(?=(   CurrentWatts=))   CurrentWatts=[^\n]*\n" + tail).replace(
            "~", "")).match)
        _PATTERNS.append(re.compile((r"NodeName=([^ \n]+~) [^\n]*~\n(?:   (?!State=)[^\n]*~\n)*~   " + state +
                                     r"   CurrentWatts=[^\n\[]*~\n" + tail).replace(
            "~", "+" if sys.version_info >= (3, 11) else "")).split)
    return _PATTERNS


def _fast():
    """The match, from its State line to its blank line, of a record as
    sprint prints it with no value over two lines: (State, Partitions or
    None, its power line's start, the Reason line, the Comment line, the
    lines after it).  Its State, Partitions and power lines are the
    record's only ones (any other line holding one fails the match: the
    record is then read line by line), and its last line ends before the
    next record or the text's end."""
    return _patterns()[0]


def _at_once(text):
    """The split's pieces: before the first record "", then each record's
    name, State, Partitions or None, the Reason line, the Comment line,
    the lines after it and "", read in one step (made in C) where every
    record is as sprint prints it (as _fast's, with
    no "[" in its power or sensors lines and no State line before its
    own): the records then follow each other with nothing between them.
    Else None."""
    pieces = _patterns()[1](text)
    if any(pieces[::7]):  # text no record's match took: a record not as sprint prints it
        return None
    return pieces
