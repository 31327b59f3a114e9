"""The one way the sweep waits for Slurm: read only the nodes still awaited,
settle what can be settled, sleep ``poll_seconds``, until nothing is awaited
or the deadline passes.  Deadlines are on the monotonic clock, so a wall
clock step during a sweep neither cuts a wait short nor stretches it."""

import time
from typing import Callable, Dict, Iterable, Set


def poll_until(waiting: Iterable[str], read: Callable[[Set[str]], Dict[str, object]],
               settle: Callable[[Dict[str, object], Set[str]], Iterable[str]], timeout: float,
               interval: float, sleep: Callable[[float], None] = time.sleep) -> Set[str]:
    """Poll until every node is settled; return those still waiting at the deadline.

    read(nodes) -> states of those nodes (one Slurm call for the whole set);
    settle(states, nodes) -> the nodes it took care of (done, left, failed).
    The first read happens at once; later reads every ``interval`` seconds.
    """
    deadline = time.monotonic() + float(timeout)
    waiting = set(waiting)
    while waiting:
        waiting -= set(settle(read(set(waiting)), set(waiting)))
        left = deadline - time.monotonic()
        if not waiting or left <= 0:
            break
        sleep(min(float(interval), left))
    return waiting
