"""JSON for the prolog's own files and log line, without the json package.

The prolog reads and writes a few small JSON files (its state, the kept
views of its configuration) and prints one JSON log line before every job.
``import json`` loads re, and re loads enum and functools: about 4 ms of
every prolog, in each of its two processes, for regular expressions
json compiles and never uses on these files.  The json package's own work
is done in C, by CPython's ``_json`` (its scanner and encoder): this module
calls them as json does, with json's defaults, and falls back to the json
package where ``_json`` is missing or refuses (another interpreter).
Same values in, same text out (tests/test_jsontext.py compares them)."""

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only: typing costs the prolog milliseconds
    from typing import Any, Callable, Optional

try:
    import _json
except ImportError:  # pragma: no cover - CPython always has it
    _json = None

_WHITESPACE = " \t\n\r"  # json's WHITESPACE
_INF = float("inf")
_CONSTANTS = {"-Infinity": -_INF, "Infinity": _INF, "NaN": float("nan")}


class _Reading:
    """What _json's scanner reads from json.JSONDecoder: its defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__


_scan = None
if _json is not None:
    try:
        _scan = _json.make_scanner(_Reading())
    except (AttributeError, TypeError):  # pragma: no cover
        _scan = None


def loads(text) -> "Any":
    """json.loads(text) for str or UTF-8 bytes; ValueError when it is not JSON."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8")
    if _scan is None:
        import json

        return json.loads(text)
    start, end = _skip(text, 0), len(text)
    try:
        value, at = _scan(text, start)
    except StopIteration as stop:  # no value where one was expected
        return _refused(text, "Expecting value", stop.value)
    except Exception:  # noqa: BLE001 - _json raises its errors through json.decoder, if loaded (else a
        # SystemError): json itself says what is wrong, with its own error
        return _refused(text, "Unreadable", start)
    if _skip(text, at) != end:
        return _refused(text, "Extra data", at)
    return value


def _skip(text: str, at: int) -> int:
    end = len(text)
    while at < end and text[at] in _WHITESPACE:
        at += 1
    return at


def _refused(text: str, what: str, at: int):
    """json's own error (JSONDecodeError, a ValueError) for this text."""
    import json

    json.loads(text)  # raises the same error, with json's line and column
    raise ValueError("%s: char %d" % (what, at))  # pragma: no cover - json refuses what _json refused


def dumps(value, sort_keys: bool = False, separators: "Optional[tuple]" = None,
          default: "Optional[Callable]" = None) -> str:
    """json.dumps(value, sort_keys=..., separators=..., default=...) with
    json's other defaults (ASCII, NaN allowed, circular references refused)."""
    item, key = separators if separators is not None else (", ", ": ")
    encoder = None
    if _json is not None:
        try:
            encoder = _json.make_encoder({}, default or _not_serializable, _json.encode_basestring_ascii, None,
                                         key, item, sort_keys, False, True)
        except (AttributeError, TypeError):  # pragma: no cover
            encoder = None
    if encoder is None or isinstance(value, (str, int, float)) or value is None:
        import json  # a lone scalar: json's own path (the C encoder takes containers)

        return json.dumps(value, sort_keys=sort_keys, separators=separators, default=default)
    return "".join(encoder(value, 0))


def _not_serializable(value):
    raise TypeError("Object of type %s is not JSON serializable" % type(value).__name__)
