"""The smoke jobs' output files, the proof a node is resumed on: made by
the sweeper in the checked ``smoke_output_dir`` before each job is submitted
(O_CREAT|O_EXCL|O_NOFOLLOW, an unpredictable name, root's, 0600) and read
back only if still that very file, written since, bounded (gpugate.sweep.smoke
has the whole story)."""

import errno
import os
from typing import Dict, List

from gpugate.safety import safeio
from gpugate.errors import ConfigError

JOB_NAME = "gpugate-smoke"
MAX_OUTPUT = 8 << 20
HEAD = 64 << 10


class Outputs:
    """The jobs' output files in the checked ``smoke_output_dir``: each made
    by the sweeper before its job is submitted, so a file planted there
    (only root could) or left by an earlier job is never the proof."""

    def __init__(self, outdir: str):
        self.outdir = outdir
        try:
            self.dir_fd = safeio.open_checked_dir(outdir, "[sweep] smoke_output_dir")
        except OSError as exc:
            raise ConfigError("%s: cannot use [sweep] smoke_output_dir: %s" % (outdir, exc.strerror or exc)) from None
        self.made: Dict[str, tuple] = {}  # label -> (name, stat at creation)
        # Held open until judged: an inode in use is never freed, so its number
        # cannot come back as a file made in its place (the read compares it).
        self.held: List[int] = []

    def close(self) -> None:
        for fd in self.held + [self.dir_fd]:
            os.close(fd)

    def create(self, label: str) -> str:
        """A new empty file (O_CREAT|O_EXCL|O_NOFOLLOW, 0600, an unpredictable
        name) for the job's --output: its path."""
        for _ in range(8):
            name = "%s-%s-%s.out" % (JOB_NAME, label.replace(",", "+"), os.urandom(6).hex())
            try:
                fd = safeio.create_new(self.dir_fd, name, 0o600)
            except FileExistsError:
                continue
            except OSError as exc:
                raise ConfigError("%s: cannot create the smoke job's output: %s" % (
                    os.path.join(self.outdir, name), exc.strerror or exc)) from None
            self.held.append(fd)
            self.made[label] = (name, os.fstat(fd))
            return os.path.join(self.outdir, name)
        raise ConfigError("%s: cannot create a new smoke job output file (every name taken)" % self.outdir)

    def reader(self, label: str):
        name, made = self.made[label]
        return Output(os.path.join(self.outdir, name), lambda: _read_bounded(name, self.dir_fd, made))

    def name_after(self, label: str, job: str) -> None:
        """gpugate-smoke-NODE-JOB.out, for the admin who reads it (best effort)."""
        name, made = self.made[label]
        final = "%s-%s-%s.out" % (JOB_NAME, label.replace(",", "+"), job)
        try:
            if safeio.identity(os.stat(name, dir_fd=self.dir_fd, follow_symlinks=False)) == safeio.identity(made):
                os.rename(name, final, src_dir_fd=self.dir_fd, dst_dir_fd=self.dir_fd)
        except OSError:
            pass


class Output:
    """One job's output: its path (for messages) and read() -> the text, or OSError."""

    def __init__(self, path: str, read):
        self.path, self.read = path, read


def _read_bounded(path: str, dir_fd: int = -1, made=None) -> str:
    """The output, or (NCCL_DEBUG=INFO can write gigabytes) its head, where
    the versions are, and its last MAX_OUTPUT bytes, where the table, the
    averages and the failure lines are.  Only a regular file of root's (the
    job's user: gpugate's own when a non-root admin dry-runs) opened without
    following a symlink or waiting on a FIFO; when ``made`` (its stat at
    creation) is given, that very file, written since.  Else OSError."""
    from gpugate.safety.trust import trusted_owners

    fd = safeio.open_regular(path, dir_fd=dir_fd, owners=trusted_owners())
    try:
        st = os.fstat(fd)
        if made is not None and safeio.identity(st) != safeio.identity(made):
            raise safeio.refused(path, "is not the file the sweeper created for the job (replaced)")
        if made is not None and (st.st_size, st.st_mtime_ns, st.st_ctime_ns) == (
                made.st_size, made.st_mtime_ns, made.st_ctime_ns):
            raise OSError(errno.ENOENT, "the job never opened its output", path)
        size = st.st_size
        if size <= MAX_OUTPUT + HEAD:
            data = os.pread(fd, MAX_OUTPUT + HEAD, 0)
        else:
            data = os.pread(fd, HEAD, 0) + b"\n"
            data += os.pread(fd, MAX_OUTPUT, size - MAX_OUTPUT).split(b"\n", 1)[-1]  # from the first whole line
    finally:
        os.close(fd)
    return data.decode("utf-8", "replace")
