"""The GPU event journal: the kernel's GPU driver records, kept by the
follower (gpugate.node.kmsgfollow) in the node's state directory as they
arrive, so that a record the ring lost is still read (issue 33, item 3).

Why a journal, and not only the ring: a job's user makes the kernel log
~1,500 records a second (a refused tmpfs mount option, in a user namespace
of their own: DESIGN.md section 10), and a ring of ~2,340 records turns
over in ~1.6 s; a check every few minutes then reads a ring that no longer
holds the Xid 79 the driver printed.  Other sources were weighed: NVML
reports no Xid history (only events to a listener registered before they
happen); DCGM's Xid record (DCGM_FI_DEV_XID_ERRORS) keeps the last Xid per
GPU only, needs DCGM's host engine and its watches, and is absent where
DCGM is; amdgpu's RAS counters count errors, not events like a GPU reset.
The kernel's own records, read as they arrive by a root daemon that tests
each with a prefix before anything else (~1 us a record: bench/
bench_kmsg_follow.py), keep up with any flood a user can make, and keep
every driver's event in the form the parsers already read.

Only what the parsers could take for a GPU event is kept: records of the
kernel's facility (a user's /dev/kmsg writes carry LOG_USER and are refused
here as by gpugate.parsers.kernlog), whose message starts with "NVRM:",
"nvidia-nvswitch" or an amdgpu head.  A user's flood ("tmpfs: Unknown
parameter ...") is never kept, so it cannot rotate the journal.

The files (directory ``kmsg`` of the state directory, root's alone, 0700):
``gpu-events.log`` and its previous part ``gpu-events.log.1`` (rotated by
rename once over MAX_FILE: at most 2 x MAX_FILE on disk); one line per
record, "BOOT_ID CRC32 RECORD": a line torn by a crash, or of another boot,
fails its check and is skipped (a torn "Xid 79" must never read as
"Xid 7").  ``follower.json``: the follower's heartbeat (coverage)."""

from __future__ import annotations

import os
import zlib

from ..parsers.kernlog import _AMD_HEADS, kmsg_record

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Dict, Iterable, Optional

DIR = "kmsg"
EVENTS = "gpu-events.log"
HEARTBEAT = "follower.json"
MAX_FILE = 1 << 20  # ~7,000 driver records a part
_HEADS = ("NVRM:", "nvidia-nvswitch") + _AMD_HEADS
STALE = 60.0  # a heartbeat older than this: the follower is down (it beats every 10 s)
MAX_LOST_WINDOWS = 64  # the follower's own losses it remembers (newest kept)


def directory(state_dir: str) -> str:
    return os.path.join(state_dir, DIR)


def keep(record: str) -> bool:
    """Is this /dev/kmsg record line one the parsers could take for a GPU
    event?  A prefix test first: it runs on every record of a flood."""
    semicolon = record.find(";", 0, 64)
    if semicolon < 0 or not record.startswith(_HEADS, semicolon + 1):
        return False
    pri = record[:record.find(",", 0, semicolon)]
    return pri.isdigit() and int(pri) >> 3 == 0 and kmsg_record(record) is not None


def entry(boot_id: str, record: str) -> bytes:
    record = record.rstrip("\n")
    return ("%s %08x %s\n" % (boot_id, zlib.crc32(record.encode("utf-8", "replace")), record)).encode(
        "utf-8", "replace")


def parse_entries(data: bytes, boot_id: str) -> Dict[int, str]:
    """{seq: record line} of this boot's intact lines (a torn or foreign line is skipped)."""
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
    from ..safeio import read_capped

    if not isinstance(boot_id, str):
        return {}
    out: Dict[int, str] = {}
    for name in (EVENTS + ".1", EVENTS):
        path = os.path.join(directory(state_dir), name)
        try:
            st = os.lstat(path)
            if st.st_uid != os.geteuid() or st.st_mode & 0o022:
                continue
            out.update(parse_entries(read_capped(path, 2 * MAX_FILE, follow=False), boot_id))
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


class Writer:
    """Appends entries (O_APPEND, fsync: an Xid just before a crash is kept)
    and rotates by rename, each step crash safe."""

    def __init__(self, state_dir: str):
        from ..safeio import makedirs

        self.dir = directory(state_dir)
        makedirs(self.dir, mode=0o700)
        os.chmod(self.dir, 0o700)
        self.path = os.path.join(self.dir, EVENTS)
        self.fd = -1

    def append(self, boot_id: str, records: Iterable[str]) -> int:
        data = b"".join(entry(boot_id, r) for r in records)
        if not data:
            return 0
        if self.fd < 0:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                              0o600)
        if os.fstat(self.fd).st_size + len(data) > MAX_FILE:
            os.close(self.fd)
            os.replace(self.path, self.path + ".1")  # the older part is dropped
            self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                              | os.O_CLOEXEC, 0o600)
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]
        os.fsync(self.fd)
        return len(data)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def read_heartbeat(state_dir: str) -> Optional[dict]:
    from ..node.state import read_json

    path = os.path.join(directory(state_dir), HEARTBEAT)
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
    if not isinstance(heartbeat, dict) or heartbeat.get("boot_id") != boot_id:
        state = "absent"
    else:
        age = now - float(heartbeat.get("at") or 0)
        state = "following" if 0 <= age <= stale and heartbeat.get("running", True) else "down"
    out = {"follower": state}
    if state != "absent":
        out["follower_lost_records"] = int(heartbeat.get("lost_records") or 0)
    if not isinstance(lost, dict):
        return out
    first, last = lost.get("first"), lost.get("last")
    if state == "absent" or not isinstance(first, int) or not isinstance(last, int):
        out.update(covered=False, why="no follower" if state == "absent" else "records lost while read, seqs unknown")
        return out
    if int(heartbeat.get("from_seq", 1 << 62)) > first:
        out.update(covered=False, why="the follower started after seq %d" % first)
    elif any(a <= last and b >= first for a, b in heartbeat.get("lost") or ()):
        out.update(covered=False, why="the follower lost records in seq %d-%d too" % (first, last))
    elif state == "down" and int(heartbeat.get("seq", -1)) < last:
        out.update(covered=False, why="the follower is down since seq %s" % heartbeat.get("seq"))
    else:
        out["covered"] = True
    return out
