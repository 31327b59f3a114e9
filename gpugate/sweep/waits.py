"""The one way the sweep waits for its scheduler: read only the nodes (or
jobs) still awaited, settle what can be settled, sleep ``poll_seconds``,
until nothing is awaited or the deadline passes.  Deadlines are on the
monotonic clock, so a wall clock step during a sweep neither cuts a wait
short nor stretches it.

A wait rides out a scheduler that does not answer for a while: a read that
failed with an error that says so (``ask_again``: any Slurm read; the API
server's no answer, 429, 5xx) settles nothing and is made again at the
next poll, until the wait's own deadline.  A batch of nodes coming back
from a reboot is when slurmctld is busiest (each slurmd registers); one
read that timed out then must not stop a sweep of many batches.  At the
deadline, a wait whose last read failed raises that error: nodes nobody
could see are never taken as late (a reboot "not back", a drain "still
running"), which would start their failure path on no evidence."""

import time
from typing import Callable, Dict, Iterable, Optional, Set

from gpugate.errors import GpugateError


def poll_until(waiting: Iterable[str], read: Callable[[Set[str]], Dict[str, object]],
               settle: Callable[[Dict[str, object], Set[str]], Iterable[str]], timeout: float,
               interval: float, sleep: Callable[[float], None] = time.sleep,
               note: Optional[Callable[[str], None]] = None) -> Set[str]:
    """Poll until every node is settled; return those still waiting at the deadline.

    read(nodes) -> states of those nodes (one scheduler call for the whole set);
    settle(states, nodes) -> the nodes it took care of (done, left, failed).
    The first read happens at once; later reads every ``interval`` seconds.
    note(text): told when reads start going unanswered (once per run of them).
    """
    deadline = time.monotonic() + float(timeout)
    waiting = set(waiting)
    failed: Optional[GpugateError] = None
    while waiting:
        try:
            states = read(set(waiting))
        except GpugateError as exc:
            if not exc.ask_again:  # each scheduler's error says (gpugate.errors)
                raise
            if failed is None and note is not None:
                note("no answer (%s); reading again every %gs until this wait's deadline"
                     % (str(exc)[:300], float(interval)))
            failed = exc
        else:
            failed = None
            waiting -= set(settle(states, set(waiting)))
        left = deadline - time.monotonic()
        if not waiting:
            break
        if left <= 0:
            if failed is not None:
                raise failed
            break
        sleep(min(float(interval), left))
    return waiting
