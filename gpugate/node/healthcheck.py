"""HealthCheckProgram: the full check, run by slurmd on its interval.

One run at a time (a run that finds another in progress exits quietly), one
time budget well under slurmd's 60 s kill, drain when unfit, and a local
record of facts and verdict for the prolog to reuse.  With [nhc] set, the
site's NHC runs between judging and acting, in its share of the budget
(gpugate.node.nhc)."""

import os
import time
from gpugate.errors import GpugateError
from gpugate.model.facts import to_jsonable
from gpugate.model.findings import PROBE
from gpugate.judges import hca
from gpugate.judges import iblinks
from gpugate.judges import lost
from gpugate.judges import operator
from gpugate.judges import operator_images
from gpugate.judges import throttle
from gpugate.probes import files
from gpugate.model.verdict import decide
from gpugate.preflight import memory as preflight_memory
from gpugate.node import nhc
from gpugate.node import kube_operator_labels as operator_labels
from gpugate.safety import state as st
from gpugate.node import xidhistory
from gpugate.node.act import act, gpu_identities
from gpugate.node.hold import HELD
from gpugate.node.check import ACT_RESERVE, run_check
from gpugate.node.lastgood import load_baseline
from gpugate.safety.lock import RunLock, lock_path
from gpugate.node.slurmd_limits import slurm_node_is_healthy

# Transient right after boot: services still starting, DCGM not yet up.
_GRACE_COMPONENTS = ("fabricmanager", "fabric", "dcgm_health", "dcgm")


def run(settings, node: str, record: dict) -> int:
    started = time.monotonic()
    lock, holder = _take_lock(settings.state_dir(node), record)
    if lock is None:
        return _busy(settings, node, holder, record)
    with lock:
        from gpugate.node.locks import node_locks_stuck

        # The other locks (act): held past their bound, no run drains or resumes the node.
        stuck = node_locks_stuck(settings, node, time.time(), skip=("healthcheck",))
        if stuck:
            record["lock_stuck"] = stuck[0]
        settings = _within_slurmd_timeout(settings, record)
        # Every Slurm call below ends by this deadline (slurmd kills the run soon after).
        deadline = started + float(settings.budgets["healthcheck"])
        judged = _judge(_nhc_share(settings), node, record)
        nhc_outcome = _run_nhc(settings, node, judged, deadline, record)
        outcome = _act(settings, node, judged, deadline, nhc_outcome)
        _save_state(settings, node, judged, outcome, record)
        if settings.prometheus_textfile:
            from gpugate.node.metrics import write_node_textfile

            not_written = write_node_textfile(settings.prometheus_textfile, node, judged.verdict, judged.facts,
                                              judged.baseline, held=outcome["action"] == HELD,
                                              config_error=bool(record.get("config_error")),
                                              nhc=(nhc_outcome or {}).get("result", ""),
                                              clocks=throttle.shares_over(judged.clocks),
                                              stuck={s["lock"]: s["seconds"] for s in stuck},
                                              preflight=preflight_memory.stats(settings, node))
            if not_written:  # logged; the verdict and the drain stand
                record["metrics_error"] = not_written[:600]
        _log_fields(record, judged, outcome)
        return judged.verdict.exit_code


def _take_lock(state_dir: str, record: dict):
    """(the run lock, None), or (None, its holder) when another run holds
    it.  Only root can take it (gpugate.safety.lock)."""
    lock = RunLock(lock_path(state_dir, "healthcheck"))
    try:
        if not lock.acquire():
            return None, lock.holder
    except (OSError, GpugateError) as exc:
        # A full or read-only state directory, or a lock directory someone
        # else owns (the error names the fix), must not switch the check off.
        record["state_error"] = ("no lock: %s" % exc)[:600]
    return lock, None


def _busy(settings, node: str, holder, record: dict) -> int:
    """Another health check holds the lock.  Within its whole budget (and
    the margin slurmd leaves after it): skipped, exit 0.  Longer: stuck (a
    run, or a child it forked, hangs; only root can take the lock), and
    every check skipped meanwhile is a node nobody gates: said in the log
    line with the holder's pid and age, in the metric
    gpugate_lock_stuck_seconds, and by exit 2 (could not judge)."""
    from gpugate.node.locks import healthcheck_bound, node_locks_stuck
    from gpugate.safety.lock import describe, held_for

    now = time.time()
    age, bound = held_for(holder, now), healthcheck_bound(settings)
    if age <= bound:
        record.update(verdict="skipped", why="previous health check still running")
        if holder:
            record["lock_holder"] = holder[0]
        return 0
    record.update(verdict="error", lock_stuck={"lock": "healthcheck", "pid": holder[0], "seconds": round(age)},
                  error="health check lock held by %s, longer than a health check's whole budget (%ds): no "
                        "health check runs on this node until it ends; look at that process (kill it if it "
                        "hangs)" % (describe(holder, now), bound))
    if settings.prometheus_textfile:
        from gpugate.node.metrics import write_lock_stuck

        others = node_locks_stuck(settings, node, now, skip=("healthcheck",))
        not_written = write_lock_stuck(settings.prometheus_textfile,
                                       dict({s["lock"]: s["seconds"] for s in others}, healthcheck=age))
        if not_written:
            record["metrics_error"] = not_written[:600]
    return 2


class _Judged:
    """What one run found, and what it read to find it."""

    __slots__ = ("baseline", "last", "last_path", "boot_id", "cursor", "in_service", "facts", "verdict",
                 "in_grace", "expected_gpus", "clocks", "links", "read_at")


def _judge(settings, node: str, record: dict) -> _Judged:
    j = _Judged()
    j.in_service = slurm_node_is_healthy(os.environ)
    if j.in_service is not None:
        record["slurm_in_service"] = j.in_service
    j.baseline = load_baseline(settings, record)
    j.last_path = os.path.join(settings.state_dir(node), st.LAST)
    j.last = st.read_json(j.last_path) or {}
    j.boot_id = files.boot_id(settings.node_root(node))
    j.cursor = j.last.get("kmsg_cursor", -1) if j.last.get("boot_id") == j.boot_id else -1
    from gpugate.probes.reuse import reset_cursor

    # The sweep's own GPU reset: what the kernel logged up to it (amdgpu's
    # "GPU reset begin!", the fault that called for it) was judged by the
    # verification after it, which starts from the same place.
    j.cursor = max(j.cursor, reset_cursor(settings, node, j.boot_id))
    j.expected_gpus = j.baseline.expect_for(node).gpus
    last_high = lost.high_for(j.last, j.baseline.vendor_for(node))
    j.clocks, j.links = j.last.get("clocks"), j.last.get("ib_links")

    # Kubernetes: the operator's view of the node, in a bounded share of the run's budget.
    seen = operator_labels.read(settings, node, j.baseline,
                                deadline=time.monotonic() + operator_labels.share(settings.budgets["healthcheck"]))

    def history(facts):  # what this node showed before: GPUs, HCA ports and counters, clock-event time
        found, j.clocks = throttle.step(j.last.get("clocks"), facts, j.baseline.health)
        links, j.links = iblinks.step(j.last.get("ib_links"), facts, j.baseline.health, facts.collected_at)
        return (lost.judge(last_high, j.expected_gpus, facts) + found + links
                + xidhistory.judged(settings, node, facts, j.baseline.health, record)
                + preflight_memory.judged(settings, node, j.boot_id if isinstance(j.boot_id, str) else None,
                                          facts.collected_at)
                + hca.judge_history(j.last.get("ib"), facts, j.baseline.health.ib_counter_max)
                + operator.judge(j.baseline, node, seen.labels, seen.label_error)
                + operator_images.judge(j.baseline, node, seen.images, seen.image_error))

    j.read_at = time.time()  # before the first read: a GPU reset after it makes the verdict stale (act)
    result = run_check(settings, j.baseline, node, "healthcheck", xid_after=j.cursor, extra=history)
    j.facts = result.facts
    j.verdict, j.in_grace = _boot_grace(settings, result)
    return j


def _act(settings, node: str, j: _Judged, deadline: float, nhc_outcome) -> dict:
    if j.in_grace and j.verdict.fit:
        # Only transient-looking findings: report, but neither drain nor
        # undrain, and do not let the prolog reuse this as "fit".
        return {"action": "none", "ok": True, "applied": False, "why": "boot grace"}
    if j.verdict.fit and nhc_outcome is not None and nhc_outcome["result"] != nhc.PASSED:
        # NHC fails (or did not answer): a drain of ours stays until it
        # passes, so the node never opens between the two tools' lifts.
        return {"action": "none", "ok": True, "applied": True,
                "why": "NHC %s: gpugate lifts no drain this run" % nhc_outcome["result"]}
    # Without a record (first run, wiped state dir) ask Slurm once,
    # unless slurmd already says the node is in service.
    return act(settings, node, j.verdict, check_fit=not j.last, deadline=deadline, spread=True,
               in_service=j.in_service, read_at=j.read_at, gpus=gpu_identities(getattr(j, "facts", None)))


def _save_state(settings, node: str, j: _Judged, outcome: dict, record: dict) -> None:
    verdict, facts = j.verdict, j.facts
    new_state = {
        "at": time.time(), "node": node, "boot_id": j.boot_id if isinstance(j.boot_id, str) else None,
        # Advance the kernel-log cursor only once the verdict is applied: a
        # drain Slurm did not take, or one an admin's drain stands in for,
        # is retried from the same Xids (within the policy's window).
        "kmsg_cursor": facts.kernel_log_seq if outcome["ok"] and outcome.get("applied", True) else j.cursor,
        "fit": verdict.fit and not j.in_grace, "class": verdict.cls, "reason": verdict.reason,
        "findings": [f.to_json() for f in verdict.findings],
        "pending": [f.to_json() for f in verdict.notes],
        "not_verified": [f.to_json() for f in verdict.not_verified],
        "pending_drain": not verdict.fit and not outcome["ok"],
        "held": outcome["action"] == HELD,
        "pending_reason": verdict.reason if not verdict.fit and not outcome["ok"] else None,
        "baseline_sig": st.file_signature(settings.baseline),
        "config_sig": st.file_signature(settings.source),
        "resolved": j.baseline.resolved_for(node),
        "gpus_high": lost.next_high(lost.high_for(j.last, j.baseline.vendor_for(node)), j.expected_gpus, facts),
        "gpus_vendor": j.baseline.vendor_for(node),  # the high-water mark counts this vendor's GPUs
        "ib": hca.next_state(j.last.get("ib"), facts),  # ports seen ACTIVE, error counters
        "clocks": j.clocks,  # clock-event counters and the last judged interval per GPU (judges.throttle)
        "ib_links": j.links,  # flap windows and error-rate intervals per port (judges.iblinks)
        "facts": to_jsonable(facts),
        "config_error": record.get("config_error"),
    }
    try:
        st.write_json(j.last_path, new_state)
    except OSError as exc:
        # Full or read-only disk: the drain still stands in Slurm, but the
        # prolog must not reuse an older "fit" record (unlinking needs no space).
        record["state_error"] = str(exc)[:200]
        try:
            os.unlink(j.last_path)
        except OSError:
            pass
    st.prune_jobs(settings.state_dir(node), 30 * 86400, time.time())  # longer than any job's time limit


def _log_fields(record: dict, j: _Judged, outcome: dict) -> None:
    verdict = j.verdict
    record.update(verdict="fit" if verdict.fit else "unfit", cls=verdict.cls, reason=verdict.reason,
                  action=outcome["action"], rpc=outcome.get("rpc", False),
                  durations={k: round(v, 3) for k, v in j.facts.durations.items()})
    if j.in_grace:
        record["boot_grace"] = True
    follower = j.facts.kernel_log_follower
    if j.facts.kernel_log_lost is not None or (isinstance(follower, dict) and follower.get("follower") != "following"):
        # Records a flood overwrote, and whether the follower read them: said, never a finding.
        record.update(kernel_log_lost=j.facts.kernel_log_lost, kernel_log_follower=follower)
    if "jitter" in outcome:
        record["jitter"] = outcome["jitter"]
    for key in ("backend", "backend_why", "node_read", "condition_error", "scope"):  # scope: device holds
        if key in outcome:
            record[key] = outcome[key]
    if not outcome["ok"]:
        record["slurm_error"] = outcome.get("error")
    if outcome.get("why"):
        record["why"] = outcome["why"]


def _nhc_share(settings):
    """With NHC configured, gpugate's own checks leave NHC its share of the
    budget (at least half of it stays gpugate's)."""
    if not nhc.configured(settings):
        return settings
    from gpugate.core.record import replace

    total = float(settings.budgets["healthcheck"])
    own = max(total - float(settings.nhc["timeout_seconds"]), total / 2)
    return replace(settings, budgets=dict(settings.budgets, healthcheck=own))


def _run_nhc(settings, node: str, j: _Judged, deadline: float, record: dict):
    """Run the site's NHC (None when not configured); its result goes to the
    log line only, never into gpugate's verdict or reason."""
    if not nhc.configured(settings):
        return None
    # While gpugate wants the node drained, NHC must not lift its own drain.
    keep = not j.verdict.fit and not j.in_grace
    outcome = nhc.run(settings, node, keep, deadline - ACT_RESERVE["healthcheck"] / 2)
    record["nhc"] = outcome
    return outcome


def _within_slurmd_timeout(settings, record: dict):
    """budgets.healthcheck, cut to end before slurmd kills the check."""
    from gpugate.core.record import replace

    from gpugate.node.slurmd_limits import conf_paths, health_check_timeout, healthcheck_budget

    configured = float(settings.budgets["healthcheck"])
    budget = healthcheck_budget(configured, health_check_timeout(conf_paths(settings)))
    if budget < configured:
        record["budget"] = budget
        settings = replace(settings, budgets=dict(settings.budgets, healthcheck=budget))
    return settings


def _boot_grace(settings, result):
    """Within the grace period after boot, findings that are usually transient
    (probe failures, services still starting) are reported but do not drain."""
    verdict, facts = result.verdict, result.facts
    boot = facts.boot_time
    since_boot = time.time() - boot if isinstance(boot, float) else -1.0
    # A boot "in the future" is a clock gone wrong, not a fresh boot: no grace.
    if verdict.fit or not 0 <= since_boot < settings.boot_grace_seconds:
        return verdict, False
    kept = [f for f in verdict.findings if f.cls != PROBE and f.component not in _GRACE_COMPONENTS]
    if len(kept) == len(verdict.findings):
        return verdict, False
    return decide(kept + list(verdict.notes) + list(verdict.not_verified), settings.reason_tag), True
