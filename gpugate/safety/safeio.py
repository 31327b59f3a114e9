"""Files root writes, and files it reads that others could have made.

Writes are atomic (a temporary file, fsync, rename: a reader sees the old
file or the new one) and never go through a name someone else chose: the
temporary file gets a random name and is created relative to an open fd on
the directory with O_CREAT|O_EXCL|O_NOFOLLOW, so a symlink or file planted
at that name (or any name) fails the create instead of being written
through; the rename replaces whatever sits at the final name, a symlink
included, and never follows it.  A directory others can write gets a
trust walk first (open_checked_dir): there, even the random name would
only move the problem.

Reads are bounded: every file has a byte cap for its kind, and one over it
is an error saying so, never a MemoryError.  A file that may be someone
else's (job or tool output) is opened with O_NOFOLLOW|O_NONBLOCK and must
be a regular file of the expected owner: a symlink, FIFO or device is
refused at once, never read and never waited on.

Only os, stat and errno: the prolog writes its job file with this.
"""

import errno
import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import FrozenSet, Optional, Tuple

# Byte caps, per kind of file gpugate reads.
CONFIG_CAP = 4 << 20  # gpugate.toml, baseline.toml (and their last good copies)
STATE_CAP = 16 << 20  # gpugate's own JSON state (the last health check's facts, kept parses)
AUDIT_CAP = 1 << 30  # the last fleet audit: every node's facts (~20 KB a node)
SYSTEM_CAP = 1 << 20  # a /proc, /sys or /etc file a probe reads
SMALL_CAP = 64 << 10  # a lock's pid, /proc/PID/stat

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_UNTRUSTED = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_TRIES = 8


def too_big(path: str, cap: int) -> OSError:
    return OSError(errno.EFBIG, "larger than gpugate's cap of %d bytes for this file; refused unread" % cap, path)


def refused(path: str, why: str) -> OSError:
    return OSError(errno.EPERM, "%s; refused unread" % why, path)


# ------------------------------------------------------------ directories
def makedirs(path: str, mode: int = 0o755, parents: int = 0o755) -> None:
    """os.makedirs, but what it creates gets exactly ``mode`` (the leaf) and
    ``parents`` (those above it), whatever the umask: every entry point sets
    0o077, and under a umask of 000 os.makedirs made parents 0777.  What
    exists already is left as it is (check_state judges it)."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path.rstrip("/"))
    if parent and parent != path and not os.path.isdir(parent):
        makedirs(parent, parents, parents)
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        return  # made meanwhile by another run: its mode is that run's (the same)
    os.chmod(path, mode)


def open_dir(path: str, create_mode: int = 0) -> int:
    """An fd on a directory gpugate chose itself or already checked (the
    state directory); created (with its parents) at create_mode when not 0."""
    try:
        return os.open(path or ".", _DIR)
    except FileNotFoundError:
        if not create_mode:
            raise
    makedirs(path, create_mode)
    return os.open(path, _DIR)


def open_checked_dir(path: str, what: str, create_mode: int = 0o755) -> int:
    """An fd on a directory that passed the trust walk (gpugate.safety.trust: root's,
    not writable by group or others, nor anything above it); created by root
    when missing and its parent is trusted.  Raises trust.Untrusted naming
    the fix, or OSError."""
    from gpugate.safety import trust

    checked = trust.open_dir(path, what)
    if checked is None:
        makedirs(path, create_mode)
        checked = trust.open_dir(path, what, missing_ok=False)
    try:
        return os.open(".", _DIR, dir_fd=checked)  # the very directory walked
    finally:
        os.close(checked)


# ----------------------------------------------------------------- writes
def temp_name(name: str) -> str:
    """Hidden, unpredictable, and not ending like the real file (node_exporter
    reads only *.prom)."""
    return ".%s.%s.tmp" % (name[:200], os.urandom(8).hex())


def create_new(dir_fd: int, name: str, mode: int, flags: int = os.O_WRONLY) -> int:
    """Create ``name`` below dir_fd; FileExistsError when anything (a file,
    a symlink, a FIFO) is already there."""
    return os.open(name, _CREATE & ~os.O_WRONLY | flags, mode, dir_fd=dir_fd)


def write_atomic(path: str, data: bytes, mode: int = 0o644, durable: bool = True, dir_fd: int = -1,
                 exact_mode: bool = False, replace: bool = True) -> None:
    """Write ``data`` to ``path`` (a name below dir_fd when given, else the
    directory of path is opened) atomically.  exact_mode: chmod the file to
    ``mode`` whatever the umask (a file another daemon must read).
    replace=False: FileExistsError when path exists (a hard link, where the
    file system has them)."""
    own = dir_fd < 0
    if own:
        dir_fd = open_dir(os.path.dirname(path))
    name = os.path.basename(path)
    try:
        for attempt in range(_TRIES):
            tmp = temp_name(name)
            try:
                fd = create_new(dir_fd, tmp, mode)
                break
            except FileExistsError:
                if attempt == _TRIES - 1:
                    raise
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                if exact_mode:
                    os.fchmod(fd, mode)
                if durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            if replace:
                os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            else:
                _link_new(tmp, name, dir_fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except OSError:
                pass
            raise
    finally:
        if own:
            os.close(dir_fd)


def write_in_checked_dir(path: str, data: bytes, what: str, mode: int = 0o644) -> None:
    """Write a file another daemon reads (a Prometheus textfile) into a
    directory that must pass the trust walk first: its mode is ``mode``
    whatever the umask.  trust.Untrusted (nothing written), or OSError."""
    dir_fd = open_checked_dir(os.path.dirname(path), what)
    try:
        write_atomic(path, data, mode=mode, durable=False, dir_fd=dir_fd, exact_mode=True)
    finally:
        os.close(dir_fd)


def _link_new(tmp: str, name: str, dir_fd: int) -> None:
    try:
        os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # no hard links on this file system
        return
    os.unlink(tmp, dir_fd=dir_fd)


# ------------------------------------------------------------------ reads
def read_fd(fd: int, cap: int, path: str) -> bytes:
    """At most cap bytes of fd, or too_big (a file growing while read too)."""
    if os.fstat(fd).st_size > cap:
        raise too_big(path, cap)
    chunks, got = [], 0
    while True:
        chunk = os.read(fd, min(cap + 1 - got, 1 << 20))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        got += len(chunk)
        if got > cap:
            raise too_big(path, cap)


def read_capped(path: str, cap: int, follow: bool = True, dir_fd: int = -1) -> bytes:
    """A regular file gpugate trusts (or a /proc, /sys file), bounded.
    follow=False: a symlink at the last component is refused."""
    fd = open_regular(path, follow=follow, dir_fd=dir_fd)
    try:
        return read_fd(fd, cap, path)
    finally:
        os.close(fd)


def open_regular(path: str, follow: bool = False, dir_fd: int = -1,
                 owners: "Optional[FrozenSet[int]]" = None) -> int:
    """An fd on a regular file (of one of ``owners`` when given), opened
    without blocking: a FIFO, device, socket or (unless follow) a symlink at
    the name is refused with an error naming it."""
    flags = _UNTRUSTED if not follow else _UNTRUSTED & ~os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, dir_fd=None if dir_fd < 0 else dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise refused(path, "is a symbolic link") from None
        if exc.errno == errno.ENXIO:  # a FIFO with no writer, a socket
            raise refused(path, "is not a regular file (a FIFO or socket)") from None
        raise
    try:
        check_regular(os.fstat(fd), path, owners)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_regular(st: os.stat_result, path: str, owners: "Optional[FrozenSet[int]]" = None) -> None:
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or
                stat.S_ISBLK(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) else "not a file")
        raise refused(path, "is not a regular file (%s)" % kind)
    if owners is not None and st.st_uid not in owners:
        raise refused(path, "is owned by uid %d, not by %s" % (
            st.st_uid, " or ".join("root" if u == 0 else "uid %d" % u for u in sorted(owners))))


def identity(st: os.stat_result) -> "Tuple[int, int]":
    return st.st_dev, st.st_ino
