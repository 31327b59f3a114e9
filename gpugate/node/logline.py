"""One structured line per node-side run: to syslog/journal and to a file in
the state directory (node, mode, verdict, reason, action, durations)."""

from __future__ import annotations

import os
import stat
import time

from gpugate.core import jsontext

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


_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK


def _append(path: str, line: str) -> bool:
    """Below the state directory's fd (safeio), by name within it only: no
    symlink followed, rotated by a rename inside that directory."""
    try:
        from gpugate.safety.safeio import open_dir

        dir_fd = open_dir(os.path.dirname(path), 0o755)
        name = os.path.basename(path)
        try:
            try:
                if os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_size > _ROTATE_BYTES:
                    os.replace(name, name + ".1", src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except OSError:
                pass
            fd = os.open(name, _APPEND, 0o600, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return False  # not a log file (a FIFO): the line goes to syslog
            os.write(fd, (line + "\n").encode("utf-8", "replace"))
        finally:
            os.close(fd)
        return True
    except OSError:
        return False  # a full or read-only state dir must not break the check
