"""`gpugate sweep repaired` and `--rollout-if-in-progress` on the sweep's
stand-in Slurm (tests/test_sweep_engine.py); the real rig runs the way back
from rma in tests/test_slurm_repaired.py."""

import sys
import types

from gpugate.model import reason as reasons
from gpugate.model.config import _SWEEP
from gpugate.model.findings import Finding
from gpugate.model import ownership
from gpugate.sweep import history as hist
from gpugate.sweep import run as sweep_run
from gpugate.sweep import timed_rollout
from gpugate.sweep.engine import Sweeper, rollout_reason
from gpugate.sweep.plan import REBOOT, RECONVERGE, remedy_for
from gpugate.sweep.repaired import repaired, repaired_reason

from test_sweep_engine import DAY, DRIFT, TAG, XID, FakeSlurm, converge_failing_on, events, make

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


class AdminRacingSlurm(FakeSlurm):
    """An admin sets a reason of their own just after gpugate read the node's rma reason."""

    def __init__(self, racing, **kw):
        super().__init__(**kw)
        self.racing = racing

    def nodes(self, names=None):
        out = super().nodes(names)
        for name in self.racing:
            if name in out:
                self._set(name, reason=ADMIN)
        return out


def test_repaired_re_reads_the_node_and_never_overwrites_a_reason_set_since_the_read(tmp_path):
    slurm = AdminRacingSlurm(racing={"gpu003"}, count=4)
    slurm.drain("gpu003", RMA_XID)
    slurm.drain("gpu004", RMA_XID)
    sweeper, journal, _ = make(tmp_path, slurm)
    done, refused = repaired(sweeper.settings, slurm, journal, ["gpu003", "gpu004"], who="ops")
    assert slurm.states["gpu003"].reason == ADMIN and "DRAIN" in slurm.states["gpu003"].flags
    assert len(refused) == 1 and refused[0].startswith("gpu003: refused, left as it is: its reason changed")
    assert ADMIN in refused[0]
    # Untouched in the journal too: no repair noted, the repeat record not cleared.
    assert "gpu003" not in journal.history() and events(journal, "gpu003") == []
    # The node whose reason did not change is handed back as before.
    assert len(done) == 1 and done[0].startswith("gpu004: repaired")
    assert slurm.states["gpu004"].reason == "gpugate: health sweep=reboot after repair (want verified)"
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


class RolloutTransport:
    """Every node still on [previous] (the healthcheck says so); a verification passes."""

    def check(self, nodes, args, timeout):
        pending = [{"component": "driver"}] if "healthcheck" in args else []
        return {n: {"node": n, "fit": True, "pending": pending} for n in nodes}


def _timer(settings, baseline, slurm, journal):
    """What the shipped timer runs (`gpugate sweep --apply --rollout-if-in-progress`, gpugate.cli.sweep):
    the repairs, then the canary when timed_rollout says so; on the real engine."""
    transport, clock = RolloutTransport(), (lambda: 10 * DAY)
    opts = sweep_run.options(settings, baseline)
    journal.start_run(["timer"])
    Sweeper(settings, baseline, slurm, transport, journal, opts, sleep=lambda s: None, clock=clock).run()
    canary_opts, note = timed_rollout.canary(settings, baseline, slurm, transport, journal, opts)
    if canary_opts is not None:
        journal.start_run(["timer"])
        Sweeper(settings, baseline, slurm, transport, journal, canary_opts, sleep=lambda s: None, clock=clock).run()
    return canary_opts, note


def test_a_rolled_back_canary_enrolled_again_for_an_xid_is_never_followed_by_another(tmp_path):
    slurm = FakeSlurm(count=6)
    sweeper, journal, _ = make(tmp_path, slurm, canary=1, max_batch=4, converge=converge_failing_on("gpu001"),
                               rollback=converge_failing_on())
    baseline = types.SimpleNamespace(rollout_in_progress=True, previous={"driver": "570.1"},
                                     pin={"driver": "580.1"}, health=types.SimpleNamespace(xid_actions={}))
    key = rollout_reason(TAG, baseline)
    # The first timer run: the canary (gpu001) fails its converge twice and is rolled back to [previous].
    opts, note = _timer(sweeper.settings, baseline, slurm, journal)
    assert opts.rollout == {"gpu001"} and "canary batch (gpu001)" in note
    assert "rollback" in [s for s, st, _ in events(journal, "gpu001") if st == "done"]
    assert "gpu001" in slurm.resumed and journal.nodes()["gpu001"].reason == key
    # Later an Xid drains it, and the next timer run repairs it: enrolled again, as a reboot.
    slurm.drain("gpu001", XID)
    opts, note = _timer(sweeper.settings, baseline, slurm, journal)
    assert journal.nodes()["gpu001"].remedy == "reboot" and journal.nodes()["gpu001"].step == "resume"
    # The rollout was canaried: no other canary, not even the same node again.
    assert opts is None and "rolled already" in note and "gpu001" in note
    assert not any(r.remedy == "rollout" for r in journal.nodes().values())
    assert all(not slurm.states["gpu%03d" % i].reason for i in range(1, 7))
    journal.close()
