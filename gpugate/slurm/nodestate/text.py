"""sinfo's text output (SINFO_TEXT_ARGV, every release): the fallback reader."""

import re
from datetime import datetime
from typing import Dict, List, Optional, Tuple

from gpugate.errors import ParseError

from .fields import _name, _show
from ...record import replace
from .record import NodeState, _guarded, _merge, _parse_state

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
    records: List[NodeState] = []
    raw_reasons: List[str] = []
    for lineno, line in enumerate(lines, 1):
        try:
            record, raw_reason = _text_record(line, f"line {lineno}")
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
    done = [replace(r, reason=_text_reason(raw)) for r, raw in zip(records, raw_reasons)]
    return _merge(done)


def _text_record(line: str, where: str) -> Tuple[NodeState, str]:
    """Parse one record line. A line without six fields starting with a node
    and a partition name is _NotARecord; a record with a bad state or time is
    a ParseError (failing beats silently dropping a node)."""
    fields = line.split("|", len(_TEXT_FIELDS) - 1)
    if len(fields) != len(_TEXT_FIELDS):
        raise _NotARecord(f"{len(fields)} fields instead of {len(_TEXT_FIELDS)}")
    name, part, state_text, stamp, user, reason = fields
    try:
        name = _name(name, where)
        part = _name(part, where, "partition name")
    except ParseError as exc:
        raise _NotARecord(str(exc)) from None
    where = f"sinfo text: {where} ({name})"
    state, flags = _parse_state(state_text, None, where)
    record = NodeState(
        name=name,
        state=state,
        flags=flags,
        reason="",
        reason_time=_text_time(stamp, where),
        reason_user="" if user == "Unknown" else user,
        partitions=(part,),
    )
    return record, reason


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
