"""The preflight's selection and a node's own proof (issue 36,
gpugate.preflight): which jobs get one, and what a proof on a simulated
node (its dcgmi and all_reduce_perf replaying real recordings) pins on the
node, budgets, or leaves undecided.  Through the prolog on a real
slurmctld: tests/test_slurm_preflight.py."""

import os
import time

import pytest
from hypothesis import given, settings as hsettings
from hypothesis import strategies as st

from conftest import DEMO_BASELINE, gpugate_cmd
from gpugate.model.findings import Finding, is_acute
from gpugate.preflight.node import prove
from gpugate.preflight.select import wanted
from gpugate.model.verdict import decide

CFG = {"partitions": ("train",), "job_word": "gpugate-preflight", "min_nodes": 2}


@pytest.mark.parametrize("env, run_it", [
    ({"SLURM_JOB_PARTITION": "train", "SLURM_JOB_NUM_NODES": "2"}, True),
    ({"SLURM_JOB_PARTITION": "debug", "SLURM_JOB_NUM_NODES": "8"}, False),
    ({"SLURM_JOB_PARTITION": "debug", "SLURM_JOB_NUM_NODES": "8", "SLURM_JOB_COMMENT": "run gpugate-preflight"},
     True),
    ({"SLURM_JOB_PARTITION": "debug", "SLURM_JOB_NODELIST": "gpu[01-04]", "SLURM_JOB_EXTRA": "gpugate-preflight"},
     True),
    ({"SLURM_JOB_PARTITION": "debug", "SLURM_NODELIST": "gpu[01-04]", "SLURM_JOB_COMMENT": "x,gpugate-preflight"},
     True),
    ({"SLURM_JOB_PARTITION": "train", "SLURM_JOB_NUM_NODES": "1"}, False),  # under min_nodes
    ({"SLURM_JOB_PARTITION": "debug", "SLURM_JOB_NUM_NODES": "4", "SLURM_JOB_COMMENT": "no-gpugate-preflight"},
     False),  # a word, not a substring
    ({"SLURM_JOB_PARTITION": "train"}, False),  # node count unknown
])
def test_who_gets_a_preflight(env, run_it):
    assert wanted(CFG, env)[0] is run_it


_TEXT = st.lists(st.sampled_from(["gpugate-preflight", "train", "debug", " ", ",", ";", "x", "-", "\n", "no"]),
                 max_size=8).map("".join)


@hsettings(max_examples=300, deadline=None)
@given(partition=st.sampled_from(["train", "debug", "train,debug", ""]), comment=_TEXT, extra=_TEXT,
       nodes=st.integers(0, 40), least=st.integers(1, 16))
def test_the_jobs_words_switch_it_on_and_nothing_else(partition, comment, extra, nodes, least):
    """A preflight runs exactly when the partition is listed or the word is
    a word of the comment or extra, on at least min_nodes nodes; what the
    user writes can add a preflight, never remove the partition's."""
    import re

    cfg = dict(CFG, min_nodes=least)
    env = {"SLURM_JOB_PARTITION": partition, "SLURM_JOB_COMMENT": comment, "SLURM_JOB_EXTRA": extra,
           "SLURM_JOB_NUM_NODES": str(nodes) if nodes else ""}
    by_partition = "train" in partition.split(",")
    by_job = any("gpugate-preflight" in re.split(r"[\s,;]+", text) for text in (comment, extra))
    run_it, why = wanted(cfg, env)
    assert run_it == ((by_partition or by_job) and nodes >= least and nodes > 0)
    if by_partition:  # the user's words change nothing about the partition's ask
        assert wanted(cfg, dict(env, SLURM_JOB_COMMENT="", SLURM_JOB_EXTRA=""))[0] == run_it
    assert bool(why) == (by_partition or by_job)


# ---------------------------------------------------------------- the proof

@pytest.fixture
def node_fleet(fleet):
    """conftest's three healthy simulated nodes; the proofs run on gpu01."""
    return fleet


def _settings(settings_for, fleet, **preflight):
    from gpugate.model.config import parse_settings
    from gpugate.core.record import replace

    cfg = dict(parse_settings({}, "(test)").preflight)
    cfg["allreduce"] = (os.path.join(fleet, "{node}", "bin", "all_reduce_perf"), "-b", "8", "-e", "8G", "-g", "{gpus}")
    cfg.update(preflight)
    return replace(settings_for(fleet), preflight=cfg)


# A job with all eight GPUs of the node (SLURM_JOB_GPUS=0,...,7).
EVERY_GPU = list(range(8))


def _prove(settings, gpus=EVERY_GPU, seconds=60.0):
    from gpugate.model.baseline import load_baseline

    return prove(settings, load_baseline(DEMO_BASELINE), "gpu01", gpus, time.monotonic() + seconds)


def _sim(fleet, *keys):
    result = gpugate_cmd("sim", "set", fleet, "gpu01", *keys)
    assert result.returncode == 0, result.stderr


def test_a_healthy_node_passes_and_says_how_long_each_part_took(settings_for, node_fleet):
    proof = _prove(_settings(settings_for, node_fleet))
    assert proof.findings == [] and proof.undecided == []
    assert proof.busbw_gbps and proof.busbw_gbps > 350
    assert set(proof.seconds) == {"dcgm", "allreduce"}


def test_a_job_whose_gpus_slurm_does_not_name_gets_no_proof(settings_for, node_fleet):
    """No GPU GRES: every job on the node may use every GPU, so a proof
    there would judge the others' load; nothing runs, nothing is pinned."""
    _sim(node_fleet, "smoke=nccl-wrong", "dcgm.diag_fail=3")
    proof = _prove(_settings(settings_for, node_fleet), gpus=None)
    assert proof.findings == [] and proof.seconds == {} and "GPUs unknown" in proof.undecided[0]


def _r1_failing(*names):
    """The judge's findings from a real `dcgmi diag -r 1 -j` (DCGM 3) with
    these tests failed on GPU 0."""
    import json as jsonlib

    from gpugate.judges.dcgm import diagnostic
    from gpugate.parsers import dcgm

    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures",
                           "dcgmi-diag-r1-json-dcgm3-virtualclient.json")) as handle:
        doc = jsonlib.load(handle)
    failed = []
    for category in doc["DCGM GPU Diagnostic"]["test_categories"]:
        for test in category["tests"]:
            if test["name"] in names:
                test["results"] = [{"status": "Fail", "gpu_ids": "0", "warnings": [
                    {"warning": "%s failed on GPU 0" % test["name"], "error_id": 9}]}]
                failed.append(test["name"])
    assert sorted(failed) == sorted(names)
    return diagnostic("dcgm_diag", dcgm.parse_diag_json(jsonlib.dumps(doc), 1, 226), "r%d")


def test_a_process_on_the_jobs_gpus_is_not_the_nodes_fault():
    """DCGM's Graphics Processes test fails for a process on the GPU: a
    user's left behind (uid 65534's, escaped its cgroup) must not drain the
    node through the next job's preflight; a failed memory test does."""
    from gpugate.preflight.node import nodes_fault

    findings = _r1_failing("Graphics Processes")
    assert [f.observed.split(" ")[0] for f in findings] == ["graphics_processes"]
    assert not any(nodes_fault(f) for f in findings)
    memory = Finding("health", "dcgm_diag", "memory fail", "pass (r3)", "investigate", gpu=0)
    assert nodes_fault(memory)


def test_a_failed_software_deployment_test_is_budgeted():
    """DCGM's r1 checks software too (CUDA main library, persistence mode):
    a package pushed to every node fails it everywhere at once, so it must
    stay within the drain budget; a GPU's own test does not."""
    from gpugate.preflight.node import node_findings

    findings = node_findings(_r1_failing("CUDA Main Library", "Persistence Mode"))
    assert sorted(f.observed.split(" ")[0] for f in findings) == ["cuda_main_library", "persistence_mode"]
    assert {f.component for f in findings} == {"preflight_setup"}
    assert not decide(findings, "gpugate:").acute
    gpu = Finding("health", "dcgm_diag", "memory fail", "pass (r3)", "investigate", gpu=0)
    assert node_findings([gpu]) == [gpu] and decide([gpu], "gpugate:").acute


def test_a_failed_dcgm_test_is_the_nodes_and_drains_at_once(settings_for, node_fleet):
    _sim(node_fleet, "dcgm.diag_fail=3")
    proof = _prove(_settings(settings_for, node_fleet), gpus=[2, 3])
    assert [f.component for f in proof.findings] == ["dcgm_diag"] and proof.findings[0].gpu == 3
    assert "allreduce" not in proof.seconds  # a node that failed its diagnostic proves no more
    verdict = decide(proof.findings, "gpugate:")
    assert verdict.acute and verdict.reason.startswith("gpugate: health dcgm_diag:gpu3=")


def test_wrong_values_under_load_are_the_nodes_and_drain_at_once(settings_for, node_fleet):
    _sim(node_fleet, "smoke=nccl-wrong")
    proof = _prove(_settings(settings_for, node_fleet))
    assert [f.component for f in proof.findings] == ["preflight"] and is_acute("health", "preflight")
    verdict = decide(proof.findings, "gpugate:")
    assert verdict.acute and verdict.reason.startswith("gpugate: health preflight=all_reduce wrong=")


def test_a_bandwidth_under_the_floor_is_budgeted_and_only_on_a_whole_node(settings_for, node_fleet):
    """The floor is the baseline's: a wrong one must not drain every
    preflighted node at once; and it is a whole node's (8 GPUs)."""
    _sim(node_fleet, "smoke=pcie-degraded")
    proof = _prove(_settings(settings_for, node_fleet))
    assert [(f.component, f.observed, f.expected) for f in proof.findings] == [
        ("preflight_busbw", "22.9GB/s", ">= 350")]
    assert not decide(proof.findings, "gpugate:").acute
    partial = _prove(_settings(settings_for, node_fleet), gpus=[0, 1, 2, 3])
    assert partial.findings == [] and partial.undecided == []


@pytest.mark.parametrize("kind, why", [("nccl-abort", "nccl error"), ("hang", "timeout")])
def test_what_the_proof_cannot_pin_on_the_node_takes_nothing(settings_for, node_fleet, kind, why):
    """An NCCL abort can be the host's (another job's /dev/shm), a timeout
    the site's sizes: no finding, the reason in the log line."""
    _sim(node_fleet, "smoke=" + kind)
    proof = _prove(_settings(settings_for, node_fleet, dcgm_level=0), seconds=3.0)
    assert proof.findings == [] and why in proof.undecided[0]


def test_a_command_that_cannot_run_is_the_sites_not_the_nodes(settings_for, node_fleet, tmp_path):
    settings = _settings(settings_for, node_fleet, allreduce=(str(tmp_path / "no-such-tool"), "-g", "{gpus}"))
    proof = _prove(settings)
    assert proof.findings == [] and "all_reduce" in proof.undecided[0] and "not found" in proof.undecided[0]


def test_a_budgeted_finding_is_kept_for_the_health_check_until_a_pass_a_boot_or_a_day(settings_for, tmp_path):
    """Only a proof under load shows it: the passive health check judges it
    again from preflight.json, so it stays published for the keeper."""
    from gpugate.model.findings import Finding
    from gpugate.preflight import memory
    from gpugate.core.record import replace

    settings = replace(settings_for(str(tmp_path / "fleet")), state_dir_template=str(tmp_path / "state" / "{node}"))
    os.makedirs(settings.state_dir("gpu01"))
    slow = Finding("health", "preflight_busbw", "22.9GB/s", ">= 350", "investigate")
    memory.remember(settings, "gpu01", [slow], False, "boot-a", now=1000.0)
    assert memory.judged(settings, "gpu01", "boot-a", now=1000.0 + 3600) == [slow]
    assert memory.judged(settings, "gpu01", "boot-b", now=1001.0) == []  # rebooted: the sweep proves it again
    assert memory.judged(settings, "gpu01", "boot-a", now=1000.0 + memory.REMEMBER_SECONDS) == []
    assert memory.judged(settings, "gpu01", None, now=1001.0) == []
    memory.remember(settings, "gpu01", [], False, "boot-a", now=1002.0)  # undecided: changes nothing
    assert memory.judged(settings, "gpu01", "boot-a", now=1003.0) == [slow]
    memory.remember(settings, "gpu01", [], True, "boot-a", now=1004.0)  # a whole node's pass forgets it
    assert memory.judged(settings, "gpu01", "boot-a", now=1005.0) == []
    # Only what a preflight may leave is read back: an edited file cannot add another finding.
    from gpugate.safety import state as st

    st.write_json(os.path.join(settings.state_dir("gpu01"), memory.NAME), {
        "at": 1000.0, "boot_id": "boot-a", "findings": [dict(slow.to_json(), component="xid"), "junk"]})
    assert memory.judged(settings, "gpu01", "boot-a", now=1001.0) == []


# ------------------------------------------------------------------ AMD

from test_amd_node import MIXED, amd_fleet  # noqa: E402,F401 - its fixture: mi[001-002] and gpu001


def _prove_amd(settings, gpus=EVERY_GPU):
    from gpugate.model.baseline import load_baseline

    return prove(settings, load_baseline(MIXED), "mi001", gpus, time.monotonic() + 60)


def test_an_amd_node_proves_itself_with_rvs_and_rccl_tests(settings_for, amd_fleet):
    settings = _settings(settings_for, amd_fleet)
    proof = _prove_amd(settings)
    assert proof.findings == [] and proof.undecided == [] and set(proof.seconds) == {"rvs", "allreduce"}
    gpugate_cmd("sim", "set", amd_fleet, "mi001", "amd.rvs.fail.1=2")
    proof = _prove_amd(settings)
    assert {f.component for f in proof.findings} == {"rvs"} and 2 in {f.gpu for f in proof.findings}
    assert decide(proof.findings, "gpugate:").acute


def test_rvs_is_not_run_for_a_job_on_some_of_an_amd_nodes_gpus(settings_for, amd_fleet):
    """RVS takes no GPU list: it would test other jobs' GPUs, whose load is
    not this node's fault; the all_reduce still runs on the job's GPUs."""
    gpugate_cmd("sim", "set", amd_fleet, "mi001", "amd.rvs.fail.1=2")
    proof = _prove_amd(_settings(settings_for, amd_fleet), gpus=[0, 1])
    assert proof.findings == [] and "RVS tests every GPU" in proof.undecided[0] and "allreduce" in proof.seconds


def test_an_rccl_abort_decides_nothing(settings_for, amd_fleet):
    gpugate_cmd("sim", "set", amd_fleet, "mi001", "smoke=rccl-abort-mi210")
    proof = _prove_amd(_settings(settings_for, amd_fleet, dcgm_level=0))
    assert proof.findings == [] and "nccl error" in proof.undecided[0]


def test_the_outcomes_are_counted_for_the_nodes_metrics(settings_for, tmp_path):
    from gpugate.model.findings import Finding
    from gpugate.node.metrics import preflight_families
    from gpugate.preflight import memory
    from gpugate.core.promtext import render
    from gpugate.core.record import replace

    settings = replace(settings_for(str(tmp_path / "fleet")), state_dir_template=str(tmp_path / "state" / "{node}"))
    os.makedirs(settings.state_dir("gpu01"))
    assert memory.stats(settings, "gpu01") is None and preflight_families(None) == []
    wrong = Finding("health", "preflight", "all_reduce wrong=3", "0", "reset_gpu")
    slow = Finding("health", "preflight_busbw", "22.9GB/s", ">= 350", "investigate")
    cases = [([], [], "passed"), ([wrong, slow], [], "acute"), ([slow], [], "budgeted"), ([], ["timeout"], "undecided"),
             ([], [], "passed")]
    for findings, undecided, want in cases:
        assert memory.outcome(findings, undecided) == want
        memory.count(settings, "gpu01", want, 1.5, across="culprit" if want == "acute" else "")
    none = {"passed": 0, "culprit": 0, "undecided": 0, "not_run": 0}
    assert memory.stats(settings, "gpu01") == {"runs": {"passed": 2, "acute": 1, "budgeted": 1, "undecided": 1},
                                               "across": dict(none, culprit=1), "seconds": 7.5}
    text = render(preflight_families(memory.stats(settings, "gpu01")))
    assert 'gpugate_preflight_runs_total{outcome="passed"} 2' in text
    assert "# TYPE gpugate_preflight_runs_total counter" in text and "gpugate_preflight_seconds_total 7.5" in text
    assert 'gpugate_preflight_across_total{outcome="culprit"} 1' in text
    # A file someone broke counts again from nothing, never a traceback.
    with open(os.path.join(settings.state_dir("gpu01"), memory.STATS), "w") as handle:
        handle.write('{"runs": {"passed": "many"}, "seconds": [1]}')
    memory.count(settings, "gpu01", "passed", 1.0)
    assert memory.stats(settings, "gpu01") == {"runs": {"passed": 1, "acute": 0, "budgeted": 0, "undecided": 0},
                                               "across": none, "seconds": 1.0}


def test_a_nodeset_without_a_gpu_count_is_never_held_to_a_whole_nodes_floor(settings_for, node_fleet, amd_fleet):
    """[nodeset] gpus unset: a job's GPUs cannot be told from the node's, so
    neither RVS (every GPU) nor the floor (a whole node's) applies to them."""
    from gpugate.model.baseline import load_baseline
    from gpugate.core.record import replace

    class Unpinned:
        """The baseline, its nodesets' gpus unset."""

        def __init__(self, baseline):
            self.baseline = baseline

        def __getattr__(self, name):
            return getattr(self.baseline, name)

        def expect_for(self, node):
            return replace(self.baseline.expect_for(node), gpus=None)

    _sim(node_fleet, "smoke=pcie-degraded")
    proof = prove(_settings(settings_for, node_fleet), Unpinned(load_baseline(DEMO_BASELINE)), "gpu01", [0, 1],
                  time.monotonic() + 60)
    assert proof.findings == [] and proof.floor_judged is False
    proof = prove(_settings(settings_for, amd_fleet), Unpinned(load_baseline(MIXED)), "mi001", [0, 1],
                  time.monotonic() + 60)
    assert "RVS tests every GPU; the job has 2 of ?" in proof.undecided[0]


def test_a_whole_node_job_without_gpu_gres_gets_every_gpu_and_a_shared_one_none():
    from gpugate.preflight.select import exclusive_gpus, job_nodes

    assert exclusive_gpus({"SLURM_JOB_OVERSUBSCRIBE": "NO"}, 8) == list(range(8))
    assert exclusive_gpus({"SLURM_JOB_EXCLUSIVE": "NODE", "SLURM_JOB_OVERSUBSCRIBE": "NO"}, 8) == list(range(8))
    # 26.05 says NO in SLURM_JOB_OVERSUBSCRIBE for any job sharing no CPUs: SLURM_JOB_EXCLUSIVE decides there.
    for env, count in (({"SLURM_JOB_OVERSUBSCRIBE": "YES"}, 8), ({"SLURM_JOB_OVERSUBSCRIBE": "USER"}, 8),
                       ({"SLURM_JOB_EXCLUSIVE": "NO", "SLURM_JOB_OVERSUBSCRIBE": "NO"}, 8),
                       ({"SLURM_JOB_EXCLUSIVE": "USER", "SLURM_JOB_OVERSUBSCRIBE": "NO"}, 8),
                       ({}, 8), ({"SLURM_JOB_OVERSUBSCRIBE": "NO"}, None)):
        assert exclusive_gpus(env, count) is None  # shared, unknown, or a count the baseline does not pin
    assert job_nodes({"SLURM_JOB_NODELIST": "gpu[03-04],gpu01"}) == ["gpu01", "gpu03", "gpu04"]
    assert job_nodes({"SLURM_NODELIST": "gpu[01-02]"}) == ["gpu01", "gpu02"]  # 22.05's name
    assert job_nodes({"SLURM_JOB_NODELIST": "gpu[01-"}) == [] and job_nodes({}) == []
