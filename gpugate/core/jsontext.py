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

from gpugate.core import lazyre

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


# What another host wrote (a node's answer to the controller): limits, so that
# no answer can raise anything but ValueError or take minutes (issue 33).
MAX_DEPTH = 64  # nesting: a check's answer needs about 8
MAX_CHARS = 64 << 20
MAX_NUMBER = 100  # characters of one number (int() of a long one is quadratic before 3.11)
MAX_BRACKETS = 2000000  # [ ] { } anywhere: a million containers, counted in C before the depth is


def loads_bounded(text, max_depth: int = MAX_DEPTH, max_chars: int = MAX_CHARS, max_number: int = MAX_NUMBER,
                  expect: "Optional[type]" = None) -> "Any":
    """loads(text) for text another host wrote.  ValueError, and no other
    error, when it is not JSON, is longer than max_chars, nests deeper than
    max_depth, has more than MAX_BRACKETS brackets, holds a number longer
    than max_number characters, or its value is not an ``expect``.  The depth is counted before the parse, in a
    loop (json recurses: 100,000 levels raise RecursionError)."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8")  # UnicodeDecodeError is a ValueError
    if not isinstance(text, str):
        raise ValueError("not JSON text: %s" % type(text).__name__)
    if len(text) > max_chars:
        raise ValueError("JSON text of %d characters (at most %d)" % (len(text), max_chars))
    brackets = sum(text.count(c) for c in "[]{}")
    if brackets > MAX_BRACKETS:
        raise ValueError("JSON text with %d brackets (at most %d)" % (brackets, MAX_BRACKETS))
    depth = nesting(text)
    if depth > max_depth:
        raise ValueError("JSON nested %d levels deep (at most %d)" % (depth, max_depth))
    try:
        value = _bounded_scan(text, max_number)
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - the documented error, whatever the scanner raised
        raise ValueError("unreadable JSON: %s: %s" % (type(exc).__name__, str(exc)[:100])) from None
    if expect is not None and not isinstance(value, expect):
        raise ValueError("JSON %s where %s was expected" % (type(value).__name__, expect.__name__))
    return value


# A JSON string, or an unterminated one to the end of the text: it always
# matches where it starts, so a scan never backtracks over the rest twice.
_STRING = lazyre.Lazy(r'"[^"\\]*(?:\\[\s\S][^"\\]*)*(?:"|\\?\Z)')
_NOT_BRACKET = lazyre.Lazy(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def nesting(text: str) -> int:
    """The deepest nesting of brackets outside strings, counted in C-speed
    passes (no recursion, no Python loop per character).  Exact for JSON;
    for text that is not, at least as deep as any parser gets before it fails."""
    from itertools import accumulate

    marks = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, marks)), default=0)


def _bounded_scan(text: str, max_number: int) -> "Any":
    def bounded(kind):
        def parse(digits: str):
            if len(digits) > max_number:
                raise ValueError("a number of %d characters in JSON (at most %d)" % (len(digits), max_number))
            return kind(digits)
        return parse

    import json  # json's own errors (JSONDecodeError); the parse itself is _json's, as above

    decoder = json.JSONDecoder(parse_int=bounded(int), parse_float=bounded(float))
    value, at = decoder.raw_decode(text, _skip(text, 0))
    if _skip(text, at) != len(text):
        raise ValueError("Extra data: char %d" % at)
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
