"""One node as Slurm reports it, its state words (every release's spellings),
and the readers' contract: ParseError and nothing else, one record per node."""

import re
from typing import Callable, Dict, FrozenSet, Iterable, List, Optional, Tuple

from gpugate.errors import ParseError

from gpugate.slurm.nodestate.fields import _expect_str, _show, _type
from gpugate.core.record import dataclass, replace


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
    comment: str = ""           # the node's Comment (root/SlurmUser only): gpugate.slurm.pending

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


_STATE_MEMO: Dict[object, Tuple[str, FrozenSet[str]]] = {}


def _parse_state(value: object, extra_flags: object, where: str) -> Tuple[str, FrozenSet[str]]:
    """State as a string ("idle", "idle+drain", "mixed*") or a list
    (["IDLE", "DRAIN"]), plus 22.05's separate state_flags list.  A fleet
    has few distinct states: each is parsed once (errors are not kept)."""
    try:
        key = (value if isinstance(value, str) else tuple(value),
               None if extra_flags is None else tuple(extra_flags))
        return _STATE_MEMO[key]
    except (KeyError, TypeError):
        pass
    parsed = _parse_state_words(value, extra_flags, where)
    if len(_STATE_MEMO) < 4096:
        try:
            _STATE_MEMO[key] = parsed
        except (TypeError, UnboundLocalError):
            pass
    return parsed


def _parse_state_words(value: object, extra_flags: object, where: str) -> Tuple[str, FrozenSet[str]]:
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
        # Field by field, not through replace(): the keeper merges 100,000 nodes.
        if (seen.state, seen.flags, seen.reason, seen.reason_time, seen.reason_user, seen.comment) != (
                rec.state, rec.flags, rec.reason, rec.reason_time, rec.reason_user, rec.comment):
            raise ParseError(f"node {rec.name} is reported twice with different states or reasons")
        parts = tuple(sorted(set(seen.partitions) | set(rec.partitions)))
        merged[rec.name] = NodeState(seen.name, seen.state, seen.flags, seen.reason, seen.reason_time,
                                     seen.reason_user, parts, seen.comment)
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
