"""Last known good: a gpugate.toml or baseline that does not load, validate
or pass the trust checks never switches gating off and never drains.

Every node-side run that loads a file whole keeps a root-only copy of it
(with its sha256) when it differs from the copy kept; a run whose file
fails falls back to that copy, judges with it, and says so (the log line's
``config_error``, the node metric ``gpugate_config_error``, the health
check's record that ``gpugate facts`` and so audit and status read).  With
no copy yet (first install) nothing changes: the error is all there is.

The copies live in a fixed directory, not in ``state_dir``: they must be
found when gpugate.toml itself cannot be read.  One directory per node and
configuration path (a test machine runs many simulated nodes)."""

import hashlib
import json
import os
import sys
import time
from dataclasses import replace
from typing import Callable, Optional

from ..errors import ConfigError

ROOT = "/var/lib/gpugate/last-good"
CONFIG = "gpugate.toml"
BASELINE = "baseline.toml"
META = "meta.json"
_MAX_BYTES = 4 << 20


def directory(config_path: str, node: str) -> str:
    key = hashlib.sha256(os.path.abspath(config_path).encode()).hexdigest()[:12]
    return os.path.join(ROOT, "%s-%s" % (node, key))


def load_settings(config_path: str, node: str, record: dict):
    """The site settings: the file's, else the last good copy's (recording
    the error), else ConfigError (nothing kept yet: change nothing)."""
    from ..config import load_settings as load, parse_settings

    where = directory(config_path, node)
    try:
        settings = load(config_path)
    except ConfigError as exc:
        copy = os.path.join(where, CONFIG)
        if not os.path.exists(copy):
            raise ConfigError("%s (no last good copy kept yet, so gpugate changes nothing until it loads)"
                              % exc) from None
        _note(record, exc, "gpugate.toml")
        settings = load(copy)  # the same checks, trust included
        return replace(settings, last_good_dir=where)
    _keep(where, CONFIG, config_path, lambda data: parse_settings(_toml(data, config_path), config_path))
    return replace(settings, last_good_dir=where)


def load_baseline(settings, record: dict):
    """The baseline settings name, else the last good copy (recording the
    error), else ConfigError.  Without a last-good directory (admin tools):
    the file or the error."""
    from ..baseline import parse_baseline
    from ..config import load_checked_baseline

    where = getattr(settings, "last_good_dir", "")
    try:
        baseline = load_checked_baseline(settings)
    except ConfigError as exc:
        copy = os.path.join(where, BASELINE) if where else ""
        if not copy or not os.path.exists(copy):
            raise ConfigError("%s (no last good copy kept yet, so gpugate changes nothing until it loads)"
                              % exc) from None
        _note(record, exc, "baseline")
        return load_checked_baseline(replace(settings, baseline=copy))
    if where:
        _keep(where, BASELINE, settings.baseline, lambda data: parse_baseline(_toml(data, settings.baseline),
                                                                              settings.baseline))
    return baseline


def for_admin(settings_loader: Callable[[], object], config_path: str, node: str, record: dict):
    """(settings, baseline) for an admin command run on a node (`gpugate
    facts`, which the audit runs): what the files say, else the node's last
    good copies as its entry points use them, recording the error."""
    from ..config import load_checked_baseline

    try:
        settings = settings_loader()
    except ConfigError:
        settings = load_settings(config_path, node, record)
        return settings, load_baseline(settings, record)
    try:
        return settings, load_checked_baseline(settings)
    except ConfigError:
        return settings, load_baseline(replace(settings, last_good_dir=directory(config_path, node)), record)


def kept(where: str) -> dict:
    """What the directory holds: {"gpugate.toml": {"sha256", "at", "source"}, ...}."""
    try:
        with open(os.path.join(where, META)) as handle:
            data = json.load(handle)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _note(record: dict, exc: Exception, what: str) -> None:
    message = "%s (judging with the last good %s)" % (exc, what)
    previous = record.get("config_error")
    record["config_error"] = (previous + "; " + message if previous else message)[:600]


def _toml(data: bytes, source: str):
    from ..schema import parse_toml_bytes

    return parse_toml_bytes(data, source)


def _keep(where: str, name: str, path: str, validate: Callable[[bytes], object]) -> None:
    """Copy ``path`` into ``where`` when its content differs from the copy
    kept.  Best effort: a full or read-only disk only costs the fallback."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(_MAX_BYTES + 1)
    except OSError:
        return
    digest = hashlib.sha256(data).hexdigest()
    meta = kept(where)
    if (meta.get(name) or {}).get("sha256") == digest and os.path.exists(os.path.join(where, name)):
        return
    try:
        validate(data)  # what was read now, not only what loaded a moment ago
    except ConfigError:
        return
    try:
        os.makedirs(where, mode=0o700, exist_ok=True)
        _write(os.path.join(where, name), data)
        meta[name] = {"sha256": digest, "at": time.time(), "source": path}
        _write(os.path.join(where, META), json.dumps(meta, sort_keys=True).encode())
    except OSError as exc:
        sys.stderr.write("gpugate: cannot keep the last good %s in %s: %s\n" % (name, where, exc))


def _write(path: str, data: bytes) -> None:
    from .state import write_bytes

    write_bytes(path, data, mode=0o600)


def fingerprint(settings) -> Optional[str]:
    """The sha256 of the last good baseline kept (for status lines)."""
    where = getattr(settings, "last_good_dir", "")
    return (kept(where).get(BASELINE) or {}).get("sha256") if where else None
