"""TOML text by hand (the standard library only reads TOML) and the reading
of a node's facts (their JSON form) that baseline capture needs: shared by
gpugate.fleet.capture (NVIDIA) and gpugate.vendors.amd.capture."""

import json
import time
from typing import Mapping, Optional, Tuple

from gpugate.model.baseline_keys import VERSION_RE

def _toml_str(value: str) -> str:
    """A TOML basic string.  JSON's escapes (\\" \\\\ \\b \\f \\n \\r \\t \\uXXXX
    for the other control characters) are TOML's; DEL is the one character
    TOML also wants escaped.  Non-ASCII stays literal: JSON would write
    astral characters as surrogate pairs, which TOML forbids."""
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return _toml_str(str(value))


def _comment(text: str) -> str:
    """One comment line: TOML comments take no control characters."""
    clean = "".join(c if (c == "\t" or (ord(c) >= 32 and c != "\x7f")) else " " for c in str(text))
    return "# " + clean.strip()


# ---------------------------------------------------------------------------
# Reading the facts (the JSON form of NodeFacts).


def _error(value) -> Optional[str]:
    """Why a fact is unusable: an {"error": ...} record or a missing value."""
    if value is None:
        return "not collected"
    if isinstance(value, Mapping) and "error" in value:
        err = value["error"] if isinstance(value["error"], Mapping) else {}
        source, kind = err.get("source") or "probe", err.get("kind") or "error"
        if kind == "nvml":
            return "%s: NVML error %s" % (source, err.get("code"))
        return "%s %s" % (source, kind)
    return None


def _version_or_why(value) -> Tuple[Optional[str], Optional[str]]:
    why = _error(value)
    if why:
        return None, why
    if not isinstance(value, str):
        return None, "not a string (%r)" % (value,)
    if not VERSION_RE.match(value):
        return None, "%s is not a version string a baseline accepts" % json.dumps(value)[:80]
    return value, None


def _stamp(at) -> str:
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(at)))
    except (TypeError, ValueError, OverflowError, OSError):
        return "an unknown time"
