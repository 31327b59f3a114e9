"""Local state of a node (in the state directory): the last health check's
verdict and facts for the prolog to reuse, the kernel-log cursor, and per-job
counters for the epilog.  Every write is atomic (write, fsync, rename): a
reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import os

from gpugate.core import jsontext
from gpugate.safety.safeio import STATE_CAP, makedirs, read_capped, write_atomic

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Any, Dict, Optional

LAST = "last-healthcheck.json"
JOBS = "jobs"
# Kubernetes: the hold this node remembers, the authority when its Node is
# registered anew (gpugate.kube.survive): while it is there, a fit run reads the Node.
KUBE_HOLD = "kube-hold.json"


def write_json(path: str, data: Dict[str, Any], durable: bool = True) -> None:
    write_bytes(path, jsontext.dumps(data, sort_keys=True, separators=(",", ":")).encode(), durable)


def write_bytes(path: str, data: bytes, durable: bool = True, mode: int = 0o644) -> None:
    """Atomically, through a random O_EXCL|O_NOFOLLOW temporary name (gpugate.safety.safeio)."""
    directory = os.path.dirname(path)
    makedirs(directory)
    write_atomic(path, data, mode=mode, durable=durable)


def read_json(path: str, cap: int = STATE_CAP) -> Optional[Dict[str, Any]]:
    """The file's object, or None when absent, unreadable or over ``cap``
    bytes (a corrupt state file means "no reusable state", never a crash)."""
    try:
        data = jsontext.loads(read_capped(path, cap).decode("utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def file_signature(path: str) -> Optional[list]:
    """Changes when the file is replaced, edited, chmod-ed or chown-ed:
    invalidates reused verdicts (and so re-runs the ownership check)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size, st.st_ino, st.st_mode, st.st_uid]


def job_path(state_dir: str, job_id: str) -> str:
    safe = "".join(c for c in job_id if c.isalnum() or c in "._-")[:64] or "unknown"
    return os.path.join(state_dir, JOBS, safe + ".json")


def prune_jobs(state_dir: str, keep_seconds: float, now: float) -> None:
    """Job files whose epilog never ran (node crash) must not pile up."""
    directory = os.path.join(state_dir, JOBS)
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        path = os.path.join(directory, name)
        try:
            if now - os.stat(path).st_mtime > keep_seconds:
                os.unlink(path)
        except OSError:
            continue
