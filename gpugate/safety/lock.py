"""Run locks only root can take: slurmd does not serialise health checks (a
hung check would pile up copies of itself), one run acts on a node at a
time, one sweep runs at once.

flock() works on a read-only descriptor, so a lock anyone can open is a lock
anyone can hold: a job's `flock -n healthcheck.lock sleep 1d` would skip
every health check, exit 0, gating off.  So every lock file is 0600, owned
by the euid (root on a node), in a directory of its own (LOCKS, 0700):

- the directory is created 0700; one the euid owns with another mode is
  chmod-ed back; one someone else owns (or a symlink) is refused, naming the
  fix (LockRefused);
- the file is opened O_NOFOLLOW|O_CLOEXEC below that directory's fd (created
  with O_EXCL, which follows no symlink) and fstat-checked: a regular file
  of the euid, mode 0600.  Anything else (an old 0644 lock a user may hold
  open, a symlink, a FIFO) is replaced by a fresh inode, made under a
  temporary name and renamed over it: the user's descriptor keeps the
  unlinked old inode, and their flock on it locks nothing;
- once flocked, the name must still be the inode locked (another run may
  have replaced it meanwhile), else the run tries again.

The holder writes "PID EPOCH" (when it took the lock) into the file.  Only
the euid can write there, so holder() is not forged: a run that finds the
lock held for longer than the holder's whole budget reports it, with the
holder's pid and age, instead of skipping quietly forever."""

import errno
import fcntl
import os
import stat
import time

from gpugate.errors import GpugateError

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only
    from typing import Optional, Tuple

LOCKS = "locks"
DIR_MODE, FILE_MODE = 0o700, 0o600
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_TRIES = 8


class LockRefused(GpugateError):
    """The lock's directory or file cannot be made root's alone: no lock was taken."""


def lock_path(directory: str, name: str) -> str:
    """Where lock NAME of a state directory (or the journal's) lives."""
    return os.path.join(directory, LOCKS, name + ".lock")


class RunLock:
    def __init__(self, path: str):
        self.path = path
        self.fd = None  # type: Optional[int]
        self.holder = None  # type: Optional[Tuple[int, float]]

    def acquire(self) -> bool:
        """True when we hold it; False when another run does (``holder``:
        its pid and when it took the lock, if it says).  LockRefused or
        OSError when no lock only root can take could be had."""
        directory, name = os.path.split(self.path)
        dir_fd = _open_dir(directory)
        try:
            for _ in range(_TRIES):
                fd = _open_file(dir_fd, name, self.path)
                if fd is None:
                    continue  # created by another run meanwhile: open that one
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    self.holder = _read_holder(fd)
                    os.close(fd)
                    return False
                if _still_named(fd, dir_fd, name):
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, b"%d %.3f\n" % (os.getpid(), time.time()), 0)
                    self.fd, self.holder = fd, None
                    return True
                os.close(fd)  # replaced while we took it: lock the file now named
        finally:
            os.close(dir_fd)
        raise LockRefused("%s: the lock file kept being replaced while gpugate took it; nothing but gpugate "
                          "should touch %s" % (self.path, directory))

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def held_for(holder, now: float) -> float:
    """How long the holder has held the lock (0 when it did not say, or the
    clock stepped back)."""
    return max(0.0, now - holder[1]) if holder else 0.0


def describe(holder, now: float) -> str:
    """'pid 123 (not running), for 95s': for a log line or an error."""
    if not holder:
        return "a holder that did not say who it is"
    pid = holder[0]
    return "pid %d%s, for %ds" % (pid, "" if _running(pid) else " (not running: a child it forked holds it)",
                                  round(held_for(holder, now)))


def lock_stuck(path: str, name: str, bound: float, now: float):
    """{"lock", "pid", "seconds"} when the lock at path is flocked by a
    holder whose record says it took it more than bound seconds ago."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or not _flocked(st):
            return None
        holder = _read_holder(fd)
    finally:
        os.close(fd)
    age = held_for(holder, now)
    if age <= bound:
        return None
    return {"lock": name, "pid": holder[0], "seconds": round(age)}


def _flocked(st) -> bool:
    """Whether anyone holds a flock on this inode (/proc/locks)."""
    ident = "%02x:%02x:%d" % (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    try:
        with open("/proc/locks") as handle:
            lines = handle.read(4 << 20).splitlines()
    except OSError:
        return True  # cannot tell: the holder's record decides
    for line in lines:
        words = line.split()
        if len(words) >= 6 and words[1] == "FLOCK" and words[5] == ident:
            return True  # "->" (a waiter) has one word more: words[1] is "->"
    return False


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # EPERM: running, someone else's
    return True


def _open_dir(directory: str) -> int:
    """An fd on the lock directory: the euid's, mode 0700 (made so)."""
    from gpugate.safety.state import makedirs

    makedirs(os.path.dirname(directory))  # the state directory (0755 when gpugate makes it)
    try:
        os.mkdir(directory, DIR_MODE)
    except FileExistsError:
        pass
    try:
        fd = os.open(directory, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        raise LockRefused("%s: the lock directory is not a directory (a symlink?): only a directory of root's "
                          "own, mode 0700, keeps others from holding gpugate's locks. Remove it (rm %s); gpugate "
                          "makes it" % (directory, directory)) from None
    try:
        st = os.fstat(fd)
        euid = os.geteuid()
        if st.st_uid != euid:
            raise LockRefused(
                "%s: the lock directory is owned by uid %d, not %s: its owner could hold gpugate's locks and "
                "switch the health check off. Fix: chown %s %s; chmod 700 %s (or remove it: gpugate makes it)"
                % (directory, st.st_uid, "root" if euid == 0 else "uid %d" % euid, euid, directory, directory))
        if stat.S_IMODE(st.st_mode) != DIR_MODE:
            os.fchmod(fd, DIR_MODE)  # ours, made under another umask or by an older gpugate
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_file(dir_fd: int, name: str, path: str):
    """An fd on a lock file only the euid can open, or None when one was
    created by another run between our tries."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        try:
            return _create(dir_fd, name)
        except FileExistsError:
            return None
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENXIO, errno.EISDIR, errno.EACCES, errno.EPERM):
            raise
        return _fresh(dir_fd, name, path)  # a symlink, socket, directory: replaced (or refused)
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == FILE_MODE:
        return fd
    os.close(fd)  # a mode others could open: they may hold it open now, so a new inode
    return _fresh(dir_fd, name, path)


def _create(dir_fd: int, name: str) -> int:
    fd = os.open(name, _FILE_FLAGS | os.O_CREAT | os.O_EXCL, FILE_MODE, dir_fd=dir_fd)
    os.fchmod(fd, FILE_MODE)  # exactly, whatever the umask
    return fd


def _fresh(dir_fd: int, name: str, path: str) -> int:
    """A new lock file renamed over ``name``: whoever has the old one open
    keeps an inode no one locks again."""
    tmp = ".%s.%s.new" % (name, os.urandom(6).hex())
    fd = _create(dir_fd, tmp)
    try:
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as exc:
        os.close(fd)
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise LockRefused("%s: is not a lock file only root can open, and cannot be replaced by one (%s): "
                          "remove it" % (path, exc.strerror or exc)) from None
    return fd


def _still_named(fd: int, dir_fd: int, name: str) -> bool:
    try:
        named = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (mine.st_dev, mine.st_ino)


def _read_holder(fd: int):
    """(pid, since) the holder wrote; None when it wrote nothing readable
    (it is between its flock and its write, or an older gpugate wrote the
    pid only: then since is the file's mtime)."""
    try:
        words = os.pread(fd, 64, 0).split()
        pid = int(words[0])
        since = float(words[1]) if len(words) > 1 else os.fstat(fd).st_mtime
    except (OSError, ValueError, IndexError):
        return None
    return (pid, since) if pid > 0 else None
