"""sinfo's text output (SINFO_TEXT_ARGV, every release): the fallback reader."""

import re
from datetime import datetime
from typing import Dict, List, Optional, Tuple

from gpugate.errors import ParseError

from gpugate.slurm.nodestate.fields import _name, _show
from gpugate.slurm.nodestate.record import NodeState, _guarded, _parse_state

_TEXT_FIELDS = ("node", "partition", "state", "timestamp", "user", "reason")


def parse_nodes_text(text: str) -> Dict[str, NodeState]:
    """Nodes from `sinfo` run with SINFO_TEXT_ARGV and SINFO_TEXT_ENV.

    Each line is ``node|partition|statecomplete|timestamp|user|reason``. The
    reason is everything after the fifth "|". Slurm prints a multi-line reason
    as is, so a line that is not a record continues the previous reason (a
    continuation line that happens to look like a record cannot be told apart).
    sinfo's placeholders map to empty values: reason "none", user and
    timestamp "Unknown".
    """
    return _guarded(_parse_text, text, "sinfo text")


class _NotARecord(Exception):
    """A text line that does not start a node record."""


def _parse_text(text: str) -> Dict[str, NodeState]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the final newline
    records: List[tuple] = []
    raw_reasons: List[str] = []
    for lineno, line in enumerate(lines, 1):
        try:
            record, raw_reason = _text_record(line, lineno)
        except _NotARecord as exc:
            if records:
                raw_reasons[-1] += "\n" + line  # multi-line reason
                continue
            if not line.strip():
                continue  # blank lines before the first record
            raise ParseError(f"sinfo text: line {lineno}: {exc}; expected "
                             f"{'|'.join(_TEXT_FIELDS)} (see SINFO_TEXT_ARGV)") from None
        records.append(record)
        raw_reasons.append(raw_reason)
    # One record per node (sinfo prints a line per partition), each made
    # once: the budget keeper reads 100,000 nodes of this.
    merged: Dict[str, list] = {}
    for (name, state, flags, when, user, parts), raw in zip(records, raw_reasons):
        comment, reason = _comment_and_reason(raw)
        key = (state, flags, reason, when, user, comment)
        seen = merged.get(name)
        if seen is None:
            merged[name] = [key, set(parts)]
        elif seen[0] != key:
            raise ParseError(f"node {name} is reported twice with different states or reasons")
        else:
            seen[1].update(parts)
    return {name: NodeState(name, k[0], k[1], k[2], k[3], k[4], tuple(sorted(parts)), k[5])
            for name, (k, parts) in merged.items()}


def _text_record(line: str, lineno: int) -> Tuple[tuple, str]:
    """Parse one record line. A line without six fields starting with a node
    and a partition name is _NotARecord; a record with a bad state or time is
    a ParseError (failing beats silently dropping a node)."""
    fields = line.split("|", len(_TEXT_FIELDS) - 1)
    if len(fields) != len(_TEXT_FIELDS):
        raise _NotARecord(f"{len(fields)} fields instead of {len(_TEXT_FIELDS)}")
    name, part, state_text, stamp, user, reason = fields
    try:
        name = _name(name, "line %d" % lineno)
        if part not in _PARTITIONS_SEEN:  # a fleet has few: each is checked once
            part = _name(part, "line %d" % lineno, "partition name")
            if len(_PARTITIONS_SEEN) < 4096:
                _PARTITIONS_SEEN.add(part)
    except ParseError as exc:
        raise _NotARecord(str(exc)) from None
    where = _Where(lineno, name)
    state, flags = _parse_state(state_text, None, where)
    # NodeState's fields but the reason and comment, which may go on over
    # the next lines (_parse_text makes the record).
    if stamp == "Unknown":
        when = None
    else:
        when = _text_time(stamp, where)
    record = (name, state, flags, when, "" if user == "Unknown" else user, (part,))
    return record, reason


_PARTITIONS_SEEN: set = set()


class _Where:
    """Where a line is, for an error message; formatted only when one is
    raised (a line of 200,000 must not pay for it)."""

    __slots__ = ("lineno", "name")

    def __init__(self, lineno: int, name: str):
        self.lineno, self.name = lineno, name

    def __str__(self):
        return "sinfo text: line %d (%s)" % (self.lineno, self.name)

    def __format__(self, spec):
        return format(str(self), spec)


def _comment_and_reason(raw: str) -> Tuple[str, str]:
    """The last field is COMMENT\x1fREASON (SINFO_TEXT_FORMAT); without the
    separator (an older format, or a comment spanning lines) all of it is the
    reason and the comment reads as none."""
    comment, sep, reason = raw.partition("\x1f")
    if not sep:
        comment, reason = "", raw
    if comment == "(null)":  # sinfo's placeholder for no comment
        comment = ""
    return comment, _text_reason(reason)


def _text_reason(raw: str) -> str:
    return "" if raw == "none" else raw  # sinfo prints "none" for no reason


_ISO_LOCAL = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\Z")


def _text_time(stamp: str, where: str) -> Optional[int]:
    if stamp in ("", "Unknown", "None", "N/A"):
        return None
    if re.fullmatch(r"[0-9]{1,19}", stamp):
        return int(stamp) or None
    if _ISO_LOCAL.match(stamp):
        # SLURM_TIME_FORMAT was not set: sinfo printed local time.
        try:
            return int(datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S").timestamp())
        except (ValueError, OverflowError, OSError):
            pass
    raise ParseError(f"{where}: bad timestamp {_show(stamp)} (set SLURM_TIME_FORMAT=%s)")
