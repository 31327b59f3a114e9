"""`gpugate check`, `reset-gpus`, `facts` and `baseline capture` on simulated
AMD Instinct nodes (issue 29): only amdgpu's sysfs, amd-smi, rvs and the
kernel log are simulated (gpugate.vendors.amd.sim_node, sim_smi_out, sim_keys); the
probes, parsers and judges run the production code.  Every injected fault
gives its class and exact reason; unknown is never good."""

import json
import os

import pytest

from conftest import ROOT, gpugate_cmd
from test_check_sim import sim_set

MIXED = os.path.join(ROOT, "slurm_conf", "baseline.mixed.example.toml")


@pytest.fixture
def amd_fleet(tmp_path):
    path = str(tmp_path / "fleet")
    result = gpugate_cmd("sim", "init", path, "--nodes", "mi[001-002],gpu001", "--baseline", MIXED)
    assert result.returncode == 0, result.stderr
    return path


@pytest.fixture(scope="module")
def case_fleet(tmp_path_factory):
    """One node per fault case (a fleet made once: each case breaks its own node)."""
    path = str(tmp_path_factory.mktemp("amd") / "fleet")
    result = gpugate_cmd("sim", "init", path, "--nodes", "mi[001-%03d]" % (len(CASES) + 1), "--baseline", MIXED)
    assert result.returncode == 0, result.stderr
    return path


def check(fleet, node="mi001", mode="healthcheck"):
    result = gpugate_cmd("check", "--sim", fleet, "--node", node, "--baseline", MIXED, "--mode", mode, "--json")
    assert result.returncode in (0, 1), result.stderr
    data = json.loads(result.stdout)
    assert data["exit_code"] == result.returncode
    return data


def test_a_healthy_mi300x_node_beside_an_h100_one_is_fit_with_its_facts(amd_fleet):
    data = check(amd_fleet)
    assert data["fit"] is True and data["findings"] == [], data["reason"]
    amd = data["facts"]["amd"]
    assert data["facts"]["nvml"] is None  # no NVML on an AMD node, and none was asked
    assert (amd["initstate"], amd["amdgpu_version"], amd["rocm_version"], amd["amd_smi_version"]) == \
        ("live", "6.16.13", "7.2.1", "26.2.2")
    assert amd["pci_functions"] == 8 and [g["index"] for g in amd["gpus"]] == list(range(8))
    gpu = amd["gpus"][3]
    assert (gpu["product"], gpu["vbios"], gpu["ifwi"], gpu["xgmi"], gpu["compute_partition"]) == \
        ("AMD Instinct MI300X OAM", "113-M3000108-103", "00159017", [7, 0, 0], "SPX")
    assert check(amd_fleet, "gpu001")["fit"] is True  # the NVIDIA node of the same baseline


# (injection, class, exact finding "component:gpuN=observed (want expected)", action)
CASES = [
    (["amd.gpu3.ras.umc.ue=+2"], "health", "ras:gpu3=umc=2 uncorrectable (want 0)", "reset_gpu"),
    (["amd.gpu3.ras.xgmi_wafl.ue=1", "amd.gpu3.ras.umc.ue=1"], "health",
     "ras:gpu3=umc=1,xgmi_wafl=1 uncorrectable (want 0)", "reset_gpu"),
    (["amd.gpu0.ras.umc.de=1"], "health", "ras_deferred:gpu0=umc=1 deferred (want <= 0)", "reset_gpu"),
    (["amd.gpu1.bad_pages=retired:2,pending:1"], "health", "bad_pages:gpu1=1 pending (want none)", "reset_gpu"),
    (["amd.gpu1.bad_pages=unreservable:1"], "health", "bad_pages:gpu1=1 unreservable (want none)", "rma"),
    (["amd.gpu4.threshold_exceeded=1"], "health",
     "bad_pages:gpu4=threshold exceeded (want under the driver's threshold)", "rma"),
    (["amd.gpu5.xgmi_down=1"], "health", "xgmi:gpu5=1 of 7 down (want <= 0 down)", "reset_gpu"),
    (["amd.gpu2.pcie_width=8"], "health", "pcie_width:gpu2=x8 (want x16)", "investigate"),
    (["amd.gpu3.log=reset_failed"], "health", "amdgpu_event:gpu3=reset_failed (want none)", "reboot"),
    (["amd.gpu6.bound=0"], "broken", "bound_gpus=7 of 8 on bus (want 8)", "reload_or_reboot"),
    (["amd.initstate=absent"], "broken", "module=amdgpu not loaded (want live)", "reload_or_reboot"),
    (["amd.gpu0.compute_partition=CPX"], "drift", "compute_partition:gpu0=CPX (want SPX)", "reconverge"),
    (["amd.gpu0.memory_partition=NPS4"], "drift", "memory_partition:gpu0=NPS4 (want NPS1)", "reconverge"),
    (["amd.gpu0.power_cap_w=600"], "drift", "power_limit:gpu0=600 W (want 750 W)", "reconverge"),
    (["amd.amdgpu=6.12.12"], "drift", "amdgpu=6.12.12 (want 6.16.13)", "reconverge"),
    (["amd.rocm=7.1.1"], "drift", "rocm=7.1.1 (want 7.2.1)", "reconverge"),
    (["amd.amd_smi=25.5.1"], "drift", "amd_smi=25.5.1 (want 26.2.2)", "reconverge"),
    (["amd.gpu7.vbios=113-M3000108-101"], "drift", "vbios:gpu7=113-M3000108-101 (want 113-M3000108-103)",
     "reconverge"),
    (["amd.gpu7.ifwi=00150000"], "drift", "ifwi:gpu7=00150000 (want 00159017)", "reconverge"),
    (["amd.smi=absent"], "probe", "amd_smi=missing (want answer)", "investigate"),
    (["amd.gpu2.file.ras/umc_err_count=ue: garbage"], "probe", "ras:gpu2=error (want answer)", "investigate"),
]


@pytest.mark.parametrize("case", range(len(CASES)), ids=[c[2].split("=")[0] + c[0][0][-6:] for c in CASES])
def test_each_amd_fault_gives_its_class_and_exact_reason(case_fleet, case):
    assignments, cls, shown, action = CASES[case]
    node = "mi%03d" % (case + 1)
    sim_set(case_fleet, node, *assignments)
    data = check(case_fleet, node)
    assert data["fit"] is False and data["class"] == cls, data["reason"]
    assert shown in data["reason"], data["reason"]
    component = shown.split("=")[0].split(":")[0]
    assert any(f["component"] == component and f["action"] == action for f in data["findings"]), data["findings"]


def test_the_fault_cases_leave_the_node_beside_them_untouched(case_fleet):
    assert check(case_fleet, "mi%03d" % (len(CASES) + 1))["fit"] is True


def test_no_kfd_access_is_a_probe_finding_never_a_pass(amd_fleet):
    sim_set(amd_fleet, "mi001", "amd.smi=kfd")
    data = check(amd_fleet)
    assert data["fit"] is False and data["class"] == "probe"
    assert "ifwi=na (want answer)" in data["reason"] and not any(f["class"] != "probe" for f in data["findings"])
    ifwi = data["facts"]["amd"]["gpus"][0]["ifwi"]["error"]
    assert ifwi["kind"] == "na" and "no /dev/kfd access" in ifwi["detail"]


def test_an_amd_smi_without_libdrm_is_read_not_rejected(amd_fleet):
    # The library's "Fail to open libdrm_amdgpu.so.1 ... cannot open shared
    # object file" warning on every call: the IFWI version it still prints is read.
    sim_set(amd_fleet, "mi001", "amd.smi=nolibdrm")
    data = check(amd_fleet)
    assert data["fit"] is True, data["reason"]
    gpu = data["facts"]["amd"]["gpus"][0]
    assert gpu["ifwi"] == "00159017" and gpu["bad_page_threshold_exceeded"] is False


def test_an_amd_smi_without_link_status_leaves_xgmi_unchecked(amd_fleet):
    sim_set(amd_fleet, "mi001", "amd.xgmi_status=0")
    data = check(amd_fleet)
    assert data["fit"] is True
    assert data["facts"]["amd"]["gpus"][0]["xgmi"]["error"]["kind"] == "unchecked"


def test_soft_recovered_timeouts_and_user_text_never_drain(amd_fleet):
    sim_set(amd_fleet, "mi001", "amd.gpu3.log=soft_recovered",
            "kmsg.user=amdgpu 0000:5f:00.0: amdgpu: GPU reset(1) failed",
            "kmsg=tmpfs: Unknown parameter 'amdgpu 0000:5f:00.0: amdgpu: GPU reset(1) failed'")
    assert check(amd_fleet)["fit"] is True


def test_kfd_processes_left_after_a_job_drain_in_the_epilog_only(amd_fleet):
    sim_set(amd_fleet, "mi001", "amd.gpu0.processes=4242")
    assert check(amd_fleet)["fit"] is True
    data = check(amd_fleet, mode="epilog")
    assert data["reason"] == "gpugate: broken processes=1 left [pid 4242] (want none)"


def test_verify_runs_rvs_and_a_failed_gpu_is_named(amd_fleet):
    data = check(amd_fleet, mode="verify")
    rvs = data["facts"]["amd"]["rvs"]
    assert data["fit"] is True and rvs["level"] == 2 and rvs["passed_levels"] == [1]
    sim_set(amd_fleet, "mi001", "amd.rvs.fail.2=3")
    data = check(amd_fleet, mode="verify")
    assert data["class"] == "health" and "rvs:gpu3=hbm_basic fail (want pass [rvs -r 2])" in data["reason"]
    sim_set(amd_fleet, "mi001", "amd.rvs=absent")
    data = check(amd_fleet, mode="verify")
    assert data["class"] == "probe" and "rvs=missing (want answer)" in data["reason"]
    # No predefined levels for this GPU or ROCm (MI200, ROCm < 7.2): not verified, said, never a pass.
    sim_set(amd_fleet, "mi001", "amd.rvs=nolevels")
    data = check(amd_fleet, mode="verify")
    assert data["fit"] is True and [f["component"] for f in data["not_verified"]] == ["rvs"], data


def test_reset_gpus_resets_the_whole_node_and_clears_what_a_reset_clears(amd_fleet):
    sim_set(amd_fleet, "mi001", "amd.gpu3.ras.umc.ue=+2", "amd.gpu1.bad_pages=pending:1")
    result = gpugate_cmd("reset-gpus", "--sim", amd_fleet, "--node", "mi001", "--gpu", "3",
                         "--json")
    out = json.loads(result.stdout)
    assert result.returncode == 0 and out["ok"] and out["all"] and out["vendor"] == "amd", out
    assert any(s["step"] == "scope" and "every GPU" in s["detail"] for s in out["steps"])
    model = json.load(open(os.path.join(amd_fleet, "mi001", "node.json")))
    assert model["amd"]["gpus"][3]["ras"]["umc"] == [0, 0, 0]
    assert model["amd"]["gpus"][1]["bad_pages"] == {"retired": 1, "pending": 0, "unreservable": 0}
    # The reset's own kernel-log lines ("GPU reset begin!") are before the verification's cursor.
    data = json.loads(gpugate_cmd("check", "--sim", amd_fleet, "--node", "mi001", "--baseline", MIXED, "--mode",
                                  "verify", "--json").stdout)
    assert data["fit"] is True, data["reason"]


@pytest.mark.parametrize("assignment, words", [("amd.gpu2.processes=4242", "hold /dev/kfd (pid 4242): not reset"),
                                               ("amd.gpu5.reset_fails=1", "Failed to reset GPU")])
def test_a_reset_the_node_refuses_or_fails_is_a_failure(amd_fleet, assignment, words):
    sim_set(amd_fleet, "mi001", assignment)
    result = gpugate_cmd("reset-gpus", "--sim", amd_fleet, "--node", "mi001", "--json")
    out = json.loads(result.stdout)
    assert result.returncode == 1 and not out["ok"] and words in out["error"], out
    assert json.load(open(os.path.join(amd_fleet, "mi001", "node.json")))["amd"].get("resets", 0) == 0


def test_capture_from_an_amd_node_without_any_baseline(amd_fleet, tmp_path):
    os.unlink(os.path.join(amd_fleet, "fleet.json"))  # no recorded baseline: the bus says AMD
    out = str(tmp_path / "captured.toml")
    result = gpugate_cmd("baseline", "capture", "--node", "mi002", "--sim", amd_fleet, "--output", out,
                         "--name", "mi300x-captured")
    assert result.returncode == 0, result.stderr
    from gpugate.model.baseline import load_baseline

    captured = load_baseline(out)
    assert captured.vendor_for("mi002") == "amd" and captured.pin.driver is None
    assert (captured.pin.amdgpu, captured.pin.rocm, captured.pin.amd_smi) == ("6.16.13", "7.2.1", "26.2.2")
    assert dict(captured.pin.ifwi) == {"AMD Instinct MI300X OAM": "00159017"}
    expect, amd = captured.expect_for("mi002"), captured.amd_expect_for("mi002")
    assert (expect.gpus, expect.product, expect.power_limit_watts) == (8, "AMD Instinct MI300X OAM", 750)
    assert (amd.device_id, amd.compute_partition, amd.memory_partition) == ("0x74a1", "SPX", "NPS1")
