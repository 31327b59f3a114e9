"""Xid events from the kernel log (/dev/kmsg, or a regular file in a
simulated sysroot).  Only events inside the policy's window count, and only
those newer than a cursor drain on their own (``fresh``): a stale log line
must not hold a node drained forever.  Older ones in the window are kept for
the judge's rate of non-fatal events."""

from __future__ import annotations

import collections
import errno
import os
import stat

from ..facts import ProbeFailure, XidEvent
from ..parsers.kernlog import parse_kmsg
from ..record import replace

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Any, Mapping, Optional, Tuple

_MAX_BYTES = 16 << 20
# Older-than-cursor events are kept only where a rate is judged: SXids and the
# NVLink5 Xids (gpugate.xidcatalog.NVLINK_XIDS; a test keeps the two equal),
# at most this many (newest first): a flood must not bloat the stored facts.
COUNTED_XIDS = frozenset(range(144, 151))
MAX_OLD_EVENTS = 500


def read_kmsg(path: str) -> Any:
    """The whole ring buffer as text, or a ProbeFailure."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return ProbeFailure("kernel_log", "missing", path)
    except OSError as exc:
        return ProbeFailure("kernel_log", "error", "%s: %s" % (path, exc.strerror or exc))
    try:
        if not stat.S_ISCHR(os.fstat(fd).st_mode):
            size = os.fstat(fd).st_size
            if size > _MAX_BYTES:  # keep the newest part: fresh Xids are at the end
                os.lseek(fd, size - _MAX_BYTES, os.SEEK_SET)
            return _read_all(fd).decode("utf-8", "replace")
        # /dev/kmsg: one record per read(), EAGAIN at the end of the buffer.
        chunks, size = collections.deque(), 0
        while True:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records overwritten while reading: go on
                    continue
                raise
            if not record:
                break
            chunks.append(record)
            size += len(record)
            while size > _MAX_BYTES:  # keep the newest records
                size -= len(chunks.popleft())
        return b"".join(chunks).decode("utf-8", "replace")
    except OSError as exc:
        return ProbeFailure("kernel_log", "error", "%s: %s" % (path, exc.strerror or exc))
    finally:
        os.close(fd)


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def bus_key(bus_id: str) -> str:
    """'00000000:38:00.0' (NVML) and '0000:38:00' (NVRM) -> '0000:38:00'."""
    text = bus_id.lower().split(".")[0]
    parts = text.split(":")
    if len(parts) == 3 and parts[0] and all(c in "0123456789abcdef" for c in parts[0]):
        return "%04x:%s:%s" % (int(parts[0][-8:], 16) & 0xFFFF, parts[1], parts[2])
    if len(parts) == 2:
        return "0000:%s:%s" % (parts[0], parts[1])
    return text


def fresh_xids(text: str, boot_time: Optional[float], after_seq: int, window: float, now: float,
               bus_to_gpu: Mapping[str, int]) -> Tuple[XidEvent, ...]:
    """Events not older than ``window`` seconds; ``fresh`` when after ``after_seq``."""
    out, old = [], 0
    for event in reversed(parse_kmsg(text, boot_time)):
        fresh = event.seq is None or event.seq > after_seq
        if event.timestamp is not None and window and now - event.timestamp > window:
            continue
        if not fresh:
            if not (event.kind == "sxid" or event.kind == "xid" and event.xid in COUNTED_XIDS):
                continue
            old += 1
            if old > MAX_OLD_EVENTS:
                continue
        gpu = bus_to_gpu.get(bus_key(event.pci_bus_id)) if event.kind != "sxid" else None
        out.append(replace(event, gpu=gpu, fresh=fresh))
    return tuple(reversed(out))


def last_seq(text: str) -> int:
    """The newest record's sequence number (the cursor to store)."""
    for line in reversed(text.splitlines()):
        head = line.split(";", 1)[0].split(",")
        if len(head) >= 3 and head[1].isdigit():
            return int(head[1])
    return -1
