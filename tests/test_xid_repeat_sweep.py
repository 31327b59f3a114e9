"""Issue 33, item 1: what becomes of an xid_repeat finding.  Its first rung
is a GPU reset proven by the deep diagnostic, never rma; a pass clears the
GPU's history; an admin's RESUME (or forgive's drain) clears it too, and
nothing a job's user or an admin's slip can do does (gpugate.sweep.plan,
gpugate.node.xidhistory)."""

import json
import os
import time

import pytest

from conftest import DEMO_BASELINE, gpugate_cmd
from gpugate.model import reason as reasons
from gpugate.model.baseline import parse_baseline
from gpugate.model.facts import NodeFacts, XidEvent
from gpugate.model.findings import Finding
from gpugate.judges import apprepeat
from gpugate.node import xidhistory
from gpugate.slurm import pending
from gpugate.slurm.nodestate import NodeState
from gpugate.sweep import history as hist
from gpugate.sweep.plan import Options, plan, remedy_for
from test_apprepeat import _job, _log
from test_node_side import node_env, run_entry  # noqa: F401  (the fixture)
from test_sweep_reset import _resumed, _snap

TAG = "gpugate:"
POLICY = parse_baseline({"pin": {"driver": "1"}}, "b").health
BUS = "0000:3a:00"
REPEAT = reasons.render(TAG, "health", [Finding("health", "xid_repeat", "xid 31 in 3 jobs", "< 3 jobs within 24h",
                                                "", gpu=2)])
NOW = float(int(time.time()))  # the health check reads Slurm's clock


def test_attack_xid_repeat_is_reset_and_diagnosed_never_rma_at_once():
    """Before: `gpugate sweep --apply` escalated it ('no automatic remedy for
    this finding'): three short jobs of a user were an RMA."""
    ours = reasons.parse(REPEAT, TAG)
    assert remedy_for(ours, Options(reset=True))[0] == "reset"
    assert remedy_for(ours, Options(reset=False))[0] == "reboot"  # no reset rung: the reboot, proven the same
    decision = plan(_snap(REPEAT), Options(reset=True, floor=0)).decisions["gpu01"]
    assert decision.remedy == "reset" and decision.included, decision.why
    # Back after a reset, then after a reboot, for xid_repeat alone: a job's user can cause it, so its
    # returns are no step towards rma (gpugate.model.findings.USER_CAUSED); the deep diagnostic failing is
    # the hardware evidence that escalates.  As the sweep journals them, its returns name nothing.
    assert hist.components(reasons.parse(REPEAT, TAG)) == frozenset()
    past = (_resumed(8 * 86400, "reset", frozenset({"xid_repeat"})),
            _resumed(9 * 86400, "reboot", frozenset({"xid_repeat"})))
    assert plan(_snap(REPEAT), Options(reset=True, floor=0, history={"gpu01": past})).decisions[
        "gpu01"].remedy == "reset"


def _history(users=("1001", "1002", "1003"), at=NOW - 600):
    history = None
    for i, user in enumerate(users):
        event = XidEvent(xid=31, pci_bus_id=BUS, text="", gpu=2, seq=100 + i, timestamp=at)
        facts = NodeFacts(node="n", mode="epilog", collected_at=at, xids=(event,))
        history = apprepeat.record(history, facts, str(500 + i), user, [2], at + i, POLICY)
    assert apprepeat.standing(history, NOW, POLICY) == [BUS]
    return history


def _state(drain=True, reason=REPEAT, stamp=NOW - 300, comment=None):
    if comment is None:
        comment = pending.publish("", REPEAT, int(NOW - 900))
    return NodeState(name="gpu01", state="IDLE", flags=frozenset({"DRAIN"} if drain else ()),
                     reason=reason if drain else "", reason_time=stamp if drain else None, reason_user="root",
                     partitions=("gpu",), comment=comment)


def _observe(history, state, wall=NOW):
    return xidhistory.observe(history, state, TAG, wall, NOW, POLICY)


def test_attack_an_admins_resume_clears_the_history():
    """Before: after an admin's RESUME the node was drained and escalated
    again a minute later with no new fault (the history never cleared)."""
    history = _history()
    marked, why = _observe(history, _state())  # the keeper's drain, five minutes old
    assert apprepeat.marked(marked) == {BUS: NOW - 300} and why == ""
    cleared, why = _observe(marked, _state(drain=False))  # RESUME: in service again
    assert apprepeat.standing(cleared, NOW, POLICY) == [] and apprepeat.marked(cleared) == {}
    assert "returned to service" in why
    # The keeper drained it again from its old comment before the node's next
    # health check: the same published reason, a newer stamp, no new evidence.
    cleared, why = _observe(marked, _state(stamp=NOW - 100))
    assert apprepeat.standing(cleared, NOW, POLICY) == [] and "after a RESUME" in why


@pytest.mark.parametrize("what,states", [
    # The keeper gives back an over-budget drain within its run: a drain
    # younger than SETTLE marks nothing, so its undrain clears nothing.
    ("a drain given back", [_state(stamp=NOW - 5), _state(drain=False)]),
    # An admin edits only the comment (the published part gone): no RESUME.
    ("a comment edited", [_state(), _state(comment="rack 3")]),
    # An admin drains it with their own reason: still out of service.
    ("an admin's drain", [_state(), _state(reason="cable swap", stamp=NOW - 10)]),
    # The sweep's own reason while it works on the node; then its rma.
    ("the sweep at work", [_state(), _state(reason=reasons.render(TAG, "health", [
        Finding("health", "sweep", "reset batch 1 attempt 1", "verified", "")]), stamp=NOW - 100),
        _state(reason=reasons.render(TAG, "rma", [Finding("rma", "xid_repeat", "xid 31 in 3 jobs", "", "", gpu=2)]),
               stamp=NOW - 90)]),
    ("never drained", [_state(drain=False), _state(drain=False)]),
    ("Slurm did not answer", [None, None]),
])
def test_nothing_else_clears_it(what, states):
    history = _history()
    for state in states:
        history, _ = _observe(history, state)
    assert apprepeat.standing(history, NOW, POLICY) == [BUS], what


def test_a_new_fault_after_the_resume_stands():
    """What the RESUME clears is the old evidence; jobs after it count."""
    history = _history()
    marked, _ = _observe(history, _state())
    cleared, _ = _observe(marked, _state(drain=False))
    for i, user in enumerate(("2001", "2002", "2003")):
        event = XidEvent(xid=13, pci_bus_id=BUS, text="", gpu=2, seq=900 + i, timestamp=NOW)
        facts = NodeFacts(node="n", mode="epilog", collected_at=NOW, xids=(event,))
        cleared = apprepeat.record(cleared, facts, str(900 + i), user, [2], NOW + i, POLICY)
    assert apprepeat.standing(cleared, NOW + 5, POLICY) == [BUS]


def test_the_health_check_reads_its_own_record_only_while_a_finding_stands(tmp_path):
    from gpugate.model.config import load_settings

    config = tmp_path / "gpugate.toml"
    config.write_text('state_dir = "%s/state/{node}"\n' % tmp_path)
    settings = load_settings(str(config))
    os.makedirs(settings.state_dir("gpu01"))
    reads = []
    facts = NodeFacts(node="gpu01", mode="healthcheck", collected_at=NOW)
    assert xidhistory.judged(settings, "gpu01", facts, POLICY, {}, lambda s, n: reads.append(n)) == []
    assert reads == []  # no history: no Slurm call
    path = os.path.join(settings.state_dir("gpu01"), xidhistory.FILE)
    with open(path, "w") as handle:
        json.dump(_history(), handle)
    record = {}
    seen = iter([_state(), _state(drain=False)])
    assert [f.component for f in xidhistory.judged(settings, "gpu01", facts, POLICY, record,
                                                   lambda s, n: next(seen))] == ["xid_repeat"]
    assert xidhistory.judged(settings, "gpu01", facts, POLICY, record, lambda s, n: next(seen)) == []
    assert "returned to service" in record["xid_history"]


def _verify(node_env, extra=()):  # noqa: F811
    return gpugate_cmd("check", "--config", node_env["config"], "--node", "gpu01", "--mode", "verify", "--json",
                       *extra)


def test_a_pass_of_the_deep_diagnostic_clears_the_history(node_env, tmp_path):  # noqa: F811
    fleet = node_env["fleet"]
    for job in ("101", "102", "103"):
        assert run_entry("prolog", node_env, extra_env=_job(job, "2")).returncode == 0
        gpugate_cmd("sim", "set", fleet, "gpu01", "gpu.2.xid=31", check=True)
        run_entry("epilog", node_env, extra_env=_job(job, "2"))
    assert "xid_repeat:gpu2" in _log(node_env)[-1]["reason"]
    # The site's verification stops at -r 1: the history asks for -r 3 anyway.
    shallow = tmp_path / "shallow.toml"
    base = open(DEMO_BASELINE).read()
    assert base.count("verify = [1, 3]") == 1
    shallow.write_text(base.replace("verify = [1, 3]", "verify = 1"))
    config = tmp_path / "shallow-config.toml"
    with open(node_env["config"]) as handle:
        config.write_text(handle.read().replace(DEMO_BASELINE, str(shallow)))
    answer = json.loads(gpugate_cmd("check", "--config", str(config), "--node", "gpu01", "--mode", "verify",
                                    "--json").stdout)
    diag = answer["facts"]["dcgm_diag"]
    assert diag["level"] == 3 and diag["passed_levels"] == [1], diag
    assert answer["fit"] and "cleared" in answer["xid_history"], answer
    result = run_entry("healthcheck", node_env)
    assert "xid_repeat" not in (_log(node_env)[-1].get("reason") or ""), result.stderr


def test_a_failed_diagnostic_keeps_the_history(node_env):  # noqa: F811
    fleet = node_env["fleet"]
    for job in ("101", "102", "103"):
        assert run_entry("prolog", node_env, extra_env=_job(job, "2")).returncode == 0
        gpugate_cmd("sim", "set", fleet, "gpu01", "gpu.2.xid=31", check=True)
        run_entry("epilog", node_env, extra_env=_job(job, "2"))
    gpugate_cmd("sim", "set", fleet, "gpu01", "dcgm.diag_fail=2", check=True)
    answer = json.loads(_verify(node_env).stdout)
    assert not answer["fit"] and "xid_history" not in answer
    run_entry("healthcheck", node_env)
    assert "xid_repeat:gpu2" in _log(node_env)[-1]["reason"]


def test_the_sweep_resets_and_resumes_it_and_forgive_hands_an_rma_back(tmp_path):
    """The whole rung against the stand-in Slurm: reset, verified, resumed.
    A node an older gpugate escalated for it ('no automatic remedy') is
    handed back to the sweep by forgive (before: left in rma)."""
    from gpugate.sweep import run as sweep_run
    from test_sweep_engine import FakeSlurm
    from test_sweep_reset import NodeSide, _sweep

    class Slurm(FakeSlurm):
        def reserve(self, name, names, *minutes):  # whichever signature the engine calls
            return super().reserve(name, names)

    slurm = Slurm(count=4, drained=("gpu001",), reason=REPEAT)
    side = NodeSide()
    sweeper, journal = _sweep(tmp_path, slurm, side, reset=True)
    report = sweeper.run()
    assert report.outcomes["gpu001"].result == "resumed" and slurm.resumed == ["gpu001"]
    assert [c[0] for c in side.calls] == ["evidence", "reset-gpus", "check"]
    assert ("reset-gpus", ("gpu001",), ("reset-gpus", "--timeout", "600", "--gpu", "2")) in side.calls, side.calls
    rma = reasons.render(TAG, "rma", [Finding("rma", "xid_repeat", "xid 31 in 3 jobs", "< 3 jobs within 24h", "",
                                              gpu=2)])
    slurm._set("gpu001", "IDLE", {"DRAIN"}, rma)
    journal.record("gpu001", "escalate", "done", detail="health xid_repeat: no automatic remedy")
    lines = sweep_run.forgive(sweeper.settings, slurm, journal, ["gpu001"])
    assert "drained again" in lines[0] and slurm.states["gpu001"].reason == REPEAT, lines
    journal.close()
