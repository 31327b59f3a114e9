"""Frames between gpugate and its pyslurm worker: a 4-byte length, then a
marshal payload (plain values only).  Both ends are the same interpreter
(sys.executable starts the worker), so marshal's format always agrees."""

import marshal
import os
import select
import struct
import time
from typing import Optional

_HEADER = struct.Struct(">I")
MAX_FRAME = 256 << 20  # 256 MiB: a fleet's node records are a few MB


class WireClosed(Exception):
    """The other end closed its pipe (it exited, or was killed)."""


class WireTimeout(Exception):
    """No whole frame before the deadline."""


def write_frame(fd: int, value) -> None:
    data = marshal.dumps(value)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        done = os.write(fd, view)
        view = view[done:]


def read_frame(fd: int, deadline: Optional[float] = None):
    """One value from fd; ``deadline`` (time.monotonic()) or None to wait."""
    size = _HEADER.unpack(_read_exactly(fd, _HEADER.size, deadline))[0]
    if size > MAX_FRAME:
        raise WireClosed("frame of %d bytes is over the %d limit" % (size, MAX_FRAME))
    try:
        return marshal.loads(_read_exactly(fd, size, deadline))
    except (EOFError, ValueError, TypeError) as exc:
        raise WireClosed("unreadable frame: %s" % exc) from None


def _read_exactly(fd: int, size: int, deadline: Optional[float]) -> bytes:
    chunks, got = [], 0
    while got < size:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise WireTimeout()
        chunk = os.read(fd, min(size - got, 1 << 20))
        if not chunk:
            raise WireClosed("pipe closed after %d of %d bytes" % (got, size))
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
