"""A small validator for the TOML files: every error names the file, the key
path and what is allowed, and nothing but ``ConfigError`` ever escapes."""

from __future__ import annotations

import os
import sys
import time

from gpugate.safety import trust
from gpugate.errors import ConfigError
from gpugate.safety.safeio import CONFIG_CAP, read_fd

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Any, Callable, Dict, Optional

REQUIRED = object()


class Invalid(Exception):
    def __init__(self, path: str, message: str):
        super().__init__(message)
        self.path = path
        self.message = message


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return type(value).__name__


class Spec:
    allowed = "a value"

    def check(self, value: Any, path: str) -> Any:
        raise NotImplementedError

    def fail(self, value: Any, path: str):
        raise Invalid(path, "expected %s, got %s" % (self.allowed, _kind(value)))


class Str(Spec):
    def __init__(self, example: str = "", validate: Optional[Callable[[str], Optional[str]]] = None):
        self.allowed = "a string" + (' (e.g. "%s")' % example if example else "")
        self.validate = validate

    def check(self, value, path):
        if not isinstance(value, str):
            self.fail(value, path)
        if self.validate:
            problem = self.validate(value)
            if problem:
                raise Invalid(path, problem)
        return value


class Int(Spec):
    def __init__(self, low: Optional[int] = None, high: Optional[int] = None):
        self.low, self.high = low, high
        rng = ""
        if low is not None and high is not None:
            rng = " from %d to %d" % (low, high)
        elif low is not None:
            rng = " >= %d" % low
        self.allowed = "an integer" + rng

    def check(self, value, path):
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(value, path)
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            raise Invalid(path, "expected %s, got %d" % (self.allowed, value))
        return value


class Number(Int):
    """Seconds and similar: an integer or a float."""

    def __init__(self, low: float = 0.0, high: Optional[float] = None):
        self.low, self.high = low, high
        self.allowed = "a number >= %g" % low + (" and <= %g" % high if high is not None else "")

    def check(self, value, path):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(value, path)
        if value != value or value < self.low or (self.high is not None and value > self.high):
            raise Invalid(path, "expected %s, got %r" % (self.allowed, value))
        return float(value)


class Bool(Spec):
    allowed = "true or false"

    def check(self, value, path):
        if not isinstance(value, bool):
            self.fail(value, path)
        return value


class Choice(Spec):
    def __init__(self, *choices: Any):
        self.choices = choices
        self.allowed = "one of " + ", ".join(repr(c) for c in choices)

    def check(self, value, path):
        if isinstance(value, bool) or value not in self.choices or type(value) not in {type(c) for c in self.choices}:
            raise Invalid(path, "expected %s, got %r" % (self.allowed, value) if isinstance(value, (str, int)) else
                          "expected %s, got %s" % (self.allowed, _kind(value)))
        return value


class AnyOf(Spec):
    def __init__(self, *specs: Spec):
        self.specs = specs
        self.allowed = " or ".join(s.allowed for s in specs)

    def check(self, value, path):
        for spec in self.specs:
            try:
                return spec.check(value, path)
            except Invalid:
                continue
        raise Invalid(path, "expected %s, got %s" % (self.allowed, _kind(value) if not isinstance(value, (str, int)) or isinstance(value, bool) else repr(value)))


class ListOf(Spec):
    def __init__(self, item: Spec, max_items: int = 10000):
        self.item = item
        self.max_items = max_items
        self.allowed = "an array of " + item.allowed.replace("a ", "", 1).replace("an ", "", 1) + "s"

    def check(self, value, path):
        if not isinstance(value, list):
            self.fail(value, path)
        if len(value) > self.max_items:
            raise Invalid(path, "at most %d items allowed" % self.max_items)
        return tuple(self.item.check(v, "%s[%d]" % (path, i)) for i, v in enumerate(value))


class MapOf(Spec):
    """A table with free-form keys (e.g. GPU product names)."""

    def __init__(self, value: Spec, key_check: Optional[Callable[[str], Optional[str]]] = None):
        self.value = value
        self.key_check = key_check
        self.allowed = "a table"

    def check(self, value, path):
        if not isinstance(value, dict):
            self.fail(value, path)
        out = {}
        for key, val in value.items():
            sub = _join(path, key)
            if self.key_check:
                problem = self.key_check(key)
                if problem:
                    raise Invalid(sub, problem)
            out[key] = self.value.check(val, sub)
        return out


class Removed(Spec):
    """A key that no longer exists, with what to do instead: a file that
    still sets it is refused loudly rather than silently doing less."""

    def __init__(self, why: str):
        self.allowed = why

    def check(self, value, path):
        raise Invalid(path, "removed: " + self.allowed)


class Table(Spec):
    """A table with known keys: field -> (spec, default or REQUIRED)."""

    allowed = "a table"

    def __init__(self, fields: Dict[str, tuple]):
        self.fields = fields

    def check(self, value, path):
        if not isinstance(value, dict):
            self.fail(value, path)
        unknown = sorted(set(value) - set(self.fields))
        if unknown:
            raise Invalid(_join(path, unknown[0]),
                          "unknown key; allowed here: %s" % ", ".join(sorted(self.fields)))
        out = {}
        for name, (spec, default) in self.fields.items():
            if name in value:
                out[name] = spec.check(value[name], _join(path, name))
            elif default is REQUIRED:
                raise Invalid(_join(path, name), "required key is missing (%s)" % spec.allowed)
            else:
                out[name] = default() if callable(default) else default
        return out


def _join(path: str, key: str) -> str:
    key = str(key)
    shown = key if key.replace("_", "").replace("-", "").isalnum() else '"%s"' % key
    return "%s.%s" % (path, shown) if path else shown


# A file changed less than this long ago is read again after this long:
# git checkout, cp and editors rewrite in place, and a half-written baseline
# that still parses must never become the pin.
SETTLE_SECONDS = 0.3
SETTLE_LIMIT = 3.0  # then give up: "being rewritten", and gpugate changes nothing


def _signature(st: os.stat_result):
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def read_settled(path: str, what: str) -> bytes:
    """The whole content of a file nobody is writing: unchanged while it was
    read, and either older than SETTLE_SECONDS or unchanged for that long.
    Read through the fd the trust walk checked (gpugate.safety.trust): a file root
    could not vouch for is refused before a byte of it is read."""
    deadline = time.monotonic() + SETTLE_LIMIT
    while True:
        # A relative path can only come from the command line: the admin's own choice.
        with os.fdopen(trust.open_file(os.path.abspath(path), what), "rb") as handle:
            before = os.fstat(handle.fileno())
            data = read_fd(handle.fileno(), CONFIG_CAP, path)  # a 2 GB baseline is refused, not parsed
            after = os.fstat(handle.fileno())
        if _signature(before) == _signature(after) and len(data) == after.st_size:
            # Empty: maybe truncated this instant (ext4 shows the new size
            # a moment before the new mtime), so it is never old enough.
            if after.st_size and time.time() - after.st_mtime >= SETTLE_SECONDS:
                return data
            # Just written, or a clock that ran backwards: wait and look again.
            # Comparing the inode is enough: a path only root can change
            # still leads to it, or the loop reads (and checks) the new file.
            time.sleep(SETTLE_SECONDS)
            try:
                if _signature(os.stat(path)) == _signature(after):
                    return data
            except FileNotFoundError:
                pass  # replaced right now: read the new one
        if time.monotonic() >= deadline:
            raise ConfigError("%s: %s is being rewritten (it kept changing for %.0f s); nothing was changed. "
                              "Write it to a temporary file and rename it into place." % (path, what, SETTLE_LIMIT))
        time.sleep(0.05)


def load_toml(path: str, what: str) -> Dict[str, Any]:
    """Read and parse a TOML file seen whole (read_settled): a file being
    rewritten gives the old or the new content, or an error, never a part."""
    return parse_toml_bytes(read_toml_file(path, what), path)


def read_toml_file(path: str, what: str) -> bytes:
    """read_settled, with the errors an admin can act on."""
    try:
        return read_settled(path, what)
    except FileNotFoundError:
        raise ConfigError("%s: %s not found; create it (see slurm_conf/ for a commented example)"
                          % (path, what)) from None
    except OSError as exc:
        raise ConfigError("%s: cannot read %s: %s" % (path, what, exc.strerror or exc)) from None


def parse_toml_bytes(data: bytes, path: str) -> Dict[str, Any]:
    _toml = _parser()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError("%s: not UTF-8 text (byte %d)" % (path, exc.start)) from None
    from gpugate.core import tomldepth  # here, not above: the hot prolog parses nothing (tests/test_hotpath.py)
    # Measured before the parser recurses into it (gpugate.core.tomldepth).
    if tomldepth.bracket_depth(text) > tomldepth.MAX_DEPTH:
        raise ConfigError("%s: invalid TOML: arrays or inline tables nested deeper than %d"
                          % (path, tomldepth.MAX_DEPTH))
    try:
        data = _toml.loads(text)
    except _toml.TOMLDecodeError as exc:
        raise ConfigError("%s: invalid TOML: %s" % (path, exc)) from None
    except (RecursionError, ValueError) as exc:  # pathological nesting, huge numbers
        raise ConfigError("%s: invalid TOML: %s" % (path, exc)) from None
    if tomldepth.value_depth(data) > tomldepth.MAX_DEPTH:
        raise ConfigError("%s: invalid TOML: tables nested deeper than %d" % (path, tomldepth.MAX_DEPTH))
    return data


def _parser():
    """Imported on first use: a node whose files did not change reuses their
    parse (gpugate.node.lastgood) and never needs the parser."""
    if sys.version_info >= (3, 11):
        import tomllib
        return tomllib
    import tomli  # pragma: no cover - exercised on 3.9/3.10
    return tomli


def validate(data: Any, spec: Spec, source: str) -> Any:
    try:
        return spec.check(data, "")
    except Invalid as exc:
        raise ConfigError("%s: %s: %s" % (source, exc.path or "(top level)", exc.message)) from None
