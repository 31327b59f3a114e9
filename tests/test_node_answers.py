"""Issue 33, item 5: a node's answer cannot wedge the controller.  A
compromised node (root there writes whatever `gpugate ... --json` prints)
answers 100,000 levels deep, with the wrong types, or with an evidence part
named MANIFEST.json: that node fails its step alone, the others of its
batch go on, their bundles are kept, and no maintenance reservation stays.
The answers travel the production path: LocalTransport runs a stand-in
`gpugate` program and parses its stdout as it parses a node's."""

import base64
import io
import json
import os
import sys
import tarfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpugate.model import reason as reasons
from gpugate.model.findings import Finding
from gpugate.sweep import evidence
from gpugate.model.answers import problem
from gpugate.node.transport import LocalTransport

from test_sweep_engine import TAG, FakeSlurm, events, make

XID = reasons.render(TAG, "health", [Finding("health", "xid", "79", "none", "", gpu=2)])
DEEP = '{"node": "gpu002", "fit": true, "facts": ' + "[" * 100000 + "]" * 100000 + "}"
KERNEL = base64.b64encode(b"NVRM: Xid (PCI:0000:3a:00): 79\n").decode()

# The stand-in for `gpugate` on the nodes: ARGS --json --node NODE.  Each
# node prints what ANSWERS holds for its command, else an honest answer.
NODE_SIDE = r'''
import json, sys
argv = sys.argv[1:]
node, command = argv[argv.index("--node") + 1], argv[0]
said = %r.get(node, {}).get(command)
if said is not None:
    print(said)
elif command == "evidence":
    print(json.dumps({"node": node, "parts": [{"name": "kernel.log", "data": %r}]}))
else:
    print(json.dumps({"node": node, "fit": True, "pending": [], "findings": []}))
'''


def _sweep(tmp_path, slurm, answers, **cfg):
    script = tmp_path / "gpugate-node.py"
    script.write_text(NODE_SIDE % (answers, KERNEL))
    sweeper, journal, _ = make(tmp_path, slurm, **cfg)
    sweeper.transport = LocalTransport([sys.executable, str(script)])
    return sweeper, journal


def _bundle(tmp_path, journal, node):
    return os.path.join(str(tmp_path / "state" / "evidence"), journal.evidence_id(node) + ".tar.gz")


def test_a_100000_deep_answer_fails_that_node_alone_and_its_batch_goes_on(tmp_path):
    """Before: RecursionError out of the transport's parser stopped the whole
    sweep (`internal error`), every node of the batch left in flight, the
    batch's reservation left for a year, and the evidence of the batch lost."""
    slurm = FakeSlurm(count=6, drained=("gpu001", "gpu002", "gpu003"), reason=XID, reboot_polls=1)
    sweeper, journal = _sweep(tmp_path, slurm, {"gpu002": {"check": DEEP, "evidence": DEEP}})
    report = sweeper.run()
    results = {n: o.result for n, o in report.outcomes.items()}
    # rma, or held drained while the drain budget has no room for it: never resumed
    assert results["gpu001"] == results["gpu003"] == "resumed" and results["gpu002"] in ("escalated", "deferred")
    assert not report.stopped and not slurm.res  # no reservation outlives the sweep
    # The compromised node's attempts are recorded, each with why.
    failed = [e for e in journal.events("gpu002") if e[2] == "verify" and e[3] == "failed"]
    assert len(failed) == 2 and all("levels deep (at most 64)" in e[6] for e in failed), failed
    assert slurm.states["gpu002"].drain and "gpu002" not in slurm.resumed
    # The other nodes' bundles are whole; the compromised node's is kept as far as it goes.
    for node in ("gpu001", "gpu003"):
        with tarfile.open(_bundle(tmp_path, journal, node)) as tar:
            assert {"MANIFEST.json", "kernel.log"} <= set(tar.getnames())
    (_, _, detail), _ = journal.evidence("gpu002")
    assert detail.startswith("incomplete, kept id=") and "levels deep (at most 64)" in detail, detail
    with tarfile.open(_bundle(tmp_path, journal, "gpu002")) as tar:
        manifest = json.load(tar.extractfile("MANIFEST.json"))
        assert "levels deep (at most 64)" in manifest["node_error"] and manifest["node"] == "gpu002"
    journal.close()


@pytest.mark.parametrize("answer,why", [
    ({"node": "gpu002", "fit": True, "pending": [], "baseline": "x"}, "'baseline' is str"),
    ({"node": "gpu002", "fit": True, "pending": [["driver"]]}, "pending[0] is list"),
    ({"node": "gpu002", "fit": True, "pending": [], "facts": {"dcgm_diag": {"level": "3"}}}, "'level' is str"),
    ({"node": "gpu002", "fit": False, "findings": [{"class": {}, "component": "xid"}]}, "'class' is dict"),
])
def test_an_answer_of_the_wrong_types_fails_that_node_alone(tmp_path, answer, why):
    """Before: AttributeError / TypeError / unhashable dict out of the verify
    step (or the escalation's sort), for the whole sweep."""
    slurm = FakeSlurm(count=4, drained=("gpu001", "gpu002"), reason=XID, reboot_polls=1)
    sweeper, journal = _sweep(tmp_path, slurm, {"gpu002": {"check": json.dumps(answer)}}, evidence_keep=0)
    report = sweeper.run()
    assert report.outcomes["gpu001"].result == "resumed" and report.outcomes["gpu002"].result in ("escalated",
                                                                                                 "deferred")
    failed = [e[6] for e in journal.events("gpu002") if e[2] == "verify" and e[3] == "failed"]
    assert failed and why in failed[0], failed
    assert not slurm.res
    journal.close()


def test_the_honest_answers_of_a_real_check_pass_the_shape_check():
    """What `gpugate check --json` prints on a simulated node reads as before."""
    from conftest import gpugate_cmd  # noqa: F401 - the simulated fleet path is tested in test_check_sim

    answer = {"node": "gpu001", "mode": "verify", "fit": True, "class": None, "reason": "", "exit_code": 0,
              "findings": [Finding("health", "xid", 79, "none", "", gpu=2).to_json()], "pending": [],
              "not_verified": [], "unchecked": [], "facts": {"dcgm_diag": None}, "durations": {},
              "baseline": {"path": "/etc/gpugate/baseline.toml", "sha256": None, "name": None}}
    assert problem(answer) == ""
    assert problem({"node": "gpu1", "ok": True, "all": False, "gpus": [2], "error": "", "steps": []}) == ""


FAKE = base64.b64encode(json.dumps({"node": "gpu999", "reason": "nothing wrong here"}).encode()).decode()
TRICKS = ["MANIFEST.json", "manifest.JSON", "../MANIFEST.json", "MANIFEST.json/", "./MANIFEST.json.",
          "a\\MANIFEST.json", "/tmp/../MANIFEST.json", "..", ".", "", "-rf", "MANIFEST.json\x00", "dcgm-diag.json",
          "kernel.log", "KERNEL.LOG", "kernel.log"]


def _names_unique(tar):
    names = [n.casefold() for n in tar.getnames()]
    return len(names) == len(set(names))


def test_a_node_part_named_manifest_json_cannot_replace_the_controllers(tmp_path):
    """Before: the node's part was stored under its own name, MANIFEST.json,
    after the controller's: extraction (and tarfile's own lookup) took the node's."""
    slurm = FakeSlurm(count=4, drained=("gpu002",), reason=XID, reboot_polls=1)
    parts = [{"name": n, "data": FAKE} for n in TRICKS]
    sweeper, journal = _sweep(tmp_path, slurm, {"gpu002": {"evidence": json.dumps({"node": "gpu002",
                                                                                  "parts": parts})}})
    sweeper.last_answers["gpu002"] = {"node": "gpu002", "fit": False, "facts": {"dcgm_diag": {"level": 3}}}
    assert sweeper.run().outcomes["gpu002"].result == "resumed"
    out = tmp_path / "out"
    with tarfile.open(_bundle(tmp_path, journal, "gpu002")) as tar:
        assert _names_unique(tar) and all("/" not in n and not n.startswith(".") for n in tar.getnames())
        assert tar.getnames()[0] == "MANIFEST.json"
        tar.extractall(str(out), filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(str(out))
    manifest = json.loads((out / "MANIFEST.json").read_text())
    assert manifest["node"] == "gpu002" and manifest["reason"] == XID  # the controller's
    # Every part kept, none over another: the node's 16 and the controller's 3.
    assert len(os.listdir(str(out))) == len(TRICKS) + 3 and "node-MANIFEST.json" in os.listdir(str(out))
    assert json.loads((out / "dcgm-diag.json").read_text()) == {"level": 3}  # the controller's too
    # The manifest names each node part as stored.
    stored = {r["name"] for r in manifest["parts"]}
    assert "node-MANIFEST.json" in stored and "MANIFEST.json" not in stored
    journal.close()


def test_store_save_never_writes_two_members_of_one_name(tmp_path):
    store = evidence.Store(str(tmp_path / "ev"))
    bundle, _ = store.save("gpu01", 1, [(n, b"x") for n in TRICKS], {"at": 0, "node": "gpu01"}, 1 << 20, 2, at=1)
    with tarfile.open(os.path.join(str(tmp_path / "ev"), bundle + ".tar.gz")) as tar:
        assert _names_unique(tar)
        assert json.load(tar.extractfile("MANIFEST.json"))["node"] == "gpu01"


# -- the batch's maintenance reservation outlives no sweep ---------------------

class Broken:
    """A transport that fails in a way nobody foresaw (a bug, an interrupt)."""

    def check(self, nodes, args, timeout):
        raise RuntimeError("unforeseen")

    run = check


def test_the_reservation_ends_with_the_sweeps_own_time_limits(tmp_path):
    """Before: Duration=UNLIMITED (scontrol) or a year (pyslurm)."""
    from gpugate.slurm.trace import in_scontrol_words
    from gpugate.schedulers.reservations import reservation_minutes

    slurm = FakeSlurm(count=4, drained=("gpu001",), reason=XID, reboot_polls=1)
    sweeper, journal = _sweep(tmp_path, slurm, {})
    assert sweeper.run().outcomes["gpu001"].result == "resumed"
    assert slurm.minutes == reservation_minutes(sweeper.cfg) and 60 < slurm.minutes < 24 * 60
    words, = in_scontrol_words("reserve", ("r", "gpu001", slurm.minutes))
    assert "Duration=%d " % slurm.minutes in words
    journal.close()


def test_a_sweep_that_dies_leaves_no_reservation_behind(tmp_path):
    """Before: an exception out of a step (the RecursionError of a 100,000-deep
    answer was one) left the batch's reservation, unbounded, for ever."""
    slurm = FakeSlurm(count=4, drained=("gpu001", "gpu002"), reason=XID, reboot_polls=1)
    sweeper, journal, _ = make(tmp_path, slurm, evidence_keep=0)
    sweeper.transport = Broken()
    with pytest.raises(RuntimeError, match="unforeseen"):
        sweeper.run()
    assert slurm.res == {}  # the nodes are drained with the sweep's reason: the next run takes them up
    assert all(slurm.states[n].drain and n not in slurm.resumed for n in ("gpu001", "gpu002"))
    assert set(journal.in_flight()) == {"gpu001", "gpu002"}
    journal.close()


def test_a_node_back_from_its_reboot_without_a_drain_keeps_the_bounded_reservation(tmp_path):
    """The one case the reservation alone keeps jobs off: 22.05-23.11 clear
    the drain as slurmd registers.  It stays, and ends by itself."""
    slurm = FakeSlurm(count=4, drained=("gpu001",), reason=XID, reboot_polls=1)
    sweeper, journal, _ = make(tmp_path, slurm, evidence_keep=0)
    said = []
    sweeper.say = said.append
    drain = slurm.drain

    def refused(names, reason):
        if "attempt" in reason:  # the work reason, after the reboot
            raise RuntimeError("slurmctld went away")
        drain(names, reason)

    slurm.drain = refused
    with pytest.raises(RuntimeError):
        sweeper.run()
    assert list(slurm.res) == ["gpugate_sweep_r1_b1"] and not slurm.states["gpu001"].drain
    assert any("kept for nodes still rebooting" in s and "ends by itself" in s for s in said), said
    journal.close()


def test_a_later_sweep_removes_a_stale_reservation_it_made_never_an_admins(tmp_path):
    """Before: every reservation named gpugate_sweep_* was deleted."""
    slurm = FakeSlurm(count=4)
    sweeper, journal, _ = make(tmp_path, slurm)
    slurm.res = {"gpugate_sweep_r1_b1": "gpu001", "gpugate_sweep_r77_b1": "gpu002",
                 "gpugate_sweep_maint": "gpu003", "gpugate_sweep_r1_b1_x": "gpu003", "site_maint": "gpu004"}
    sweeper.run()
    assert sorted(slurm.res) == ["gpugate_sweep_maint", "gpugate_sweep_r1_b1_x", "gpugate_sweep_r77_b1",
                                 "site_maint"]
    journal.close()


# -- what passes the shape check, the controller reads without an exception --

_ANY = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                max_size=3), max_leaves=8)


def _keyed(keys, values=_ANY):
    return st.dictionaries(st.sampled_from(keys), values, max_size=len(keys))


_FINDINGS = st.lists(_keyed(["class", "component", "gpu", "observed", "expected", "action", "detail"]) | _ANY,
                     max_size=3)
_DIAG = _keyed(["level", "passed_levels", "results", "exit_code"],
               _ANY | st.lists(st.integers() | _keyed(["test", "status"]), max_size=3))
_FACTS = _keyed(["dcgm_diag", "amd"], _ANY | _DIAG | _keyed(["rvs"]))
_PARTS = st.lists(_keyed(["name", "data", "error", "truncated", "bytes"],
                         _ANY | st.sampled_from(["MANIFEST.json", "a2Vy", "..", "a/b"])) | _ANY, max_size=3)
_ANSWER = st.fixed_dictionaries({"node": st.sampled_from(["gpu1", "gpu2"]) | _ANY}, optional={
    "fit": _ANY, "reason": _ANY, "findings": _FINDINGS | _ANY, "pending": _FINDINGS | _ANY,
    "baseline": _keyed(["sha256", "name"]) | _ANY, "facts": _FACTS | _ANY, "ok": _ANY, "all": _ANY,
    "gpus": st.lists(_ANY, max_size=3) | _ANY, "steps": st.lists(_keyed(["step", "detail"]) | _ANY) | _ANY,
    "parts": _PARTS | _ANY, "error": _ANY, "seconds": _ANY})


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(_ANSWER, st.sampled_from([1, 3]))
def test_an_answer_the_shape_check_passes_is_read_without_an_exception(answer, attempt):
    """Property: problem() never raises; an answer it passes goes through every
    reader of the sweep (verify, its DCGM proofs, the rma reason from its
    findings, the reset's summary, the evidence bundle's parts) without one."""
    import types

    from gpugate.core.record import replace
    from gpugate.sweep import steps

    why = problem(answer)
    assert isinstance(why, str)
    if why:
        return
    journal = types.SimpleNamespace(stage=lambda *a: None)
    steps._journal_diag(journal, "gpu1", answer)
    me = types.SimpleNamespace(_baseline_id=lambda: "abc", baseline=types.SimpleNamespace(rollout_in_progress=False))
    rec = types.SimpleNamespace(attempt=attempt)
    steps.Steps._verify_problem(me, "gpu1", answer, rec)
    found = [Finding.from_json(f) for f in answer.get("findings", [])
             if isinstance(f, dict) and "class" in f and "component" in f]
    reasons.render(TAG, "rma", [replace(f, cls="rma") for f in found])
    "; ".join("%s: %s" % (s.get("step"), " ".join(str(s.get("detail")).split())[:80])
              for s in answer.get("steps") or [] if isinstance(s, dict))
    evidence.node_parts(answer, ["dcgm-diag.json"])
    me = types.SimpleNamespace(last_answers={"gpu1": answer}, cfg={"smoke_output_dir": ""})
    evidence.controller_parts(me, "gpu1")


# -- the audit: one node's facts fold or are that node's alone -----------------

_FACT_KEYS = ["nvml", "packages", "hcas", "amd", "services", "image", "kernel_release", "kernel_log_follower",
              "install", "dcgm_version"]
_INNER = _keyed(["gpus", "driver_version", "fabricmanager", "container_toolkit", "error", "version", "name",
                 "vbios", "bound", "product", "hca_type", "fw_ver", "follower", "covered"],
                _ANY | st.lists(_ANY | _keyed(["name", "vbios", "bound", "product", "hca_type", "fw_ver"]),
                                max_size=2))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(_keyed(_FACT_KEYS, _ANY | _INNER | st.lists(_ANY | _INNER, max_size=2)))
def test_the_audit_folds_any_facts_a_node_sends_or_lists_that_node_alone(facts):
    """Property.  Before: `gpugate audit` stopped with `internal error` on facts
    such as {"packages": [{}]} or {"hcas": ["x"]} from one node."""
    from gpugate.fleet.audit import fold

    honest = {"kernel_release": "6.1.0", "nvml": {"driver_version": "580.65.06", "gpus": []}}
    audit = fold({"gpu1": facts, "gpu2": honest})
    assert "gpu2" not in audit.unreachable and any("gpu2" in r.nodes for r in audit.rows)
    if "gpu1" in audit.unreachable:
        assert not any("gpu1" in r.nodes for r in audit.rows)


def test_the_smoke_stage_makes_an_ended_reservation_again_before_its_job(tmp_path, monkeypatch):
    """A bounded reservation can end before a later run takes its batch up
    (the sweeper killed overnight): the nodes are drained, so the stage makes
    it again, and the job still never runs outside it.  Before the bound,
    it could not end; with the bound and no remaking, the proof failed."""
    import types

    from gpugate.sweep import slurm_smoke, smoke

    slurm = FakeSlurm(count=4, drained=("gpu001",), reason=XID, reboot_polls=1)
    slurm.undrain = lambda names: [slurm._set(n, flags=set(), reason="") for n in slurm._names(names)]
    slurm.cancel_named = lambda name, reservation: None
    sweeper, journal, _ = make(tmp_path, slurm, evidence_keep=0, smoke=["/bin/true"])
    ran = []

    def run_smoke(slurm_, cfg, baseline, nodes, reservation, sleep, say):
        ran.append((reservation, reservation in slurm.res))
        return {n: smoke.SmokeResult(n, job="7", passed=True) for n in nodes}

    monkeypatch.setattr(slurm_smoke, "run_smoke", run_smoke)
    monkeypatch.setattr(slurm_smoke, "Outputs", lambda path: types.SimpleNamespace(close=lambda: None))
    step = sweeper._step_smoke

    def ended_first(nodes, records):
        slurm.res.clear()  # its end came while nobody ran the sweep
        step(nodes, records)

    sweeper._step_smoke = ended_first
    assert sweeper.run().outcomes["gpu001"].result == "resumed"
    assert ran == [("gpugate_sweep_r1_b1", True)] and not slurm.res
    journal.close()


def test_the_manifest_names_long_node_parts_as_stored():
    """A node's long part names, taken twice (node- and a number added):
    the manifest's rows name the members the bundle holds."""
    long = "k" * 150
    answer = {"node": "gpu01", "parts": [{"name": n, "data": FAKE} for n in (long, long, long, "dcgm-diag.json")]}
    parts, rows, _ = evidence.node_parts(answer, ["dcgm-diag.json"])
    data, manifest = evidence._tar(parts + [("dcgm-diag.json", b"{}")], {"at": 0, "parts": rows}, 1 << 20)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        stored = tar.getnames()[1:]
    assert [r["name"] for r in rows] == stored[:4] and len(set(stored)) == 5


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=130) | st.sampled_from(TRICKS + ["a" * 99 + ".txt", "k" * 150]), max_size=8))
def test_every_part_is_stored_under_the_name_its_manifest_row_has(names):
    parts, rows, _ = evidence.node_parts({"node": "gpu01", "parts": [{"name": n, "data": FAKE} for n in names]},
                                         ["dcgm-diag.json"])
    data, _ = evidence._tar(parts + [("dcgm-diag.json", b"{}")], {"at": 0, "parts": rows}, 1 << 20)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        stored = tar.getnames()
    assert stored == ["MANIFEST.json"] + [r["name"] for r in rows] + ["dcgm-diag.json"]
    assert all(len(n) <= 100 for n in stored)
