"""The node's own locks (the health check's and the act lock) and how long
each may be held: its run's budget and the margin slurmd's kill leaves after
it.  A lock held past its bound is stuck (`gpugate facts`, the log line and
gpugate_lock_stuck_seconds say so); the locking itself is
gpugate.safety.lock's."""

from __future__ import annotations

from gpugate.safety.lock import lock_path, lock_stuck


def healthcheck_bound(settings) -> float:
    """The longest a health check holds its lock: its whole budget, and the
    margin slurmd's kill leaves after it (gpugate.node.slurmd_limits)."""
    from gpugate.node.slurmd_limits import MARGIN

    return float(settings.budgets["healthcheck"]) + MARGIN


def act_bound(settings) -> float:
    """The longest a run holds the act lock: only a health check, prolog or
    epilog takes it, each within its budget (the longest of them), and the
    margin slurmd's kill leaves after it."""
    from gpugate.node.slurmd_limits import MARGIN

    return max(float(settings.budgets[m]) for m in ("healthcheck", "prolog", "epilog")
               if m in settings.budgets) + MARGIN


def node_locks_stuck(settings, node: str, now: float, skip=()) -> list:
    """[{"lock", "pid", "seconds"}] for each lock of the node's locks/ held
    past its own bound (healthcheck_bound, act_bound), health check first."""
    stuck = []
    for name, bound in (("healthcheck", healthcheck_bound), ("act", act_bound)):
        if name not in skip:
            found = lock_stuck(lock_path(settings.state_dir(node), name), name, bound(settings), now)
            if found:
                stuck.append(found)
    return stuck


def healthcheck_stuck(settings, node: str, now: float):
    """The first of node_locks_stuck (the health check's, else the act
    lock's), else None (`gpugate facts`, so the audit and `gpugate status`
    see it).  Takes no lock: a check starting meanwhile is not skipped."""
    stuck = node_locks_stuck(settings, node, now)
    return stuck[0] if stuck else None
