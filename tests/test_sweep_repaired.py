"""`gpugate sweep repaired` and `--rollout-if-in-progress` on the sweep's
stand-in Slurm (tests/test_sweep_engine.py); the real rig runs the way back
from rma in tests/test_slurm_repaired.py."""

import types

from gpugate import reason as reasons
from gpugate.config import _SWEEP
from gpugate.findings import Finding
from gpugate.slurm import ownership
from gpugate.sweep import history as hist
from gpugate.sweep import run as sweep_run
from gpugate.sweep import timed_rollout
from gpugate.sweep.engine import rollout_reason
from gpugate.sweep.plan import REBOOT, RECONVERGE, remedy_for
from gpugate.sweep.repaired import repaired, repaired_reason

from test_sweep_engine import DAY, DRIFT, TAG, XID, FakeSlurm, events, make

RMA_XID = "gpugate: rma xid:gpu2=79 (want none); evidence=gpu003-20270101T000000Z-a1"
ADMIN = "fan replaced, burn-in pending"


def test_repaired_turns_gpugate_s_rma_into_the_sweep_s_work_and_refuses_the_rest(tmp_path):
    now = 10 * DAY
    slurm = FakeSlurm(count=6, drained=("gpu003",), reason=XID)
    slurm.drain("gpu003", RMA_XID)
    slurm.drain("gpu004", ADMIN)
    slurm.drain("gpu005", DRIFT)
    sweeper, journal, _ = make(tmp_path, slurm, clock=lambda: now)
    journal.note("gpu003", hist.ESCALATED, {"xid"}, at=now - 60, detail="escalated")
    done, refused = repaired(sweeper.settings, slurm, journal, ["gpu003", "gpu004", "gpu005", "gpu006"], who="ops")
    assert len(done) == 1 and done[0].startswith("gpu003: repaired") and "only then resumes" in done[0]
    work = slurm.states["gpu003"].reason
    assert work == "gpugate: health sweep=reboot after repair (want verified)"
    assert "DRAIN" in slurm.states["gpu003"].flags
    # Never a reason gpugate did not write; never another gpugate class.
    assert slurm.states["gpu004"].reason == ADMIN and slurm.states["gpu005"].reason == DRIFT
    assert [line.split(":")[0] for line in refused] == ["gpu004", "gpu005", "gpu006"]
    assert "never replaced" in refused[0] and "not rma" in refused[1] and "nothing to return" in refused[2]
    # The repeat record is cleared as `sweep forgive` does, and the repair journaled.
    assert journal.history()["gpu003"][-1].kind == hist.FORGIVEN
    assert "repaired by ops" in journal.history()["gpu003"][-1].detail
    assert ("repaired", "done") in [(s, st) for s, st, _ in events(journal, "gpu003")]
    # The node's own check keeps the work reason (it is the sweep's), never resumes it.
    fit = types.SimpleNamespace(fit=True, reason="", cls="", acute=False, findings=())
    decision = ownership.decide(slurm.states["gpu003"], fit, TAG, ("probe", "health"))
    assert decision.kind == ownership.KEEP
    # The next sweep reboots, verifies and only then resumes it.
    journal.close()
    sweeper, journal, _ = make(tmp_path, slurm, clock=lambda: now + 60)
    report = sweeper.run()
    assert report.outcomes["gpu003"].result == "resumed" and "gpu003" in slurm.resumed
    steps = [s for s, st, _ in events(journal, "gpu003") if st == "done"]
    assert steps.index("reboot") < steps.index("verify") < steps.index("resume")
    assert "gpu004" not in report.outcomes and "gpu004" not in slurm.resumed
    journal.close()


def test_the_work_reason_keeps_the_drain_s_class_and_the_plan_says_why():
    drift = reasons.parse(DRIFT, TAG)
    text = repaired_reason(TAG, drift)
    assert text == "gpugate: drift sweep=reconverge after repair (want verified)"
    opts = sweep_run.options(types.SimpleNamespace(sweep=_SWEEP.check({}, "sweep"), drain_budget=None),
                             types.SimpleNamespace(health=types.SimpleNamespace(xid_actions={})))
    assert remedy_for(reasons.parse(text, TAG), opts) == (RECONVERGE, "repaired after rma: reconverge, verify, "
                                                                      "smoke test, then resume")
    health = repaired_reason(TAG, None)
    assert remedy_for(reasons.parse(health, TAG), opts)[0] == REBOOT
    rollout = reasons.parse(reasons.render(TAG, "rollout", [Finding("rollout", "driver", "1", "2", "")]), TAG)
    assert repaired_reason(TAG, rollout).startswith("gpugate: drift sweep=reconverge")


def _rollout_case(tmp_path, pending, journal_reason=None):
    slurm = FakeSlurm(count=6)
    sweeper, journal, _ = make(tmp_path, slurm, canary=2, max_batch=4)
    prev = types.SimpleNamespace(get=lambda c: {"driver": "570.1"}.get(c))
    pin = types.SimpleNamespace(get=lambda c: {"driver": "580.1"}.get(c))
    baseline = types.SimpleNamespace(rollout_in_progress=True, previous=prev, pin=pin)
    if journal_reason:
        journal.enrol("gpu006", "rollout", 1, journal_reason(baseline))

    class Transport:
        def check(self, nodes, args, timeout):
            return {n: {"node": n, "fit": True, "pending": [{"component": "driver"}] if n in pending else []}
                    for n in nodes}
    out = timed_rollout.canary(sweeper.settings, baseline, slurm, Transport(), journal, sweeper.options)
    journal.close()
    return out, baseline


def test_the_timer_rolls_the_canary_once_per_rollout_and_never_more(tmp_path):
    (opts, note), _ = _rollout_case(tmp_path / "a", pending={"gpu%03d" % i for i in range(1, 7)})
    assert opts.rollout == {"gpu001", "gpu002"} and not opts.canary_done and "wait for approval" in note
    # One node on the new pin already (the canary passed): nothing more rolls.
    (opts, note), _ = _rollout_case(tmp_path / "b", pending={"gpu%03d" % i for i in range(2, 7)})
    assert opts is None and "rolled already" in note and "gpugate sweep --rollout --apply" in note
    # The journal holds a node this rollout took (a canary that failed and was rolled back): never another.
    (opts, note), _ = _rollout_case(tmp_path / "c", pending={"gpu%03d" % i for i in range(1, 7)},
                                    journal_reason=lambda b: rollout_reason(TAG, b))
    assert opts is None and "gpu006" in note
    # Nothing on [previous] any more.
    (opts, note), _ = _rollout_case(tmp_path / "d", pending=set())
    assert opts is None and "in_progress = false" in note


def test_no_rollout_in_progress_rolls_nothing(tmp_path):
    slurm = FakeSlurm(count=2)
    sweeper, journal, _ = make(tmp_path, slurm)
    opts, note = timed_rollout.canary(sweeper.settings, sweeper.baseline, slurm, None, journal, sweeper.options)
    assert opts is None and "no rollout in progress" in note
    journal.close()
