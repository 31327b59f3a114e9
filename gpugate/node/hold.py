"""The fleet drain budget (gpugate.budget.rules), node side: a node never reads
the fleet.  A budgeted finding is *published* on the node's own Slurm
record (its Comment: gpugate.slurm.pending) and the node keeps running jobs
("held"); the budget keeper on the controller (gpugate.keeper.run) drains the
published nodes within each partition's budget.  With no keeper, nothing
budgeted is ever drained, and the findings stay visible.

A node remembers what it published (published.json): while its findings
stay the same its health checks and prologs ask the controller nothing,
but once every REFRESH_SECONDS (gpugate.slurm.pending: it signs the finding
again, or the keeper takes it for an old copy and never drains it).
It reads its own record (the single-node RPC) when its findings change,
and clears its part of the comment once fit, or once gpugate drained it for
more (an acute finding, the sweep's rma or work): a drained node publishes
nothing but the finding the keeper drained it for (gpugate.node.act)."""

from __future__ import annotations

import os
import time

from gpugate.safety import state as st

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Optional

HELD = "held"  # unfit for budgeted findings, published, not drained by the node
# Why a budgeted finding is held when Slurm did not answer: a non-zero exit
# would have slurmd drain the node outside the budget.
UNPUBLISHED = ("Slurm did not answer: the budgeted finding is not published yet (retried next run); "
               "not drained, job not blocked")
PUBLISHED = "published.json"
# These budgeted findings seen on a node gpugate already holds drained for
# more (acute, rma, the sweep's work): nothing is published, and the same
# findings ask Slurm nothing again for REFRESH_SECONDS, as a published hold.
KEPT = "kept.json"


def applies(settings, verdict) -> bool:
    from gpugate.budget import rules as budget  # only an unfit node gets here: not on the healthy path

    return budget.switched_on(float(settings.drain_budget["max_share"])) and budget.applies(verdict)


def published(settings, node: str) -> bool:
    """Has this node published a finding it has not cleared yet?"""
    return os.path.exists(os.path.join(settings.state_dir(node), PUBLISHED))


def held_recently(settings, node: str, verdict) -> Optional[str]:
    """Why the node is held, when it has already published these very
    findings (no controller call needed), or None."""
    if not applies(settings, verdict):
        return None
    record = st.read_json(os.path.join(settings.state_dir(node), PUBLISHED)) or {}
    if record.get("reason") != verdict.reason:
        return None  # new findings (or a damaged record): read and publish again
    from gpugate.slurm.pending import REFRESH_SECONDS

    try:
        age = time.time() - float(record["seen"])
    except (KeyError, TypeError, ValueError):
        return None  # published by a gpugate before proofs: sign it now
    if not 0 <= age < REFRESH_SECONDS:
        return None  # the keeper drains only a recent proof: sign it again
    return _why(record.get("since"), record.get("unsigned"))


def kept_recently(settings, node: str, verdict) -> Optional[str]:
    """Why nothing is published, when these very budgeted findings were
    last seen on a node gpugate holds drained for more (no controller call
    needed), or None."""
    if not applies(settings, verdict):
        return None
    record = st.read_json(os.path.join(settings.state_dir(node), KEPT)) or {}
    if record.get("reason") != verdict.reason:
        return None
    from gpugate.slurm.pending import REFRESH_SECONDS

    try:
        age = time.time() - float(record["at"])
    except (KeyError, TypeError, ValueError):
        return None
    if not 0 <= age < REFRESH_SECONDS:
        return None  # read the node again now and then: an admin may have resumed it
    return ("budgeted finding not published: gpugate holds the node drained for more (Slurm read %ds ago)"
            % int(age))


def remember_kept(settings, slurm, node: str, state, reason: str) -> None:
    """gpugate holds the node drained for more than these budgeted
    findings: clear any span published earlier, remember them (kept_recently)."""
    unpublish(settings, slurm, node, state)
    try:
        st.write_json(os.path.join(settings.state_dir(node), KEPT), {"reason": reason, "at": time.time()},
                      durable=False)
    except OSError:
        pass  # best effort: losing it costs one read on the next run


def _why(since, unsigned=None) -> str:
    try:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(since)))
    except (TypeError, ValueError, OverflowError):
        when = "?"
    if unsigned:
        return ("budgeted finding published UNSIGNED on the node's Slurm record since %s: the budget keeper "
                "never drains it (%s); the node keeps running jobs" % (when, str(unsigned)[:300]))
    return ("budgeted finding published on the node's Slurm record since %s: the budget keeper "
            "(gpugate budget) drains it within its partitions' drain budget; the node keeps running jobs" % when)


def publish(settings, slurm, node: str, state, reason: str) -> str:
    """Publish ``reason`` in the node's comment (written only when it
    changes; an admin's text in the comment is kept).  Returns why held."""
    from gpugate.safety import budgetkey
    from gpugate.slurm import pending

    comment = state.comment if state is not None else ""
    now = int(time.time())
    path = os.path.join(settings.state_dir(node), PUBLISHED)
    mine = st.read_json(path) or {}  # root's own record: its first time is this node's, not a paste's
    first = mine.get("since") if mine.get("reason") == reason else None
    try:
        key, unsigned = budgetkey.load(settings), None
    except budgetkey.KeyUnavailable as exc:
        key, unsigned = None, str(exc)  # published all the same: visible, never drained
    wanted = pending.publish(comment, reason, now, key, node, first if isinstance(first, int) else None)
    if wanted != comment:
        slurm.set_comment(node, wanted)
    mark = pending.read(wanted)
    since = mark.since
    # When it was signed (a proof still fresh is kept as it is), else now.
    record = {"reason": reason, "since": since, "seen": mark.seen if mark.seen is not None else now}
    if unsigned:
        record["unsigned"] = unsigned[:300]
    try:
        st.write_json(path, record, durable=False)
    except OSError:
        pass  # best effort: losing it costs one read on the next run
    try:
        os.unlink(os.path.join(settings.state_dir(node), KEPT))  # no longer held drained for more
    except OSError:
        pass
    return _why(since, unsigned)


def unpublish(settings, slurm, node: str, state) -> None:
    """Clear gpugate's part of the node's comment (fit, or drained by
    gpugate for more: acute, rma, the sweep's work): the keeper must not
    drain it for old findings, nor may it read as waiting for the keeper."""
    from gpugate.slurm import pending

    if state is not None and pending.read(state.comment) is not None:
        slurm.set_comment(node, pending.clear(state.comment))
    for name in (PUBLISHED, KEPT):
        path = os.path.join(settings.state_dir(node), name)
        try:
            if os.path.exists(path):
                os.unlink(path)
        except OSError:
            pass
