"""AMD nodes fail safe where a review found they did not (issue 29): an
unreadable kernel log, another job's process in the epilog, an empty FRU,
an unreadable firmware file or PCI bus, the sweep's own reset in a rate, a
finding no repair fixes that is not the first, pairs across vendors."""

import json
import os

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from conftest import ROOT, gpugate_cmd
from test_amd_judges import CLEAN, baseline, gpu, node, reason, with_gpu
from test_check_sim import sim_set

from gpugate.model.facts import ProbeFailure
from gpugate.core.record import replace

MIXED = os.path.join(ROOT, "slurm_conf", "baseline.mixed.example.toml")


def _fleet(tmp_path, nodes="mi[001-002]"):
    path = str(tmp_path / "fleet")
    result = gpugate_cmd("sim", "init", path, "--nodes", nodes, "--baseline", MIXED)
    assert result.returncode == 0, result.stderr
    return path


def _check(fleet, node="mi001", mode="healthcheck"):
    result = gpugate_cmd("check", "--sim", fleet, "--node", node, "--mode", mode, "--json")
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


def test_an_unreadable_or_overrun_kernel_log_is_a_probe_finding_on_amd_too(tmp_path):
    fleet = _fleet(tmp_path)
    kmsg = os.path.join(fleet, "mi001", "root", "dev", "kmsg")
    os.unlink(kmsg)
    os.mkdir(kmsg)
    data = _check(fleet)
    assert data["class"] == "probe" and "kernel_log=" in data["reason"], data["reason"]
    # Records overwritten after a cursor (the sweep's reset here) before they were read.
    assert gpugate_cmd("reset-gpus", "--sim", fleet, "--node", "mi002", "--json").returncode == 0
    sim_set(fleet, "mi002", "kmsg.flood=3000")
    data = _check(fleet, "mi002", "verify")
    assert "kernel_log=lost" in (data["reason"] or ""), data["reason"]


def test_the_sweeps_own_reset_is_no_gpu_reset_event_for_any_later_run(tmp_path):
    fleet = _fleet(tmp_path)
    result = gpugate_cmd("reset-gpus", "--sim", fleet, "--node", "mi001", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    assert _check(fleet)["fit"] is True  # a health check from the start of the kernel log
    sim_set(fleet, "mi001", "amd.gpu0.log=reset_begin")  # a reset of the driver's own, after ours: counted
    data = _check(fleet)
    from gpugate.model.findings import is_acute

    assert "amdgpu_repeat:gpu0=gpu_reset (want" in data["reason"], data["reason"]
    assert not is_acute("health", "amdgpu_repeat")  # a rate: budgeted, as NVIDIA's xid_repeat


def test_epilog_counts_only_the_jobs_own_gpus_processes():
    from gpugate.judges import judge
    from gpugate.model.verdict import decide

    b = baseline()
    facts = replace(node(mode="epilog"), amd=replace(node().amd, kfd_processes=()))  # as narrowed to the job
    assert decide(judge(b, facts), "gpugate:").fit
    unknown = replace(facts, amd=replace(facts.amd, kfd_processes=ProbeFailure("amdgpu_sysfs", "error", "x")))
    assert decide(judge(b, unknown), "gpugate:").reason == "gpugate: probe processes=error (want answer)"


def test_job_processes_are_narrowed_to_the_jobs_gpus():
    from gpugate.probes import _job_processes

    gpus = [gpu(i, processes=(4242,) if i == 5 else ()) for i in range(8)]
    amd = replace(node(gpus).amd, kfd_processes=(4242,))
    assert _job_processes(amd, [0, 1]).kfd_processes == ()
    assert _job_processes(amd, [5]).kfd_processes == (4242,)
    # An index past the node's GPUs (CPX numbers more logical GPUs than
    # physical): every GPU's processes, never none (issue 34).
    assert _job_processes(amd, [8]).kfd_processes == (4242,)
    assert _job_processes(amd, [0, 31]).kfd_processes == (4242,)
    broken = [gpu(i, processes=ProbeFailure("amdgpu_sysfs", "error", "topology")) for i in range(8)]
    assert _job_processes(replace(node(broken).amd, kfd_processes=(1,)), [0]).kfd_processes.kind == "error"


@hsettings(max_examples=200, deadline=None)
@given(on=st.sets(st.integers(0, 7)), job=st.lists(st.integers(0, 63), min_size=1, max_size=8))
def test_a_job_index_never_narrows_to_fewer_processes_than_its_gpus_hold(on, job):
    """Property: the job's GPUs' processes, or every GPU's where an index
    names no GPU of the node; never none where its GPUs hold some."""
    from gpugate.probes import _job_processes

    gpus = [gpu(i, processes=(1000 + i,) if i in on else ()) for i in range(8)]
    amd = replace(node(gpus).amd, kfd_processes=tuple(sorted(1000 + i for i in on)))
    got = set(_job_processes(amd, job).kfd_processes)
    wanted = set(amd.kfd_processes) if any(i > 7 for i in job) else {1000 + i for i in on if i in job}
    assert got == wanted


def test_an_empty_fru_falls_back_to_the_nodesets_device_id_or_says_so():
    facts = with_gpu(2, product=None, vbios="999-BAD")
    assert "vbios:gpu2=999-BAD (want 113-M3000108-103)" in reason(facts).reason  # device_id 0x74a1 is pinned
    b = baseline()
    no_id = replace(b, resolved_amd=replace(b.amd_expect_for("mi01"), device_id=None))
    verdict = reason(facts, no_id)
    assert verdict.reason == "gpugate: probe product:gpu2=FRU empty (want a product name [or the nodeset's " \
                             "device_id])", verdict.reason


def test_an_unreadable_firmware_or_bus_is_a_probe_never_drift_or_missing_gpus():
    import copy

    from gpugate.model.baseline import parse_baseline
    from test_amd_judges import BASELINE, PRODUCT

    data = copy.deepcopy(BASELINE)
    data["pin"]["amdgpu_firmware"] = {PRODUCT: {"mec": "0x000000a6"}}
    b = parse_baseline(data, "b")
    facts = with_gpu(0, firmware={"mec": ProbeFailure("amdgpu_sysfs", "error", "garbage")})
    assert reason(facts, b).reason == "gpugate: probe amdgpu_firmware:gpu0=error (want answer)"
    bus = node([], pci_functions=ProbeFailure("amdgpu_sysfs", "error", "class: garbage"))
    assert reason(bus).reason == "gpugate: probe pci=error (want answer)"


def test_a_finding_no_repair_fixes_escalates_wherever_it_stands_in_the_reason():
    from gpugate.model import reason as reasons
    from gpugate.sweep.plan import ESCALATE, Options, remedy_for

    text = reason(node([gpu(0, ras=dict(CLEAN, umc=(2, 0, 0))), gpu(1, bad_pages=(0, 0, 1))] +
                       [gpu(i) for i in range(2, 8)])).reason
    assert text.index("ras:gpu0") < text.index("bad_pages:gpu1=1 unreservable")
    assert remedy_for(reasons.parse(text, "gpugate:"), Options())[0] == ESCALATE


def test_pairs_never_cross_vendors():
    from gpugate.sweep.smoke import _by_vendor

    b = baseline()
    assert _by_vendor(b, ["gpu01", "mi01", "gpu02", "mi02"]) == [["gpu01", "gpu02"], ["mi01", "mi02"]]


def test_what_an_older_amd_smi_or_ras_off_leaves_unjudged_is_listed():
    from gpugate.model.facts import unchecked_facts

    old = ProbeFailure("amd_smi", "unchecked", "this amd-smi has no xgmi --link-status (AMD SMI 25.3+)")
    facts = node([gpu(i, xgmi=old, ras=None if i == 3 else dict(CLEAN)) for i in range(8)])
    listed = dict(unchecked_facts(facts))
    assert listed["xgmi"].startswith("this amd-smi has no xgmi") and "ras:gpu3" in listed


def test_a_baseline_that_names_an_nvidia_node_amd_never_reads_as_gpus_lost():
    from types import SimpleNamespace

    from gpugate.judges import lost

    nvidia_record = {"gpus_high": 8}  # a record written before vendors (or by NVIDIA's probes)
    assert lost.high_for(nvidia_record, "nvidia") == 8
    assert lost.high_for(nvidia_record, "amd") is None  # a typo'd vendor = "amd" counts AMD functions: 0
    facts = SimpleNamespace(nvml=None, pci_gpus=0, amd=None)
    assert lost.judge(lost.high_for(nvidia_record, "amd"), 8, facts) == []
    assert lost.judge(lost.high_for(nvidia_record, "nvidia"), 8, facts)[0].acute  # same vendor: lost, acute
    assert lost.high_for({"gpus_high": 8, "gpus_vendor": "amd"}, "amd") == 8


@pytest.mark.parametrize("mode", ["healthcheck", "prolog", "epilog", "verify"])
def test_an_amd_node_whose_nodeset_lacks_vendor_amd_is_never_drained_at_once(tmp_path, mode):
    """A baseline that forgot vendor = "amd": no libnvidia-ml and no NVIDIA GPU
    on the bus is no broken NVIDIA stack (nvml, module, dkms: acute), only
    findings the drain budget bounds, in every mode: the prolog and epilog
    read the bus on this failure path only (issue 34)."""
    from conftest import DEMO_BASELINE
    from gpugate.model.findings import is_acute

    path = str(tmp_path / "fleet")
    assert gpugate_cmd("sim", "init", path, "--nodes", "gpu01", "--vendor", "amd",
                       "--baseline", DEMO_BASELINE).returncode == 0
    result = gpugate_cmd("check", "--sim", path, "--node", "gpu01", "--baseline", DEMO_BASELINE,
                         "--mode", mode, "--json")
    data = json.loads(result.stdout)
    assert data["fit"] is False
    assert any(f["component"] == "nvml" and f["class"] == "probe" for f in data["findings"]), data["reason"]
    assert not any(is_acute(f["class"], f["component"]) for f in data["findings"]), data["reason"]


def test_the_prolog_reads_no_bus_where_nvml_answers(tmp_path):
    """The bus read is the failure path's only: a healthy NVIDIA node's prolog
    and epilog read no /sys/bus/pci (the prolog's cost stays what it was)."""
    from conftest import DEMO_BASELINE

    path = str(tmp_path / "fleet")
    assert gpugate_cmd("sim", "init", path, "--nodes", "gpu01", "--baseline", DEMO_BASELINE).returncode == 0
    for mode in ("prolog", "epilog"):
        result = gpugate_cmd("check", "--sim", path, "--node", "gpu01", "--baseline", DEMO_BASELINE,
                             "--mode", mode, "--json")
        data = json.loads(result.stdout)
        assert data["fit"] is True and data["facts"]["pci_gpus"] is None, data["reason"]


def test_the_amd_epilog_checks_every_gpu_for_a_job_index_past_the_nodes_count(tmp_path):
    """slurmd's SLURM_JOB_GPUS=8 on an 8-GPU node (CPX numbers more logical
    GPUs than physical): an index that names no GPU means every GPU, so a KFD
    process left on GPU 0 still drains (it checked none before, issue 34)."""
    from test_node_side import run_entry

    fleet = _fleet(tmp_path, "mi001")
    config = tmp_path / "gpugate.toml"
    config.write_text('baseline = "%s"\nstate_dir = "%s/state/{node}"\nlog = "file"\n[sim]\nfleet = "%s"\n'
                      '[slurm]\nbin_dir = "%s/no-slurm-here"\n' % (MIXED, tmp_path, fleet, tmp_path))
    env = {"config": str(config)}
    sim_set(fleet, "mi001", "amd.gpu0.processes=4242", "slurm.jobs=none")
    for gpus, drained in (("1", False), ("8", True), ("0,31", True)):
        result = run_entry("epilog", env, node="mi001", extra_env={"SLURM_JOB_ID": "202", "SLURM_JOB_GPUS": gpus})
        with open(os.path.join(str(tmp_path), "state", "mi001", "gpugate.log")) as handle:
            reason = json.loads(handle.read().splitlines()[-1])["reason"]
        assert (reason == "gpugate: broken processes=1 left [pid 4242] (want none)") is drained, (gpus, reason)
        assert (result.returncode != 0) is drained, (gpus, result.stderr)
