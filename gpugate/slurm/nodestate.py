"""Slurm node state, parsed from what sinfo/scontrol print (no subprocess here).

Two readers, each returning ``{node_name: NodeState}``:

* :func:`parse_nodes_json` reads every JSON shape Slurm 22.05 .. 26.05 prints
  for nodes:

  - 22.05 ``sinfo --json`` (openapi/v0.0.38, recorded on Debian 22.05.8):
    top key ``nodes``; ``state`` is the lower-case base (``"idle"``),
    ``state_flags`` a list (``["DRAIN"]``), ``reason_changed_at`` an int,
    ``reason_set_by_user`` a name or null, ``partitions`` a list.
  - 23.02 ``scontrol --json show node`` (data_parser/v0.0.39): same keys, but
    ``state`` is a list holding the base and the flags (``["IDLE", "DRAIN"]``).
  - 23.11 and later (data_parser/v0.0.40 ..): as 23.02, with times wrapped as
    ``{"set": true, "infinite": false, "number": 1700000000}``.
  - 23.02+ ``sinfo --json``: top key ``sinfo``, one entry per (partition,
    group of nodes) with ``nodes.nodes`` (names), ``node.state`` (list),
    ``reason.description/time/user`` and ``partition.name``.

* :func:`parse_nodes_text` reads the output of ``sinfo`` run with
  :data:`SINFO_TEXT_ARGV` and :data:`SINFO_TEXT_ENV` (works on every release).

Both raise :class:`gpugate.errors.ParseError`, and nothing else, for any input.

Which command to run (the runner lives elsewhere):

* 22.05: ``sinfo`` + :data:`SINFO_JSON_ARGV`. It always dumps every node, one
  entry per node, whatever other options are given; 22.05 scontrol has no
  ``--json``.
* 23.02+: ``scontrol`` + :data:`SCONTROL_JSON_ARGV` (top key ``nodes``, one
  entry per node). Prefer it to ``sinfo --json``, whose entries may group
  several nodes: sinfo fills a group's reason from its first node only
  (``_update_sinfo`` in src/sinfo/sinfo.c), so this parser refuses a group of
  several nodes that carries a reason.
* Any release, as a fallback: the text format below.
"""

import json
import re
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Callable, Dict, FrozenSet, Iterable, List, Optional, Tuple

from gpugate.errors import ParseError

__all__ = [
    "NodeState",
    "parse_nodes_json",
    "parse_nodes_text",
    "SINFO_JSON_ARGV",
    "SCONTROL_JSON_ARGV",
    "SINFO_TEXT_FORMAT",
    "SINFO_TEXT_ARGV",
    "SINFO_TEXT_ENV",
]

# 22.05: `sinfo --json` dumps the slurmrestd v0.0.38 node list and ignores all
# other options (src/sinfo/sinfo.c exits through dump_data()).
SINFO_JSON_ARGV: List[str] = ["--json"]

# 23.02+: one entry per node. --all shows nodes whose partitions are hidden.
SCONTROL_JSON_ARGV: List[str] = ["--all", "--json", "show", "node"]

# Text fallback. --Format fields are "Name:width suffix"; width 0 prints the
# whole value (no 20-column cut), the suffix "|" separates fields. StateComplete
# prints base+flags ("idle+drain+not_responding"), which %T ("drained*") cannot:
# %T hides DRAIN behind REBOOT/MAINT and does not say whether DRAIN sits on
# IDLE or DOWN. The reason goes last so it may contain "|". -N prints one line
# per (node, partition); --all includes hidden partitions. Nodes that belong to
# no partition are not printed by sinfo at all.
SINFO_TEXT_FORMAT = "NodeList:0|,PartitionName:0|,StateComplete:0|,TimeStamp:0|,User:0|,Reason:0"
SINFO_TEXT_ARGV: List[str] = ["--all", "--noheader", "--Node", "--Format=" + SINFO_TEXT_FORMAT]
# Timestamps as epoch seconds instead of local ISO time. Also run without
# SINFO_* and SLURM_CLUSTERS in the environment: they filter or reshape output.
SINFO_TEXT_ENV: Dict[str, str] = {"SLURM_TIME_FORMAT": "%s"}

_TEXT_FIELDS = ("node", "partition", "state", "timestamp", "user", "reason")


# --------------------------------------------------------------------------
# The record
# --------------------------------------------------------------------------

# Base states (NODE_STATE_BASE values); INVALID is what Slurm prints for NO_VAL.
BASE_STATES = frozenset({"UNKNOWN", "DOWN", "IDLE", "ALLOCATED", "ERROR", "MIXED", "FUTURE", "INVALID"})

# Flags Slurm 22.05 .. 25.x print (slurm_protocol_defs.c node_state_flags[],
# data_parser NODE_STATES; BLOCKED in later sinfo). Unknown upper-case words next
# to a base state are kept as flags too, so a newer flag does not break us.
KNOWN_FLAGS = frozenset({
    "BLOCKED", "CLOUD", "COMPLETING", "DRAIN", "DYNAMIC_FUTURE", "DYNAMIC_NORM",
    "FAIL", "INVALID_REG", "MAINTENANCE", "NOT_RESPONDING",
    "PERFCTRS", "PLANNED", "POWER_DOWN", "POWER_DRAIN", "POWER_UP",
    "POWERED_DOWN", "POWERING_DOWN", "POWERING_UP", "REBOOT_CANCELED",
    "REBOOT_ISSUED", "REBOOT_REQUESTED", "RESERVED", "RESUME", "UNDRAIN",
})

# Flags that keep Slurm from starting new work on a node. Informational flags
# (COMPLETING, RESERVED, PLANNED, CLOUD, DYNAMIC_NORM, ...) do not.
_OUT_OF_SERVICE_FLAGS = frozenset({
    "DRAIN", "NOT_RESPONDING", "FAIL", "MAINTENANCE", "REBOOT_REQUESTED",
    "REBOOT_ISSUED", "POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN",
    "POWERING_UP", "POWER_UP", "POWER_DRAIN", "INVALID_REG", "DYNAMIC_FUTURE",
})

_IN_SERVICE_BASES = frozenset({"IDLE", "ALLOCATED", "MIXED"})


@dataclass(frozen=True)
class NodeState:
    """One node as Slurm reports it."""

    name: str
    state: str                  # base state, upper case: IDLE, MIXED, DOWN, ...
    flags: FrozenSet[str]       # upper case: DRAIN, NOT_RESPONDING, ...
    reason: str                 # "" when none
    reason_time: Optional[int]  # epoch seconds the reason was set; None unknown
    reason_user: str            # "" when unknown
    partitions: Tuple[str, ...]  # sorted, no duplicates

    @property
    def drain(self) -> bool:
        return "DRAIN" in self.flags

    @property
    def draining(self) -> bool:
        """Drain requested but jobs still run (sinfo's "draining")."""
        busy = self.state in ("ALLOCATED", "MIXED") or "COMPLETING" in self.flags
        return self.drain and busy

    @property
    def drained(self) -> bool:
        """Drain requested and no job left (sinfo's "drained", any other base)."""
        return self.drain and not self.draining

    @property
    def responding(self) -> bool:
        return "NOT_RESPONDING" not in self.flags

    @property
    def down(self) -> bool:
        return self.state == "DOWN" or not self.responding

    @property
    def in_service(self) -> bool:
        """True when Slurm may start new jobs here (before any health check)."""
        if self.state not in _IN_SERVICE_BASES:
            return False
        return not (self.flags & _OUT_OF_SERVICE_FLAGS)


# --------------------------------------------------------------------------
# State strings and lists
# --------------------------------------------------------------------------

# sinfo's one-character suffixes (sinfo(1) NODE STATE CODES, node_state_string).
_SUFFIX_FLAGS = {
    "*": "NOT_RESPONDING",
    "~": "POWERED_DOWN",
    "#": "POWERING_UP",
    "!": "POWER_DOWN",
    "%": "POWERING_DOWN",
    "$": "MAINTENANCE",
    "@": "REBOOT_REQUESTED",
    "^": "REBOOT_ISSUED",
    "-": "PLANNED",
}

# Long (%T) and compact (%t) names that are not plain base or flag names:
# name -> (base it implies or None, flags it stands for).
_ALIASES: Dict[str, Tuple[Optional[str], Tuple[str, ...]]] = {
    "ALLOC": ("ALLOCATED", ()),
    "MIX": ("MIXED", ()),
    "FUTR": ("FUTURE", ()),
    "UNK": ("UNKNOWN", ()),
    "DRAINED": (None, ("DRAIN",)),
    "DRAINING": ("ALLOCATED", ("DRAIN",)),
    "DRNG": ("ALLOCATED", ("DRAIN",)),
    "FAILING": ("ALLOCATED", ("FAIL",)),
    "FAILG": ("ALLOCATED", ("FAIL",)),
    "MAINT": (None, ("MAINTENANCE",)),
    "REBOOT": (None, ("REBOOT_REQUESTED",)),
    "BOOT": (None, ("REBOOT_REQUESTED",)),
    "CANCEL_REBOOT": (None, ("REBOOT_CANCELED",)),
    "CANC_R": (None, ("REBOOT_CANCELED",)),
    "RESV": (None, ("RESERVED",)),
    "PLND": (None, ("PLANNED",)),
    "NPC": (None, ("PERFCTRS",)),
    "COMP": (None, ("COMPLETING",)),
    "INVAL": (None, ("INVALID_REG",)),
    "POW_DN": (None, ("POWER_DOWN",)),
    "POW_UP": (None, ("POWER_UP",)),
    "POWERED_DN": (None, ("POWERED_DOWN",)),
    "POWRING_DN": (None, ("POWERING_DOWN",)),
    "RESM": (None, ("RESUME",)),
    "NO_RESPOND": (None, ("NOT_RESPONDING",)),
    "POWER": (None, ("POWERED_DOWN",)),  # Slurm <= 20.11 "IDLE+POWER"
}

_WORD = re.compile(r"[A-Z][A-Z0-9_]*\Z")


def _state_tokens(raw: str, where: str) -> Tuple[List[str], set]:
    """Split "idle+drain", "ALLOCATED+" or "down*" into words and flags."""
    text = raw.strip().upper()
    if not text:
        raise ParseError(f"{where}: empty node state")
    parts = text.split("+")
    flags = set()
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()  # sinfo's "allocated+": jobs are completing
        flags.add("COMPLETING")
    tokens = []
    for part in parts:
        word = part.rstrip("".join(_SUFFIX_FLAGS))
        if not word:
            raise ParseError(f"{where}: malformed node state {_show(raw)}")
        flags.update(_SUFFIX_FLAGS[c] for c in part[len(word):])
        tokens.append(word)
    return tokens, flags


def _resolve_state(tokens: Iterable[str], flags: set, raw: object, where: str) -> Tuple[str, FrozenSet[str]]:
    """Turn state words into (base, flags)."""
    bases, implied, unknown = set(), set(), False
    for word in tokens:
        if word in BASE_STATES:
            bases.add(word)
        elif word in _ALIASES:
            base, alias_flags = _ALIASES[word]
            flags.update(alias_flags)
            if base:
                implied.add(base)
        elif _WORD.match(word):
            # Newer Slurm may add flags; keep them rather than fail.
            flags.add(word)
            unknown = unknown or word not in KNOWN_FLAGS
        else:
            raise ParseError(f"{where}: malformed node state {_show(raw)}")
    if len(bases) > 1:
        raise ParseError(f"{where}: several base states in {_show(raw)}")
    if not bases and len(implied) > 1:
        raise ParseError(f"{where}: contradictory node state {_show(raw)}")
    if bases:
        return bases.pop(), frozenset(flags)
    if implied:
        return implied.pop(), frozenset(flags)
    if unknown or not flags:
        raise ParseError(f"{where}: no base state in {_show(raw)}")
    # %T/%t names without a base ("drained", "maint", "reboot^") are printed
    # for nodes running no job; IDLE is the closest base (a DOWN one is lost).
    return "IDLE", frozenset(flags)


def _parse_state(value: object, extra_flags: object, where: str) -> Tuple[str, FrozenSet[str]]:
    """State as a string ("idle", "idle+drain", "mixed*") or a list
    (["IDLE", "DRAIN"]), plus 22.05's separate state_flags list."""
    items: List[str] = []
    if isinstance(value, str):
        items.append(value)
    elif isinstance(value, list) and value:
        items.extend(_expect_str(v, f"{where}.state[]") for v in value)
    else:
        raise ParseError(f"{where}: 'state' must be a string or a non-empty list, got {_type(value)}")
    if extra_flags is not None:
        if not isinstance(extra_flags, list):
            raise ParseError(f"{where}: 'state_flags' must be a list, got {_type(extra_flags)}")
        items.extend(_expect_str(v, f"{where}.state_flags[]") for v in extra_flags)
    tokens: List[str] = []
    flags: set = set()
    for item in items:
        item_tokens, item_flags = _state_tokens(item, where)
        tokens.extend(item_tokens)
        flags |= item_flags
    return _resolve_state(tokens, flags, value, where)


# --------------------------------------------------------------------------
# Small validators
# --------------------------------------------------------------------------

def _type(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _show(value: object) -> str:
    """repr() short enough for an error message."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _expect_str(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise ParseError(f"{where}: expected a string, got {_type(value)}")
    return value


def _name(value: object, where: str, what: str = "node name") -> str:
    """Node and partition names: one printable word, no hostlist syntax."""
    if not isinstance(value, str) or not value:
        raise ParseError(f"{where}: {what} must be a non-empty string, got {_show(value)}")
    if not value.isprintable() or any(c.isspace() or c in "|,[]" for c in value):
        raise ParseError(f"{where}: bad {what} {_show(value)}")
    return value


def _opt_str(entry: dict, key: str, where: str) -> str:
    value = entry.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ParseError(f"{where}: '{key}' must be a string, got {_type(value)}")
    return value


def _epoch(value: object, where: str) -> Optional[int]:
    """Plain int (<= 23.02) or {"set", "infinite", "number"} (23.11+); 0 = unset."""
    if isinstance(value, dict):
        is_set = value.get("set", True)
        infinite = value.get("infinite", False)
        if not isinstance(is_set, bool) or not isinstance(infinite, bool):
            raise _time_error(value, where)
        if not is_set or infinite:
            return None
        value = value.get("number", 0)
        if isinstance(value, dict):
            raise _time_error(value, where)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _time_error(value, where)
    return value or None


def _time_error(value: object, where: str) -> ParseError:
    return ParseError(f"{where}: malformed time {_show(value)}")


def _partitions(value: object, where: str) -> Tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):  # tolerate a CSV string
        value = [p for p in value.split(",") if p]
    if not isinstance(value, list):
        raise ParseError(f"{where}: 'partitions' must be a list, got {_type(value)}")
    return tuple(sorted({_name(p, where, "partition name") for p in value}))


# --------------------------------------------------------------------------
# JSON
# --------------------------------------------------------------------------

def parse_nodes_json(text: str) -> Dict[str, NodeState]:
    """Nodes from sinfo/scontrol JSON of Slurm 22.05 .. 26.05 (see module doc)."""
    return _guarded(_parse_json, text, "Slurm node JSON")


def _parse_json(text: str) -> Dict[str, NodeState]:
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ParseError(f"Slurm node JSON: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ParseError(f"Slurm node JSON: top level must be an object, got {_type(doc)}")
    _check_errors(doc)
    if "nodes" not in doc and "sinfo" not in doc:
        raise ParseError("Slurm node JSON: neither a 'nodes' nor a 'sinfo' key")
    records: List[NodeState] = []
    for i, entry in enumerate(_list_at(doc, "nodes")):
        records.append(_node_entry(entry, f"nodes[{i}]"))
    for i, entry in enumerate(_list_at(doc, "sinfo")):
        records.extend(_sinfo_entry(entry, f"sinfo[{i}]"))
    return _merge(records)


def _list_at(doc: dict, key: str) -> list:
    value = doc.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ParseError(f"Slurm node JSON: '{key}' must be a list, got {_type(value)}")
    return value


def _check_errors(doc: dict) -> None:
    """Slurm reports failures in "errors" and may still exit 0 (22.05 sinfo
    --json without a controller prints no nodes and "Unspecified error")."""
    errors = doc.get("errors")
    if not errors:
        return
    if not isinstance(errors, list):
        raise ParseError(f"Slurm node JSON: 'errors' must be a list, got {_type(errors)}")
    texts = []
    for err in errors[:5]:
        if isinstance(err, dict):
            msg = err.get("description") or err.get("error") or err
            texts.append(str(msg)[:200])
        else:
            texts.append(str(err)[:200])
    raise ParseError("Slurm reported errors: " + "; ".join(texts))


def _node_entry(entry: object, where: str) -> NodeState:
    """One node of the "nodes" list (22.05 sinfo, 23.02+ scontrol)."""
    if not isinstance(entry, dict):
        raise ParseError(f"{where}: expected an object, got {_type(entry)}")
    name = _name(entry.get("name"), where)
    where = f"{where} ({name})"
    if "state" not in entry:
        raise ParseError(f"{where}: no 'state'")
    state, flags = _parse_state(entry["state"], entry.get("state_flags"), where)
    return NodeState(
        name=name,
        state=state,
        flags=flags,
        reason=_opt_str(entry, "reason", where),
        reason_time=_epoch(entry.get("reason_changed_at"), where),
        reason_user=_opt_str(entry, "reason_set_by_user", where),
        partitions=_partitions(entry.get("partitions"), where),
    )


def _sinfo_entry(entry: object, where: str) -> List[NodeState]:
    """One (partition, node group) entry of 23.02+ sinfo --json."""
    if not isinstance(entry, dict):
        raise ParseError(f"{where}: expected an object, got {_type(entry)}")
    names = _sinfo_names(entry, where)
    node = entry.get("node")
    if not isinstance(node, dict) or "state" not in node:
        raise ParseError(f"{where}: no 'node.state'")
    state, flags = _parse_state(node["state"], None, where)
    reason, when, user = _sinfo_reason(entry.get("reason"), where)
    if len(names) > 1 and reason:
        # sinfo gives a group the reason of one member only.
        raise ParseError(
            f"{where}: sinfo grouped {len(names)} nodes under one reason; "
            "reasons are not per node, read `scontrol --json show node` instead")
    if len(names) > 1:
        when, user = None, ""
    partition = entry.get("partition")
    parts: Tuple[str, ...] = ()
    if partition is not None:
        if not isinstance(partition, dict):
            raise ParseError(f"{where}: 'partition' must be an object, got {_type(partition)}")
        if partition.get("name") is not None:
            parts = (_name(partition.get("name"), where, "partition name"),)
    return [NodeState(n, state, flags, reason, when, user, parts) for n in names]


def _sinfo_names(entry: dict, where: str) -> List[str]:
    nodes = entry.get("nodes")
    listed = nodes.get("nodes") if isinstance(nodes, dict) else None
    if isinstance(listed, str) and listed:
        listed = [listed]  # a single name; hostlist ranges are refused by _name
    if not isinstance(listed, list):
        raise ParseError(f"{where}: 'nodes.nodes' must be a list of node names")
    return [_name(n, where) for n in listed]


def _sinfo_reason(value: object, where: str) -> Tuple[str, Optional[int], str]:
    if value is None:
        return "", None, ""
    if isinstance(value, str):
        return value, None, ""
    if not isinstance(value, dict):
        raise ParseError(f"{where}: 'reason' must be an object, got {_type(value)}")
    return (_opt_str(value, "description", where),
            _epoch(value.get("time"), where),
            _opt_str(value, "user", where))


# --------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------

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


# --------------------------------------------------------------------------
# Shared
# --------------------------------------------------------------------------

def _merge(records: Iterable[NodeState]) -> Dict[str, NodeState]:
    """One NodeState per node: sinfo prints a node once per partition."""
    merged: Dict[str, NodeState] = {}
    for rec in records:
        seen = merged.get(rec.name)
        if seen is None:
            merged[rec.name] = rec
            continue
        if replace(seen, partitions=()) != replace(rec, partitions=()):
            raise ParseError(f"node {rec.name} is reported twice with different states or reasons")
        parts = tuple(sorted(set(seen.partitions) | set(rec.partitions)))
        merged[rec.name] = replace(seen, partitions=parts)
    return merged


def _without_stale_reason(state: NodeState) -> NodeState:
    """A reason on a node in service is a leftover: Slurm clears it on RESUME
    (22.05, 26.05) but 24.11 without accounting storage keeps it.  Read as it
    is, it would look like an admin's mark ("never touch") on a healthy node,
    or like the sweep's work on a node it already resumed."""
    if state.reason and state.in_service:
        return replace(state, reason="", reason_time=None, reason_user="")
    return state


def _guarded(parse: Callable[[str], Dict[str, NodeState]], text: object, what: str) -> Dict[str, NodeState]:
    """The contract is ParseError for any bad input; turn a slip into one."""
    if not isinstance(text, str):
        raise ParseError(f"{what}: expected text, got {_type(text)}")
    try:
        return {name: _without_stale_reason(st) for name, st in parse(text).items()}
    except ParseError:
        raise
    except Exception as exc:  # noqa: BLE001 - defensive: never leak another type
        raise ParseError(f"{what}: unreadable input ({type(exc).__name__}: {str(exc)[:200]})") from exc
