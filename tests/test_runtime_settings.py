"""Issue 14, item 4: runtime GPU settings a nodeset pins (compute mode,
power limit, ECC mode, MIG mode), read through NVML, judged as budgeted
drift: a wrong pin in the baseline stays within the drain budget."""

import json
from gpugate.core.record import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import DEMO_BASELINE, gpugate_cmd
from gpugate.budget import rules as budget
from gpugate.model import reason
from gpugate.model.baseline import NodeExpect, parse_baseline
from gpugate.errors import ConfigError
from gpugate.model.facts import NOT_READ, GpuFacts, ProbeFailure, from_jsonable, to_jsonable
from gpugate.model.findings import DRIFT, PROBE, RECONVERGE, RESET_GPU, is_acute
from gpugate.judges import settings
from gpugate.vendors.nvidia import nvml_sim
from gpugate.model.verdict import decide


def gpu(**changes):
    values = dict(index=0, name="NVIDIA H100 80GB HBM3", uuid="GPU-1", serial="1", pci_bus_id="00000000:18:00.0",
                  vbios="96.00.99.00.01", gsp_firmware="580.65.06", ecc_enabled=True, ecc_uncorrected_volatile=0,
                  ecc_uncorrected_aggregate=0, retired_pages_pending=None, remapped_rows=None, nvlink_up=(),
                  pcie=None, clock_event_reasons=0, persistence_mode=True, mig_enabled=False, fabric_state=None,
                  recovery_action=0, compute_mode=0, power_limit_mw=700000, ecc_pending=True, mig_pending=False)
    values.update(changes)
    return GpuFacts(**values)


def found(expect, **changes):
    return [(f.cls, f.component, f.observed, f.expected, f.action)
            for f in settings.judge(NodeExpect(**expect), gpu(**changes))]


FAIL = ProbeFailure("nvml.compute_mode", "nvml", "Unknown Error", 999)

# (pins, GPU facts, findings)
CASES = [
    ({}, dict(compute_mode=2, power_limit_mw=1, ecc_enabled=False, mig_enabled=True), []),
    ({"compute_mode": "default", "power_limit_watts": 700, "ecc": True, "mig": False}, {}, []),
    ({"compute_mode": "default"}, dict(compute_mode=3),
     [(DRIFT, "compute_mode", "exclusive_process", "default", RECONVERGE)]),
    ({"compute_mode": "exclusive_process"}, dict(compute_mode=1),
     [(DRIFT, "compute_mode", "exclusive_thread", "exclusive_process", RECONVERGE)]),
    ({"compute_mode": "prohibited"}, dict(compute_mode=None),
     [(DRIFT, "compute_mode", "not supported", "prohibited", RECONVERGE)]),
    ({"compute_mode": "default"}, dict(compute_mode=FAIL), [(PROBE, "compute_mode", "nvml error 999", "answer",
                                                             "investigate")]),
    ({"compute_mode": "default"}, dict(compute_mode=NOT_READ), []),  # facts from an older gpugate
    ({"power_limit_watts": 700}, dict(power_limit_mw=699001), []),  # within 1 W
    ({"power_limit_watts": 700}, dict(power_limit_mw=699000), [(DRIFT, "power_limit", "699 W", "700 W", RECONVERGE)]),
    ({"power_limit_watts": 600}, dict(power_limit_mw=450500),
     [(DRIFT, "power_limit", "450.5 W", "600 W", RECONVERGE)]),
    ({"power_limit_watts": 600}, dict(power_limit_mw=None), [(DRIFT, "power_limit", "not supported", "600 W",
                                                              RECONVERGE)]),
    ({"ecc": True}, dict(ecc_enabled=False, ecc_pending=False), [(DRIFT, "ecc_mode", "off", "on", RECONVERGE)]),
    # Set with nvidia-smi -e 1, not reset yet: a reset alone fixes it.
    ({"ecc": True}, dict(ecc_enabled=False, ecc_pending=True),
     [(DRIFT, "ecc_mode", "off, pending on", "on", RESET_GPU)]),
    # Right now, but the next reset turns it off.
    ({"ecc": True}, dict(ecc_enabled=True, ecc_pending=False),
     [(DRIFT, "ecc_mode", "on, pending off", "on", RECONVERGE)]),
    ({"ecc": True}, dict(ecc_enabled=None, ecc_pending=None), [(DRIFT, "ecc_mode", "not supported", "on",
                                                                RECONVERGE)]),
    ({"ecc": False}, dict(ecc_enabled=None, ecc_pending=None), []),  # no ECC: it cannot be on
    ({"mig": True}, dict(mig_enabled=None, mig_pending=None), [(DRIFT, "mig", "not supported", "on", RECONVERGE)]),
    ({"mig": False}, dict(mig_enabled=False, mig_pending=True), [(DRIFT, "mig", "off, pending on", "off",
                                                                  RECONVERGE)]),
    ({"mig": True}, dict(mig_enabled=False, mig_pending=True), [(DRIFT, "mig", "off, pending on", "on", RESET_GPU)]),
    ({"mig": True}, dict(mig_enabled=FAIL), []),  # gpus.judge reports an unreadable MIG mode, pinned or not
    ({"persistence": True}, dict(persistence_mode=False), [(DRIFT, "persistence", "off", "on", RECONVERGE)]),
]


@pytest.mark.parametrize("expect,facts,expected", CASES, ids=[str(c[:2]) for c in CASES])
def test_judge_table(expect, facts, expected):
    assert found(expect, **facts) == expected


PIN = st.one_of(st.none(), st.booleans())
MODE = st.one_of(st.none(), st.booleans(), st.just(FAIL))


@given(pin=PIN, current=MODE, pending=MODE)
def test_reset_modes_pass_only_when_now_and_after_the_reset_match_the_pin(pin, current, pending):
    findings = settings.judge(NodeExpect(ecc=pin), gpu(ecc_enabled=current, ecc_pending=pending))
    assert all(f.cls in (DRIFT, PROBE) and not is_acute(f.cls, f.component) for f in findings)
    if pin is None or (current is None and pin is False):
        assert findings == []
    elif current == pin and (pending == pin or not isinstance(pending, bool)):  # else the current mode is judged
        assert findings == []
    else:
        assert len(findings) == 1
        assert ("pending" in findings[0].observed) == (isinstance(pending, bool) and pending != current
                                                      and isinstance(current, bool))


@given(watts=st.integers(1, 5000), mw=st.integers(0, 6000000))
def test_power_limit_matches_within_one_watt(watts, mw):
    findings = settings.judge(NodeExpect(power_limit_watts=watts), gpu(power_limit_mw=mw))
    assert bool(findings) == (abs(mw - watts * 1000) >= 1000)
    for f in findings:
        # The reason names both values and reads back as a budgeted drain.
        parsed = reason.parse(decide(findings, "gpugate:").reason, "gpugate:")
        assert parsed.first.observed == f.observed and parsed.first.expected == "%d W" % watts
        assert not reason.acute(parsed)


@given(mode=st.one_of(st.none(), st.integers(0, 9)),
       pin=st.sampled_from(["default", "exclusive_process", "prohibited"]))
def test_compute_mode_is_a_finding_unless_it_is_the_pinned_mode(mode, pin):
    findings = settings.judge(NodeExpect(compute_mode=pin), gpu(compute_mode=mode))
    assert bool(findings) == (settings.COMPUTE_MODE_NAMES.get(mode) != pin)
    assert all(budget.applies(decide([f], "gpugate:")) for f in findings)


def test_baseline_keys_and_their_errors():
    base = {"pin": {"driver": "580.65.06"}}
    b = parse_baseline(dict(base, nodes={"gpu[1-2]": {"compute_mode": "exclusive_process", "power_limit_watts": 500,
                                                      "ecc": False}}), "t.toml")
    assert b.expect_for("gpu1") == NodeExpect(compute_mode="exclusive_process", power_limit_watts=500, ecc=False)
    for bad, words in (({"compute_mode": "exclusive_thread"}, "compute_mode"),
                       ({"power_limit_watts": 0}, "power_limit_watts"),
                       ({"power_limit_watts": "700W"}, "power_limit_watts"), ({"ecc": "on"}, "ecc")):
        with pytest.raises(ConfigError) as err:
            parse_baseline(dict(base, nodes={"gpu1": bad}), "t.toml")
        assert "t.toml" in str(err.value) and words in str(err.value)


def test_nvml_reader_reads_the_settings_and_pending_modes():
    from gpugate.vendors.nvidia.probe_nvml import read

    state = json.loads(json.dumps(_sim_node()))
    state["gpus"][0].update(compute_mode=2, power_limit_mw=612500, ecc_mode=[1, 0], mig=[0, 1])
    state["gpus"][1].update(compute_mode=None, power_limit_mw=None, ecc_mode=None, mig=None)
    state["gpus"][1]["errors"] = {"nvmlDeviceGetPowerManagementLimit": 999}
    facts = read(nvml_sim.load(state), 10, gpus=[0, 1])
    g0, g1 = facts.gpus
    assert (g0.compute_mode, g0.power_limit_mw, g0.ecc_enabled, g0.ecc_pending, g0.mig_enabled, g0.mig_pending) == \
        (2, 612500, True, False, False, True)
    assert (g1.compute_mode, g1.ecc_enabled, g1.ecc_pending, g1.mig_enabled, g1.mig_pending) == (None,) * 5
    assert isinstance(g1.power_limit_mw, ProbeFailure) and g1.power_limit_mw.code == 999


def test_facts_of_an_older_gpugate_are_not_read_never_a_value():
    data = to_jsonable(gpu())
    for key in ("compute_mode", "power_limit_mw", "ecc_pending", "mig_pending"):
        del data[key]
    node = from_jsonable({"node": "gpu01", "mode": "healthcheck", "collected_at": 0,
                          "nvml": {"driver_version": "1", "cuda_driver_version": "1", "gpu_count": 1,
                                   "gpus": [data]}})
    old = node.nvml.gpus[0]
    assert old.compute_mode == NOT_READ and old.power_limit_mw == NOT_READ
    assert settings.judge(NodeExpect(compute_mode="prohibited", power_limit_watts=1), old) == []
    assert from_jsonable(to_jsonable(replace(node, nvml=replace(node.nvml, gpus=(gpu(),))))).nvml.gpus[0] == gpu()


def _sim_node():
    from gpugate.model.baseline import load_baseline
    from gpugate.sim.fleet import new_model

    return new_model("gpu01", load_baseline(DEMO_BASELINE))["nvml"]


# ---------------------------------------------------------------- simulated nodes, production path


def check(fleet, node="gpu01", baseline=DEMO_BASELINE):
    result = gpugate_cmd("check", "--sim", fleet, "--node", node, "--baseline", baseline, "--json")
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


def sim_set(fleet, node, *assignments):
    result = gpugate_cmd("sim", "set", fleet, node, *assignments)
    assert result.returncode == 0, result.stderr


def test_sim_set_flows_through_nvml_into_a_precise_drift_finding(fleet):
    assert check(fleet)["fit"] is True  # the demo baseline pins every setting; sim init applies them
    sim_set(fleet, "gpu01", "gpu.2.compute_mode=prohibited", "gpu.3.power_limit=550", "gpu.4.ecc.pending=0")
    data = check(fleet)
    assert data["fit"] is False and data["class"] == "drift"
    assert [(f["component"], f["gpu"], f["observed"], f["expected"]) for f in data["findings"]] == [
        ("compute_mode", 2, "prohibited", "default"), ("power_limit", 3, "550 W", "700 W"),
        ("ecc_mode", 4, "on, pending off", "on")]
    assert data["reason"] == ("gpugate: drift compute_mode:gpu2=prohibited (want default); "
                              "power_limit:gpu3=550 W (want 700 W); ecc_mode:gpu4=on, pending off (want on)")
    assert data["facts"]["nvml"]["gpus"][3]["power_limit_mw"] == 550000
    # The reset applies the pending ECC mode: now it is off.
    sim_set(fleet, "gpu01", "reboot=1")
    assert ("ecc_mode", 4, "off", "on") in [(f["component"], f["gpu"], f["observed"], f["expected"])
                                           for f in check(fleet)["findings"]]
    assert check(fleet, "gpu02")["fit"] is True
    explain = gpugate_cmd("explain", "--sim", fleet, "--node", "gpu01", "--baseline", DEMO_BASELINE)
    assert "nvidia-smi -i N -c" in explain.stdout and "nvidia-smi -i N -pl" in explain.stdout
    assert "nvidia-smi -i N -e" in explain.stdout


def test_a_wrong_pin_on_every_node_stays_within_the_drain_budget(fleet, tmp_path):
    with open(DEMO_BASELINE) as handle:
        text = handle.read()
    wrong = text.replace('compute_mode = "default"', 'compute_mode = "prohibited"').replace(
        "power_limit_watts = 700", "power_limit_watts = 350")
    assert wrong != text
    path = tmp_path / "wrong.toml"
    path.write_text(wrong)
    for node in ("gpu01", "gpu02", "gpu03"):
        data = check(fleet, node, str(path))
        assert data["fit"] is False and data["class"] == "drift"
        assert {f["component"] for f in data["findings"]} == {"compute_mode", "power_limit"}
        parsed = reason.parse(data["reason"], "gpugate:")
        assert not reason.acute(parsed)  # Slurm's copy reads as budgeted
        assert not any(is_acute(f["class"], f["component"]) for f in data["findings"])


def test_unsupported_setting_with_a_pin_is_a_finding_not_a_pass(fleet):
    sim_set(fleet, "gpu02", "power_limit=none")
    data = check(fleet, "gpu02")
    assert data["fit"] is False
    assert {(f["component"], f["observed"], f["expected"]) for f in data["findings"]} == {
        ("power_limit", "not supported", "700 W")}


def test_sim_set_rejects_a_bad_value_and_changes_nothing(fleet):
    result = gpugate_cmd("sim", "set", fleet, "gpu01", "gpu.1.power_limit=500", "compute_mode=exclusive")
    assert result.returncode != 0 and "compute_mode" in result.stderr
    assert check(fleet)["fit"] is True
