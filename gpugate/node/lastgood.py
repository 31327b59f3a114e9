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
configuration path (a test machine runs many simulated nodes).

Next to each copy is its TOML parse (NAME.parsed.json, with the text it was
made from): a run whose file holds exactly that text validates the kept
parse instead of parsing again, so the prolog needs no TOML parser.  The
validation runs every time, and the copy is compared byte for byte: no
stat signature or hash stands in for the content.

For the prolog and epilog, the baseline's copy also has this node's
resolved view (baseline.toml.resolved.json: what Baseline.resolved_for
gives, with the text and the gpugate version it was made by): a run whose
baseline holds exactly that text, under that version, takes the view as
validated, since validating the same text with the same code gives the same
answer.  The prolog then needs neither the TOML parser nor ClusterShell
(about 15 ms to load) when its health check's verdict is not reusable."""

from __future__ import annotations

import os
import sys
import time

from gpugate.core import jsontext
from gpugate.errors import ConfigError
from gpugate.core.record import replace
from gpugate.safety.state import makedirs
from gpugate.safety.safeio import STATE_CAP, read_capped

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Callable, Optional

ROOT = "/var/lib/gpugate/last-good"
CONFIG = "gpugate.toml"
BASELINE = "baseline.toml"
META = "meta.json"
PARSED = ".parsed.json"  # NAME + PARSED: the kept parse of NAME
RESOLVED = ".resolved.json"  # BASELINE + RESOLVED: this node's view of the kept baseline
_MAX_BYTES = 4 << 20


def directory(config_path: str, node: str) -> str:
    key = _sha256(os.path.abspath(config_path).encode())[:12]
    return os.path.join(ROOT, "%s-%s" % (node, key))


def _sha256(data: bytes) -> str:
    # The builtin module when there is one: hashlib loads OpenSSL, a few ms
    # of every prolog.  The same digest either way.
    try:
        from _sha2 import sha256  # Python 3.12+
    except ImportError:
        try:
            from _sha256 import sha256
        except ImportError:  # pragma: no cover - a build without the builtin hashes
            from hashlib import sha256
    return sha256(data).hexdigest()


def load_settings(config_path: str, node: str, record: dict):
    """The site settings: the file's, else the last good copy's (recording
    the error), else ConfigError (nothing kept yet: change nothing)."""
    from gpugate.model.config import load_settings as load, parse_settings
    from gpugate.model.schema import read_toml_file

    where = directory(config_path, node)
    try:
        data = read_toml_file(config_path, "gpugate configuration")  # refused unless root's alone
        parsed, cached = _parse(where, CONFIG, data, config_path)
        settings = parse_settings(parsed, config_path)
    except ConfigError as exc:
        copy = _fallback(where, CONFIG, exc, record, "gpugate.toml")
        return replace(load(copy), last_good_dir=where)  # the same checks, trust included
    _keep(where, CONFIG, config_path, data, parsed, cached)
    return replace(settings, last_good_dir=where)


def _fallback(where: str, name: str, exc: ConfigError, record: dict, what: str) -> str:
    """The last good copy's path, with the error recorded; without one,
    ConfigError (first install: nothing changes until the file loads)."""
    copy = os.path.join(where, name)
    if not os.path.exists(copy):
        raise ConfigError("%s (no last good copy kept yet, so gpugate changes nothing until it loads)"
                          % exc) from None
    _note(record, exc, what)
    return copy


def load_baseline(settings, record: dict, node: Optional[str] = None):
    """The baseline settings name, else the last good copy (recording the
    error), else ConfigError.  Without a last-good directory (admin tools):
    the file or the error.  With ``node``, this node's kept resolved view
    when the file's text is the one it was made from."""
    from gpugate.model.config import load_checked_baseline
    from gpugate.model.schema import read_toml_file

    where = getattr(settings, "last_good_dir", "")
    if not where:
        try:
            return load_checked_baseline(settings)
        except ConfigError as exc:
            raise ConfigError("%s (no last good copy kept yet, so gpugate changes nothing until it loads)"
                              % exc) from None
    try:
        data = read_toml_file(settings.baseline, "baseline")  # refused unless root's alone
        view = _resolved(where, data, node) if node else None
        if view is not None:
            return view
        parsed, cached = _parse(where, BASELINE, data, settings.baseline)
        from gpugate.model.baseline import parse_baseline

        baseline = parse_baseline(parsed, settings.baseline)
    except ConfigError as exc:
        copy = _fallback(where, BASELINE, exc, record, "baseline")
        return load_checked_baseline(replace(settings, baseline=copy))
    _keep(where, BASELINE, settings.baseline, data, parsed, cached)
    if node:
        _keep_resolved(where, data, node, baseline)
    return baseline


def _resolved(where: str, data: bytes, node: str):
    """The kept view of this node, if made from this very text by this
    version of gpugate; else None."""
    from gpugate import __version__

    kept_view = _kept_for(where, BASELINE + RESOLVED, data, "gpugate's kept view")
    if kept_view is None or kept_view.get("version") != __version__ or kept_view.get("node") != node:
        return None
    from gpugate.model.baseline import from_resolved

    try:
        return from_resolved(kept_view["view"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None  # damaged, or another shape: parse and validate


def _keep_resolved(where: str, data: bytes, node: str, baseline) -> None:
    """Best effort, like _keep: without it the next run parses again."""
    from gpugate import __version__

    if len(data) > _MAX_BYTES:
        return
    try:
        text = jsontext.dumps({"text": data.decode("utf-8"), "version": __version__, "node": node,
                           "view": baseline.resolved_for(node)}, sort_keys=True)
        makedirs(where, 0o700)  # 0755 above it, whatever the umask
        _write(os.path.join(where, BASELINE + RESOLVED), text.encode())
    except (TypeError, ValueError):
        return  # a value JSON cannot hold: the baseline is parsed every run
    except OSError as exc:
        sys.stderr.write("gpugate: cannot keep this node's view of the baseline in %s: %s\n" % (where, exc))


def for_admin(settings_loader: Callable[[], object], config_path: str, node: str, record: dict):
    """(settings, baseline) for an admin command run on a node (`gpugate
    facts`, which the audit runs): what the files say, else the node's last
    good copies as its entry points use them, recording the error."""
    from gpugate.model.config import load_checked_baseline

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
        data = jsontext.loads(read_capped(os.path.join(where, META), STATE_CAP).decode("utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _note(record: dict, exc: Exception, what: str) -> None:
    message = "%s (judging with the last good %s)" % (exc, what)
    previous = record.get("config_error")
    record["config_error"] = (previous + "; " + message if previous else message)[:600]


def _parse(where: str, name: str, data: bytes, source: str):
    """(the TOML parse of data, whether it is the kept one).  The kept parse
    is used only for the very text it was made from; the caller validates
    it as it would a fresh parse."""
    from gpugate.model.schema import parse_toml_bytes

    kept_parse = _kept_for(where, name + PARSED, data, "gpugate's kept parse")
    if kept_parse is not None and "toml" in kept_parse:
        return kept_parse["toml"], True
    return parse_toml_bytes(data, source), False


def _kept_for(where: str, filename: str, data: bytes, what: str):
    """The JSON object kept in ``filename`` (root's alone: the trust walk)
    when it was made from exactly the text of ``data``; else None (none
    kept, another text, unreadable)."""
    from gpugate.safety.trust import open_file

    try:
        with os.fdopen(open_file(os.path.join(where, filename), what), "rb") as handle:
            kept_data = jsontext.loads(handle.read(2 * _MAX_BYTES))
        if isinstance(kept_data, dict) and kept_data.get("text") == data.decode("utf-8"):
            return kept_data
    except (ConfigError, OSError, ValueError):
        pass
    return None


def _keep(where: str, name: str, path: str, data: bytes, parsed, cached: bool) -> None:
    """Copy data, which just loaded and validated, into ``where`` when it
    differs from the copy kept, with its parse.  Best effort: a full or
    read-only disk only costs the fallback."""
    if len(data) > _MAX_BYTES:
        return
    copy = os.path.join(where, name)
    try:
        with open(copy, "rb") as handle:
            same = handle.read(_MAX_BYTES + 1) == data
    except OSError:
        same = False
    if same and cached:
        return
    try:
        makedirs(where, 0o700)  # 0755 above it, whatever the umask
        if not same:
            _write(copy, data)
            meta = kept(where)
            meta[name] = {"sha256": _sha256(data), "at": time.time(), "source": path}
            _write(os.path.join(where, META), jsontext.dumps(meta, sort_keys=True).encode())
        if not cached:
            try:
                text = jsontext.dumps({"text": data.decode("utf-8"), "toml": parsed}, sort_keys=True)
            except (TypeError, ValueError):
                return  # a date or time value: nothing to keep, the file is parsed every run
            _write(os.path.join(where, name + PARSED), text.encode())
    except OSError as exc:
        sys.stderr.write("gpugate: cannot keep the last good %s in %s: %s\n" % (name, where, exc))


def _write(path: str, data: bytes) -> None:
    from gpugate.safety.state import write_bytes

    write_bytes(path, data, mode=0o600)


def fingerprint(settings) -> Optional[str]:
    """The sha256 of the last good baseline kept (for status lines)."""
    where = getattr(settings, "last_good_dir", "")
    return (kept(where).get(BASELINE) or {}).get("sha256") if where else None
