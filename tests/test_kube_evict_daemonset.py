"""The sweep's eviction spares a DaemonSet's pod only while it requests no
GPU: a user's DaemonSet that tolerates everything and holds the node's GPUs
would otherwise refuse every smoke Pod (OutOfnvidia.com/gpu) and keep the
drained node out for good (the reboot then killing it past its budget).
The node agent, the GPU operator's device plugin and DCGM exporter request
none, and stay."""

from gpugate.kube import evict
from gpugate.sweep.kube_sweeper import KubeSweeper

DAEMONSET = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "x", "uid": "u", "controller": True}]


def pod(limits=None, requests=None, init=None, owners=DAEMONSET, namespace="team-a"):
    container = {"name": "main", "image": "registry.example.com/x:1"}
    if limits is not None or requests is not None:
        container["resources"] = {k: v for k, v in (("limits", limits), ("requests", requests)) if v is not None}
    spec = {"nodeName": "gpu01", "tolerations": [{"operator": "Exists"}], "containers": [container]}
    if init is not None:
        spec["initContainers"] = [{"name": "init", "image": "registry.example.com/x:1",
                                   "resources": {"limits": init}}]
    return {"metadata": {"name": "x-abcde", "namespace": namespace, "ownerReferences": owners},
            "spec": spec, "status": {"phase": "Running"}}


def test_a_daemonset_pod_that_requests_gpus_is_evicted_in_any_namespace():
    assert evict.must_go(pod(limits={"nvidia.com/gpu": "8"}))
    assert evict.must_go(pod(limits={"amd.com/gpu": 8}))
    assert evict.must_go(pod(limits={"nvidia.com/gpu": "1"}, namespace="kube-system"))  # the namespace spares none
    assert evict.must_go(pod(requests={"nvidia.com/gpu": "2"}))
    assert evict.must_go(pod(limits={"cpu": "1"}, init={"nvidia.com/gpu": "8"}))  # an init container's count
    assert evict.must_go(pod(limits={"example.com/gpu": "1"}))  # any extended resource named .../gpu
    assert evict.must_go(pod(limits={"nvidia.com/gpu.shared": "4"}))  # time-slicing's renamed resource
    assert evict.must_go(pod(limits={"nvidia.com/mig-1g.10gb": "7"}))  # MIG slices
    # The site's own names ([kubernetes] smoke_resource, smoke_resource_amd).
    assert not evict.must_go(pod(limits={"site.example/accelerator": "8"}))
    assert evict.must_go(pod(limits={"site.example/accelerator": "8"}), gpus=("site.example/accelerator",))
    assert evict.gpus_requested(pod(limits={"nvidia.com/gpu": "8", "cpu": "2"})) == ["nvidia.com/gpu"]


def test_a_daemonset_pod_that_requests_no_gpu_stays():
    # gpugate's node agent (deploy/kubernetes/node-agent.yaml), the device plugin, DCGM exporter: no GPU asked.
    assert not evict.must_go(pod())
    assert not evict.must_go(pod(limits={"memory": "512Mi"}, requests={"cpu": "20m", "memory": "64Mi"}))
    assert not evict.must_go(pod(limits={"nvidia.com/gpu": "0"}))  # a count of zero holds no GPU
    assert not evict.must_go(pod(limits={"hugepages-2Mi": "1Gi", "rdma/hca": "1"}))
    # Not a DaemonSet's: goes, GPU or not (as before).
    rs = [{"kind": "ReplicaSet", "name": "x", "controller": True}]
    assert evict.must_go(pod(owners=rs)) and evict.must_go(pod(owners=rs, limits={"nvidia.com/gpu": "8"}))
    # A DaemonSet's that has ended holds nothing: it does not go.
    ended = pod(limits={"nvidia.com/gpu": "8"})
    ended["status"]["phase"] = "Succeeded"
    assert not evict.must_go(ended)


def test_the_sweep_reads_the_site_s_gpu_resources():
    class Settings:
        kubernetes = {"smoke_resource": "site.example/accelerator", "smoke_resource_amd": "amd.com/gpu-partition"}

    sweeper = KubeSweeper.__new__(KubeSweeper)
    sweeper.settings = Settings()
    assert sweeper._gpus() == ("site.example/accelerator", "amd.com/gpu-partition")
    held = pod(limits={"site.example/accelerator": "8"})
    assert evict.must_go(held, gpus=sweeper._gpus()) and not evict.must_go(held)


def test_evict_round_asks_a_gpu_daemonset_pod_to_leave_and_leaves_the_agent():
    class Client:
        def __init__(self, pods):
            self.pods, self.asked = pods, []

        def list_pages(self, path, **query):
            return iter(self.pods)

        def create(self, path, body):
            self.asked.append(body["metadata"]["name"])

    hog = pod(limits={"nvidia.com/gpu": "8"})
    agent = pod(limits={"memory": "512Mi"})
    agent["metadata"].update(name="gpugate-node-agent-xyz12", namespace="gpugate")
    client = Client([hog, agent])
    left, refused = evict.evict_round(client, "gpu01")
    assert left == ["team-a/x-abcde"] and refused == {} and client.asked == ["x-abcde"]
