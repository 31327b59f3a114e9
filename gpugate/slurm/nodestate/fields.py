"""Validators shared by the JSON and text readers: names, strings, times."""

import re
from typing import Optional, Tuple

from gpugate.errors import ParseError


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


_NOT_IN_NAMES = re.compile(r"[\s|,\[\]]")


def _name(value: object, where: str, what: str = "node name") -> str:
    """Node and partition names: one printable word, no hostlist syntax."""
    if not isinstance(value, str) or not value:
        raise ParseError(f"{where}: {what} must be a non-empty string, got {_show(value)}")
    if not value.isprintable() or _NOT_IN_NAMES.search(value):
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
