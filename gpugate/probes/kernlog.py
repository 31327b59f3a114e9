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

from gpugate.model.facts import ProbeFailure, XidEvent
from gpugate.parsers.kernlog import kmsg_record, parse_kmsg
from gpugate.core.record import replace

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Any, Dict, Mapping, Optional, Tuple

_MAX_BYTES = 16 << 20
# Older-than-cursor events are kept only where a rate is judged: SXids and the
# NVLink5 Xids (gpugate.vendors.nvidia.xidcatalog.NVLINK_XIDS; a test keeps the two equal),
# at most this many (newest first): a flood must not bloat the stored facts.
COUNTED_XIDS = frozenset(range(144, 151))
MAX_OLD_EVENTS = 500
# amdgpu events counted against a per-GPU maximum in the window
# (gpugate.vendors.amd.judge_events: ring_timeout_max, gpu_reset_events_max).
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
    NVML's pci_bus_id or amd-smi's/sysfs' BDF (gpugate.vendors.amd.facts.AmdGpu.bdf):
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


# ---------------------------------------------------------------------------
# The follower's journal (gpugate.probes.gpujournal: why, and its writer):
# read by every check beside the ring, here so that the prolog loads no
# module more for it.
DIR = "kmsg"  # under the node's state directory, 0700
EVENTS = "gpu-events.log"  # and its previous part EVENTS + ".1"
# The application's faults (Xid 13, 31, 43, 45, 94; amdgpu VM faults), which a
# job's user makes at will: kept apart, so that their storm rotates only these
# parts, never an Xid 79 out of EVENTS.
APP_EVENTS = "app-events.log"
HEARTBEAT = "follower.json"
# A part's bound: ~1,800 driver records; two parts cost a prolog at most ~50 ms
# to read and parse (a storm of the driver's events), a few records usually.
MAX_FILE = 256 << 10
MAX_APP_FILE = 64 << 10  # an application's Xid storm: ~450 records a part
STALE = 60.0  # a heartbeat older than this: the follower is down (it beats every 10 s)


def journal_dir(state_dir: str) -> str:
    return os.path.join(state_dir, DIR)


def parse_entries(data: bytes, boot_id: str) -> Dict[int, str]:
    """{seq: record line} of this boot's intact lines (a torn or foreign line is skipped)."""
    import zlib  # only where a follower keeps a journal

    out = {}
    for raw in data.split(b"\n")[:-1]:  # the part after the last newline is a torn write
        line = raw.decode("utf-8", "replace")
        boot, _, rest = line.partition(" ")
        crc, _, record = rest.partition(" ")
        if boot != boot_id or len(crc) != 8:
            continue
        try:
            if int(crc, 16) != zlib.crc32(record.encode("utf-8", "replace")):
                continue
        except ValueError:
            continue
        fields = kmsg_record(record)
        if fields is not None:
            out[int(fields[1])] = record
    return out


def read_events(state_dir: str, boot_id) -> Dict[int, str]:
    """This boot's journaled records; {} when there is no journal (no follower)
    or it is not root's: a file someone else could write is never read."""
    from gpugate.safety.safeio import read_capped

    if not isinstance(boot_id, str) or not os.path.isdir(journal_dir(state_dir)):
        return {}  # no follower here: one stat, not one a part
    out: Dict[int, str] = {}
    for name, cap in ((APP_EVENTS + ".1", MAX_APP_FILE), (APP_EVENTS, MAX_APP_FILE), (EVENTS + ".1", MAX_FILE),
                      (EVENTS, MAX_FILE)):
        path = os.path.join(journal_dir(state_dir), name)
        try:
            st = os.lstat(path)
            if st.st_uid != os.geteuid() or st.st_mode & 0o022:
                continue
            out.update(parse_entries(read_capped(path, 2 * cap, follow=False), boot_id))
        except (OSError, ValueError):
            continue
    return out


def merge(ring_text: str, events: Dict[int, str]) -> str:
    """The ring's records with the journal's it no longer holds, in seq order
    (a record both hold is read once: by its seq)."""
    if not events:
        return ring_text
    lines, seen = [], set()
    for line in ring_text.split("\n"):
        record = kmsg_record(line)
        if record is not None:
            seen.add(int(record[1]))
            lines.append((int(record[1]), line))
    lines += [(seq, line) for seq, line in events.items() if seq not in seen]
    lines.sort(key=lambda item: item[0])
    return "".join(line + "\n" for _, line in lines)


def read_heartbeat(state_dir: str) -> Optional[dict]:
    from gpugate.safety.state import read_json

    path = os.path.join(journal_dir(state_dir), HEARTBEAT)
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        return None
    return read_json(path, 1 << 20)


def coverage(heartbeat: Optional[dict], boot_id, lost: Optional[dict], now: float, stale: float) -> dict:
    """What the follower says of the ring's lost records (``lost``: the
    probe's kernel_log_lost), for the log line, metrics and status:
    {"follower": "following" | "down" | "absent", "covered": bool, "why": ...}.
    ``covered``: every record the ring lost was read by the follower (its
    Xids are in the journal); otherwise Xids in that window may be missed.
    Never a finding: a flood, or a follower down, drains nothing."""
    try:  # the follower's (root's) file; a garbled one is no follower, never a crash
        watched = heartbeat["from_seq"]  # None: nothing read yet, every record is still to come
        beat = (1 << 62 if watched is None else int(watched), int(heartbeat["seq"]), float(heartbeat["at"]),
                [(int(a), int(b)) for a, b in heartbeat.get("lost") or ()], int(heartbeat.get("lost_records") or 0))
    except (TypeError, ValueError, KeyError, AttributeError):
        beat = None
    if beat is None or heartbeat.get("boot_id") != boot_id:
        state = "absent"
    else:
        from_seq, seq, at, windows, follower_lost = beat
        state = "following" if 0 <= now - at <= stale and heartbeat.get("running", True) else "down"
    out = {"follower": state}
    if state != "absent":
        out["follower_lost_records"] = follower_lost
        errors, last = heartbeat.get("write_errors"), heartbeat.get("write_error")
        if isinstance(errors, int) and errors > 0:  # its journal's writes failed (a full disk): it went on
            out["follower_write_errors"] = errors
            at = last.get("at") if isinstance(last, dict) else None
            if isinstance(at, (int, float)) and not isinstance(at, bool):
                out["follower_write_error_at"] = float(at)
    if not isinstance(lost, dict):
        return out
    first, last = lost.get("first"), lost.get("last")
    if state == "absent" or not isinstance(first, int) or not isinstance(last, int):
        out.update(covered=False, why="no follower" if state == "absent" else "records lost while read, seqs unknown")
        return out
    if from_seq > first:
        out.update(covered=False, why="the follower started after seq %d" % first)
    elif any(a <= last and b >= first for a, b in windows):
        out.update(covered=False, why="the follower lost records in seq %d-%d too" % (first, last))
    elif state == "down" and seq < last:
        out.update(covered=False, why="the follower is down since seq %d" % seq)
    else:
        out["covered"] = True
    return out
