"""The sweep's smoke Pod on Kubernetes (gpugate.kube.smokepod): its spec,
how its end reads, and the sh wrapper run for real on recorded nccl-tests
output: what it leaves in the termination message is judged as the Slurm
job's output is, within Kubernetes' 4096 bytes."""

import os
import subprocess

from gpugate.kube import evict
from gpugate.kube import smokepod as sp
from gpugate.parsers.nccl import parse_nccl_tests

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = os.path.join(ROOT, "gpugate", "data", "smoke")


def run_wrapper(tmp_path, argv):
    log = tmp_path / "termination-log"
    wrapper = sp.WRAPPER.replace("/dev/shm/", str(tmp_path) + "/")
    out = subprocess.run(["/bin/sh", "-c", wrapper, "gpugate-smoke", str(log)] + argv, capture_output=True,
                         text=True, timeout=30)
    return out, log.read_text()


def test_the_wrapper_keeps_the_table_and_summary_within_4096_bytes_and_the_exit_code(tmp_path):
    for name in ("healthy", "nccl-wrong", "pair-healthy", "nccl-abort"):
        path = os.path.join(SMOKE, name + ".txt")
        with open(path) as handle:
            whole = handle.read()
        out, message = run_wrapper(tmp_path, ["sh", "-c", 'cat "$0"; exit 3', path])
        assert out.returncode == 3 and out.stdout == whole  # the log stream keeps everything
        assert len(message.encode()) <= sp.MESSAGE_BYTES
        full, kept = parse_nccl_tests(whole), parse_nccl_tests(message)
        assert (kept.avg_busbw_gbps, len(kept.rows), kept.wrong_total) == (
            full.avg_busbw_gbps, len(full.rows), full.wrong_total), name
        assert bool(kept.errors) == bool(full.errors), name
    assert not list(tmp_path.glob("gpugate-smoke.*"))  # its scratch file is gone


def test_a_command_that_is_not_there_says_so_in_the_message(tmp_path):
    out, message = run_wrapper(tmp_path, ["/opt/nccl-tests/build/all_reduce_perf", "-g", "8"])
    assert out.returncode == 127 and "not found" in message


def test_the_pod_is_bound_to_the_node_asks_for_its_gpus_and_holds_no_token():
    spec = sp.pod_spec(sp.pod_name("gpu01", "abcd1234"), "gpu01", "gpugate", "registry.example.com/nccl:1",
                       ["all_reduce_perf", "-g", "8"], 8, "nvidia.com/gpu", 300)
    body = spec["spec"]
    assert body["nodeName"] == "gpu01" and body["restartPolicy"] == "Never" and body["activeDeadlineSeconds"] == 300
    assert body["automountServiceAccountToken"] is False
    container = body["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert container["command"][-3:] == ["all_reduce_perf", "-g", "8"]
    assert {t["key"] for t in body["tolerations"]} == {"gpugate.io/unfit", "node.kubernetes.io/unschedulable"}
    assert evict.SMOKE_LABEL in spec["metadata"]["labels"] and not evict.must_go(spec)
    long = sp.pod_name("n" * 300, "abcd1234")
    assert len(long) <= 253 and long.endswith("-abcd1234")


def test_how_a_pod_s_end_reads():
    assert sp.ended({"status": {"phase": "Running"}}) is None
    done = {"status": {"phase": "Failed", "containerStatuses": [
        {"state": {"terminated": {"exitCode": 1, "message": "# Avg bus bandwidth : 1.0", "reason": "Error"}}}]}}
    assert sp.ended(done) == (1, "# Avg bus bandwidth : 1.0", "Error")
    assert sp.ended({"status": {"phase": "Failed", "reason": "DeadlineExceeded"}}) == (None, "", "DeadlineExceeded")
    pulling = {"status": {"phase": "Pending", "containerStatuses": [{"state": {"waiting": {"reason": "ImagePullBackOff"}}}]}}
    assert sp.waiting_reason(pulling) == "ImagePullBackOff"


def test_which_pods_an_eviction_takes():
    def pod(**meta):
        return {"metadata": dict({"name": "p", "namespace": "default"}, **meta), "status": {"phase": "Running"}}
    assert evict.must_go(pod())
    assert not evict.must_go(pod(ownerReferences=[{"kind": "DaemonSet", "controller": True, "name": "x"}]))
    assert evict.must_go(pod(ownerReferences=[{"kind": "ReplicaSet", "controller": True, "name": "x"}]))
    assert not evict.must_go(pod(annotations={"kubernetes.io/config.mirror": "abc"}))
    assert not evict.must_go({"metadata": {"name": "p"}, "status": {"phase": "Succeeded"}})


def test_each_node_asks_for_its_vendor_s_gpu_resource():
    from gpugate.baseline import parse_baseline
    from gpugate.config import parse_settings
    from gpugate.kube.sweeper import resource_for

    mixed = parse_baseline({"name": "mixed", "pin": {"driver": "580.65.06", "amdgpu": "6.12.12"},
                            "nodes": {"mi[01-02]": {"vendor": "amd", "gpus": 8}, "gpu[01-02]": {"gpus": 8}}},
                           "baseline.toml")
    kube = parse_settings({"scheduler": "kubernetes"}, "(test)").kubernetes
    assert resource_for(kube, mixed, "gpu01") == "nvidia.com/gpu" and resource_for(kube, mixed, "mi01") == "amd.com/gpu"
    site = parse_settings({"kubernetes": {"smoke_resource_amd": "amd.com/gpu-partition"}}, "(test)").kubernetes
    assert resource_for(site, mixed, "mi02") == "amd.com/gpu-partition"
