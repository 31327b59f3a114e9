"""A job's preflight through gpugate's prolog as slurmd runs it (issue 36),
against a real slurmctld: the simulated nodes' dcgmi and all_reduce_perf
replay real recordings.  What the node's proof pins on it drains at once
and the prolog exits 1 (Slurm requeues the job); a bandwidth under the
baseline's floor is budgeted (published, the job runs); a job that does not
ask, or is too small, gets none."""

import subprocess

import pytest
from conftest import run_entry

pytestmark = pytest.mark.slurm
# A drain budget (the rig's default switches it off): a budgeted finding is published, not drained.
CLUSTER = {"nodes": 4, "interval": 600, "extra": "[drain_budget]\nmax_share = 0.5\n"}


@pytest.fixture(scope="module")
def preflighted(cluster):
    """The cluster's gpugate.toml with a [preflight] whose all_reduce is the
    simulated nodes' own (read again by every run)."""
    with open(cluster.gpugate_conf, "a") as handle:
        handle.write('\n[preflight]\nmin_nodes = 2\ntimeout_seconds = 30\n'
                     'allreduce = ["%s/{node}/bin/all_reduce_perf", "-b", "8", "-e", "8G", "-g", "{gpus}"]\n'
                     % cluster.fleet)
    return cluster


def _prolog(cluster, node, job, nodes="2", comment="gpugate-preflight"):
    env = {"SLURMD_NODENAME": node, "SLURM_JOB_ID": job, "SLURM_JOB_UID": "0", "SLURM_JOB_USER": "root",
           "SLURM_JOB_PARTITION": "gpu", "SLURM_JOB_NUM_NODES": nodes, "SLURM_JOB_COMMENT": comment,
           "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7"}  # the whole node
    result = subprocess.run([cluster.path("bin", "prolog")], env=env, capture_output=True, text=True, timeout=120,
                            cwd=cluster.path("log"))
    assert "Traceback" not in result.stderr, result.stderr
    records = cluster.records_when(node, lambda r: r.get("mode") == "prolog" and r.get("job") == job)
    return result.returncode, records[-1]


def test_a_healthy_node_passes_its_preflight_and_says_what_it_took(preflighted):
    code, record = _prolog(preflighted, "gpu01", "880001")
    assert code == 0 and record["verdict"] == "fit"
    pf = record["preflight"]
    assert pf["passed"] is True and pf["findings"] == [] and pf["busbw_gbps"] > 350
    assert set(pf["seconds"]) == {"dcgm", "allreduce"} and pf["why"] == "asked by job, 2 nodes"
    assert "drain" not in preflighted.state("gpu01")
    assert _stats(preflighted, "gpu01")["runs"]["passed"] == 1  # the node's metrics count it


def _stats(cluster, node):
    from gpugate.model.config import load_settings
    from gpugate.preflight import memory

    return memory.stats(load_settings(cluster.gpugate_conf), node)


def test_wrong_values_drain_the_node_at_once_and_the_prolog_exits_1(preflighted):
    preflighted.sim("set", "FLEET", "gpu02", "smoke=nccl-wrong")
    code, record = _prolog(preflighted, "gpu02", "880002")
    assert code == 1 and record["action"] == "drain"
    assert "drain" in preflighted.state("gpu02")
    assert preflighted.reason("gpu02").startswith("gpugate: health preflight=all_reduce wrong=")
    assert _stats(preflighted, "gpu02")["runs"]["acute"] == 1


def test_a_bandwidth_under_the_floor_is_published_for_the_keeper_and_the_job_runs(preflighted):
    preflighted.sim("set", "FLEET", "gpu03", "smoke=pcie-degraded")
    code, record = _prolog(preflighted, "gpu03", "880003")
    assert code == 0 and record["action"] == "held"
    assert "drain" not in preflighted.state("gpu03")
    assert "preflight_busbw=22.9GB/s (want >= 350)" in preflighted.run(
        ["/usr/bin/scontrol", "show", "node", "gpu03"]).stdout
    # The passive health check runs no proof, and keeps the finding (gpugate.preflight.memory).
    before = len(preflighted.log_records("gpu03"))
    run_entry(preflighted, "healthcheck", "gpu03")
    check = [r for r in preflighted.log_records("gpu03")[before:] if r.get("mode") == "healthcheck"][-1]
    assert check["reason"] == "gpugate: health preflight_busbw=22.9GB/s (want >= 350)"
    assert check["action"] == "held" and "drain" not in preflighted.state("gpu03")
    assert "preflight_busbw=22.9GB/s (want >= 350)" in preflighted.run(
        ["/usr/bin/scontrol", "show", "node", "gpu03"]).stdout


def test_a_job_that_does_not_ask_or_is_too_small_gets_none(preflighted):
    preflighted.sim("set", "FLEET", "gpu04", "smoke=nccl-wrong")
    code, record = _prolog(preflighted, "gpu04", "880004", comment="")
    assert code == 0 and "preflight" not in record
    code, record = _prolog(preflighted, "gpu04", "880005", nodes="1")
    assert code == 0 and record["preflight"] == {"why": "asked by job; 1 node, under min_nodes = 2"}
    assert "drain" not in preflighted.state("gpu04")
