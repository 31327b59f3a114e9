"""Every external command goes through ``run``: argv only, a timeout, its own
process group (so a hung tool's children die with it), and a typed error that
carries argv, exit code and output.  Never ``shell=True``.  Its output is read
with a byte cap: a tool printing without end is killed there, not read
until memory runs out.  The program must
be an absolute path that only root can change (gpugate.safety.trust), and the file
checked is the file run (/proc/self/fd/N), whatever the path says later."""

import os
import select
import selectors
import signal
import subprocess
import time
from typing import Mapping, Optional, Sequence

from gpugate.safety import trust
from gpugate.errors import CommandError
from gpugate.core.record import dataclass

# Exit codes that still come with a valid answer on stdout (dcgmi diag: a test
# failed / an isolate-class failure).  Callers pass them in ``ok_codes``.
_KILL_GRACE = 1.0
# The most a tool may print: far above any answer gpugate reads (dcgmi diag's
# JSON of 8 GPUs is ~100 KB); a call that reads a larger one says so (max_stdout).
MAX_STDOUT = 16 << 20
MAX_STDERR = 1 << 20
_CHUNK = 1 << 16
# The calls in flight, by pid: a run that leaves at its deadline while a
# tool still hangs stops their process groups (stop_running), or a hung
# dcgmi would outlive every health check that started one.
_running = {}


@dataclass(frozen=True)
class Result:
    argv: tuple
    rc: int
    stdout: str
    stderr: str


def run(argv: Sequence[str], timeout: float, env: Optional[Mapping[str, str]] = None,
        ok_codes: Sequence[int] = (0,), input_text: Optional[str] = None, max_stdout: int = MAX_STDOUT,
        max_stderr: int = MAX_STDERR, pass_fds: Sequence[int] = ()) -> Result:
    """Run argv; return its Result when rc is in ok_codes, else raise
    CommandError (also when it prints more than max_stdout or max_stderr
    bytes: it is killed there, with its process group).  pass_fds: the
    caller's descriptors the child keeps (a checked file it opens as
    /proc/self/fd/N)."""
    argv = [str(a) for a in argv]
    if not argv:
        raise CommandError(argv, "empty command")
    if timeout <= 0:
        raise CommandError(argv, "%s: no time left in the budget" % argv[0], timed_out=True)
    fd = _open_checked(argv)
    try:
        # argv[0] stays what the tool expects; the kernel runs the checked
        # inode (a "#!" interpreter gets /proc/self/fd/N, kept open by pass_fds).
        proc = subprocess.Popen(
            argv, executable="/proc/self/fd/%d" % fd, pass_fds=(fd,) + tuple(pass_fds),
            stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(env) if env is not None else None,
            start_new_session=True, close_fds=True)
    except FileNotFoundError:
        raise CommandError(argv, "%s: cannot start it through /proc/self/fd (is /proc mounted?)" % argv[0],
                           missing=True) from None
    except PermissionError as exc:
        raise CommandError(argv, "%s: cannot execute (%s)" % (argv[0], exc), missing=True) from None
    except OSError as exc:
        raise CommandError(argv, "%s: cannot start (%s)" % (argv[0], exc)) from None
    finally:
        os.close(fd)
    _running[proc.pid] = proc
    deadline = time.monotonic() + timeout
    try:
        out, err = read_output(proc, argv, deadline, (max_stdout, max_stderr), input_text)
        proc.wait(max(deadline - time.monotonic(), 0.001))  # both pipes closed: it is leaving
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise CommandError(argv, "%s: timed out after %.1fs" % (argv[0], timeout),
                           timed_out=True) from None
    finally:
        _running.pop(proc.pid, None)
        _close_pipes(proc)
    stdout = out.decode("utf-8", "replace")
    stderr = err.decode("utf-8", "replace")
    if proc.returncode not in ok_codes:
        first = (stderr.strip() or stdout.strip()).splitlines()[:1]
        raise CommandError(argv, "%s exited %d%s" % (argv[0], proc.returncode,
                                                     ": " + first[0][:200] if first else ""),
                           rc=proc.returncode, stdout=stdout, stderr=stderr)
    return Result(tuple(argv), proc.returncode, stdout, stderr)


def read_output(proc: subprocess.Popen, argv, deadline: float, caps=(MAX_STDOUT, MAX_STDERR),
                input_text: Optional[str] = None, kill=None) -> list:
    """Popen.communicate with a cap on each pipe: [stdout, stderr] bytes
    (b"" for one not piped) once both are closed.  subprocess.TimeoutExpired
    at the deadline (time.monotonic()); CommandError once a pipe brings more
    than its cap, after ``kill(proc)`` (default: SIGTERM, then SIGKILL, its
    process group)."""
    pending = memoryview(input_text.encode("utf-8")) if input_text is not None else None
    names = ("stdout", "stderr")
    pipes = {pipe.fileno(): i for i, pipe in enumerate((proc.stdout, proc.stderr)) if pipe is not None}
    # One growing buffer a pipe: a list of os.read() results can hold far
    # more memory than its bytes when reads come back small (each is a
    # _CHUNK allocation shrunk in place), seen as ~280 MB for a 16 MiB cap.
    chunks, sizes = (bytearray(), bytearray()), [0, 0]
    with selectors.PollSelector() as selector:
        for fd in pipes:
            selector.register(fd, selectors.EVENT_READ)
        if pending is not None:
            if pending:
                selector.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
            else:
                proc.stdin.close()
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(argv, 0)
            for key, _ in selector.select(left):
                if key.fd not in pipes:  # stdin: a write of PIPE_BUF never blocks once it polls writable
                    try:
                        pending = pending[os.write(key.fd, pending[:select.PIPE_BUF]):]
                    except BrokenPipeError:  # it stopped reading: its answer tells
                        pending = pending[:0]
                    if not pending:
                        selector.unregister(key.fd)
                        proc.stdin.close()
                    continue
                i = pipes[key.fd]
                data = os.read(key.fd, _CHUNK)
                if not data:
                    selector.unregister(key.fd)
                    continue
                sizes[i] += len(data)
                if sizes[i] > caps[i]:
                    (kill or _kill_group)(proc)
                    raise CommandError(argv, "%s: printed more than %s on %s; killed"
                                       % (argv[0], _size(caps[i]), names[i]), overflow=True)
                chunks[i].extend(data)
    return [bytes(c) for c in chunks]


def _size(n: int) -> str:
    return "%d MiB" % (n >> 20) if n >= 1 << 20 and not n % (1 << 20) else "%d bytes" % n


def _open_checked(argv) -> int:
    """An fd on argv[0] after the trust walk, or CommandError: nothing runs."""
    try:
        fd = trust.open_executable(argv[0])
    except trust.Untrusted as exc:
        raise CommandError(argv, str(exc), refused=True) from None
    except FileNotFoundError:
        raise CommandError(argv, "%s: not found" % argv[0], missing=True) from None
    except OSError as exc:
        raise CommandError(argv, "%s: cannot open it to check it (%s)" % (argv[0], exc.strerror or exc),
                           missing=isinstance(exc, (NotADirectoryError, PermissionError))) from None
    return fd


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM then SIGKILL the whole process group; never wait unbounded,
    and read nothing more (a tool printing on while it dies would be read
    without a cap): our ends of its pipes are closed first."""
    _close_pipes(proc)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=_KILL_GRACE)
            return
        except subprocess.TimeoutExpired:
            continue
    # A process stuck in the kernel (D state) cannot be reaped; leave it.


def _close_pipes(proc: subprocess.Popen) -> None:
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            try:
                pipe.close()
            except OSError:  # stdin's buffer, to a reader that left
                pass


def stop_running() -> None:
    """SIGKILL the process group of every call still in flight: this
    process is leaving (a node-side run at its deadline) and will read none
    of their answers.  The threads waiting on them end with the process."""
    for proc in list(_running.values()):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
