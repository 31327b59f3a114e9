"""Issue 28 without a cluster: the reset rung before the reboot rung, the
evidence bundle before either, the ladder over the repeat history (plan and
engine against the stand-in Slurm of test_sweep_engine)."""

import base64
import os
import stat
import tarfile

import pytest

from gpugate.model import reason as reasons
from gpugate.model.findings import Finding
from gpugate.sweep import evidence
from gpugate.sweep import history as hist
from gpugate.sweep import journal as jr
from gpugate.sweep.plan import Options, plan, remedy_for
from gpugate.sweep.snapshot import take

from test_sweep_engine import DAY, TAG, FakeSlurm, events, make

ECC = reasons.render(TAG, "health", [Finding("health", "ecc", "3 uncorrected", "<= 0", "", gpu=2),
                                     Finding("health", "xid", "48", "none", "", gpu=2)])
REMAP = reasons.render(TAG, "health", [Finding("health", "row_remap", "pending", "none", "", gpu=1)])
XID79 = reasons.render(TAG, "health", [Finding("health", "xid", "79", "none", "", gpu=2)])


def parse(text):
    return reasons.parse(text, TAG)


@pytest.mark.parametrize("text,remedy", [
    (ECC, "reset"),
    (REMAP, "reset"),
    (reasons.render(TAG, "health", [Finding("health", "recovery", "gpu reset", "none", "", gpu=0)]), "reset"),
    (reasons.render(TAG, "health", [Finding("health", "retired_pages", "pending", "none", "", gpu=0)]), "reset"),
    (XID79, "reboot"),  # off the bus: a reset cannot bring it back
    (reasons.render(TAG, "health", [Finding("health", "xid", "119", "none", "")]), "reboot"),  # policy: reboot
    (reasons.render(TAG, "health", [Finding("health", "xid", "154", "none", "")]), "reboot"),
    (reasons.render(TAG, "health", [Finding("health", "recovery", "node reboot", "none", "", gpu=0)]), "reboot"),
    (reasons.render(TAG, "health", [Finding("health", "gpu_count", "7", "8", "")]), "reboot"),  # a lost GPU
    # One finding a reset cannot clear: the whole node reboots.
    (reasons.render(TAG, "health", [Finding("health", "ecc", "3 uncorrected", "<= 0", "", gpu=2),
                                    Finding("health", "pcie_width", "8", "16", "", gpu=1)]), "reboot"),
    (reasons.render(TAG, "drift", [Finding("drift", "driver", "550.54.15", "580.65.06", "")]), "reconverge"),
])
def test_which_findings_take_the_reset_rung(text, remedy):
    opts = Options(reset=True, reboot_xids=frozenset({119, 120}))
    assert remedy_for(parse(text), opts)[0] == remedy
    # [sweep] reset = false: as before, every such finding reboots.
    off = remedy_for(parse(text), Options(reset=False))[0]
    assert off == ("reboot" if remedy == "reset" else remedy)


def test_a_reason_cut_short_is_rebooted():
    many = reasons.render(TAG, "health", [Finding("health", "ecc", "%d uncorrected" % i, "<= 0", "x" * 60, gpu=i)
                                          for i in range(8)])
    assert parse(many).more
    assert remedy_for(parse(many), Options(reset=True))[0] == "reboot"


def _snap(reason_text):
    from test_sweep_plan import _state

    return take({"gpu01": _state("gpu01", reason=reason_text), "gpu02": _state("gpu02", drain=False)}, TAG, 10 * DAY)


def _resumed(at, rung, components=frozenset({"ecc", "xid"})):
    return hist.Event("gpu01", hist.RESUMED, at, components, "rung=%s" % rung)


@pytest.mark.parametrize("past,remedy", [
    ((), "reset"),
    ((_resumed(9 * DAY, "reset"),), "reboot"),  # came back after a reset: not reset again
    ((_resumed(8 * DAY, "reset"), _resumed(9 * DAY, "reboot")), "escalate"),  # and after the reboot: rma
    ((_resumed(1 * DAY, "reset"),), "reset"),  # outside the 7-day window
    ((_resumed(9 * DAY, "reset", frozenset({"driver"})),), "reset"),  # another fault
    ((_resumed(8 * DAY, "reset"), hist.Event("gpu01", hist.FORGIVEN, 8.5 * DAY)), "reset"),  # forgiven
])
def test_the_ladder_climbs_past_a_rung_that_did_not_hold(past, remedy):
    opts = Options(reset=True, floor=0, history={"gpu01": past})
    decision = plan(_snap(ECC), opts).decisions["gpu01"]
    assert decision.remedy == remedy, decision.why


class NodeSide:
    """The transport: verification answers, and the node-side commands
    (`gpugate evidence`, `gpugate reset-gpus`) as the real ones answer."""

    def __init__(self, reset_ok=True, fit=True, evidence_ok=True):
        self.reset_ok, self.fit, self.evidence_ok, self.calls = reset_ok, fit, evidence_ok, []

    def check(self, nodes, args, timeout):
        self.calls.append(("check", tuple(nodes), tuple(args)))
        fit = self.fit(nodes) if callable(self.fit) else self.fit
        return {n: {"node": n, "fit": fit, "pending": [], "reason": None if fit else "gpugate: health ecc:gpu2=1",
                    "findings": [], "facts": {"dcgm_diag": {"level": 1, "exit_code": 0}}} for n in nodes}

    def run(self, nodes, args, timeout, max_stdout=0):
        self.calls.append((args[0], tuple(nodes), tuple(args)))
        if args[0] == "evidence":
            if not self.evidence_ok:
                return {n: "timed out after 600s (ssh connected or not, no answer in time)" for n in nodes}
            data = base64.b64encode(b"NVRM: Xid (PCI:0000:3a:00): 48\n").decode()
            return {n: {"node": n, "parts": [{"name": "kernel.log", "data": data, "bytes": 31},
                                             {"name": "nvidia-bug-report.log.gz", "error": "not installed (x)"}]}
                    for n in nodes}
        if self.reset_ok:
            return {n: {"node": n, "ok": True, "all": False, "gpus": [2], "error": "",
                        "steps": [{"step": "reset", "detail": "GPU 00000000:3A:00.0 was successfully reset."}]}
                    for n in nodes}
        return {n: {"node": n, "ok": False, "error": "nvidia-smi -r -i 2 exited 255: The following GPUs could not "
                    "be reset: GPU 00000000:3A:00.0: In use by another client"} for n in nodes}


def _sweep(tmp_path, slurm, side, **cfg):
    sweeper, journal, _ = make(tmp_path, slurm, **cfg)
    sweeper.transport = side
    return sweeper, journal


def test_a_reset_repairs_without_a_reboot_and_keeps_the_evidence_first(tmp_path):
    slurm = FakeSlurm(count=4, drained=("gpu001",), reason=ECC)
    side = NodeSide()
    sweeper, journal = _sweep(tmp_path, slurm, side)
    rebooted = []
    slurm.reboot = lambda names, reason, next_state=None: rebooted.append(names)
    report = sweeper.run()
    assert report.outcomes["gpu001"].result == "resumed" and slurm.resumed == ["gpu001"]
    assert not rebooted  # the reset rung: no reboot
    steps = [s for s, status, _ in events(journal, "gpu001") if status == "done"]
    assert steps == ["planned", "wait_drained", "evidence", "reset", "verify", "smoke", "resume"]
    # The evidence came before the reset; the reset named the finding's GPU.
    kinds = [c[0] for c in side.calls]
    assert kinds.index("evidence") < kinds.index("reset-gpus")
    assert ("reset-gpus", ("gpu001",), ("reset-gpus", "--timeout", "600", "--gpu", "2")) in side.calls
    # The bundle: root's alone, named in the journal.
    bundle = journal.evidence_id("gpu001")
    path = os.path.join(str(tmp_path / "state" / "evidence"), bundle + ".tar.gz")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    with tarfile.open(path) as tar:
        assert {"MANIFEST.json", "kernel.log"} <= set(tar.getnames())
    # The history says which rung held: the ladder reads it next time.
    resumed = [e for e in journal.history()["gpu001"] if e.kind == hist.RESUMED]
    assert hist.rung_of(resumed[-1]) == "reset"
    journal.close()


def test_a_failed_reset_falls_to_the_reboot_rung(tmp_path):
    slurm = FakeSlurm(count=4, drained=("gpu001",), reason=ECC, reboot_polls=1)
    side = NodeSide(reset_ok=False)
    sweeper, journal = _sweep(tmp_path, slurm, side)
    report = sweeper.run()
    assert report.outcomes["gpu001"].result == "resumed", report.outcomes["gpu001"].detail
    steps = [(s, status, attempt) for s, status, attempt in events(journal, "gpu001")]
    assert ("reset", "failed", 1) in steps and ("reboot", "done", 2) in steps
    # A bundle per attempt: before the reset, and before the reboot.
    assert [a for a, _, _ in journal.evidence("gpu001")] == [1, 2]
    assert journal.nodes()["gpu001"].remedy == "reboot"
    resumed = [e for e in journal.history()["gpu001"] if e.kind == hist.RESUMED]
    assert hist.rung_of(resumed[-1]) == "reboot"
    journal.close()


def test_reset_then_reboot_failing_is_rma_with_the_evidence_named(tmp_path):
    slurm = FakeSlurm(count=4, drained=("gpu001",), reason=ECC, reboot_polls=1)
    side = NodeSide(reset_ok=False, fit=False)
    sweeper, journal = _sweep(tmp_path, slurm, side)
    report = sweeper.run()
    assert report.outcomes["gpu001"].result == "escalated"
    text = slurm.states["gpu001"].reason
    assert text.startswith("gpugate: rma ") and len(text.encode()) <= 255
    assert text.endswith("; evidence=%s" % journal.evidence_id("gpu001")), text
    assert parse(text).cls == "rma"  # still gpugate's, still parseable
    # Two rungs, two bundles, the rma after the last rung (no second reboot).
    assert len(journal.evidence("gpu001")) == 2
    assert [s for s, st, _ in events(journal, "gpu001") if s == "reboot" and st == "done"] == ["reboot"]
    journal.close()


def test_a_failed_collection_is_recorded_and_never_blocks_the_repair(tmp_path):
    slurm = FakeSlurm(count=4, drained=("gpu001",), reason=ECC)
    sweeper, journal = _sweep(tmp_path, slurm, NodeSide(evidence_ok=False))
    assert sweeper.run().outcomes["gpu001"].result == "resumed"
    (_, _, detail), = journal.evidence("gpu001")
    assert detail.startswith("incomplete, kept id=") and "timed out" in detail
    journal.close()


def test_a_sweeper_killed_during_the_reset_resets_again_and_resumes(tmp_path):
    """The journal as a kill -9 leaves it in the middle of the reset: the
    step started, the node in the sweep's hands with its work reason."""
    slurm = FakeSlurm(count=4, drained=("gpu001",), reason=ECC)
    side = NodeSide()
    sweeper, journal = _sweep(tmp_path, slurm, side)
    journal.enrol("gpu001", "reset", 1, ECC)
    for step in ("wait_drained", "evidence"):
        journal.record("gpu001", step, jr.DONE)
    journal.record("gpu001", "reset", jr.STARTED)
    report = sweeper.run()
    assert report.outcomes["gpu001"].result == "resumed"
    assert [c[0] for c in side.calls].count("reset-gpus") == 1
    assert not slurm.res  # the reservation went with the batch
    journal.close()


def test_reset_false_turns_the_rung_off(tmp_path):
    slurm = FakeSlurm(count=4, drained=("gpu001",), reason=ECC, reboot_polls=1)
    side = NodeSide()
    sweeper, journal = _sweep(tmp_path, slurm, side, reset=False)
    assert sweeper.run().outcomes["gpu001"].result == "resumed"
    assert "reset-gpus" not in [c[0] for c in side.calls]
    assert ("reboot", "done", 1) in events(journal, "gpu001")
    journal.close()


def test_the_circuit_breaker_counts_failed_resets(tmp_path):
    slurm = FakeSlurm(count=8, drained=("gpu001", "gpu002", "gpu003"), reason=ECC)
    sweeper, journal = _sweep(tmp_path, slurm, NodeSide(reset_ok=False), circuit_breaker=2)
    report = sweeper.run()
    assert report.stopped.startswith("circuit breaker")
    journal.close()


def test_the_store_caps_keeps_and_names(tmp_path):
    store = evidence.Store(str(tmp_path / "ev"))
    for i in range(4):
        bundle, size = store.save("gpu01", 1, [("kernel.log", b"x" * 1000), ("big.gz", os.urandom(200000))],
                                  {"at": 0}, max_bytes=128 * 1024, keep=2, at=1000 + i)
        assert size <= 128 * 1024
    kept = store.list("gpu01")
    assert [b["id"] for b in kept] == ["gpu01-19700101T001642Z-a1", "gpu01-19700101T001643Z-a1"]
    with tarfile.open(kept[-1]["path"]) as tar:
        import json

        manifest = json.load(tar.extractfile("MANIFEST.json"))
        assert "big.gz" not in tar.getnames() and manifest["left_out"][0]["name"] == "big.gz"
    long_reason = "gpugate: rma " + "x" * 230
    assert evidence.with_id(long_reason, "gpu01-19700101T001643Z-a1") == long_reason  # does not fit: left out
    assert evidence.with_id("gpugate: rma ecc:gpu2=3 (want 0)", "b1").endswith("; evidence=b1")


def test_the_metrics_name_the_evidence_of_rma_nodes(tmp_path):
    from types import SimpleNamespace

    from gpugate.fleet.metrics import fleet_families
    from gpugate.core.promtext import render

    slurm = FakeSlurm(count=4, drained=("gpu001",), reason=ECC, reboot_polls=1)
    sweeper, journal = _sweep(tmp_path, slurm, NodeSide(reset_ok=False, fit=False))
    sweeper.run()
    nodes = journal.nodes()
    bundle = journal.evidence_id("gpu001")
    text = render(fleet_families(SimpleNamespace(nodes={}), nodes, None, None, evidence={"gpu001": bundle}))
    assert 'gpugate_sweep_rma_evidence{evidence="%s",node="gpu001"} 1' % bundle in text
    journal.close()


def test_the_plan_shows_the_reset_rung_and_the_evidence(tmp_path):
    import types

    from gpugate.cli.sweep_render import plan_text
    from gpugate.model.config import _SWEEP

    settings = types.SimpleNamespace(sweep=dict(_SWEEP.check({}, "sweep"), journal=str(tmp_path / "sweep.db")),
                                     reason_tag=TAG)
    snap = _snap(ECC)
    text = plan_text(plan(snap, Options(reset=True, floor=0)), settings, snap)
    assert "Batch 1: reset" in text
    assert "reset-gpus" in text and "scontrol reboot" not in text
    assert "evidence --json" in text and str(tmp_path / "evidence") in text


def test_back_after_a_reset_and_a_reboot_is_rma_and_forgive_hands_it_back(tmp_path):
    from gpugate.sweep import run as sweep_run

    now = 10 * DAY
    slurm = FakeSlurm(count=4, drained=("gpu001",), reason=ECC, reboot_polls=1)
    sweeper, journal = _sweep(tmp_path, slurm, NodeSide(), clock=lambda: now)
    for at, rung in ((now - 3 * DAY, "reset"), (now - DAY, "reboot")):
        journal.resumed("gpu001", {"ecc", "xid"}, at=at, rung=rung)
    report = sweeper.run()
    assert report.outcomes["gpu001"].result == "escalated"
    assert report.outcomes["gpu001"].detail.startswith("repeat offender: came back within 7d after a GPU reset")
    text = slurm.states["gpu001"].reason
    assert text.startswith("gpugate: rma repeat=reset then reboot in 7d (want a rung that holds); ecc:gpu2="), text
    lines = sweep_run.forgive(sweeper.settings, slurm, journal, ["gpu001"])
    assert "drained again" in lines[0] and slurm.states["gpu001"].reason == ECC
    journal.close()
