"""The GPUs' history of application Xids, kept in the state directory
(gpugate.judges.apprepeat judges it): the epilog records its job's and
judges, the health check judges, the sweep's verification clears it.  A
file that cannot be read or written never fails a run: the history
restarts (said in the log line).

What clears a GPU's history, and why nothing else can:

- its deep diagnostic passed (``gpugate check --mode verify``, run as root
  by the sweep after the GPU reset: DCGM ``-r`` at ``[health]
  xid_repeat_diag`` or deeper, every GPU clean, the verification fit);
- the node was returned to service after it was drained for the finding
  (an admin's RESUME, or ``gpugate sweep forgive`` draining it again for
  the sweep).  The health check, while the history holds a finding, reads
  the node's own Slurm record (the single-node RPC, one a run, on such
  nodes only) and marks the GPUs once it sees the node drained with
  gpugate's reason naming xid_repeat, stamped at least SETTLE seconds
  before (older than any drain the budget keeper gives back within its
  run).  A marked GPU's history is cleared when the node is next seen in
  service, or drained anew with the very reason it had published (the
  keeper draining it again from its old comment after a RESUME, or
  forgive's drain): both need a RESUME or a drain, which only root,
  SlurmUser or a Slurm operator may do, never a job's user.  An admin who
  only edits the comment, drains the node with a reason of their own, or
  resumes a node the keeper drained moments ago trips nothing: the
  finding stands until the diagnostic or a later RESUME."""

import os
import time

from gpugate.judges import apprepeat
from gpugate.safety import state as st

FILE = "xid-history.json"
CAP = 1024 * 1024  # MAX_GPUS x (MAX_JOBS entries + MAX_SEEN keys) of a few dozen bytes fit below
SETTLE = 60.0  # the keeper gives back an over-budget drain within its run (< 30 s)
XID_REPEAT = "xid_repeat"


def _path(settings, node: str) -> str:
    return os.path.join(settings.state_dir(node), FILE)


def _save(path: str, history: dict, before, record: dict) -> None:
    if history != before and (history["gpus"] or before):
        try:
            st.write_json(path, history, durable=False)  # losing it in a crash loses only history
        except OSError as exc:
            record["state_error"] = ("xid history: %s" % exc)[:200]


class _Locked:
    """The history's own lock (state_dir/locks/xid-history.lock, root's
    alone: gpugate.safety.lock): epilogs, the health check and the
    verification read, change and write the file one at a time, so a clear
    is never undone by an epilog that read before it.  ``held`` is False
    when it could not be had within a second (the caller decides)."""

    def __init__(self, settings, node: str):
        from gpugate.safety.lock import RunLock, lock_path

        self.lock, self.held = RunLock(lock_path(settings.state_dir(node), "xid-history")), False

    def __enter__(self):
        from gpugate.errors import GpugateError

        deadline = time.monotonic() + 1.0
        try:
            while not self.lock.acquire():
                if time.monotonic() >= deadline:
                    return self
                time.sleep(0.02)
            self.held = True
        except (GpugateError, OSError):
            pass
        return self

    def __exit__(self, *exc):
        self.lock.release()
        return False


def after_job(settings, node: str, facts, job: str, user: str, gpus, policy, record: dict) -> list:
    """The epilog: add this job's application Xids on its own GPUs (host
    indices; None: slurmd did not say which, and nothing is recorded: on a
    shared node an Xid must not count for a job that did not hold its GPU),
    then judge."""
    path = _path(settings, node)
    if job and gpus is None:
        record["xid_history"] = "the job's GPUs unknown (no SLURM_JOB_GPUS): its Xids not recorded"
    with _Locked(settings, node):  # not had: written anyway (losing a clear beats losing the job's Xids)
        before = st.read_json(path, CAP)
        history = apprepeat.record(before, facts, job, user, gpus, facts.collected_at, policy)
        _save(path, history, before, record)
    return apprepeat.judge(history, facts, facts.collected_at, policy)


def judged(settings, node: str, facts, policy, record=None, read_own=None) -> list:
    """The health check: what the history says (it records nothing: it
    does not know which job an Xid came from).  While it holds a finding
    (or a mark), the node's own Slurm record tells whether the node was
    returned to service since (see the module's docstring)."""
    path = _path(settings, node)
    history = st.read_json(path, CAP)
    now = facts.collected_at
    if apprepeat.standing(history, now, policy) or apprepeat.marked(history):
        state = (read_own or _own_record)(settings, node)  # outside the lock: it may take seconds
        with _Locked(settings, node) as lock:
            history = st.read_json(path, CAP)  # an epilog may have written meanwhile
            after, why = observe(history, state, settings.reason_tag, time.time(), now, policy)
            if lock.held and after is not history:  # not had: the next run marks or clears
                _save(path, after, history, record if record is not None else {})
                history = after
                if why and record is not None:
                    record["xid_history"] = why
    return apprepeat.judge(history, facts, now, policy)


def observe(history, state, tag: str, wall: float, now: float, policy):
    """(the history, what changed) after seeing the node's Slurm record
    (None: not read, nothing changes).  wall: time.time(), Slurm's clock."""
    from gpugate.model import reason as reasons
    from gpugate.slurm import pending

    marks = apprepeat.marked(history)
    if state is None:
        return history, ""
    if state.in_service and marks:
        return (apprepeat.clear(history, list(marks)),
                "returned to service after its xid_repeat drain: GPUs %s' history cleared" % ", ".join(sorted(marks)))
    ours = reasons.parse(state.reason, tag) if state.drain and state.reason else None
    if ours is None or not any(f.component == XID_REPEAT for f in ours.findings):
        return history, ""
    stamp = state.reason_time
    if not isinstance(stamp, (int, float)) or wall - stamp < SETTLE:
        return history, ""  # may yet be given back by the keeper: wait
    seen = pending.read(state.comment)
    if marks and seen is not None and seen.reason == state.reason and stamp > max(marks.values()):
        # Drained again, for the finding it published before: returned to service in between.
        return (apprepeat.clear(history, list(marks)),
                "drained again for its old xid_repeat finding after a RESUME: GPUs %s' history cleared"
                % ", ".join(sorted(marks)))
    buses = [b for b in apprepeat.standing(history, now, policy) if b not in marks]
    if not buses:
        return history, ""
    return apprepeat.mark_drained(history, buses, float(stamp)), ""


def _own_record(settings, node: str):
    """The node's own Slurm record (one RPC), or None."""
    from gpugate.errors import GpugateError
    from gpugate.schedulers.registry import connect

    try:
        # Bounded well inside the health check's budget; no answer leaves the finding standing.
        slurm = connect(settings, timeout=min(float(settings.slurm["timeout_seconds"]), 5.0))
        try:
            return slurm.own_record(node)
        finally:
            slurm.close()
    except (GpugateError, OSError):
        return None


def deepen(settings, node: str, baseline):
    """The baseline a verification runs under: where this node's history
    holds application faults, its DCGM levels end with [health]
    xid_repeat_diag (3, or 4 with EUD where the site sets it), and an AMD
    node runs RVS (its verify levels, (1, 2) where none are set), so that a
    pass proves the GPUs and clears the history."""
    history = st.read_json(_path(settings, node), CAP)
    if not (history or {}).get("gpus"):
        return baseline
    from gpugate.core.record import replace

    health = baseline.health
    if baseline.vendor_for(node) == "amd":
        if _levels(health.rvs.get("verify")):
            return baseline
        return replace(baseline, health=replace(health, rvs=dict(health.rvs, verify=(1, 2))))
    levels = _levels(health.dcgm_diag.get("verify"))
    deep = int(health.xid_repeat_diag)
    if levels and max(levels) >= deep:
        return baseline
    return replace(baseline, health=replace(health, dcgm_diag=dict(health.dcgm_diag, verify=levels + (deep,))))


def _levels(value) -> tuple:
    return tuple(value) if isinstance(value, (list, tuple)) else ((value,) if value else ())


def after_verify(settings, node: str, baseline, result) -> str:
    """A verification that is fit and whose deep diagnostic passed on every
    GPU (DCGM at xid_repeat_diag or deeper; RVS at its last verify level)
    clears the history: all GPUs were tested.  What it did, or ""."""
    from gpugate.model.toolfacts import DcgmDiag

    if baseline.vendor_for(node) == "amd":
        amd = result.facts.amd
        diag = getattr(amd, "rvs", None)  # a ProbeFailure for the whole AMD read has none
        deep, tool = max(_levels(baseline.health.rvs.get("verify")) or (99,)), "rvs -r"
    else:
        diag, deep, tool = result.facts.dcgm_diag, int(baseline.health.xid_repeat_diag), "dcgmi diag -r"
    clean = (isinstance(diag, DcgmDiag) and diag.level >= deep and diag.exit_code == 0 and not diag.failures
             and not diag.not_run and any(r.status == "Pass" for r in diag.results))
    if not (result.verdict.fit and clean):
        return ""
    path = _path(settings, node)
    record: dict = {}
    with _Locked(settings, node):  # the node is drained and idle: no epilog to wait for
        history = st.read_json(path, CAP)
        if not (history or {}).get("gpus"):
            return ""
        _save(path, apprepeat.clear(history), history, record)
    return record.get("state_error") or "%s %d passed: the GPUs' application fault history cleared" % (
        tool, diag.level)
