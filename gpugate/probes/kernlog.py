"""Xid and amdgpu events from the kernel log (/dev/kmsg, or a regular file in a
simulated sysroot).  Only events inside the policy's window count, and only
those newer than a cursor drain on their own (``fresh``): a stale log line
must not hold a node drained forever.  Older ones in the window are kept for
the judge's rate of non-fatal events.

Records lost before gpugate read them are said, never silent (issue 24: a
user's flood of 3,000 records in 4 s pushed a real Xid out of the ring): the
oldest record read is past the cursor (the newest record the last run saw, of
this boot), or read() failed with EPIPE (records overwritten while reading).
Without a cursor (the first run of a boot) the records before the oldest one
read are not counted: the ring of a large node often wraps with its own boot
messages, which would be a finding on every node after every reboot; the
GPUs' state then is NVML's and DCGM's to tell."""

from __future__ import annotations

import collections
import errno
import os
import stat

from ..facts import ProbeFailure, XidEvent
from ..parsers.kernlog import kmsg_record, parse_kmsg
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
# amdgpu events counted against a per-GPU maximum in the window
# (gpugate.judges.amdevents: ring_timeout_max, gpu_reset_events_max).
COUNTED_AMDGPU = ("ring_timeout", "gpu_reset")


def read_kmsg(path: str) -> Tuple[Any, bool]:
    """(the whole ring buffer as text, or a ProbeFailure; whether records were
    overwritten while it was read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return ProbeFailure("kernel_log", "missing", path), False
    except OSError as exc:
        return ProbeFailure("kernel_log", "error", "%s: %s" % (path, exc.strerror or exc)), False
    overwritten = False
    try:
        if not stat.S_ISCHR(os.fstat(fd).st_mode):
            size = os.fstat(fd).st_size
            if size > _MAX_BYTES:  # keep the newest part: fresh Xids are at the end
                os.lseek(fd, size - _MAX_BYTES, os.SEEK_SET)
            return _read_all(fd).decode("utf-8", "replace"), False
        # /dev/kmsg: one record per read(), EAGAIN at the end of the buffer.
        chunks, size = collections.deque(), 0
        while True:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # records overwritten while reading: go on, say so
                    overwritten = True
                    continue
                raise
            if not record:
                break
            chunks.append(record)
            size += len(record)
            while size > _MAX_BYTES:  # keep the newest records
                size -= len(chunks.popleft())
        return b"".join(chunks).decode("utf-8", "replace"), overwritten
    except OSError as exc:
        return ProbeFailure("kernel_log", "error", "%s: %s" % (path, exc.strerror or exc)), overwritten
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
    """'00000000:38:00.0' (NVML), '0000:38:00' (NVRM) and '0000:38:00.0'
    (amdgpu, sysfs) -> '0000:38:00'."""
    text = bus_id.lower().split(".")[0]
    parts = text.split(":")
    if len(parts) == 3 and parts[0] and all(c in "0123456789abcdef" for c in parts[0]):
        return "%04x:%s:%s" % (int(parts[0][-8:], 16) & 0xFFFF, parts[1], parts[2])
    if len(parts) == 2:
        return "0000:%s:%s" % (parts[0], parts[1])
    return text


def fresh_xids(text: str, boot_time: Optional[float], after_seq: int, window: float, now: float,
               bus_to_gpu: Mapping[str, int], amd_bus_to_gpu: Optional[Mapping[str, int]] = None
               ) -> Tuple[XidEvent, ...]:
    """Events not older than ``window`` seconds; ``fresh`` when after ``after_seq``.

    ``bus_to_gpu``: {bus_key(PCI bus id): GPU index} of the node's GPUs, from
    NVML's pci_bus_id or amd-smi's/sysfs' BDF (gpugate.amdfacts.AmdGpu.bdf):
    the key drops the function either way.  ``amd_bus_to_gpu``, when given,
    places the amdgpu events instead (a caller that holds both maps)."""
    out, old = [], 0
    amd_map = bus_to_gpu if amd_bus_to_gpu is None else amd_bus_to_gpu
    for event in reversed(parse_kmsg(text, boot_time)):
        fresh = event.seq is None or event.seq > after_seq
        if event.timestamp is not None and window and now - event.timestamp > window:
            continue
        if not fresh:
            if not _counted(event):
                continue
            old += 1
            if old > MAX_OLD_EVENTS:
                continue
        if event.kind == "sxid":
            gpu = None
        else:
            gpu = (amd_map if event.kind == "amdgpu" else bus_to_gpu).get(bus_key(event.pci_bus_id))
        out.append(replace(event, gpu=gpu, fresh=fresh))
    return tuple(reversed(out))


def _counted(event) -> bool:
    """Is an event older than the cursor kept, for a rate the judges count?"""
    if event.kind == "amdgpu":
        return event.where.split(":", 1)[0] in COUNTED_AMDGPU
    return event.kind == "sxid" or event.kind == "xid" and event.xid in COUNTED_XIDS


def lost_records(text: str, after_seq: int, overwritten: bool) -> Optional[dict]:
    """Records lost before this read: {"records": N, "first": SEQ, "last": SEQ}
    (None where only EPIPE tells, with no seq around the loss), or None when
    nothing is known lost.  ``after_seq``: the cursor, -1 for none."""
    lost = []
    previous = after_seq if after_seq >= 0 else None
    for seq in _seqs(text, whole=overwritten):  # without EPIPE, the ring holds no gap: the first record tells
        if previous is not None and seq > previous + 1:
            lost.append((previous + 1, seq - 1))
        previous = seq if previous is None else max(previous, seq)
    if lost:
        return {"records": sum(last - first + 1 for first, last in lost), "first": lost[0][0], "last": lost[-1][1]}
    return {"records": None, "first": None, "last": None} if overwritten else None


def _seqs(text: str, whole: bool):
    start = 0
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        record = kmsg_record(text[start:end])
        start = end + 1
        if record is not None:
            yield int(record[1])
            if not whole:
                return


def last_seq(text: str) -> int:
    """The newest record's sequence number (the cursor to store)."""
    for line in reversed(text.split("\n")):  # as parse_kmsg frames records
        record = kmsg_record(line)
        if record is not None:
            return int(record[1])
    return -1
