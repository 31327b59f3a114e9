"""What a node's answer must be before the controller reads it (issue 33).

A node answers `gpugate check|facts|reset-gpus|evidence --json` with one
JSON object, read by transport.py within jsontext.loads_bounded's limits
(depth, size, numbers).  Whoever holds root on a node writes that line, so
every field the controller reads (steps.py, reset_step.py, evidence.py,
run.py) must have the type it is read as: an answer that breaks one is no
answer, and the node fails its step alone (its attempt recorded), never the
batch or the sweep.  Pure: the checks are of values, not of I/O.
"""

from typing import Any, Dict, Tuple

_NUMBER = (int, float)
_TEXT = (str,)
_OPT_TEXT = (str, type(None))
# Top-level fields the controller reads, and what each must be where present.
_FIELDS: Dict[str, Tuple[type, ...]] = {
    "node": _TEXT, "fit": (bool,), "reason": _OPT_TEXT, "mode": _OPT_TEXT, "ok": (bool,), "all": (bool,),
    "error": _OPT_TEXT, "config_error": _OPT_TEXT, "findings": (list,), "pending": (list,),
    "baseline": (dict, type(None)), "facts": (dict, type(None)), "gpus": (list, type(None)), "steps": (list,),
    "parts": (list,), "lock_stuck": (dict, type(None)), "seconds": _NUMBER + (dict, type(None)),
    "preflight": (dict, type(None)),
}
_SCALAR = (str, int, float, bool, type(None))  # rendered with str(): any scalar reads
# A finding's class and component key tables (findings.py), its GPU sorts with others'.
_FINDING = {"class": _TEXT, "component": _TEXT, "observed": _SCALAR, "expected": _SCALAR, "action": _SCALAR,
            "detail": _SCALAR, "gpu": (int, type(None))}
_PART = {"name": _TEXT, "data": _OPT_TEXT, "error": _OPT_TEXT, "truncated": (bool, type(None)),
         "bytes": (int, type(None))}
_DIAG = {"level": (int,), "passed_levels": (list, type(None)), "results": (list, type(None))}


def _name(types: Tuple[type, ...]) -> str:
    return " or ".join("null" if t is type(None) else {int: "integer", float: "number", str: "string",
                                                       bool: "boolean", list: "list", dict: "object"}.get(t, t.__name__)
                       for t in types)


def _is(value: Any, types: Tuple[type, ...]) -> bool:
    # bool is an int to Python, never to the controller (a GPU index, a level)
    return isinstance(value, types) and not (isinstance(value, bool) and bool not in types)


def _fields(where: str, data: dict, fields: Dict[str, Tuple[type, ...]], required=()) -> str:
    for key in required:
        if key not in data:
            return "%s has no %r" % (where, key)
    for key, types in fields.items():
        if key in data and not _is(data[key], types):
            return "%s %r is %s, not %s" % (where, key, type(data[key]).__name__, _name(types))
    return ""


def _items(where: str, items: list, fields, required=(), kind: Tuple[type, ...] = (dict,)) -> str:
    for i, item in enumerate(items):
        if not _is(item, kind):
            return "%s[%d] is %s, not %s" % (where, i, type(item).__name__, _name(kind))
        if kind == (dict,):
            wrong = _fields("%s[%d]" % (where, i), item, fields, required)
            if wrong:
                return wrong
    return ""


def problem(data: Any) -> str:
    """"" when the answer may be read; otherwise what is wrong with it."""
    if not isinstance(data, dict):
        return "the answer is %s, not an object" % type(data).__name__
    wrong = _fields("the answer's", data, _FIELDS)
    if not wrong and "findings" in data:
        wrong = _items("findings", data["findings"], _FINDING, ("class", "component"))
    if not wrong and "pending" in data:
        wrong = _items("pending", data["pending"], {"component": _TEXT}, ("component",))
    if not wrong and "parts" in data:
        wrong = _items("parts", data["parts"], _PART, ("name",))
    if not wrong and data.get("gpus"):
        wrong = _items("gpus", data["gpus"], {}, kind=(int,))
    if not wrong and isinstance(data.get("baseline"), dict):
        wrong = _fields("baseline", data["baseline"], {"sha256": _OPT_TEXT, "name": _OPT_TEXT})
    facts = data.get("facts") or {}
    if not wrong and facts.get("dcgm_diag") is not None:
        diag = facts["dcgm_diag"]
        wrong = ("facts 'dcgm_diag' is %s, not object" % type(diag).__name__ if not isinstance(diag, dict)
                 else _fields("dcgm_diag", diag, _DIAG))
        if not wrong and diag.get("passed_levels"):
            wrong = _items("dcgm_diag passed_levels", diag["passed_levels"], {}, kind=(int,))
    return "malformed answer: " + wrong if wrong else ""
