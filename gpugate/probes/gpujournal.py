"""The GPU event journal: the kernel's GPU driver records, kept by the
follower (gpugate.node.kmsgfollow) in the node's state directory as they
arrive, so that a record the ring lost is still read (issue 33, item 3).

Why a journal, and not only the ring: a job's user makes the kernel log
~1,500 records a second (a refused tmpfs mount option, in a user namespace
of their own: DESIGN.md section 10), and a ring of ~2,340 records turns
over in ~1.6 s; a check every few minutes then reads a ring that no longer
holds the Xid 79 the driver printed.  Other sources were weighed:
- NVML keeps no Xid history: nvmlEventSetWait hands Xid events
  (nvmlEventTypeXidCriticalError) only to a listener registered before they
  happen, a daemon like this one, but without NVSwitch SXids, the split
  "fallen off the bus" records or amdgpu's events;
- DCGM's Xid field (DCGM_FI_DEV_XID_ERRORS) has the values nv-hostengine
  sampled while it watched the field, for the watch's keep age: it needs the
  host engine up and watching before the event, and there is none where a
  site runs no DCGM, nor on AMD nodes;
- amdgpu's RAS counters (sysfs ras/*_err_count, read by the checks already)
  are counters a flood cannot touch, but a GPU reset, a ring timeout or
  "VRAM is lost" are kernel-log events only.
The kernel's own records, read as they arrive by a root daemon that tests
each with a prefix before anything else (bench/bench_kmsg_follow.py: ~480k
records a second on one core, 320x the measured flood), keep up with any
flood a user can make, and keep every driver's event in the form the
parsers already read.

Only what the parsers take for a GPU event is kept: records of the
kernel's facility (a user's /dev/kmsg writes carry LOG_USER and are refused
here as by gpugate.parsers.kernlog), whose message starts with "NVRM:",
"nvidia-nvswitch" or an amdgpu head and reads as an event (or a part of the
split "fallen off the bus").  A user's flood ("tmpfs: Unknown parameter
...") is never kept, nor the driver's other records ("API mismatch", a VM
fault's register dump), so they cannot rotate the journal.  A job's user
still makes some GPU events at will: the application's faults (a faulting
kernel prints an Xid 13 record per faulting SM; Xid 31, 43, the Xid 45 of a
killed process, 94; amdgpu VM faults).  They are kept in parts of their own
(``app-events.log``), so that their storm rotates those only, never an
Xid 79 or 119 out of ``gpu-events.log``.

The files (directory ``kmsg`` of the state directory, root's alone, 0700):
``gpu-events.log`` and its previous part ``gpu-events.log.1`` (rotated by
rename once over MAX_FILE: at most 2 x MAX_FILE on disk; the current part
is preallocated to MAX_FILE when opened, zeros past its entries, so a full
disk cannot refuse a driver's record, and the driver's parts are never
deleted to make room: only the application's are), ``app-events.log``
and ``.1`` rotated the same at MAX_APP_FILE (never preallocated); one line per
record, "BOOT_ID CRC32 RECORD": a line torn by a crash, or of another boot,
fails its check and is skipped (a torn "Xid 79" must never read as
"Xid 7").  ``follower.json``: the follower's heartbeat (coverage)."""

from __future__ import annotations

import os
import zlib

from gpugate.parsers import kernlog as _parse
from gpugate.parsers.kernlog import _AMD_HEADS, kmsg_record
from gpugate.vendors.nvidia.xidcatalog import APP_XIDS
# The checks' side (reading it, every prolog) is in gpugate.probes.kernlog:
# no module more on the prolog's path.
from gpugate.probes.kernlog import APP_EVENTS, DIR, EVENTS, HEARTBEAT, MAX_APP_FILE, MAX_FILE, STALE, coverage, journal_dir as directory, merge, parse_entries, read_events, read_heartbeat

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only
    from typing import Iterable, Optional

_HEADS = ("NVRM:", "nvidia-nvswitch") + _AMD_HEADS
MAX_LOST_WINDOWS = 64  # the follower's own losses it remembers (newest kept)


APP_CODES = APP_XIDS | {45}  # 45: the driver's cleanup of a killed process's channels
GPU, APP = EVENTS, APP_EVENTS  # classify's answers: the part a record is kept in


def classify(record: str) -> Optional[str]:
    """Where the follower keeps this /dev/kmsg record line: APP (an
    application's fault), GPU (any other GPU event, or a part of the split
    "fallen off the bus"), or None (not kept).  A prefix test first: it
    runs on every record of a flood."""
    semicolon = record.find(";", 0, 128)  # past any header kmsg_record reads
    if semicolon < 0 or not record.startswith(_HEADS, semicolon + 1):
        return None
    pri = record[:record.find(",", 0, semicolon)]
    fields = kmsg_record(record) if pri.isdigit() and int(pri) >> 3 == 0 else None
    if fields is None:
        return None
    message = fields[3]
    event = (_parse.parse_xid_message(message) or _parse.parse_sxid_message(message)
             or _parse.parse_amdgpu_message(message))
    if event is None:  # as gpugate.parsers.kernlog.Scanner reads the rest
        off_bus = message[:5].lower() == "nvrm:" and (
            _parse._OFF_BUS.match(message) or _parse._OFF_BUS_HEAD.match(message)
            or message[6:].startswith(_parse._OFF_BUS_TAIL))
        return GPU if off_bus else None
    if event.kind == "xid" and event.xid in APP_CODES or (
            event.kind == "amdgpu" and event.where.split(":", 1)[0] == "vm_fault"):
        return APP
    return GPU


def is_gpu_record(record: str) -> bool:
    """Is this /dev/kmsg record line one the follower keeps?"""
    return classify(record) is not None


def _preallocate(fd: int, size: int) -> None:
    """Allocate the part's blocks up to ``size`` now, so that its appends
    never need a block from the file system (a job that fills the disk
    cannot cost a driver's record).  The file is ``size`` long then, zeros
    past its entries (a reader skips them: no line).  Silently nothing
    where the file system cannot (no fallocate, or already full)."""
    try:
        if os.fstat(fd).st_size < size:
            os.posix_fallocate(fd, 0, size)
    except (OSError, AttributeError, ValueError):
        pass


def _content_end(fd: int) -> int:
    """Where the part's entries end: its length less the preallocated zeros past them."""
    pos = os.fstat(fd).st_size
    while pos > 0:
        n = min(pos, 65536)
        block = os.pread(fd, n, pos - n).rstrip(b"\0")
        if block:
            return pos - n + len(block)
        pos -= n
    return 0


def entry(boot_id: str, record: str) -> bytes:
    record = record.rstrip("\n")
    return ("%s %08x %s\n" % (boot_id, zlib.crc32(record.encode("utf-8", "replace")), record)).encode(
        "utf-8", "replace")


class Writer:
    """Appends entries (past the part's last entry, fsync) and rotates by
    rename, each step crash safe: a reader sees whole parts, and a torn last
    line is skipped.  The driver's current part is preallocated to MAX_FILE
    when it is opened (``_preallocate``): its appends do not hit ENOSPC."""

    def __init__(self, state_dir: str, name: str = EVENTS):
        from gpugate.safety.safeio import makedirs

        self.dir = directory(state_dir)
        makedirs(self.dir, mode=0o700)
        os.chmod(self.dir, 0o700)
        self.path = os.path.join(self.dir, name)
        self.app = name == APP_EVENTS
        self.fd = -1
        self.end = 0  # where the next entry goes: the end of the current part's entries
        self.torn = False  # a failed write left a partial line that the next must end first

    def append(self, boot_id: str, records: Iterable[str]) -> int:
        """Write the records' entries; a part never grows past its bound (a
        burst larger than a part fills it and goes on in the next)."""
        bound = MAX_APP_FILE if self.app else MAX_FILE
        written, chunk = 0, []
        size = self._size()
        for line in (entry(boot_id, r) for r in records):
            if chunk and size + len(line) > bound:
                written += self._write(chunk)
                chunk = []
            if size + len(line) > bound and size:
                self._rotate()
                size = 0
            chunk.append(line)
            size += len(line)
        return written + self._write(chunk)

    def open(self) -> None:
        """Open the current part now (the follower, at its start: the
        driver's part is then preallocated while the disk has room)."""
        self._size()

    def _size(self) -> int:
        """The current part's length: its entries, never the preallocated
        zeros past them (the driver's part, opened, is allocated to its
        bound: ``_preallocate``)."""
        if self.fd < 0:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            os.fchmod(self.fd, 0o600)  # an older file of root's with a looser mode
            if not self.app:
                _preallocate(self.fd, MAX_FILE)
            self.end = _content_end(self.fd)
            # A run killed mid-write left a torn last line: the next entry starts on a line of its own.
            self.torn = bool(self.end) and os.pread(self.fd, 1, self.end - 1) != b"\n"
        return self.end

    def _rotate(self) -> None:
        os.close(self.fd)
        self.fd = -1
        os.replace(self.path, self.path + ".1")  # atomic: the older part is dropped
        self._size()

    def _write(self, chunk) -> int:
        if not chunk:
            return 0
        view = memoryview((b"\n" if self.torn else b"") + b"".join(chunk))
        total = len(view)
        start = self.end
        try:
            os.lseek(self.fd, start, os.SEEK_SET)  # past the entries, into the preallocated part
            while view:
                view = view[os.write(self.fd, view):]
            os.fsync(self.fd)  # an Xid just before a crash is kept
        except OSError:  # a full disk, EIO: no torn line left for the next entry to run into
            done = total - len(view)
            try:
                if start + done < os.fstat(self.fd).st_size:  # within the preallocated part: zeros again
                    os.pwrite(self.fd, bytes(done), start)
                else:
                    os.ftruncate(self.fd, start)
            except OSError:
                self.torn, self.end = True, start + done
            raise
        self.torn, self.end = False, start + total
        return total

    def drop(self, older: bool, boot_id: str):
        """Free the disk this part holds (the follower's answer to a write
        error): the older part (``.1``) or the current one.  Only the
        application's parts are ever dropped: the driver's (an Xid 79 the
        ring no longer holds) are never deleted to make room, whoever fills
        the disk (a driver's Writer answers (False, None)).  Returns (freed:
        whether a file was removed, (first, last) seq of this boot's records
        it held, or None for none, or () when they could not be read)."""
        from gpugate.safety.safeio import read_capped

        if not self.app:
            return False, None
        path = self.path + ".1" if older else self.path
        try:
            data = read_capped(path, 2 * MAX_APP_FILE, follow=False)
        except FileNotFoundError:
            return False, None
        except (OSError, ValueError):
            data = None
        if not older:
            self.close()
            self.torn = False
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        if data is None:
            return True, ()
        seqs = parse_entries(data, boot_id)
        return True, (min(seqs), max(seqs)) if seqs else None

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
