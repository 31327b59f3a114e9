"""A function run in a forked child, its answer read back with a deadline.

A wedged GPU can leave NVML stuck in the kernel (D state); a thread stuck
there keeps its whole process alive, so such reads run in a child that the
caller abandons at its deadline.  Small on purpose (no gpugate imports): the
prolog forks its NVML reader before loading the judges, so that the two run
at once.  Fork before starting threads: a fork inherits no lock another
thread holds.

Orders and answers cross the pipes with marshal: plain values only (None,
bool, int, float, str, bytes, tuple, list, dict, set), which is what the
NVML reader answers with, and marshal is built in (pickle costs each
process about 1.5 ms to load, on the prolog's critical path).  Both ends
are the same interpreter, forked, so its format always agrees."""

import marshal
import os
import time

OK, ERROR, TIMEOUT = "ok", "error", "timeout"
# POSIX fixes SIGKILL at 9.  The signal module would load enum (about 2.5 ms)
# before the fork, on the prolog's critical path.
SIGKILL = 9


class Forked:
    """fn() in a child.  With ``prepare``, the child runs prepare() (its
    imports) at once and fn(orders) once the caller sends orders (``send``):
    a child forked before the caller knows what to read.  Without orders
    (``cancel``, or the caller ending) it leaves, having read nothing."""

    def __init__(self, fn, prepare=None):
        self.read_fd, write_fd = os.pipe()
        self.orders_fd = None
        if prepare is not None:
            orders_read, self.orders_fd = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: run, send, leave without cleanup
            os.close(self.read_fd)
            try:
                if prepare is None:
                    answer = (OK, fn())
                else:
                    os.close(self.orders_fd)
                    answer = (OK, fn(_orders(prepare, orders_read)))
            except Exception as exc:  # a bug in a binding must not kill the check
                answer = (ERROR, "%s: %s" % (type(exc).__name__, exc))
            try:
                data = marshal.dumps(answer)
            except ValueError as exc:  # not plain values
                data = marshal.dumps((ERROR, "unserialisable answer: %s" % exc))
            view = memoryview(data)
            while view:
                view = view[os.write(write_fd, view):]
            # The caller reads to the end of the pipe: close it now, not
            # when the exit has unmapped this process (about 1 ms later).
            os.close(write_fd)
            os._exit(0)
        os.close(write_fd)
        if prepare is not None:
            os.close(orders_read)

    def send(self, orders) -> None:
        os.write(self.orders_fd, marshal.dumps(orders))  # a few hundred bytes: within the pipe's buffer
        os.close(self.orders_fd)
        self.orders_fd = None

    def result(self, timeout: float):
        """(OK, value), (ERROR, text) when fn raised or the child died, or
        (TIMEOUT, None): the child is killed and not waited for."""
        import select  # here: the reader is forked before it is needed (an extension module to load)

        chunks, deadline = [], time.monotonic() + max(timeout, 0.0)
        try:
            while True:
                left = deadline - time.monotonic()
                ready, _, _ = select.select([self.read_fd], [], [], max(left, 0.0))
                if not ready:
                    os.kill(self.pid, SIGKILL)  # a D-state child lingers; we do not wait for it
                    return TIMEOUT, None
                chunk = os.read(self.read_fd, 1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
        finally:
            os.close(self.read_fd)
            self.read_fd = None
        _reap(self.pid)
        try:
            return marshal.loads(b"".join(chunks))
        except (EOFError, ValueError, TypeError) as exc:
            return ERROR, "the reader died: %s" % exc

    def cancel(self) -> None:
        """Not needed after all: kill it (it is reaped when this process
        ends).  Again, or after result(): nothing."""
        if self.read_fd is None:
            return
        for fd in (self.orders_fd, self.read_fd):
            if fd is not None:
                os.close(fd)
        self.orders_fd = self.read_fd = None
        try:
            os.kill(self.pid, SIGKILL)
        except ProcessLookupError:
            pass


# Children that had answered but not yet exited: reaped later, by pid (never
# waitpid(-1), which would take other code's children).
_EXITING = []


def _reap(pid: int) -> None:
    """Reap this child if it has exited, else later; and any earlier ones."""
    for child in _EXITING + [pid]:
        try:
            done, _ = os.waitpid(child, os.WNOHANG)
        except ChildProcessError:
            done = child
        if done and child in _EXITING:
            _EXITING.remove(child)
        elif not done and child not in _EXITING:
            _EXITING.append(child)


def finish(limit: float = 2.0) -> None:
    """Wait, at most ``limit`` seconds, for the children that answered and
    are exiting (not the ones killed at a deadline: one stuck in the kernel
    may never go).  Before this process ends: its own resource use then
    counts theirs.  A child whose exit stalls (closing a wedged GPU's device
    can block) is left to init."""
    ends = time.monotonic() + limit
    while _EXITING:
        for child in list(_EXITING):
            try:
                done, _ = os.waitpid(child, os.WNOHANG)
            except ChildProcessError:
                done = child
            if done:
                _EXITING.remove(child)
        if _EXITING:
            if time.monotonic() >= ends:
                return
            time.sleep(0.0005)


def _orders(prepare, fd: int):
    """In the child: prepare, then wait for the orders; none: leave."""
    try:
        prepare()
    except Exception:
        pass  # what it would have loaded fails again, and is reported, when fn loads it
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    if not chunks:
        os._exit(0)  # cancelled, or the caller ended first: nothing read, nothing to say
    return marshal.loads(b"".join(chunks))
