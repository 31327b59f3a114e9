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

from ..probes import gpujournal

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
        last = gpujournal.read_heartbeat(state_dir)
        if isinstance(last, dict) and last.get("boot_id") == boot_id:
            self.seq, self.from_seq = int(last.get("seq", -1)), last.get("from_seq")
            self.lost = [list(w) for w in last.get("lost") or ()]
            self.lost_records = int(last.get("lost_records") or 0)
        else:  # the first run of this boot: the ring is read from its oldest record
            self.seq, self.from_seq, self.lost, self.lost_records = -1, None, [], 0
        self.kept = self.read = 0

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
        if keep:
            self.writer.append(self.boot_id, keep)
        if app:
            self.app_writer.append(self.boot_id, app)
        self.kept += len(keep) + len(app)

    def _lost(self, first: int, last: int) -> None:
        self.lost.append([first, last])
        del self.lost[:-gpujournal.MAX_LOST_WINDOWS]
        self.lost_records += last - first + 1

    def heartbeat(self, now: float, running: bool = True) -> None:
        from .state import write_bytes
        from .. import jsontext

        data = {"boot_id": self.boot_id, "pid": os.getpid(), "started": round(self.started, 3),
                "at": round(now, 3), "running": running, "seq": self.seq, "from_seq": self.from_seq,
                "lost": self.lost, "lost_records": self.lost_records, "kept": self.kept, "read": self.read}
        write_bytes(os.path.join(self.writer.dir, gpujournal.HEARTBEAT),
                    jsontext.dumps(data, sort_keys=True).encode(), durable=False, mode=0o600)

    def close(self, now: float) -> None:
        self.heartbeat(now, running=False)
        self.writer.close()
        self.app_writer.close()


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
        beat, lost = None, follower.lost_records
        while not stop():
            batch = _read_device(fd) if device else _read_file(path)
            follower.feed(batch)
            now = clock()
            if beat is None or now - beat >= heartbeat or follower.lost_records != lost:
                follower.heartbeat(now)
                beat, lost = now, follower.lost_records
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
    from ..safeio import read_capped

    try:
        data = read_capped(path, 64 << 20)
    except FileNotFoundError:  # between the simulator's unlink and rename: the next poll reads it
        return []
    return data.decode("utf-8", "replace").split("\n")[:-1]


def run(settings, node: str, seconds: Optional[float] = None, poll: float = 0.1) -> int:
    """Follow the node's kernel log (a simulated node's with --sim) until
    SIGTERM, or for ``seconds``."""
    import signal

    from ..probes.files import boot_id

    from ..config import check_state

    check_state(settings.state_dir(node))  # root's alone, as the checks that read the journal ask
    root = settings.node_root(node)
    boot = boot_id(root)
    if not isinstance(boot, str):
        raise OSError("cannot read the boot id under %s" % root)
    from ..errors import GpugateError
    from .lock import RunLock, lock_path

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
