"""Values of `gpugate sim set` assignments, shared by the key tables
(keys.py, ib.py): an integer, a 1/0 flag."""

from gpugate.errors import ConfigError


def parse_int(value: str) -> int:
    try:
        return int(value, 0)
    except ValueError:
        raise ConfigError("expected an integer, got %r" % value) from None


def parse_flag(value: str) -> int:
    lowered = value.lower()
    if lowered in ("1", "true", "yes", "on"):
        return 1
    if lowered in ("0", "false", "no", "off"):
        return 0
    raise ConfigError("expected 1/0 (or true/false), got %r" % value)
