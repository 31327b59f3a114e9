"""The testbed's kubelet for the preflight init container
(gpugate.testbed.kubelet_preflight) on the fuller control plane: the
release's kube-apiserver, kube-scheduler, kube-controller-manager (its Job
controller) and KWOK's kubelets (gpugate.testbed.kube_control, whose KWOK
pod-ready stage waits for a Pod's preflight).  No gpugate agent here: each
node's "agent" is a TCP server of the test speaking the preflight's
contract, failed on gpu01 (which it holds with a taint, as the agent holds
a culprit) and passed on gpu02.  The init container is the one `gpugate
kube-preflight --print-init-container` prints, in a batch/v1 Job's Pod
template, as a site without the MutatingAdmissionPolicy adds it.

- The Job's Pod on gpu01 runs `gpugate kube-preflight`, exits 1 and
  fails; the Job controller makes it anew, the scheduler places it on
  gpu02, its preflight passes, KWOK runs it, the Job completes.
- A Pod with the preflight on a node with no agent given stays Pending:
  KWOK does not start it before its preflight ran.
- A Pod without one is KWOK's at once, as before."""

import json
import time

import pytest

from gpugate.kube.client import node_path
from test_kube_preflight_call import Agent, lines
from test_kube_control_plane import start_control_plane, wait_for

pytestmark = pytest.mark.kube

NAMESPACE = "ml"
JOBS = "/apis/batch/v1/namespaces/%s/jobs" % NAMESPACE
PODS = "/api/v1/namespaces/%s/pods" % NAMESPACE
HOLD = {"key": "gpugate.io/test-preflight", "value": "culprit", "effect": "NoSchedule"}


def fake_agent(api, node: str, verdict: str):
    """One node's preflight port: answers ``verdict`` for ``node``, on failed first holding the node
    with HOLD, as the agent holds a culprit."""
    admin = api.admin()

    def hold(_request):
        if verdict == "failed":
            admin.patch(node_path(node), {"spec": {"taints": [HOLD]}})

    agent = Agent(lines({"progress": "own proof on %s" % node}, {"verdict": verdict, "why": "test agent",
                                                                   "node": node}), on_request=hold)
    agent.node = node
    return agent


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    from gpugate.testbed.kube import add_node
    from gpugate.testbed.kubelet_preflight import PreflightKubelets

    api = start_control_plane(str(tmp_path_factory.mktemp("preflight-kubelet") / "api"))
    agents, kubelets = [], None
    try:
        admin = api.admin()
        admin.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        for node in ("gpu01", "gpu02", "gpu03"):
            add_node(admin, node, {"nvidia.com/gpu.present": "true"}, kwok=True)
        agents = [fake_agent(api, "gpu01", "failed"), fake_agent(api, "gpu02", "passed")]
        kubelets = PreflightKubelets(api, {a.node: a.address for a in agents}).start()
        api.agents, api.kubelets = {a.node: a for a in agents}, kubelets
        yield api
    finally:
        if kubelets is not None:
            kubelets.stop()
        for agent in agents:
            agent.close()
        api.stop()


def _init_container():
    from gpugate.node.kube_preflight_call import init_container

    return init_container("registry.example.com/gpugate:1", "gpugate-preflight.gpugate.svc:9412", seconds=30)


def _preflight(pod):
    for item in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if item["name"] == "gpugate-preflight":
            return (item.get("state") or {}).get("terminated")
    return None


def _cordon(admin, node, on):
    admin.patch(node_path(node), {"spec": {"unschedulable": on}})


def test_the_culprits_pod_fails_and_the_job_runs_it_on_a_good_node(plane):
    admin = plane.admin()
    _cordon(admin, "gpu02", True)  # the first Pod goes to gpu01 (gpu03 tainted: no agent given there)
    admin.patch(node_path("gpu03"), {"spec": {"taints": [HOLD]}})
    try:
        admin.create(JOBS, {"metadata": {"name": "train"}, "spec": {
            "completions": 1, "parallelism": 1, "backoffLimit": 3, "template": {"spec": {
                "restartPolicy": "Never", "initContainers": [_init_container()],
                "containers": [{"name": "train", "image": "registry.example.com/train:1",
                                "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}})
        first = wait_for("the Job's Pod bound", lambda: [
            p for p in admin.get(PODS + "?labelSelector=job-name%3Dtrain")["items"] if p["spec"].get("nodeName")], 60)
        assert first[0]["spec"]["nodeName"] == "gpu01"
    finally:
        _cordon(admin, "gpu02", False)

    def job_complete():
        job = admin.get(JOBS + "/train")
        return any(c["type"] == "Complete" and c["status"] == "True" for c in job["status"].get("conditions") or [])

    wait_for("the Job complete", job_complete, 120)
    pods = {p["spec"]["nodeName"]: p for p in admin.get(PODS + "?labelSelector=job-name%3Dtrain")["items"]}
    assert sorted(pods) == ["gpu01", "gpu02"]
    failed, good = pods["gpu01"], pods["gpu02"]
    assert failed["status"]["phase"] == "Failed"
    done = _preflight(failed)
    assert done["exitCode"] == 1 and done["reason"] == "Error"
    said = json.loads(done["message"])
    assert said["verdict"] == "failed" and said["node"] == "gpu01" and said["pod"] == failed["metadata"]["name"]
    assert failed["status"]["containerStatuses"][0]["state"] == {"waiting": {"reason": "PodInitializing"}}
    assert good["status"]["phase"] == "Succeeded" and _preflight(good)["exitCode"] == 0
    # The downward API as the kubelet resolves it: each agent was asked for its own node's Pod.
    for node, pod in pods.items():
        meta = pod["metadata"]
        asked = [json.loads(r) for r in plane.agents[node].requests]
        assert {"namespace": NAMESPACE, "pod": meta["name"], "uid": meta["uid"]} in asked
    ran = [(node, code) for _, _, node, code, _ in plane.kubelets.ran]
    assert ("gpu01", 1) in ran and ("gpu02", 0) in ran


def test_kwok_waits_for_the_preflight_and_not_for_other_pods(plane):
    """gpu03 has no agent given here: its Pod with the preflight is never started by KWOK, while a
    Pod without one on the same node runs at once."""
    admin = plane.admin()
    toleration = [{"key": HOLD["key"], "operator": "Exists"}]
    admin.create(PODS, {"metadata": {"name": "waits"}, "spec": {
        "nodeName": "gpu03", "tolerations": toleration, "initContainers": [_init_container()],
        "containers": [{"name": "main", "image": "x:1"}]}})
    admin.create(PODS, {"metadata": {"name": "plain"}, "spec": {
        "nodeName": "gpu03", "tolerations": toleration, "containers": [{"name": "main", "image": "x:1"}]}})
    wait_for("the Pod without a preflight Running", lambda: admin.get(PODS + "/plain")["status"].get("phase")
             == "Running", 30)
    time.sleep(2)  # KWOK made "plain" Running within a second: it has had the time for "waits" too
    waits = admin.get(PODS + "/waits")["status"]
    assert waits.get("phase") == "Pending" and _preflight({"status": waits}) is None
