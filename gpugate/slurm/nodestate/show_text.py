"""One node as ``slurm_sprint_node_table`` prints it (what `scontrol show
node NAME` prints, every release): the one-RPC read's answer
(gpugate.slurm.libslurm).

The multi-line form puts each group of fields on a line of its own, three
spaces in (``line_end`` in Slurm's src/api/node_info.c): ``State=`` starts
one, ``Reason=TEXT [USER@TIME]`` one, ``Comment=TEXT`` one.  A value with a
line break in it would be read as two lines, so the same record's one-line
form, which ends fields with a space and the record with its only line
break, must hold no other: any line break in a value is refused, never
guessed at.  So is a reason of several lines (continuation lines, ten
spaces in) and a reason time that is not epoch seconds (the caller sets
SLURM_TIME_FORMAT=%s).  The caller reads such a node the older way.

A reason reads as Slurm prints it (strtok_r on line breaks): line breaks
at its ends are not shown, and one made of line breaks alone prints as
an empty line, as 24.11 prints one after its power line, so it reads as
none.  gpugate's own reasons hold no line break.

No Partitions line: slurmctld does not send a node's partitions (scontrol
and sinfo fill them from a partition read), so ``partitions`` is empty
unless the text has one."""

import re
from typing import Dict

from gpugate.errors import ParseError

from gpugate.slurm.nodestate.fields import _name, _show
from gpugate.slurm.nodestate.record import NodeState, _guarded, _parse_state

_FIELD_LINE = re.compile(r"   [A-Z][A-Za-z0-9_]*=")
# What sprint appends to the reason's first line when the reason has a time.
_REASON_TAIL = re.compile(r" \[([^\s@\[\]]*)@(\d{1,12})\]\Z")
_ANY_TAIL = re.compile(r" \[[^\[\]\n]*@[^\[\]\n]*\]\Z")
_READ = ("State", "Reason", "Comment", "Partitions")


def parse_show_node(text: str, oneline: str, name: str) -> NodeState:
    """The node ``name`` from sprint's multi-line ``text`` and one-line
    ``oneline`` forms of one record; ParseError for anything else."""
    if not isinstance(oneline, str):
        raise ParseError("show node: the one-line form is not text")
    found = _guarded(lambda t: _parse(t, oneline, name), text, "show node")
    return found[name]


def _parse(text: str, oneline: str, name: str) -> Dict[str, NodeState]:
    head = "NodeName=%s " % _name(name, "show node")
    if not oneline.startswith(head) or not oneline.endswith("\n") or "\n" in oneline[:-1]:
        raise ParseError("show node %s: a value holds a line break (or the record is not %s's)" % (name, name))
    lines = text.rstrip("\n").split("\n")
    if not lines[0].startswith(head):
        raise ParseError("show node %s: the record starts %s" % (name, _show(lines[0][:40])))
    fields: Dict[str, str] = {}
    for line in lines[1:]:
        if line == "   ":
            continue  # a line_end with nothing after it (24.11, after the power line)
        m = _FIELD_LINE.match(line)
        if not m:
            raise ParseError("show node %s: %s is no line of fields (a reason of several lines?)"
                             % (name, _show(line[:40])))
        key = m.group(0)[3:-1]
        if key in _READ:
            if key in fields:
                raise ParseError("show node %s: %s twice" % (name, key))
            fields[key] = line[m.end():]
    if "State" not in fields:
        raise ParseError("show node %s: no State" % name)
    state, flags = _parse_state(fields["State"].split(" ", 1)[0], None, "show node %s" % name)
    reason, when, user = fields.get("Reason", ""), None, ""
    tail = _REASON_TAIL.search(reason)
    if tail:
        reason, user, when = reason[:tail.start()], tail.group(1), int(tail.group(2))
    elif _ANY_TAIL.search(reason):
        raise ParseError("show node %s: the reason's time is not in epoch seconds (SLURM_TIME_FORMAT=%%s)" % name)
    parts = tuple(sorted({p for p in fields.get("Partitions", "").strip().split(",") if p}))
    return {name: NodeState(name, state, flags, reason, when, user, parts, fields.get("Comment", ""))}
