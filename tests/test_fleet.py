"""gpugate audit and the controller metrics: exact folding, on simulated
nodes and against the real test cluster."""

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st
from prometheus_client.parser import text_string_to_metric_families

from conftest import DEMO_BASELINE, check_now, gpugate_cmd, make_cluster, sim_config
from gpugate.model.baseline import load_baseline
from gpugate.fleet.audit import DRIFT, PINNED, UNREADABLE, fold, hostlist, to_json


def facts(driver="580.65.06", kernel="6.1.0-27-amd64", vbios=("96.00.99.00.01",) * 2, dcgm="4.2.3"):
    return {"kernel_release": kernel, "module_resident": driver, "dcgm_version": dcgm,
            "image": {"version": "gpu-2026.11.1"},
            "packages": {"container_toolkit": {"name": "nvidia-container-toolkit", "version": "1.17.8"}},
            "nvml": {"driver_version": driver, "cuda_driver_version": "13.0",
                     "gpus": [{"name": "NVIDIA H100 80GB HBM3", "vbios": v, "gsp_firmware": driver} for v in vbios]}}


def rows(audit, component):
    return {(r.value, hostlist(r.nodes), r.status) for r in audit.rows if r.component == component}


def test_fold_counts_hostlists_and_status():
    baseline = load_baseline(DEMO_BASELINE)
    fleet = {"gpu%03d" % i: facts() for i in range(1, 129)}
    fleet["gpu125"] = fleet["gpu126"] = facts(driver="550.54.15")
    fleet["gpu007"] = facts(vbios=("96.00.99.00.01", "96.00.74.00.01"))
    fleet["gpu050"] = {"nvml": {"error": {"kind": "timeout"}}, "kernel_release": "6.1.0-27-amd64"}
    fleet["gpu099"] = "ssh: connect to host gpu099 port 22: No route to host"
    audit = fold(fleet, baseline)
    assert rows(audit, "driver") == {("580.65.06", "gpu[001-049,051-098,100-124,127-128]", PINNED),
                                     ("550.54.15", "gpu[125-126]", DRIFT),
                                     ("(unreadable: timeout)", "gpu050", UNREADABLE)}
    assert ("96.00.74.00.01", "gpu007", DRIFT) in rows(audit, "vbios")
    assert audit.unreachable == {"gpu099": fleet["gpu099"]}
    assert audit.drift
    data = to_json(audit)
    assert data["unreachable"]["nodes"] == "gpu099"
    assert {"component": "driver", "product": None, "value": "550.54.15", "count": 2, "nodes": "gpu[125-126]",
            "status": DRIFT} in data["rows"]
    assert not fold({n: facts() for n in ("a1", "a2")}, baseline).drift


def test_the_installed_code_has_a_row_and_one_others_could_change_is_not_fine():
    """Issue 24, item 4: the audit shows which nodes run gpugate from code
    only root can change (the health check's install fact)."""
    fleet = {"gpu%02d" % i: dict(facts(), install="trusted") for i in range(1, 5)}
    fleet["gpu03"]["install"] = {"error": {"kind": "untrusted", "detail": "/opt/gpugate/lib: directory is writable"}}
    del fleet["gpu04"]["install"]  # a node whose facts predate the fact: no row for it
    audit = fold(fleet, load_baseline(DEMO_BASELINE))
    assert rows(audit, "install") == {("trusted", "gpu[01-02]", PINNED),
                                      ("(unreadable: untrusted)", "gpu03", UNREADABLE)}


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.from_regex(r"n[0-9]{1,3}", fullmatch=True),
                       st.tuples(st.sampled_from(["580.65.06", "550.54.15", "570.133.20"]),
                                 st.sampled_from(["6.1.0-27-amd64", "6.1.0-26-amd64"])), max_size=60))
def test_fold_partitions_every_node_exactly_once_per_component(spec):
    fleet = {node: facts(driver=d, kernel=k) for node, (d, k) in spec.items()}
    audit = fold(fleet, load_baseline(DEMO_BASELINE))
    for component in ("driver", "kernel", "dcgm"):
        nodes = [n for r in audit.rows if r.component == component for n in r.nodes]
        assert sorted(nodes) == sorted(spec)
    drifted = {n for r in audit.rows if r.component == "driver" and r.status == DRIFT for n in r.nodes}
    assert drifted == {n for n, (d, _) in spec.items() if d != "580.65.06"}


def test_audit_of_simulated_nodes_exit_codes_and_json(tmp_path):
    fleet_dir = str(tmp_path / "fleet")
    gpugate_cmd("sim", "init", fleet_dir, "--nodes", "gpu[01-04]", "--baseline", DEMO_BASELINE, check=True)
    config = sim_config(tmp_path, fleet_dir)
    result = gpugate_cmd("audit", "--config", str(config), "-w", "gpu[01-04]")
    assert result.returncode == 0, result.stderr
    gpugate_cmd("sim", "set", fleet_dir, "gpu[02-03]", "dcgm=3.3.5", check=True)
    result = gpugate_cmd("audit", "--config", str(config), "-w", "gpu[01-05]", "--json")
    assert result.returncode == 1
    data = json.loads(result.stdout)
    dcgm = {(r["value"], r["count"], r["nodes"], r["status"]) for r in data["rows"] if r["component"] == "dcgm"}
    assert dcgm == {("4.2.3", 2, "gpu[01,04]", "pinned"), ("3.3.5", 2, "gpu[02-03]", "DRIFT")}
    assert data["unreachable"]["nodes"] == "gpu05"
    text = gpugate_cmd("audit", "--config", str(config), "-w", "gpu[01-05]").stdout
    assert "3.3.5" in text and "gpu[02-03]" in text and "DRIFT" in text and "UNREACHABLE" in text
    saved = json.load(open(tmp_path / "audit.json"))
    assert sorted(saved["facts"]) == ["gpu01", "gpu02", "gpu03", "gpu04", "gpu05"]


@pytest.mark.slurm
def test_audit_and_metrics_on_the_real_cluster(tmp_path):
    cluster = make_cluster(tmp_path / "c", nodes=4, interval=5)
    try:
        cluster.sim("set", "FLEET", "gpu[02-03]", "driver=550.54.15")
        # Their health checks run now as slurmd runs them, not at slurmd's next tick.
        cluster.wait_for(lambda: ("drain" in cluster.state("gpu02") and "drain" in cluster.state("gpu03"))
                         or check_now(cluster, "gpu02", "gpu03"), 60, "drift drained")
        cluster.scontrol("update", "NodeName=gpu04", "State=DRAIN", "Reason=rack maintenance")
        result = subprocess.run([sys.executable, "-m", "gpugate", "audit", "--config", cluster.gpugate_conf, "--json"],
                                capture_output=True, text=True, env=cluster.env, timeout=120)
        assert result.returncode == 1, result.stderr
        data = json.loads(result.stdout)
        driver = {(r["value"], r["count"], r["nodes"], r["status"]) for r in data["rows"] if r["component"] == "driver"}
        assert driver == {("580.65.06", 2, "gpu[01,04]", "pinned"), ("550.54.15", 2, "gpu[02-03]", "DRIFT")}
        assert data["nodes"] == 4 and data["unreachable"]["nodes"] == "-"
        result = subprocess.run([sys.executable, "-m", "gpugate", "metrics", "--config", cluster.gpugate_conf],
                                capture_output=True, text=True, env=cluster.env, timeout=60)
        assert result.returncode == 0, result.stderr
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for fam in text_string_to_metric_families(result.stdout) for s in fam.samples}
        assert samples[("gpugate_fleet_drained", (("class", "drift"),))] == 2
        assert samples[("gpugate_fleet_out_for_others", ())] == 1
        assert samples[("gpugate_audit_drift_nodes", (("component", "driver"),))] == 2
        assert samples[("gpugate_fleet_nodes", ())] == 4
        assert cluster.reason("gpu04") == "rack maintenance"
    finally:
        cluster.stop()
