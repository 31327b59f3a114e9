"""Issue 29 on a real slurmctld and slurmd: a mixed fleet (an H100
partition beside an MI300X one) under one baseline.  Simulated AMD nodes
replace only amdgpu's sysfs, amd-smi, rvs, all_reduce_perf (rccl-tests) and
the kernel log; the health check, the sweep (GPU reset through amd-smi,
RVS as the verification, the rccl smoke job), audit and status run the
production code, vendor-blind above the probes."""

import json
import os
import sys

import pytest

from conftest import check_now, make_cluster
from test_slurm_sweep import drift_and_drain, journal_events, run_sweep

# Long (about 35 s of clusters): CI runs them (-m "slow or long" on 22.05, and every --release run);
# the default run stays under ten minutes.  tests/test_amd_node.py covers the same node path without Slurm.
pytestmark = [pytest.mark.slurm, pytest.mark.long]

MIXED = '''
name = "mixed-test"
[pin]
kernel = "6.8.0-60-generic"
driver = "580.65.06"
cuda_driver = "13.0"
fabricmanager = "580.65.06"
container_toolkit = "1.17.8"
dcgm = "4.2.3"
image = "gpu-2026.11.1"
amdgpu = "6.16.13"
rocm = "7.2.1"
[pin.vbios]
"NVIDIA H100 80GB HBM3" = "96.00.99.00.01"
"AMD Instinct MI300X OAM" = "113-M3000108-103"
[pin.ifwi]
"AMD Instinct MI300X OAM" = "00159017"
[nodes."gpu[01-02]"]
gpus = 8
product = "NVIDIA H100 80GB HBM3"
nvswitch = true
persistence = true
[nodes."gpu[03-04]"]
vendor = "amd"
gpus = 8
product = "AMD Instinct MI300X OAM"
compute_partition = "SPX"
memory_partition = "NPS1"
power_limit_watts = 750
[smoke.min_busbw_gbps]
"AMD Instinct MI300X OAM" = 300
'''


@pytest.fixture
def mixed(tmp_path):
    from gpugate.testbed import smoke_command

    path = tmp_path / "baseline.toml"
    path.write_text(MIXED)
    smoke = smoke_command(str(tmp_path))
    cluster = make_cluster(tmp_path, nodes=4, baseline=str(path), partitions={"h100": "gpu[01-02]",
                                                                              "mi300x": "gpu[03-04]"},
                           sweep={"floor": 0.5, "smoke_deadline": 30, "smoke": smoke, "smoke_amd": smoke})
    yield cluster
    cluster.stop()


def gpugate_json(cluster, *args):
    result = cluster.run([sys.executable, "-m", "gpugate"] + list(args) + ["--config", cluster.gpugate_conf, "--json"],
                         check=False, timeout=120)
    assert "Traceback" not in result.stderr, result.stderr
    return json.loads(result.stdout)


def test_a_mixed_fleet_gates_repairs_and_audits_amd_nodes_beside_nvidia(mixed):
    cluster = mixed
    cluster.wait_for(lambda: all(cluster.state(n) == "idle" for n in cluster.nodes), 60, "all four idle")
    assert cluster.reason("gpu03") == "" and cluster.reason("gpu01") == ""
    # An uncorrectable HBM error on GPU 3 of an MI300X node: amdgpu's counter and its kernel-log line.
    drift_and_drain(cluster, "gpu03", "amd.gpu3.ras.umc.ue=+2", "amd.gpu3.log=ue:umc:2")
    # The counter and the log line are two files (as in the kernel): a check
    # between their writes drains for one, the next one names both.
    both = ("ras:gpu3=umc=2 uncorrectable", "amdgpu_event:gpu3=ue umc")
    cluster.wait_for(lambda: all(b in cluster.reason("gpu03") for b in both) or check_now(cluster, "gpu03"), 60,
                     "gpu03's reason naming both the counter and the kernel-log event")
    reason = cluster.reason("gpu03")
    assert reason.startswith("gpugate: health ") and "ras:gpu3=umc=2 uncorrectable (want 0)" in reason, reason
    assert "amdgpu_event:gpu3=ue umc (want none)" in reason, reason
    assert cluster.state("gpu04") == "idle" and cluster.state("gpu01") == "idle"

    # The sweep resets the node's GPUs (amd-smi), verifies (RVS r1 -> r2, the RAS counters read
    # again), runs the rccl smoke job and only then resumes it: no reboot.
    code, report, err = run_sweep(mixed)
    assert code == 0, err
    assert report["outcomes"]["gpu03"]["result"] == "resumed", report
    steps = [(s, st) for _, s, st, _ in journal_events(cluster, "gpu03")]
    assert ("reset", "done") in steps and ("smoke single", "done") in steps, steps
    assert not any(s in ("reboot", "wait_up") for s, _ in steps), (steps, report)
    cluster.wait_for(lambda: cluster.state("gpu03") == "idle", 60, "gpu03 idle")
    model = json.load(open(os.path.join(cluster.fleet, "gpu03", "node.json")))
    assert model["amd"]["resets"] == 1 and model["amd"]["gpus"][3]["ras"]["umc"][0] == 0
    # The reset's own "GPU reset begin!" lines never drain the node it repaired (health checks
    # keep running every 5 s): it stays idle with no reason.
    checks = lambda: sum(1 for r in cluster.log_records("gpu03") if r.get("mode") == "healthcheck")  # noqa: E731
    before = checks()
    cluster.wait_for(lambda: checks() >= before + 2, 60, "two health checks after the reset")
    assert cluster.state("gpu03") == "idle" and cluster.reason("gpu03") == ""

    # The controller's views read both vendors.
    audit = gpugate_json(cluster, "audit", "--max-age", "0")
    rows = {(r["component"], r["product"], r["value"]): (r["nodes"], r["status"]) for r in audit["rows"]}
    assert rows[("amdgpu", None, "6.16.13")] == ("gpu[03-04]", "pinned")
    assert rows[("rocm", None, "7.2.1")] == ("gpu[03-04]", "pinned")
    assert rows[("ifwi", "AMD Instinct MI300X OAM", "00159017")] == ("gpu[03-04]", "pinned")
    assert rows[("driver", None, "580.65.06")] == ("gpu[01-02]", "pinned")
    assert rows[("vbios", "AMD Instinct MI300X OAM", "113-M3000108-103")][1] == "pinned"


def test_amd_drift_drains_as_drift_and_a_missing_driver_as_broken(mixed):
    cluster = mixed
    cluster.wait_for(lambda: all(cluster.state(n) == "idle" for n in cluster.nodes), 60, "all four idle")
    drift_and_drain(cluster, "gpu04", "amd.initstate=absent")
    assert cluster.reason("gpu04").startswith("gpugate: broken module=amdgpu not loaded (want live)")
    cluster.sim("set", "FLEET", "gpu03", "amd.rocm=7.1.1")
    cluster.wait_for(lambda: "drain" in cluster.state("gpu03"), 60, "gpu03 drained")
    assert cluster.reason("gpu03").startswith("gpugate: drift rocm=7.1.1 (want 7.2.1)")
    # `gpugate status`: the fleet by class and partition, vendor-blind.
    status = gpugate_json(cluster, "status")
    assert [e["node"] for e in status["gpugate"]["broken"]] == ["gpu04"]
    assert [e["node"] for e in status["gpugate"]["drift"]] == ["gpu03"]
    assert status["partitions"]["mi300x"] == {"members": 2, "in_service": 0, "gpugate": 2, "others": 0}
    assert status["partitions"]["h100"]["in_service"] == 2
    # The sweep: a reboot loads amdgpu again, the drift is reconverged (ROCm), both verified
    # (RVS, the rccl smoke job) and resumed.
    code, report, err = run_sweep(cluster)
    assert code == 0, err
    outcomes = report["outcomes"]
    assert (outcomes["gpu04"]["result"], outcomes["gpu03"]["result"]) == ("resumed", "resumed"), report
    assert (outcomes["gpu04"]["remedy"], outcomes["gpu03"]["remedy"]) == ("reboot", "reconverge"), report
    model = json.load(open(os.path.join(cluster.fleet, "gpu03", "node.json")))
    assert model["amd"]["rocm"] == "7.2.1"
