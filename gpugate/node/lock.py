"""Non-blocking run locks: slurmd does not serialise health checks, so a hung
check would otherwise pile up copies of itself."""

import fcntl
import os
from typing import Optional


class RunLock:
    def __init__(self, path: str):
        self.path = path
        self.fd: Optional[int] = None

    def acquire(self) -> bool:
        """True when we hold it; False when another run does."""
        os.makedirs(os.path.dirname(self.path), mode=0o755, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, b"%d\n" % os.getpid())
        self.fd = fd
        return True

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()
