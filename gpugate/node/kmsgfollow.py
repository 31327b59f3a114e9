"""`gpugate kmsg-follow`: read the kernel log record by record as records
arrive and keep the GPU drivers' records in the node's journal
(gpugate.probes.gpujournal says why and what is kept).

It runs as root (slurm_conf/gpugate-kmsg-follow.service), alone per node:
/dev/kmsg opened non-blocking, every record read until EAGAIN, then poll()
until the next one (a heartbeat every HEARTBEAT seconds meanwhile).  A read
that fails with EPIPE means the ring overwrote records before this reader
got them (the kernel's Documentation/ABI/testing/dev-kmsg: the read after
an overwrite fails with EPIPE and the position moves to the oldest record
left): it goes on from there, and the gap in
the sequence numbers is a window *this follower* lost, kept in its
heartbeat (``lost``) so that a check can say that Xids there may be
missed.  Between its runs (a restart, a crash) the same holds: it starts
from the seq its last heartbeat of this boot stored, and the records the
ring no longer holds are a window lost.  Nothing here drains or judges:
the node's checks read the journal beside the ring (gpugate.probes.collect).

It does not stop on its own (issue 44): a journal write that fails (a full
disk, EIO) frees the application's parts, and is tried again; the driver's
parts are never deleted to make room (a kept Xid 79 the ring lost is what a
job that fills the disk would otherwise erase), and the driver's current
part is preallocated to its bound when opened (at start and at each
rotation), so its appends do not meet a full disk.  What it still cannot
keep is dropped, counted (``write_errors``, ``dropped_records``) and its
seqs become a window it lost, so the checks never read that window as
covered.  A heartbeat it cannot write is counted;
one it cannot read back (garbled) is skipped, as if none.

On a simulated node (``--sim``) the kernel log is a regular file the
simulator rewrites; it is read again every ``poll`` seconds and only the
records past the last seq are taken.  Its boot id is read once, at start,
as on a real node where systemd starts it again after each boot: after
`gpugate sim reboot`, start it again too."""

from __future__ import annotations

import errno
import os
import select
import stat
import time

from gpugate.probes import gpujournal

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, List, Optional

HEARTBEAT = 10.0  # seconds between heartbeats when records are few
_BATCH = 4096  # records read before the kept ones are written


def _seq(record: str) -> int:
    """The record's seq, cheaply (-1 when the line is not a record)."""
    first = record.find(",")
    second = record.find(",", first + 1)
    text = record[first + 1:second] if first > 0 and second > first else ""
    return int(text) if text.isdigit() else -1


class Follower:
    """The journal's writer and the follower's own account: the newest seq
    read, the seq it has watched from (this boot), the windows it lost."""

    def __init__(self, state_dir: str, boot_id: str, now: float):
        self.state_dir, self.boot_id, self.started = state_dir, boot_id, now
        self.writer = gpujournal.Writer(state_dir)
        self.app_writer = gpujournal.Writer(state_dir, gpujournal.APP_EVENTS)  # the application's faults
        try:
            self.writer.open()  # the driver's part, preallocated now, while the disk has room
        except OSError:
            pass  # opened again by its first append (a write error then, counted)
        (self.seq, self.from_seq, self.lost, self.lost_records, self.write_errors, self.dropped_records,
         self.write_error) = _resume(gpujournal.read_heartbeat(state_dir), boot_id)
        self.kept = self.read = self.forgot = 0  # forgot: windows a write error cost, this run

    def feed(self, records: List[str]) -> None:
        """Records in the order read; the GPU drivers' are written, the gaps counted."""
        keep, app = [], []
        for record in records:
            seq = _seq(record)
            if seq <= self.seq:
                continue  # read before (a simulated ring read again), or no record
            if self.from_seq is None:
                self.from_seq = seq
            elif seq > self.seq + 1:
                self._lost(self.seq + 1, seq - 1)
            self.seq = seq
            self.read += 1
            part = gpujournal.classify(record)
            if part is not None:
                (app if part == gpujournal.APP else keep).append(record)
        if app:
            self._keep(self.app_writer, app)
        if keep:  # only the application's parts give way: an Xid 79 is worth more than an Xid 13
            self._keep(self.writer, keep)

    def _keep(self, writer, records: List[str]) -> None:
        """Write the records; on a write error (a full disk, EIO) free the
        application's parts, the older before the current, and write again.
        The driver's parts are never deleted to make room (a job that keeps
        the disk full would erase the Xid 79 the ring no longer holds).
        Never an exit: what it could not keep is dropped, counted, and its
        seqs become a window it lost (the checks then say Xids there may be
        missed, never "covered")."""
        steps = [(self.app_writer, True), (self.app_writer, False)]
        while True:
            try:
                writer.append(self.boot_id, records)
                self.kept += len(records)
                return
            except OSError as exc:
                self._failed(exc)
            freed = False
            while steps and not freed:
                part, older = steps.pop(0)
                freed, window = part.drop(older, self.boot_id)
                if window is not None:
                    self._forgot(window)
            if not freed:
                break
        self.dropped_records += len(records)
        self._forgot((_seq(records[0]), _seq(records[-1])))

    def _failed(self, exc: OSError) -> None:
        self.write_errors += 1
        self.write_error = {"at": round(time.time(), 3), "error": "%s: %s" % (
            errno.errorcode.get(exc.errno or 0, "OSError"), str(exc.strerror or exc)[:120])}

    def _forgot(self, window) -> None:
        """Records of these seqs are no longer in the journal: a window lost
        (() : which ones is unknown, so every one read this boot)."""
        first, last = window if window else (self.from_seq if self.from_seq is not None else 0, self.seq)
        self.lost.append([first, last])
        del self.lost[:-gpujournal.MAX_LOST_WINDOWS]
        self.forgot += 1

    def _lost(self, first: int, last: int) -> None:
        self.lost.append([first, last])
        del self.lost[:-gpujournal.MAX_LOST_WINDOWS]
        self.lost_records += last - first + 1

    def heartbeat(self, now: float, running: bool = True) -> None:
        from gpugate.safety.state import write_bytes
        from gpugate.core import jsontext

        data = {"boot_id": self.boot_id, "pid": os.getpid(), "started": round(self.started, 3),
                "at": round(now, 3), "running": running, "seq": self.seq, "from_seq": self.from_seq,
                "lost": self.lost, "lost_records": self.lost_records, "kept": self.kept, "read": self.read,
                "write_errors": self.write_errors, "dropped_records": self.dropped_records}
        if self.write_error:
            data["write_error"] = self.write_error
        try:
            write_bytes(os.path.join(self.writer.dir, gpujournal.HEARTBEAT),
                        jsontext.dumps(data, sort_keys=True).encode(), durable=False, mode=0o600)
        except OSError as exc:  # a full disk: counted, said by the next heartbeat that gets through
            self._failed(exc)

    def close(self, now: float) -> None:
        self.heartbeat(now, running=False)
        self.writer.close()
        self.app_writer.close()


def _resume(last, boot_id: str):
    """(seq, from_seq, lost, lost_records, write_errors, dropped_records,
    write_error) from the last heartbeat of this boot; a first run's where
    there is none, or it is garbled (a heartbeat that cannot be read is
    skipped, never an exit: the ring is then read from its oldest record)."""
    try:
        if not isinstance(last, dict) or last.get("boot_id") != boot_id:
            raise ValueError("no heartbeat of this boot")
        seq, from_seq = _int(last.get("seq", -1)), last.get("from_seq")
        from_seq = None if from_seq is None else _int(from_seq)
        lost = [[_int(a), _int(b)] for a, b in last.get("lost") or ()]
        counts = [_int(last.get(k) or 0) for k in ("lost_records", "write_errors", "dropped_records")]
        error = last.get("write_error")
        return (seq, from_seq, lost[-gpujournal.MAX_LOST_WINDOWS:], *counts,
                error if isinstance(error, dict) else None)
    except (TypeError, ValueError, AttributeError, KeyError):
        return -1, None, [], 0, 0, 0, None


def _int(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise ValueError("not a count: %r" % (value,))
    return value


def follow(path: str, follower: Follower, stop: Callable[[], bool], poll: float = 0.1,
           heartbeat: float = HEARTBEAT, clock: Callable[[], float] = time.time) -> None:
    """Read ``path`` until stop() says so; a heartbeat at the start, every
    ``heartbeat`` seconds, at once after a loss, and at the end."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    device = stat.S_ISCHR(os.fstat(fd).st_mode)
    if not device:
        os.close(fd)  # the simulator replaces the file: opened again each time
        fd = -1
    try:
        poller = select.poll() if device else None
        if poller is not None:
            poller.register(fd, select.POLLIN)
        beat, lost = None, (follower.lost_records, follower.forgot)
        while not stop():
            batch = _read_device(fd) if device else _read_file(path)
            follower.feed(batch)
            now = clock()
            if beat is None or now - beat >= heartbeat or (follower.lost_records, follower.forgot) != lost:
                follower.heartbeat(now)
                beat, lost = now, (follower.lost_records, follower.forgot)
            if len(batch) < _BATCH:
                if poller is not None:
                    poller.poll(int(min(heartbeat, 1.0) * 1000))  # a second at most: stop() is looked at
                else:
                    time.sleep(poll)
    finally:
        if fd >= 0:
            os.close(fd)
        follower.close(clock())


def _read_device(fd: int) -> List[str]:
    """Records until EAGAIN (or a batch's worth); EPIPE: the ring overwrote
    some, the next read gives the oldest left (the seq gap counts them)."""
    out = []
    while len(out) < _BATCH:
        try:
            record = os.read(fd, 8192)
        except BlockingIOError:
            break
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                continue
            raise
        if not record:
            break
        out.append(record.split(b"\n", 1)[0].decode("utf-8", "replace"))  # no " KEY=value" lines
    return out


def _read_file(path: str) -> List[str]:
    from gpugate.safety.safeio import read_capped

    try:
        data = read_capped(path, 64 << 20)
    except FileNotFoundError:  # between the simulator's unlink and rename: the next poll reads it
        return []
    return data.decode("utf-8", "replace").split("\n")[:-1]


def run(settings, node: str, seconds: Optional[float] = None, poll: float = 0.1) -> int:
    """Follow the node's kernel log (a simulated node's with --sim) until
    SIGTERM, or for ``seconds``."""
    import signal

    from gpugate.probes.files import boot_id

    from gpugate.model.config import check_state

    check_state(settings.state_dir(node))  # root's alone, as the checks that read the journal ask
    root = settings.node_root(node)
    boot = boot_id(root)
    if not isinstance(boot, str):
        raise OSError("cannot read the boot id under %s" % root)
    from gpugate.errors import GpugateError
    from gpugate.safety.lock import RunLock, lock_path

    # One follower a node: a second would write every record twice and race on the heartbeat.
    lock = RunLock(lock_path(settings.state_dir(node), "kmsg-follow"))
    if not lock.acquire():
        raise GpugateError("another gpugate kmsg-follow runs for %s (pid %s)"
                           % (node, (lock.holder or ["?"])[0]))
    with lock:
        stopping = []
        signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
        end = None if seconds is None else time.monotonic() + seconds
        follower = Follower(settings.state_dir(node), boot, time.time())
        follow(os.path.join(root, settings.kernel_log.lstrip("/")), follower,
               lambda: bool(stopping) or (end is not None and time.monotonic() >= end), poll=poll)
    return 0
