"""One structured line per node-side run: to syslog/journal and to a file in
the state directory (node, mode, verdict, reason, action, durations)."""

from __future__ import annotations

import os
import time

from .. import jsontext

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Any, Dict

LOG_FILE = "gpugate.log"
_ROTATE_BYTES = 5 << 20


def emit(settings_log: str, state_dir: str, record: Dict[str, Any]) -> str:
    record = dict(record)
    record.setdefault("ts", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    line = jsontext.dumps(record, sort_keys=True, separators=(",", ":"), default=str)
    if settings_log in ("syslog", "both"):
        _syslog(line, record.get("verdict"))
    if settings_log in ("file", "both"):
        if not _append(os.path.join(state_dir, LOG_FILE), line) and settings_log == "file":
            _syslog(line, record.get("verdict"))  # full or read-only state dir: the line still goes somewhere
    return line


def _syslog(line: str, verdict: Any) -> None:
    try:
        import syslog

        syslog.openlog("gpugate", syslog.LOG_PID, syslog.LOG_DAEMON)
        priority = syslog.LOG_INFO if verdict in ("fit", "skipped") else syslog.LOG_WARNING
        syslog.syslog(priority, line)
    except OSError:
        pass  # no syslog socket: the file still has the line


def _append(path: str, line: str) -> bool:
    try:
        from .state import makedirs

        makedirs(os.path.dirname(path))
        try:
            if os.path.getsize(path) > _ROTATE_BYTES:
                os.replace(path, path + ".1")
        except OSError:
            pass
        with open(path, "a") as handle:
            handle.write(line + "\n")
        return True
    except OSError:
        return False  # a full or read-only state dir must not break the check
