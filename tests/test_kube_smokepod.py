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
    assert evict.SMOKE_LABEL in spec["metadata"]["labels"] and evict.must_go(spec)  # the label alone spares none
    assert not evict.must_go(spec, evict.OwnSmoke("gpugate", None, {spec["metadata"]["name"]}))
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
    from gpugate.model.baseline import parse_baseline
    from gpugate.model.config import parse_settings
    from gpugate.sweep.kube_sweeper import resource_for

    mixed = parse_baseline({"name": "mixed", "pin": {"driver": "580.65.06", "amdgpu": "6.12.12"},
                            "nodes": {"mi[01-02]": {"vendor": "amd", "gpus": 8}, "gpu[01-02]": {"gpus": 8}}},
                           "baseline.toml")
    kube = parse_settings({"scheduler": "kubernetes"}, "(test)").kubernetes
    assert resource_for(kube, mixed, "gpu01") == "nvidia.com/gpu" and resource_for(kube, mixed, "mi01") == "amd.com/gpu"
    site = parse_settings({"kubernetes": {"smoke_resource_amd": "amd.com/gpu-partition"}}, "(test)").kubernetes
    assert resource_for(site, mixed, "mi02") == "amd.com/gpu-partition"


# ---------------------------------------------------------------- issue 44, item 5
KEY = b"k" * 32


def _smoke_pod(namespace="gpugate-smoke", name="gpugate-smoke-gpu01-abcd1234", node="gpu01", key=KEY):
    spec = sp.pod_spec(name, node, namespace, "registry.example.com/nccl:1", ["all_reduce_perf"], 8,
                       "nvidia.com/gpu", 300, key=key)
    spec["status"] = {"phase": "Running"}
    return spec


def test_only_gpugate_s_own_smoke_pod_is_spared_by_the_eviction():
    """The label alone spares nothing: only a Pod in [kubernetes] smoke_namespace
    that the sweep made (its name, this run) or signed (the drain budget key)."""
    ours = evict.OwnSmoke("gpugate-smoke", KEY)
    assert not evict.must_go(_smoke_pod(), ours)  # gpugate's own, signed
    # A user's pod with the label in their own namespace, or with the label copied with its proof: evicted.
    user = {"metadata": {"name": "train-0", "namespace": "team-a", "labels": {evict.SMOKE_LABEL: "all_reduce"}},
            "spec": {"nodeName": "gpu01"}, "status": {"phase": "Running"}}
    assert evict.must_go(user, ours) and evict.must_go(user)
    copied = _smoke_pod(namespace="team-a")
    assert evict.must_go(copied, ours)
    stolen = _smoke_pod()
    stolen["metadata"]["annotations"][evict.PROOF] = _smoke_pod(name="gpugate-smoke-gpu01-ffff0000")[
        "metadata"]["annotations"][evict.PROOF]  # another Pod's proof
    assert evict.must_go(stolen, ours)
    moved = _smoke_pod()
    moved["spec"]["nodeName"] = "gpu02"  # the proof names the node it was made for
    assert evict.must_go(moved, ours)
    assert evict.must_go(_smoke_pod(key=b"x" * 32), ours)  # signed with another key
    assert evict.must_go(_smoke_pod(key=None), ours)  # unsigned, and not made by this run
    # Without a key, only the Pods this run made (by the names it chose), in its namespace.
    made = evict.OwnSmoke("gpugate-smoke", None, names={"gpugate-smoke-gpu01-abcd1234"})
    assert not evict.must_go(_smoke_pod(key=None), made)
    assert evict.must_go(_smoke_pod(key=None, namespace="team-a"), made)
    assert evict.must_go(_smoke_pod(), evict.OwnSmoke("gpugate-smoke", None))  # a proof no one can check


def _status(**status):
    return {"metadata": {"name": "gpugate-smoke-gpu01-abcd1234"}, "status": status}


def test_which_smoke_pod_ends_say_it_could_not_run():
    """A Pod the kubelet refused, or one that never started by the deadline,
    proves nothing about the node: "could not run", never a finding."""
    rejected = _status(phase="Failed", reason="OutOfnvidia.com/gpu",
                       message="Pod was rejected: Node didn't have enough resource: nvidia.com/gpu, requested: 8, "
                               "used: 8, capacity: 8")
    why = sp.could_not_run(rejected)
    assert "OutOfnvidia.com/gpu" in why and "requested: 8" in why
    assert sp.could_not_run(_status(phase="Failed", reason="UnexpectedAdmissionError",
                                    message="Allocate failed due to ...")).startswith("the kubelet refused it")
    assert "Evicted" in sp.could_not_run(_status(phase="Failed", reason="Evicted", containerStatuses=[
        {"state": {"terminated": {"exitCode": 137, "reason": "Error"}}}]))
    assert "ended" in sp.could_not_run(_status(phase="Failed"))  # no container status at all
    assert sp.could_not_run(_status(phase="Failed", containerStatuses=[
        {"state": {"terminated": {"exitCode": 128, "reason": "StartError", "message": "exec failed"}}}]))
    # Never started: by our deadline (Pending, pulling), or by activeDeadlineSeconds before it ran.
    pulling = _status(phase="Pending", containerStatuses=[{"state": {"waiting": {"reason": "ContainerCreating"}}}])
    assert sp.could_not_run(pulling) == ""  # still coming: not yet judged
    assert "ContainerCreating" in sp.could_not_run(pulling, late=True)
    assert sp.could_not_run(_status(phase="Pending"), late=True)
    assert sp.could_not_run(_status(phase="Failed", reason="DeadlineExceeded", containerStatuses=[
        {"state": {"waiting": {"reason": "ContainerCreating"}}}]))
    # It ran: what it did is the node's (a hang, a failure, a pass).
    ran = {"state": {"terminated": {"exitCode": 137, "reason": "Error"}}}
    assert sp.could_not_run(_status(phase="Failed", reason="DeadlineExceeded", containerStatuses=[ran])) == ""
    assert sp.could_not_run(_status(phase="Failed", containerStatuses=[
        {"state": {"terminated": {"exitCode": 1, "reason": "Error", "message": "NCCL WARN"}}}])) == ""
    assert sp.could_not_run(_status(phase="Succeeded", containerStatuses=[
        {"state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}])) == ""
    assert sp.could_not_run(_status(phase="Running", containerStatuses=[
        {"state": {"running": {"startedAt": "2026-12-05T00:00:00Z"}}}]), late=True) == ""
