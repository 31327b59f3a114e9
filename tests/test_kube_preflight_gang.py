"""A gang's preflight on Kubernetes, on the fuller control plane: the
release's kube-apiserver, kube-scheduler and kube-controller-manager, and
KWOK's kubelets (gpugate.testbed.kube, control_plane=True).  The chart's
manifests are applied as a site applies them: the node agent's RBAC, the
preflight's (reading Pods and the gangs' objects) and its
MutatingAdmissionPolicy, which gives every GPU Pod of an opted-in
namespace the gpugate-preflight init container.

Five simulated GPU nodes, each with its node agent (`gpugate agent`, as
the DaemonSet runs it, with a token bound to its Node) serving the
preflight port; the testbed kubelet runs each Pod's init container as a
kubelet would (its command and env from the Pod, the Service's address
mapped to that node's agent) and KWOK the rest.  The gangs are batch/v1
Jobs of whole-node Pods under the real Job controller, their Pods in a
Volcano PodGroup (the annotation and the object Volcano writes).

- A 4-Pod gang placed on four nodes of which one (gpu03) is slow across
  nodes: the proof across pins gpu03, the keeper holds it (a pin is
  budgeted), gpu03's Pod fails its init container, the Job controller
  makes it anew, the scheduler places it on gpu05, and the gang runs on
  four good nodes; no other node is held.
- 10 healthy gangs, one after another: every Pod passes, nothing held."""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from gpugate.kube.client import KubeError, node_path
from gpugate.testbed import manifests
from test_kube_agent import DEMO_BASELINE, MANIFESTS
from test_kube_control_plane import GPU, held, start_control_plane, wait_for

pytestmark = pytest.mark.kube

NODES = ["gpu01", "gpu02", "gpu03", "gpu04", "gpu05"]
NAMESPACE = "ml"
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFLIGHT_MANIFESTS = os.path.join(ROOT, "deploy", "kubernetes", "preflight")  # helm-render's, preflight.enabled
VOLCANO_CRD = os.path.join(FIXTURES, "gangs", "crds", "scheduling.volcano.sh_podgroups.yaml")
PODGROUPS = "/apis/scheduling.volcano.sh/v1beta1/namespaces/%s/podgroups" % NAMESPACE
JOBS = "/apis/batch/v1/namespaces/%s/jobs" % NAMESPACE
PODS = "/api/v1/namespaces/%s/pods" % NAMESPACE


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    from gpugate.testbed.kube import KubeFleet

    base = tmp_path_factory.mktemp("gang")
    api = start_control_plane(str(base / "api"))
    agents, kubelets, keeper = [], None, None
    try:
        if not _policy_served(api):
            pytest.skip("this release serves no MutatingAdmissionPolicy (admissionregistration.k8s.io/v1)")
        api.apply(MANIFESTS)
        api.apply(PREFLIGHT_MANIFESTS)
        admin = api.admin()
        with open(VOLCANO_CRD) as handle:
            admin.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                         manifests.parse(handle.read(), VOLCANO_CRD)[0])
        wait_for("the PodGroup CRD served", lambda: _served(admin, PODGROUPS), 30)
        admin.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE,
                                                         "labels": {"gpugate.io/preflight": "true"}}})
        wait_for("the preflight policy in force", lambda: _injected(admin), 60)
        fleet = KubeFleet(api, str(base / "fleet"), NODES, DEMO_BASELINE, labels=GPU, kwok=True)
        ports = {node: _free_port() for node in NODES}
        meet = _free_port()
        agents = [_agent(fleet, node, ports[node], meet) for node in NODES]
        kubelets = _kubelets(api, fleet, ports)
        keeper = Keeper(fleet, fleet.config("keeper", share=0.5, extra=_preflight(fleet, 0, meet)))
        fleet.agents = agents
        yield fleet
    finally:
        if keeper is not None:
            keeper.stop()
        if kubelets is not None:
            kubelets.stop()
        for proc in agents:
            proc.terminate()
        for proc in agents:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        api.stop()


def _injected(admin) -> bool:
    """A GPU Pod made in the opted-in namespace gets the init container (then it goes)."""
    made = admin.create(PODS, {"metadata": {"generateName": "probe-"}, "spec": {"containers": [
        {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    admin.request("DELETE", PODS + "/" + made["metadata"]["name"])
    return [c["name"] for c in made["spec"].get("initContainers") or []] == ["gpugate-preflight"]


def _served(admin, path: str) -> bool:
    try:
        admin.get(path)
        return True
    except KubeError:
        return False


def _policy_served(api) -> bool:
    try:
        api.admin().get("/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies")
        return True
    except KubeError:
        return False


def _preflight(fleet, port: int, meet: int) -> str:
    """The [preflight] table of every node's gpugate.toml: the simulated
    nodes' all_reduce_perf, alone and across the gang's nodes."""
    run = os.path.join(fleet.fleet, "{node}", "bin", "all_reduce_perf")
    return ('\n[preflight]\nkubernetes = true\nkube_port = %d\ntimeout_seconds = 30\nacross_seconds = 60\n'
            'run_seconds = 20\nrendezvous_host = "127.0.0.1"\nport = %d\nports = 1\n'
            'allreduce = %s\nallreduce_multi = %s\n'
            % (port or 9412, meet, json.dumps([run, "-b", "8", "-e", "8G", "-g", "{gpus}"]),
               json.dumps([run, "-b", "1G", "-e", "8G", "-f", "2", "-g", "{gpus}"])))


def _agent(fleet, node: str, port: int, meet: int) -> subprocess.Popen:
    """`gpugate agent` for ``node``, as the DaemonSet runs it (a token bound to its Node)."""
    config = fleet.node_config(fleet.config("agent", share=0.5, extra=_preflight(fleet, port, meet)), node)
    # node_config copies it for this node at once: each node's copy keeps its own port.
    log = open(os.path.join(fleet.dir, "agent-%s.log" % node), "w")
    return subprocess.Popen([sys.executable, "-m", "gpugate", "agent", "--config", config, "--interval", "3600",
                             "--poll", "2"], env=dict(os.environ, GPUGATE_NODE_NAME=node), stdout=log,
                            stderr=subprocess.STDOUT)


def _kubelets(api, fleet, ports):
    from gpugate.testbed.kubelet_preflight import PreflightKubelets

    return PreflightKubelets(api, {node: "127.0.0.1:%d" % port for node, port in ports.items()}).start()


class Keeper:
    """`gpugate budget` every 2 s, as the keeper's Deployment runs it (--watch)."""

    def __init__(self, fleet, config: str):
        self.fleet, self.config, self.done = fleet, config, threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self):
        while not self.done.wait(2.0):
            try:
                self.fleet.keeper(self.config)
            except Exception:  # noqa: BLE001 - the next run tries again, as the keeper's loop does
                pass

    def stop(self):
        self.done.set()
        self.thread.join(30)


def _gang(admin, name: str, size: int):
    """A Volcano PodGroup and a Job of ``size`` whole-node Pods in it (restartPolicy Never)."""
    admin.create(PODGROUPS, {"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
                             "metadata": {"name": name}, "spec": {"minMember": size}})
    admin.create(JOBS, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": {
        "completions": size, "parallelism": size, "completionMode": "Indexed", "backoffLimit": 4,
        "template": {"metadata": {"annotations": {"scheduling.k8s.io/group-name": name}}, "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "train", "image": "registry.example.com/train:1",
                            "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}})


def _pods(admin, job: str):
    return admin.get(PODS + "?labelSelector=job-name%3D" + job)["items"]


def _preflight_exit(pod):
    for item in pod["status"].get("initContainerStatuses") or []:
        if item["name"] == "gpugate-preflight":
            done = (item.get("state") or {}).get("terminated")
            return None if done is None else done.get("exitCode")
    return None


def _cordon(admin, node: str, on: bool):
    admin.patch(node_path(node), {"spec": {"unschedulable": on}})


def test_a_gang_with_one_slow_node_runs_on_four_good_nodes_and_the_culprit_is_held(rig):
    admin = rig.admin
    rig.sim("gpu03", "smoke=pair-slow")  # slow in every run across nodes it joins
    _cordon(admin, "gpu05", True)  # the gang lands on gpu01-04, gpu03 among them
    try:
        _gang(admin, "gang-slow", 4)
        wait_for("the gang's 4 Pods bound", lambda: len(
            [p for p in _pods(admin, "gang-slow") if p["spec"].get("nodeName")]) == 4, 60)
    finally:
        _cordon(admin, "gpu05", False)
    first = {p["spec"]["nodeName"]: p for p in _pods(admin, "gang-slow")}
    assert sorted(first) == ["gpu01", "gpu02", "gpu03", "gpu04"]
    culprit = wait_for("gpu03's Pod failed its preflight", lambda: [
        p for p in _pods(admin, "gang-slow") if p["spec"].get("nodeName") == "gpu03" and _preflight_exit(p) == 1], 120)
    assert culprit[0]["status"]["phase"] == "Failed"
    wait_for("gpu03 held by the keeper", lambda: held(admin, "gpu03"), 60)
    reason = admin.get(node_path("gpu03"))["metadata"]["annotations"]
    assert "preflight_across=busbw=" in json.dumps(reason), reason

    # KWOK completes a Job's Pods once they run: the gang's work done is four Pods Succeeded.
    wait_for("the gang's Job complete", lambda: _complete(admin, "gang-slow"), 150)
    done = [p for p in _pods(admin, "gang-slow") if p["status"].get("phase") == "Succeeded"]
    assert len(done) == 4 and "gpu03" not in [p["spec"]["nodeName"] for p in done], [
        (p["spec"]["nodeName"], p["status"].get("phase")) for p in _pods(admin, "gang-slow")]
    assert all(_preflight_exit(p) == 0 for p in done)
    assert [n for n in NODES if n != "gpu03" and held(admin, n)] == []
    records = _records(rig, "gpu03")
    assert any(r.get("verdict") == "failed" and "culprit" in r.get("why", "") for r in records), records
    # The Pod made anew for gpu03's ran after its gang had started: its own node's proof only.
    first_uids = {p["metadata"]["uid"] for p in first.values()}
    (late,) = [p for p in done if p["metadata"]["uid"] not in first_uids]
    said = [r for r in _records(rig, late["spec"]["nodeName"]) if r.get("uid") == late["metadata"]["uid"]]
    assert said and said[-1]["verdict"] == "passed" and "across" not in said[-1]["preflight"], said
    assert said[-1]["preflight"].get("gang_why", "").startswith("the gang has started"), said
    rig.sim("gpu03", "smoke=healthy")


def _records(fleet, node):
    path = os.path.join(fleet.dir, "state", node, "gpugate.log")
    out = []
    try:
        with open(path) as handle:
            for line in handle:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if record.get("mode") == "kube-preflight":
                    out.append(record)
    except OSError:
        pass
    return out


def test_ten_healthy_gangs_pass_and_nothing_is_held(rig):
    admin = rig.admin
    good = [n for n in NODES if not held(admin, n)]
    size = min(4, len(good))
    started = time.monotonic()
    for i in range(10):
        name = "gang-ok-%d" % i
        _gang(admin, name, size)
        wait_for("%s complete" % name, lambda: _complete(admin, name), 120)
        pods = _pods(admin, name)
        assert len(pods) == size and all(_preflight_exit(p) == 0 for p in pods), [p["status"] for p in pods]
    assert [n for n in good if held(admin, n)] == []
    passed = [r for n in good for r in _records(rig, n) if r.get("verdict") == "passed"
              and r.get("preflight", {}).get("across", {}).get("ran")]
    assert len(passed) >= 10 * size
    print("10 healthy gangs of %d in %.1fs" % (size, time.monotonic() - started))


def _complete(admin, name):
    job = admin.get(JOBS + "/" + name)
    return any(c["type"] == "Complete" and c["status"] == "True" for c in job["status"].get("conditions") or [])
