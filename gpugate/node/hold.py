"""Draining within the fleet drain budget (gpugate.budget), node side.

Only a node about to be drained for a budgeted class reads the fleet's
state; the healthy path never gets here.  A node the budget holds in service
remembers that (drain-held.json), so the prolog before each job and the next
health checks do not ask the controller again for the same findings until
``recheck_seconds`` have passed."""

from __future__ import annotations

import os
import time

from ..errors import SlurmError
from . import state as st

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Optional

HELD = "held"  # unfit, not drained: the partition's drain budget is spent
HOLD_FILE = "drain-held.json"
UNSETTLED = "budget-unsettled"  # a budgeted drain sent, its ranking not yet checked
# Slurm stamps reasons in whole seconds: once its clock has passed our
# second, every drain stamped at or before ours is visible.
_SETTLE = 1.1
_SETTLE_MAX = 3.0
# What the jitter leaves per Slurm call still to make (a typical answer
# takes well under a second; slower ones fail safe: "not enough time").
_CALL_RESERVE = 3.0
_DEFAULT_INTERVAL = 60  # no HealthCheckInterval found in slurm.conf


def applies(settings, verdict) -> bool:
    from .. import budget  # only an unfit node gets here: not on the healthy path

    return budget.switched_on(float(settings.drain_budget["max_share"])) and budget.applies(verdict)


def held_recently(settings, node: str, verdict) -> Optional[str]:
    """Why the node was held for these very findings within recheck_seconds, or None."""
    if not applies(settings, verdict):
        return None
    record = st.read_json(os.path.join(settings.state_dir(node), HOLD_FILE)) or {}
    try:
        age = time.time() - float(record.get("at", 0) or 0)
    except (TypeError, ValueError):
        return None  # a damaged record: ask the controller, never "held" by default
    # A clock that jumped backwards gives a negative age: ask again.
    if record.get("reason") == verdict.reason and 0 <= age < float(settings.drain_budget["recheck_seconds"]):
        return str(record.get("why", "drain budget spent"))
    return None


def remember(settings, node: str, verdict, why: Optional[str]) -> None:
    """Record a hold (why) or forget it (None).  Best effort: losing it costs one RPC."""
    path = os.path.join(settings.state_dir(node), HOLD_FILE)
    try:
        if why:
            st.write_json(path, {"at": time.time(), "reason": verdict.reason, "why": why}, durable=False)
        elif os.path.exists(path):
            os.unlink(path)
    except OSError:
        pass


def spread(settings, verdict, left: float) -> Optional[float]:
    """The health check waits a random moment before a budgeted drain, so a
    drift found on every node at once reaches the controller spread out and
    most nodes find the budget already spent (no drain, no give-back).  The
    window is ``jitter_seconds`` ("auto": HealthCheckInterval), cut to what
    the run can spend (``left`` seconds) and still read, drain and re-read.
    Returns the seconds waited, None when the verdict is not budgeted."""
    if not applies(settings, verdict):
        return None
    import random

    wanted = settings.drain_budget["jitter_seconds"]
    if wanted == "auto":
        from .slurmd_limits import conf_paths, health_check_interval

        wanted = health_check_interval(conf_paths(settings)) or _DEFAULT_INTERVAL
    reserve = 3 * min(float(settings.slurm["timeout_seconds"]), _CALL_RESERVE) + _SETTLE
    wait = random.uniform(0, max(0.0, min(float(wanted), left - reserve)))
    time.sleep(wait)
    return wait


def drain_within_budget(settings, slurm, node: str, reason: str, states=None) -> Optional[str]:
    """Drain ``node`` with ``reason`` unless its partitions' budget is spent.
    None when the node is (and stays) drained; otherwise why it was held.
    states: the fleet's node states when the caller has just read them."""
    from .. import budget

    ok, why = budget.admit(node, states if states is not None else slurm.nodes(), *_rule(settings))
    if not ok:
        return why
    # The drain must be followed by the re-read that may give it back: start
    # it only with time left for both (slurmd kills a health check at its
    # timeout, and a drain never checked against the ranking could exceed
    # the budget).  Should the run die in between anyway, the marker makes
    # the next run finish the check (settle_drain).
    need = 2 * max(slurm.slowest, _min_call()) + _SETTLE
    if slurm.time_left() < need:
        raise SlurmError("not enough time left in this run to drain within the drain budget (%.1f s left, "
                         "a Slurm call takes %.1f s): retried on the next run" % (slurm.time_left(), slurm.slowest))
    _set_unsettled(settings, node, True)
    slurm.drain(node, reason)
    return settle_drain(settings, slurm, node, reason)


def unsettled(settings, node: str) -> bool:
    """A budgeted drain was sent but its ranking never checked (the run ended first)."""
    return os.path.exists(os.path.join(settings.state_dir(node), UNSETTLED))


def settle_drain(settings, slurm, node: str, reason: str) -> Optional[str]:
    """After a budgeted drain: keep it if the node ranks within the allowance,
    else give it back.  None when kept (or no longer ours); why when given back."""
    # Nodes that passed admit() together all drained: the ranking decides
    # which keep the drain.  Read once every drain up to ours is stamped.
    _sleep_within(slurm, _SETTLE)
    states = slurm.nodes()
    me = states.get(node)
    if me is not None and me.reason_time is not None:
        wait = min(me.reason_time + _SETTLE - time.time(), _SETTLE_MAX)
        if wait > 0 and _sleep_within(slurm, wait):
            states = slurm.nodes()
            me = states.get(node)
    if me is None or me.reason != reason or not me.drain:
        _set_unsettled(settings, node, False)
        return None  # changed meanwhile (an admin, the sweep): not ours to give back
    from .. import budget

    ok, why = budget.keep(node, states, *_rule(settings))
    if not ok:
        slurm.undrain(node)
    _set_unsettled(settings, node, False)
    return None if ok else why + "; others drained first, drain given back"


def _min_call() -> float:
    # Imported when a drain is near: the Slurm commands (subprocess, threads)
    # are not loaded on the healthy path.
    from ..slurm.commands import MIN_CALL_SECONDS

    return MIN_CALL_SECONDS


def _rule(settings):
    return settings.reason_tag, float(settings.drain_budget["max_share"])


def _sleep_within(slurm, seconds: float) -> bool:
    """Sleep unless that would leave no time for the next Slurm call."""
    if slurm.time_left() - seconds < max(slurm.slowest, _min_call()):
        return False
    time.sleep(seconds)
    return True


def _set_unsettled(settings, node: str, present: bool) -> None:
    path = os.path.join(settings.state_dir(node), UNSETTLED)
    try:
        if present:
            with open(path, "w"):
                pass
        elif os.path.exists(path):
            os.unlink(path)
    except OSError:
        pass  # a full disk: the ranking is still checked in this run
