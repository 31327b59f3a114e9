"""Draining within the fleet drain budget (gpugate.budget), node side.

Only a node about to be drained for a budgeted class reads the fleet's
state; the healthy path never gets here.  A node the budget holds in service
remembers that (drain-held.json), so the prolog before each job and the next
health checks do not ask the controller again for the same findings until
``recheck_seconds`` have passed."""

import os
import random
import time
from typing import Optional

from .. import budget
from . import state as st

HELD = "held"  # unfit, not drained: the partition's drain budget is spent
HOLD_FILE = "drain-held.json"
# Slurm stamps reasons in whole seconds: once its clock has passed our
# second, every drain stamped at or before ours is visible.
_SETTLE = 1.1
_SETTLE_MAX = 3.0


def applies(settings, verdict) -> bool:
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


def spread(settings, verdict, limit: float) -> Optional[float]:
    """The health check waits a random moment before a budgeted drain, so a
    drift found on every node at once reaches the controller spread out and
    most nodes find the budget already spent (no drain, no give-back).
    Returns the seconds waited, None when the verdict is not budgeted."""
    if not applies(settings, verdict):
        return None
    wait = random.uniform(0, max(0.0, min(float(settings.drain_budget["jitter_seconds"]), limit)))
    time.sleep(wait)
    return wait


def drain_within_budget(settings, slurm, node: str, reason: str) -> Optional[str]:
    """Drain ``node`` with ``reason`` unless its partitions' budget is spent.
    None when the node is (and stays) drained; otherwise why it was held."""
    rule = (settings.reason_tag, float(settings.drain_budget["max_share"]))
    ok, why = budget.admit(node, slurm.nodes(), *rule)
    if not ok:
        return why
    slurm.drain(node, reason)
    # Nodes that passed admit() together all drained: the ranking decides
    # which keep the drain.  Read once every drain up to ours is stamped.
    time.sleep(_SETTLE)
    states = slurm.nodes()
    me = states.get(node)
    if me is not None and me.reason_time is not None:
        wait = min(me.reason_time + _SETTLE - time.time(), _SETTLE_MAX)
        if wait > 0:
            time.sleep(wait)
            states = slurm.nodes()
            me = states.get(node)
    if me is None or me.reason != reason or not me.drain:
        return None  # changed meanwhile (an admin, the sweep): not ours to give back
    ok, why = budget.keep(node, states, *rule)
    if ok:
        return None
    slurm.undrain(node)
    return why + "; others drained first, drain given back"
