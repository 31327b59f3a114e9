"""HealthCheckProgram: the full check, run by slurmd on its interval.

One run at a time (a run that finds another in progress exits quietly), one
time budget well under slurmd's 60 s kill, drain when unfit, and a local
record of facts and verdict for the prolog to reuse."""

import os
import time
from ..facts import to_jsonable
from ..findings import PROBE
from ..judges import lost
from ..probes import files
from ..verdict import decide
from . import state as st
from .act import act
from .hold import HELD
from .check import run_check
from .lastgood import load_baseline
from .lock import RunLock
from .slurmd_limits import slurm_node_is_healthy

# Transient right after boot: services still starting, DCGM not yet up.
_GRACE_COMPONENTS = ("fabricmanager", "fabric", "dcgm_health", "dcgm")


def run(settings, node: str, record: dict) -> int:
    started = time.monotonic()
    state_dir = settings.state_dir(node)
    lock = RunLock(os.path.join(state_dir, "healthcheck.lock"))
    try:
        held = lock.acquire()
    except OSError as exc:
        # A full or read-only state directory must not switch the check off.
        record["state_error"] = "no lock: %s" % exc
        held = True
    if not held:
        record.update(verdict="skipped", why="previous health check still running")
        return 0
    with lock:
        settings = _within_slurmd_timeout(settings, record)
        in_service = slurm_node_is_healthy(os.environ)
        if in_service is not None:
            record["slurm_in_service"] = in_service
        baseline = load_baseline(settings, record)
        last_path = os.path.join(state_dir, st.LAST)
        last = st.read_json(last_path) or {}
        boot_id = files.boot_id(settings.node_root(node))
        cursor = last.get("kmsg_cursor", -1) if last.get("boot_id") == boot_id else -1
        # Every Slurm call below ends by this deadline (slurmd kills the run soon after).
        deadline = started + float(settings.budgets["healthcheck"])
        expected_gpus = baseline.expect_for(node).gpus
        result = run_check(settings, baseline, node, "healthcheck", xid_after=cursor,
                           extra=lambda facts: lost.judge(last.get("gpus_high"), expected_gpus, facts))
        verdict, in_grace = _boot_grace(settings, result)
        if in_grace and verdict.fit:
            # Only transient-looking findings: report, but neither drain nor
            # undrain, and do not let the prolog reuse this as "fit".
            outcome = {"action": "none", "ok": True, "applied": False, "why": "boot grace"}
        else:
            # Without a record (first run, wiped state dir) ask Slurm once,
            # unless slurmd already says the node is in service.
            outcome = act(settings, node, verdict, check_fit=not last, deadline=deadline, spread=True,
                          in_service=in_service)
        facts = result.facts
        new_state = {
            "at": time.time(), "node": node, "boot_id": boot_id if isinstance(boot_id, str) else None,
            # Advance the kernel-log cursor only once the verdict is applied: a
            # drain Slurm did not take, or one an admin's drain stands in for,
            # is retried from the same Xids (within the policy's window).
            "kmsg_cursor": facts.kernel_log_seq if outcome["ok"] and outcome.get("applied", True) else cursor,
            "fit": verdict.fit and not in_grace, "class": verdict.cls, "reason": verdict.reason,
            "findings": [f.to_json() for f in verdict.findings],
            "pending": [f.to_json() for f in verdict.notes],
            "not_verified": [f.to_json() for f in verdict.not_verified],
            "pending_drain": not verdict.fit and not outcome["ok"],
            "held": outcome["action"] == HELD,
            "pending_reason": verdict.reason if not verdict.fit and not outcome["ok"] else None,
            "baseline_sig": st.file_signature(settings.baseline),
            "config_sig": st.file_signature(settings.source),
            "resolved": baseline.resolved_for(node),
            "gpus_high": lost.next_high(last.get("gpus_high"), expected_gpus, facts),
            "facts": to_jsonable(facts),
            "config_error": record.get("config_error"),
        }
        try:
            st.write_json(last_path, new_state)
        except OSError as exc:
            # Full or read-only disk: the drain still stands in Slurm, but the
            # prolog must not reuse an older "fit" record (unlinking needs no space).
            record["state_error"] = str(exc)[:200]
            try:
                os.unlink(last_path)
            except OSError:
                pass
        st.prune_jobs(state_dir, 30 * 86400, time.time())  # longer than any job's time limit
        if settings.prometheus_textfile:
            from .metrics import write_node_textfile

            write_node_textfile(settings.prometheus_textfile, node, verdict, facts, baseline,
                                held=outcome["action"] == HELD, config_error=bool(record.get("config_error")))
        record.update(verdict="fit" if verdict.fit else "unfit", cls=verdict.cls, reason=verdict.reason,
                      action=outcome["action"], rpc=outcome.get("rpc", False),
                      durations={k: round(v, 3) for k, v in facts.durations.items()})
        if in_grace:
            record["boot_grace"] = True
        if "jitter" in outcome:
            record["jitter"] = outcome["jitter"]
        if not outcome["ok"]:
            record["slurm_error"] = outcome.get("error")
        if outcome.get("why"):
            record["why"] = outcome["why"]
        return verdict.exit_code


def _within_slurmd_timeout(settings, record: dict):
    """budgets.healthcheck, cut to end before slurmd kills the check."""
    from dataclasses import replace

    from .slurmd_limits import conf_paths, health_check_timeout, healthcheck_budget

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
