"""Issue 44, item 5, on the real API server: only gpugate's own smoke Pod is
spared by the sweep's eviction (a user's pod with the label, in their own
namespace, leaves through its PodDisruptionBudget like any other), pods
that come to the node after the eviction pass are evicted before the smoke
Pod, and a smoke Pod the kubelet refused (its GPUs held by another pod)
proves nothing: the node is deferred, held, never failed or sent to rma.
A user's DaemonSet pod that requests GPUs is evicted like any other, and
while its DaemonSet makes it again the node is deferred with it named.

The user is a ServiceAccount token with rights in its own namespace only
(team-a): it may make pods and PodDisruptionBudgets there, bound to a node
by spec.nodeName (no scheduler needed), and nothing in gpugate-smoke."""

import threading
import time

import pytest

from gpugate.kube.client import KubeError, node_path
from gpugate.kube.evict import SMOKE_LABEL
from test_kube_agent import api  # noqa: F401 (the module's API server)
from test_kube_sweep import held, journal, pdb, site, sweep  # noqa: F401 (the sweep's fleet and kubelets)

pytestmark = pytest.mark.kube

TEAM = "team-a"
REJECTED = ("OutOfnvidia.com/gpu", "Pod was rejected: Node didn't have enough resource: nvidia.com/gpu, "
                                   "requested: 8, used: 8, capacity: 8")


@pytest.fixture
def user(site):  # noqa: F811
    """The user's client: pods and PodDisruptionBudgets in team-a, nothing else."""
    admin = site.admin
    rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces/%s/" % TEAM
    for path, body in (
            ("/api/v1/namespaces", {"metadata": {"name": TEAM}}),
            (rbac + "roles", {"metadata": {"name": "user"}, "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "delete"]},
                {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["create", "get"]}]}),
            (rbac + "rolebindings", {"metadata": {"name": "user"}, "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "user"},
                "subjects": [{"kind": "ServiceAccount", "name": "someone", "namespace": "default"}]})):
        try:
            admin.create(path, body)
        except KubeError as exc:
            if exc.status != 409:
                raise
    try:
        yield site.api.client("stranger")
    finally:
        for pod in admin.list_pages("/api/v1/namespaces/%s/pods" % TEAM):
            admin.request("DELETE", "/api/v1/namespaces/%s/pods/%s" % (TEAM, pod["metadata"]["name"]),
                          {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})
        for budget in admin.list_pages("/apis/policy/v1/namespaces/%s/poddisruptionbudgets" % TEAM):
            admin.request("DELETE", "/apis/policy/v1/namespaces/%s/poddisruptionbudgets/%s"
                          % (TEAM, budget["metadata"]["name"]))


def user_pod(site, client, name, node, labels):
    """A pod the user binds to ``node`` by name; running, as its kubelet would report it."""
    client.create("/api/v1/namespaces/%s/pods" % TEAM, {"metadata": {"name": name, "labels": labels}, "spec": {
        "nodeName": node, "tolerations": [{"operator": "Exists"}],
        "containers": [{"name": "main", "image": "registry.example.com/train:1",
                        "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}})
    site.admin.patch("/api/v1/namespaces/%s/pods/%s/status" % (TEAM, name), {"status": {
        "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}, "strategic")


def gone(site, name):
    try:
        pod = site.admin.get("/api/v1/namespaces/%s/pods/%s" % (TEAM, name))
    except KubeError as exc:
        return exc.status == 404
    return bool(pod["metadata"].get("deletionTimestamp"))


def boot_id(site, node):
    return site.admin.get(node_path(node))["status"]["nodeInfo"]["bootID"]


def deferred(site, node, *named):
    """A sweep (drain_timeout 3 s) that defers ``node``: held, not rebooted,
    no smoke Pod run; its outcome names each of ``named``."""
    before = boot_id(site, node)
    out, report, _ = sweep(site, drain_timeout=3)
    assert out.returncode == 0, out.stderr[-2000:]
    outcome = report["outcomes"][node]
    assert outcome["result"] == "deferred", (report, out.stdout[-3000:])
    assert all(word in outcome["detail"] for word in named), outcome
    assert [t["value"] for t in held(site.admin, node)] == ["health"]
    assert boot_id(site, node) == before and site.kubelets.ran == []
    return outcome


def test_a_user_pod_labelled_smoke_in_its_own_namespace_is_evicted_through_its_budget(site, user):  # noqa: F811
    agent = site.config("agent")
    site.sim("gpu02", "gpu.1.xid=79")  # acute; a reboot repairs it
    site.healthcheck(agent, "gpu02")
    assert [t["value"] for t in held(site.admin, "gpu02")] == ["health"]
    with pytest.raises(KubeError) as refused:  # the user cannot make a pod where gpugate's smoke Pods live
        user.create("/api/v1/namespaces/gpugate-smoke/pods", {"metadata": {"name": "x"}, "spec": {
            "containers": [{"name": "main", "image": "registry.example.com/train:1"}]}})
    assert refused.value.status == 403
    user_pod(site, user, "sneaky-0", "gpu02", {SMOKE_LABEL: "all_reduce", "app": "sneaky"})
    pdb(site.admin, "sneaky", "sneaky", 0, TEAM, user)
    before = boot_id(site, "gpu02")

    deferred(site, "gpu02", "team-a/sneaky-0", "disruption budget")
    assert not gone(site, "sneaky-0")  # the budget held: the pod is there, not terminating

    pdb(site.admin, "sneaky", "sneaky", 1, TEAM, user)  # the budget allows it now: through the Eviction API
    out, report, _ = sweep(site)
    assert report["outcomes"]["gpu02"]["result"] == "resumed", (report, out.stdout[-3000:])
    assert gone(site, "sneaky-0") and boot_id(site, "gpu02") != before
    assert [(n, code) for _, n, code in site.kubelets.ran] == [("gpu02", 0)]


def test_a_pod_bound_to_the_node_after_the_eviction_pass_is_evicted_before_the_smoke_pod(site, user):  # noqa: F811
    agent = site.config("agent")
    site.sim("gpu01", "gpu.1.xid=79")
    site.healthcheck(agent, "gpu01")
    before = boot_id(site, "gpu01")
    stop = threading.Event()

    def arrive():  # once the node is back from its reboot (after the eviction pass), a pod bound to it by name
        while not stop.is_set():
            if boot_id(site, "gpu01") != before:
                user_pod(site, user, "late-0", "gpu01", {"app": "late"})
                return
            time.sleep(0.1)

    thread = threading.Thread(target=arrive, daemon=True)
    thread.start()
    try:
        out, report, _ = sweep(site)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert report["outcomes"]["gpu01"]["result"] == "resumed", (report, out.stdout[-3000:])
    assert ("evict", "done", "1 pod(s) came since the drain, evicted before the smoke Pod: team-a/late-0") in (
        journal(site, "gpu01")), journal(site, "gpu01")
    assert gone(site, "late-0")


def test_a_smoke_pod_the_kubelet_refuses_for_want_of_gpus_defers_the_node_never_rma(site):  # noqa: F811
    agent = site.config("agent")
    site.sim("gpu03", "gpu.1.xid=79")  # verifies after its reboot; its all_reduce would pass
    site.healthcheck(agent, "gpu03")
    site.kubelets.reject["gpu03"] = REJECTED  # its GPUs held by a pod the sweep never saw

    out, report, _ = sweep(site)
    assert out.returncode == 0, out.stderr[-2000:]
    outcome = report["outcomes"]["gpu03"]
    assert outcome["result"] == "deferred", (report, out.stdout[-3000:])
    assert "could not run" in outcome["detail"] and "OutOfnvidia.com/gpu" in outcome["detail"], outcome
    assert "not a finding against the node" in outcome["detail"], outcome
    # Never a finding: no retry, no escalation, no rma; held with the class it came in with.
    assert [t["value"] for t in held(site.admin, "gpu03")] == ["health"]
    events = journal(site, "gpu03")
    assert not any(step in ("escalate", "smoke", "smoke single") and status == "failed"
                   for step, status, _ in events), events
    assert not any(step == "escalate" for step, _, _ in events), events
    assert list(site.admin.list_pages("/api/v1/namespaces/gpugate-smoke/pods")) == []

    del site.kubelets.reject["gpu03"]  # the GPUs free again: the next sweep proves it and returns it
    out, report, _ = sweep(site)
    assert report["outcomes"]["gpu03"]["result"] == "resumed", (report, out.stdout[-3000:])
    assert held(site.admin, "gpu03") == []


def test_a_user_gpu_daemonset_pod_is_evicted_and_defers_the_node_while_it_comes_back(site, user):  # noqa: F811
    """A user's DaemonSet that tolerates everything and requests nvidia.com/gpu:
    its pod is evicted like any other (a DaemonSet's pod is spared only while
    it requests no GPU); while its DaemonSet makes it again, the node is
    deferred, held, never rebooted, with the pod named; once it is gone, the
    sweep proves the node and returns it."""
    admin = site.admin
    agent = site.config("agent")
    site.sim("gpu01", "gpu.1.xid=79")
    site.healthcheck(agent, "gpu01")
    daemonset = admin.create("/apis/apps/v1/namespaces/%s/daemonsets" % TEAM, {
        "metadata": {"name": "gpu-hog"}, "spec": {
            "selector": {"matchLabels": {"app": "gpu-hog"}},
            "template": {"metadata": {"labels": {"app": "gpu-hog"}}, "spec": {
                "tolerations": [{"operator": "Exists"}],
                "containers": [{"name": "main", "image": "registry.example.com/train:1",
                                "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}}})
    owner = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "gpu-hog",
              "uid": daemonset["metadata"]["uid"], "controller": True}]
    made, stop = [], threading.Event()

    def controller():  # the DaemonSet controller's part: the node always has its pod
        client = site.api.admin()  # one client per thread
        while not stop.is_set():
            mine = [p for p in client.list_pages("/api/v1/namespaces/%s/pods" % TEAM, labelSelector="app=gpu-hog")
                    if not p["metadata"].get("deletionTimestamp")]
            if not mine:
                name = "gpu-hog-%d" % len(made)
                client.create("/api/v1/namespaces/%s/pods" % TEAM, {"metadata": {
                    "name": name, "labels": {"app": "gpu-hog"}, "ownerReferences": owner}, "spec": {
                    "nodeName": "gpu01", "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "main", "image": "registry.example.com/train:1",
                                    "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}})
                client.patch("/api/v1/namespaces/%s/pods/%s/status" % (TEAM, name), {"status": {
                    "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}, "strategic")
                made.append(name)
            stop.wait(0.1)

    thread = threading.Thread(target=controller, daemon=True)
    thread.start()
    try:
        time.sleep(0.5)
        deferred(site, "gpu01", "team-a/gpu-hog-", "made again by their DaemonSet")
        assert len(made) >= 2 and gone(site, made[0])  # evicted, and made again
    finally:
        stop.set()
        thread.join(timeout=10)
    admin.request("DELETE", "/apis/apps/v1/namespaces/%s/daemonsets/gpu-hog" % TEAM)  # the user gives up
    out, report, _ = sweep(site)
    assert report["outcomes"]["gpu01"]["result"] == "resumed", (report, out.stdout[-3000:])
    assert all(gone(site, name) for name in made)
    assert [(n, code) for _, n, code in site.kubelets.ran] == [("gpu01", 0)]
