"""`gpugate check` on simulated nodes: every injected fault gives the right
class, and a reason naming observed and expected values."""

import json
import os
import time

import pytest

from conftest import DEMO_BASELINE, gpugate_cmd


def check(fleet, node="gpu01", mode="healthcheck", *extra):
    result = gpugate_cmd("check", "--sim", fleet, "--node", node, "--baseline", DEMO_BASELINE,
                         "--mode", mode, "--json", *extra)
    assert result.returncode in (0, 1), result.stderr
    data = json.loads(result.stdout)
    assert data["exit_code"] == result.returncode
    return data


def sim_set(fleet, node, *assignments):
    result = gpugate_cmd("sim", "set", fleet, node, *assignments)
    assert result.returncode == 0, result.stderr


def test_healthy_node_is_fit(fleet):
    data = check(fleet)
    assert data["fit"] is True and data["reason"] is None and data["findings"] == []
    assert set(["node", "mode", "fit", "reason", "findings", "facts", "durations"]) <= set(data)
    facts = data["facts"]
    assert facts["nvml"]["driver_version"] == "580.65.06"
    assert len(facts["nvml"]["gpus"]) == 8
    assert facts["module_on_disk"] == "580.65.06"
    assert facts["pci_gpus"] == 8 and facts["pci_nvswitches"] == 4
    assert facts["dcgm_version"] == "4.2.3"
    assert facts["dcgm_health"]["overall"] == "Healthy"


# (injection, class, component, observed substring, expected substring, gpu)
CASES = [
    (["driver=550.54.15"], "drift", "driver", "550.54.15", "580.65.06", None),
    (["gsp=580.11.11"], "drift", "gsp_firmware", "580.11.11", "580.65.06", None),
    (["kernel=6.1.0-26-amd64"], "drift", "kernel", "6.1.0-26-amd64", "6.1.0-27-amd64", None),
    (["image_version=gpu-2026.09.2"], "drift", "image", "gpu-2026.09.2", "gpu-2026.11.1", None),
    (["container_toolkit=1.16.2"], "drift", "container_toolkit", "1.16.2", "1.17.8", None),
    (["dcgm=3.3.5"], "drift", "dcgm", "3.3.5", "4.2.3", None),
    (["gpu.3.vbios=96.00.74.00.01"], "drift", "vbios", "96.00.74.00.01", "96.00.99.00.01", 3),
    (["fabricmanager=580.65.01"], "drift", "fabricmanager", "580.65.01", "580.65.06", None),
    (["service.nvidia-fabricmanager=inactive"], "broken", "fabricmanager", "inactive", "active", None),
    (["nvml.init_error=18"], "broken", "nvml", "mismatch", "nvml ok", None),
    (["module.resident=570.133.20"], "broken", "module", "570.133.20", "580.65.06", None),
    (["gpus=7"], "health", "gpu_count", "7", "8", None),
    (["gpu.3.xid=79"], "health", "xid", "79", "none", 3),
    (["gpu.2.remapped_rows.pending=1"], "health", "row_remap", "pending", "none", 2),
    (["gpu.1.ecc.uncorrected.volatile=2"], "health", "ecc", "2", "0", 1),
    (["gpu.0.pcie.width=8"], "health", "pcie_width", "x8", "x16", 0),
    (["gpu.0.recovery_action=1"], "health", "recovery", "reset", "none", 0),
    (["gpu.4.nvlink.down=2"], "health", "nvlink", "2 of 18", "0", 4),
    (["gpu.6.lost=1"], "health", "gpu", "lost", "present", 6),
    (["dcgm.health=Failure"], "health", "dcgm_health", "failure", "healthy", None),
]


@pytest.mark.parametrize("inject,cls,component,observed,expected,gpu", CASES,
                         ids=[" ".join(c[0]) for c in CASES])
def test_injected_fault(fleet, inject, cls, component, observed, expected, gpu):
    sim_set(fleet, "gpu01", *inject)
    data = check(fleet)
    assert data["fit"] is False
    assert data["class"] == cls
    match = [f for f in data["findings"] if f["component"] == component and f["class"] == cls]
    assert match, data["findings"]
    first = match[0]
    assert observed in first["observed"] and expected in first["expected"]
    assert first["gpu"] == gpu
    reason = data["reason"]
    assert reason.startswith("gpugate: %s " % cls)
    # The reason names observed and expected values of the leading finding.
    assert "%s" % observed in reason and expected in reason
    # Other nodes are untouched by the injection.
    assert check(fleet, "gpu02")["fit"] is True


def test_driver_drift_is_drift_not_broken(fleet):
    """A whole driver install at the wrong version works: drift, not broken."""
    sim_set(fleet, "gpu01", "driver=550.54.15")
    data = check(fleet)
    assert {f["class"] for f in data["findings"]} == {"drift"}


def test_stale_module_is_broken_even_when_userspace_matches_pin(fleet):
    # Userspace upgraded to the pin, old module still loaded.
    sim_set(fleet, "gpu01", "module.resident=570.133.20")
    data = check(fleet)
    assert data["class"] == "broken"
    assert data["reason"].startswith("gpugate: broken module=loaded 570.133.20 (want on-disk 580.65.06)")


def test_no_module_for_running_kernel_is_broken(fleet):
    sim_set(fleet, "gpu01", "module.on_disk=none")
    data = check(fleet)
    assert data["class"] == "broken"
    assert any(f["component"] == "module" and "none for" in f["observed"] for f in data["findings"])


def test_dkms_without_build_for_running_kernel_is_broken(fleet):
    sim_set(fleet, "gpu01", "dkms=0")
    data = check(fleet)
    assert any(f["class"] == "broken" and f["component"] == "dkms" for f in data["findings"])


def test_gpus_on_bus_but_not_in_nvml_is_broken(fleet):
    sim_set(fleet, "gpu01", "nvml.init_error=9")
    data = check(fleet)
    assert data["class"] == "broken"
    assert data["findings"][0]["observed"] == "driver not loaded"


def test_dcgm_healthy_but_recovery_action_reset_is_unfit(fleet):
    sim_set(fleet, "gpu01", "gpu.2.recovery_action=1")
    data = check(fleet)
    assert data["facts"]["dcgm_health"]["overall"] == "Healthy"
    assert data["fit"] is False and data["class"] == "health"


def test_application_xid_does_not_drain(fleet):
    sim_set(fleet, "gpu01", "gpu.1.xid=13")
    data = check(fleet)
    assert data["fit"] is True
    assert [x["xid"] for x in data["facts"]["xids"]] == [13]


def test_dcgm4_diag_failure_with_exit_226_in_verify_mode(fleet, tmp_path):
    report = {
        "DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
            {"name": "memory", "results": [
                {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status": "Pass"},
                {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 5, "status": "Fail",
                 "warnings": [{"warning": "Detected 3 volatile double-bit ECC error(s) in GPU 5.",
                               "error_id": 4, "error_category": 7, "error_severity": 2}]}],
             "test_summary": {"status": "Fail"}}]}]},
        "entity_groups": [{"entity_group": "GPU", "entity_group_id": 1, "entities": [{"entity_id": 0}]}],
        "metadata": {"version": "4.2.3"}}
    path = tmp_path / "diag.json"
    path.write_text(json.dumps(report))
    result = gpugate_cmd("sim", "replay", fleet, "gpu01", "--stdout-file", str(path), "--exit-code", "226",
                         "--", "dcgmi", "diag", "-r", "3", "-j")  # verify: -r 1 passes, then -r 3 fails
    assert result.returncode == 0, result.stderr
    assert check(fleet, mode="healthcheck")["fit"] is True  # no diag outside verify
    data = check(fleet, "gpu01", "verify")
    assert data["class"] == "health"
    finding = data["findings"][0]
    assert (finding["component"], finding["gpu"], finding["action"]) == ("dcgm_diag", 5, "rma")
    assert "memory fail" in data["reason"]
    assert data["facts"]["dcgm_diag"]["passed_levels"] == [1]  # the cheap level first, then the long one


def test_dcgmi_missing_is_probe(fleet):
    os.unlink(os.path.join(fleet, "gpu01", "bin", "dcgmi"))
    data = check(fleet)
    assert data["class"] == "probe"
    assert {f["component"] for f in data["findings"]} == {"dcgm", "dcgm_health"}
    assert all(f["observed"] == "missing" for f in data["findings"])


def test_dcgmi_hanging_is_probe_within_budget(fleet, tmp_path):
    config = tmp_path / "gpugate.toml"
    config.write_text("[budgets]\nhealthcheck = 6\n")
    result = gpugate_cmd("sim", "replay", fleet, "gpu01", "--hang", "--", "dcgmi", "health", "-c", "-j")
    assert result.returncode == 0, result.stderr
    started = time.monotonic()
    data = check(fleet, "gpu01", "healthcheck", "--config", str(config))
    took = time.monotonic() - started
    assert data["class"] == "probe"
    assert [f["observed"] for f in data["findings"] if f["component"] == "dcgm_health"] == ["timeout"]
    assert took < 6 + 3  # the budget, plus interpreter start-up


def test_nvml_hanging_is_probe_within_budget(fleet, tmp_path):
    config = tmp_path / "gpugate.toml"
    config.write_text("[budgets]\nhealthcheck = 4\n")
    sim_set(fleet, "gpu01", "nvml.hang=1")
    started = time.monotonic()
    data = check(fleet, "gpu01", "healthcheck", "--config", str(config))
    assert data["class"] == "probe" and data["findings"][0]["component"] == "nvml"
    assert time.monotonic() - started < 4 + 3


def test_rollout_in_progress_reports_previous_as_pending(fleet, tmp_path):
    text = open(DEMO_BASELINE).read().replace("in_progress = false", "in_progress = true")
    baseline = tmp_path / "rollout.toml"
    baseline.write_text(text)
    sim_set(fleet, "gpu01", "driver=570.133.20", "fabricmanager=570.133.20", "dcgm=4.1.1")
    result = gpugate_cmd("check", "--sim", fleet, "--node", "gpu01", "--baseline", str(baseline), "--json")
    data = json.loads(result.stdout)
    assert result.returncode == 0 and data["fit"] is True
    assert {p["component"] for p in data["pending"]} >= {"driver", "dcgm", "fabricmanager"}
    # Not on previous either: drift.
    sim_set(fleet, "gpu02", "driver=550.54.15")
    result = gpugate_cmd("check", "--sim", fleet, "--node", "gpu02", "--baseline", str(baseline), "--json")
    assert json.loads(result.stdout)["class"] == "drift"


def test_human_output_and_explain(fleet):
    sim_set(fleet, "gpu01", "module.resident=570.133.20")
    result = gpugate_cmd("check", "--sim", fleet, "--node", "gpu01", "--baseline", DEMO_BASELINE)
    assert result.returncode == 1
    assert "UNFIT (broken)" in result.stdout and "reason: gpugate: broken" in result.stdout
    result = gpugate_cmd("explain", "--sim", fleet, "--node", "gpu01", "--baseline", DEMO_BASELINE)
    assert result.returncode == 1
    assert "unload the modules in order" in result.stdout and "DCGM diagnostic" in result.stdout


def test_bad_baseline_is_exit_2_with_file_and_key(fleet, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[pin]\ndriver = "580.65.06"\nfabricmanager = "575.1.1"\n')
    result = gpugate_cmd("check", "--sim", fleet, "--node", "gpu01", "--baseline", str(bad))
    assert result.returncode == 2
    assert str(bad) in result.stderr and "pin.fabricmanager" in result.stderr
    assert "Traceback" not in result.stderr


def test_sim_set_unknown_key_is_an_error_and_changes_nothing(fleet):
    before = open(os.path.join(fleet, "gpu01", "node.json")).read()
    result = gpugate_cmd("sim", "set", fleet, "gpu01", "driver=1.2.3", "gpu.0.colour=red")
    assert result.returncode == 2 and "unknown key 'gpu.0.colour'" in result.stderr
    assert open(os.path.join(fleet, "gpu01", "node.json")).read() == before


def test_version_and_help():
    result = gpugate_cmd("--version")
    assert result.returncode == 0 and result.stdout.startswith("gpugate, version ")
    result = gpugate_cmd("--help")
    assert "Examples:" in result.stdout and "Exit codes:" in result.stdout


def test_pcie_below_the_policy_but_at_the_gpus_own_maximum_is_budgeted(fleet, tmp_path):
    """A link trained below what the GPU can do is hardware (acute); a policy
    minimum beyond what the GPU can do is a baseline that does not fit the
    node: pcie_max_width, budgeted, so a typo cannot drain a partition."""
    from gpugate.model.findings import is_acute

    baseline = tmp_path / "baseline.toml"
    with open(DEMO_BASELINE) as handle:
        baseline.write_text(handle.read().replace('pcie_min_width = "max"', "pcie_min_width = 32"))
    result = gpugate_cmd("check", "--sim", fleet, "--node", "gpu01", "--baseline", str(baseline), "--json")
    data = json.loads(result.stdout)
    assert result.returncode == 1, result.stderr
    assert {(f["component"], f["observed"], f["expected"]) for f in data["findings"]} == {
        ("pcie_max_width", "x16 max", "x32")}
    assert not any(is_acute(f["class"], f["component"]) for f in data["findings"])
    sim_set(fleet, "gpu01", "gpu.0.pcie.width=8")
    data = check(fleet)
    assert [f["component"] for f in data["findings"]] == ["pcie_width"]
    assert is_acute(data["class"], "pcie_width")
