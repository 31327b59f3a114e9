"""The pure parts of the sweep's repair of one GPU held alone
(gpugate.sweep.kube_gpu_repair): which nodes can be repaired so, the
verification narrowed to the held GPUs, the Pods whose claims hold a
device (gpugate.kube.claims), and the reset's process check narrowed to
the GPUs reset (gpugate.vendors.nvidia.reset).  On the real control
plane: tests/test_kube_device_repair.py."""

from types import SimpleNamespace as NS

import pytest

from gpugate.kube import claims
from gpugate.sweep.kube_gpu_repair import GpuCheck, alone
from gpugate.vendors.nvidia import reset as nvidia_reset


def baseline(vendor="nvidia", nvswitch=False):
    return NS(vendor_for=lambda name: vendor, expect_for=lambda name: NS(nvswitch=nvswitch))


@pytest.mark.parametrize("vendor,nvswitch,want", [("nvidia", False, True), ("nvidia", True, False),
                                                   ("nvidia", None, False), ("amd", False, False)])
def test_one_gpu_is_repaired_alone_only_where_it_can_be_reset_alone(vendor, nvswitch, want):
    assert alone(baseline(vendor, nvswitch), "n1") is want


def test_the_verification_is_of_the_held_gpus_alone():
    seen = []
    inner = NS(check=lambda nodes, args, timeout: seen.append((nodes, args, timeout)) or {"n1": {}}, name="local")
    assert GpuCheck(inner, (1, 5)).check(["n1"], ["--mode", "verify"], 60) == {"n1": {}}
    assert seen == [(["n1"], ["--mode", "verify", "--gpu", "1", "--gpu", "5"], 60)]
    assert GpuCheck(inner, (1,)).name == "local"  # the rest of the transport as it is


def test_a_pods_claims_and_their_devices():
    pod = {"metadata": {"namespace": "ml"}, "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "c1"},
                                                                       {"name": "t", "resourceClaimTemplateName": "x"}]},
           "status": {"resourceClaimStatuses": [{"name": "t", "resourceClaimName": "p-t-abc"}]}}
    assert claims.claim_names(pod) == ["c1", "p-t-abc"]
    claim = {"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-3"}]}}}}
    assert claims.allocated(claim) == {("gpu.nvidia.com", "n1", "gpu-3")}
    assert claims.allocated({}) == set()


def test_only_the_pods_on_the_held_devices_are_waited_for(monkeypatch):
    pods = [{"metadata": {"namespace": "ml", "name": name}, "spec": {"resourceClaims": [{"resourceClaimName": name}]},
             "status": {"phase": phase}} for name, phase in (("a", "Running"), ("b", "Running"), ("c", "Succeeded"))]
    given = {"a": "gpu-3", "b": "gpu-4", "c": "gpu-3"}
    monkeypatch.setattr(claims, "pods_on", lambda client, node: pods)
    client = NS(get=lambda path: {"status": {"allocation": {"devices": {"results": [
        {"driver": "d", "pool": "n1", "device": given[path.rsplit("/", 1)[1]]}]}}}})
    assert claims.using(client, "n1", [("d", "n1", "gpu-3")]) == ["ml/a"]
    assert claims.using(client, "n1", [("d", "n1", "gpu-7")]) == []


def test_the_reset_of_some_gpus_waits_only_for_their_processes(monkeypatch):
    procs = ["4242, python3, 00000000:18:00.0", "4343, python3, 00000000:2A:00.0"]
    listing = "0, 00000000:18:00.0\n1, 00000000:2A:00.0\n2, 00000000:3A:00.0\n"
    monkeypatch.setattr(nvidia_reset, "run", lambda argv, timeout: NS(stdout=listing))
    assert nvidia_reset._on(None, "n1", "nvidia-smi", procs, [2], 5) == []
    assert nvidia_reset._on(None, "n1", "nvidia-smi", procs, [1, 2], 5) == procs[1:]
    # The GPUs' bus ids not read: every process counts (the safe side).
    monkeypatch.setattr(nvidia_reset, "run", lambda argv, timeout: NS(stdout=""))
    assert nvidia_reset._on(None, "n1", "nvidia-smi", procs, [2], 5) == procs


def test_the_sweeps_work_on_a_gpu_held_alone_keeps_the_node_serving():
    """KubeNodes (over FakeAPI): empty_gpus writes the sweep's NoExecute rule
    beside gpugate's and names it in the record; the work reason keeps the
    GPUs held alone only while the sweep repairs them alone (gpu_repair)."""
    from test_device_holds import REMAP, FakeAPI, finding, gpu3, kube_nodes

    from gpugate.kube import dra
    from gpugate.kube import nodeview as nv
    from gpugate.model.findings import RMA_ACTION

    api = FakeAPI()
    backend = kube_nodes(api)
    backend.hold_devices("node01", REMAP, [finding("row_remap", 3, RMA_ACTION)], gpu3(api))
    assert backend.empty_gpus("node01", (3,)) == [("gpu.nvidia.com", "node01", "gpu-3")]
    effects = {n: r["spec"]["taint"]["effect"] for n, r in api.rules.items()}
    assert effects == {"gpugate.node01.gpu.nvidia.com.gpu-3": "NoSchedule",
                       "gpugate.node01.gpu.nvidia.com.gpu-3" + dra.EMPTY: "NoExecute"}
    assert sorted(nv.devices_held(api.node)) == sorted(effects) and nv.owned(api.node)["gpus"] == [3]
    assert backend.empty_gpus("node01", (3,)) == [("gpu.nvidia.com", "node01", "gpu-3")]  # again: the same
    work = "gpugate health sweep=reset batch 1 attempt 1 (want verified)"
    backend.gpu_repair.add("node01")
    backend.drain("node01", work)
    assert nv.owned(api.node)["reason"] == work and not nv.our_taints(api.node)
    assert nv.state_of(api.node).reason == work  # what the sweep's resume compares
    backend.gpu_repair.clear()
    backend._seen.pop("node01", None)
    backend.drain("node01", work)
    assert [t["effect"] for t in nv.our_taints(api.node)] == ["NoSchedule"]  # not repaired alone: the Node
    backend.undrain("node01")
    assert api.rules == {} and nv.owned(api.node) == {}
