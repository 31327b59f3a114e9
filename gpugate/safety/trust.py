"""Is a file safe for root to read or run?  OpenSSH's StrictModes, done on
file descriptors.

gpugate runs as root and acts on what its files say and runs the tools they
name, so a file (and every directory above it) that someone else could
change would hand them root.  The walk starts at "/" and opens one component
at a time below the directory it has already checked (O_PATH|O_NOFOLLOW,
dir_fd=...), so what is judged is what was opened: a rename or a swapped
symlink after the check changes nothing.  The caller gets an fd on the very
object checked (read it, or exec it through /proc/self/fd/N).

The rules, with OWNERS = {root} when running as root, else {root, you}:
  - every directory on the way: owned by OWNERS, not writable by group or
    others, unless it is sticky (like /tmp: 1777)
  - an entry of a sticky directory others can write: owned by OWNERS (the
    sticky bit stops others from renaming or removing it; they can only
    create names that do not exist yet)
  - symlinks are followed as the kernel would (absolute targets from "/",
    relative ones from the directory holding the link, at most 40 of them): a
    symlink is as trustworthy as the checked directory it sits in
  - the object itself: owned by OWNERS, not writable by group or others
    (sticky or not), a regular file or a directory as asked, an executable
    with an execute bit; a "#!" script's interpreter is walked too.
No setting switches this off: it would be read from a file being checked.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat

from gpugate.errors import ConfigError

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import FrozenSet, List, Optional, Tuple

FILE, EXECUTABLE, DIRECTORY = "file", "executable", "directory"
MAX_SYMLINKS = 40  # the kernel's limit
_MAX_INTERPRETERS = 4  # "#!" chains the kernel follows (binfmt_script)
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


class Untrusted(ConfigError):
    """Someone other than root could change this: nothing was read or run."""

    def __init__(self, message: str, path: str, culprit: str):
        super().__init__(message)
        self.path = path
        self.culprit = culprit


def trusted_owners(euid: Optional[int] = None) -> FrozenSet[int]:
    """root's files; a non-root dry run (`gpugate check` as an admin) may also
    use its own: it can only hurt itself."""
    euid = os.geteuid() if euid is None else euid
    return frozenset((0, euid))


# --------------------------------------------------------------- the rules
def directory_problem(st: os.stat_result, owners: FrozenSet[int], final: bool = False) -> Optional[str]:
    """Why a directory on the way (final: the directory asked for) is not
    trusted, or None.  A sticky directory passes on the way only: gpugate
    creates names in the final one, and others could have made them first."""
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid not in owners:
        return "is owned by uid %d" % st.st_uid
    if st.st_mode & 0o022 and (final or not st.st_mode & stat.S_ISVTX):
        return "is writable by group or others (mode %04o)" % stat.S_IMODE(st.st_mode)
    return None


def entry_problem(parent: os.stat_result, st: os.stat_result, owners: FrozenSet[int]) -> Optional[str]:
    """An entry of a sticky directory others can write must be ours: only
    then does the sticky bit keep others from replacing it."""
    if parent.st_mode & 0o022 and st.st_uid not in owners:
        return "is owned by uid %d inside a directory others can write" % st.st_uid
    return None


def object_problem(st: os.stat_result, kind: str, owners: FrozenSet[int]) -> Optional[str]:
    if kind == DIRECTORY:
        return directory_problem(st, owners, final=True)
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid not in owners:
        return "is owned by uid %d" % st.st_uid
    if st.st_mode & 0o022:
        return "is writable by group or others (mode %04o)" % stat.S_IMODE(st.st_mode)
    if kind == EXECUTABLE and not st.st_mode & 0o111:
        return "is not executable"
    return None


def _refuse(path: str, what: str, culprit: str, problem: str, owners: FrozenSet[int]) -> Untrusted:
    who = "root" if owners == frozenset((0,)) else "root (or you)"
    where = "%s %s" % (what, problem) if culprit == path else "%s: directory %s %s" % (what, culprit, problem)
    if problem.startswith("is not"):  # a type, not a permission: chown/chmod would not help
        return Untrusted("%s: %s. Nothing was read or run" % (path, where), path, culprit)
    return Untrusted("%s: %s; it must be owned by %s and not writable by group or others, and so must every "
                     "directory above it (chown root %s; chmod go-w %s). Nothing was read or run"
                     % (path, where, who, culprit, culprit), path, culprit)


# ---------------------------------------------------------------- the walk
def _components(path: str) -> List[str]:
    return [part for part in path.split("/") if part not in ("", ".")]


def _walk(path: str, what: str, kind: str, owners: FrozenSet[int], missing_ok: bool) -> Optional[int]:
    """An fd on the checked object (O_RDONLY; O_PATH for a directory), or
    None when it does not exist and missing_ok.  Raises Untrusted or OSError."""
    if not path.startswith("/"):
        raise Untrusted("%s: %s must be an absolute path: gpugate starts with no PATH and an unknown "
                        "working directory; nothing was read or run" % (path, what), path, path)
    root = os.open("/", _PATH_FLAGS | os.O_DIRECTORY)
    stack: List[Tuple[int, str, os.stat_result]] = [(root, "/", os.fstat(root))]
    try:
        problem = directory_problem(stack[0][2], owners)
        if problem:
            raise _refuse(path, what, "/", problem, owners)
        todo = _components(path)
        hops = 0
        while todo:
            name = todo.pop(0)
            if name == "..":
                if len(stack) > 1:
                    os.close(stack.pop()[0])
                continue
            parent_fd, parent_path, parent_st = stack[-1]
            here = os.path.join(parent_path, name)
            try:
                fd = os.open(name, _PATH_FLAGS, dir_fd=parent_fd)
            except FileNotFoundError:
                if not missing_ok:
                    raise
                # gpugate will create it here: others must not get there first.
                problem = directory_problem(parent_st, owners, final=True)
                if problem and parent_st.st_mode & stat.S_ISVTX:
                    raise Untrusted("%s: %s does not exist, and others can create it first in %s: create it "
                                    "as root (mkdir -p -m 755 %s), or choose a directory only root can write"
                                    % (path, what, parent_path, path), path, parent_path) from None
                if problem:
                    raise _refuse(path, what, parent_path, problem, owners) from None
                return None
            keep = False
            try:
                st = os.fstat(fd)
                problem = entry_problem(parent_st, st, owners)
                if problem:
                    raise _refuse(path, what, here, problem, owners)
                if stat.S_ISLNK(st.st_mode):
                    hops += 1
                    if hops > MAX_SYMLINKS:
                        raise OSError(errno.ELOOP, "too many levels of symbolic links", path)
                    target = os.readlink("", dir_fd=fd)  # the link we checked, not its name
                    if target.startswith("/"):
                        while len(stack) > 1:
                            os.close(stack.pop()[0])
                    todo[0:0] = _components(target)
                    continue
                if todo:  # more to come: a directory on the way
                    problem = directory_problem(st, owners)
                    if problem:
                        raise _refuse(path, what, here, problem, owners)
                    stack.append((fd, here, st))
                    keep = True
                    continue
                problem = object_problem(st, kind, owners)
                if problem:
                    raise _refuse(path, what, here, problem, owners)
                if kind == DIRECTORY:
                    keep = True
                    return fd
                return _reopen(parent_fd, name, st, path)
            finally:
                if not keep:
                    os.close(fd)
        # The path ended on a directory already walked ("/", "/a/..").
        fd, here, st = stack[-1]
        problem = object_problem(st, kind, owners)
        if problem:
            raise _refuse(path, what, here, problem, owners)
        return os.dup(fd)
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _reopen(parent_fd: int, name: str, checked: os.stat_result, path: str) -> int:
    """A readable fd on the file checked: same name below the same directory
    fd, and the same inode, or nothing."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent_fd)
    st = os.fstat(fd)
    if (st.st_dev, st.st_ino) != (checked.st_dev, checked.st_ino):
        os.close(fd)
        raise OSError(errno.EAGAIN, "replaced while it was checked; try again", path)
    return fd


# -------------------------------------------------------------------- API
def open_file(path: str, what: str, owners: Optional[FrozenSet[int]] = None) -> int:
    """An O_RDONLY fd on the checked regular file.  Untrusted, or OSError
    (FileNotFoundError when it is missing)."""
    fd = _walk(path, what, FILE, trusted_owners() if owners is None else owners, False)
    assert fd is not None
    return fd


def open_executable(path: str, what: str = "command", owners: Optional[FrozenSet[int]] = None) -> int:
    """An O_RDONLY fd (3 or above) on the checked executable, to run as
    /proc/self/fd/N.
    A "#!" script's interpreter (and its interpreter's) is walked too: a
    trusted script run by an untrusted interpreter is no better."""
    owners = trusted_owners() if owners is None else owners
    fd = _walk(path, what, EXECUTABLE, owners, False)
    assert fd is not None
    if fd < 3:  # a child's stdio is put on 0-2 and would replace it
        low, fd = fd, fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
        os.close(low)
    current = fd
    try:
        for _ in range(_MAX_INTERPRETERS):
            interpreter = _interpreter(current)
            if current != fd:
                os.close(current)
            current = fd
            if interpreter is None:
                return fd
            if not interpreter.startswith("/"):
                raise Untrusted("%s: its #! interpreter %r is not an absolute path. Nothing was run"
                                % (path, interpreter), path, path)
            current = _walk(interpreter, "#! interpreter of %s" % path, EXECUTABLE, owners, False)
        if current != fd:
            os.close(current)
        return fd
    except BaseException:
        if current != fd:
            os.close(current)
        os.close(fd)
        raise


def _interpreter(fd: int) -> Optional[str]:
    """The interpreter a "#!" line names, or None for a binary."""
    head = os.pread(fd, 256, 0)
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].split()
    return os.fsdecode(words[0]) if words else ""


def open_dir(path: str, what: str, missing_ok: bool = True, owners: Optional[FrozenSet[int]] = None) -> Optional[int]:
    """An O_PATH fd on the checked directory, to create and open names below
    it (dir_fd=...), or None when it is missing and missing_ok."""
    return _walk(path, what, DIRECTORY, trusted_owners() if owners is None else owners, missing_ok)


def check_dir(path: str, what: str, missing_ok: bool = True, owners: Optional[FrozenSet[int]] = None) -> None:
    """A directory gpugate keeps state in (created by root when missing)."""
    fd = _walk(path, what, DIRECTORY, trusted_owners() if owners is None else owners, missing_ok)
    if fd is not None:
        os.close(fd)


def check_file(path: str, what: str, missing_ok: bool = True, owners: Optional[FrozenSet[int]] = None) -> None:
    """A state file (the sweep journal): checked, not opened for reading."""
    fd = _walk(path, what, FILE, trusted_owners() if owners is None else owners, missing_ok)
    if fd is not None:
        os.close(fd)
