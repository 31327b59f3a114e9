"""Kubernetes GPU nodes under the same gate (issue 37), against a real
kube-apiserver and etcd (gpugate.testbed.kube; no kubelet: the tests create
the Node objects and write their Ready condition, as a kubelet would).

The node agent is gpugate-healthcheck as installed, run on simulated GPUs
with ``scheduler = "kubernetes"`` and the node agent's own ServiceAccount
token, so the RBAC of deploy/kubernetes/rbac.yaml is all it has.  The
manifests are applied to the same server with strict field validation."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from gpugate.kube import nodeview as nv
from gpugate.kube.client import KubeError, node_path

pytestmark = pytest.mark.kube

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MANIFESTS = os.path.join(ROOT, "deploy", "kubernetes")
DEMO_BASELINE = os.path.join(ROOT, "gpugate", "data", "demo-baseline.toml")
NODES = ("gpu01", "gpu02", "gpu03")


def _require_kube():
    from gpugate.testbed.kube import built_versions, cache_dir

    if built_versions():
        return
    message = "no kube-apiserver built in %s (scripts/kube-build; scripts/test builds it with --kube)" % cache_dir()
    if os.environ.get("CI") == "true":
        pytest.fail(message + "; CI=true: CI builds it", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    _require_kube()
    from gpugate.testbed.kube import KubeAPI

    server = KubeAPI(str(tmp_path_factory.mktemp("kube"))).start()
    try:
        server.apply(MANIFESTS)
        yield server
    finally:
        server.stop()


DEDICATED = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}  # the site's own taint


@pytest.fixture
def site(api, tmp_path):
    """Three healthy simulated GPU nodes that are Kubernetes nodes
    (gpugate.testbed.kube.KubeFleet), each with the site's own taint."""
    from gpugate.testbed.kube import KubeFleet

    fleet = KubeFleet(api, str(tmp_path), NODES, DEMO_BASELINE,
                      labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, taints=[DEDICATED])
    return fleet


def condition(node_obj):
    for cond in node_obj["status"].get("conditions") or []:
        if cond["type"] == nv.CONDITION:
            return cond
    return None


def test_the_manifests_apply_and_grant_each_component_only_what_it_needs(api):
    admin = api.admin()
    from gpugate.testbed.kube import add_node

    add_node(admin, "gpu09")
    agent, keeper, stranger = api.client("agent"), api.client("keeper"), api.client("stranger")
    assert agent.get(node_path("gpu09"))["metadata"]["name"] == "gpu09"
    from gpugate.kube.client import KubeClient
    from gpugate.testbed.kube_tokens import node_token

    # (A write needs a token naming the Node: agent-policy.yaml, tests/test_kube_least_privilege.py.)
    KubeClient(api.server, node_token(admin, "gpu09"), api.ca_file).patch(
        node_path("gpu09"), {"metadata": {"annotations": {"gpugate.io/pending": "1"}}})
    sweep = api.client("sweep")
    for who, call in ((agent, lambda c: c.get("/api/v1/nodes")),  # the agent reads its own node, never the fleet
                      (agent, lambda c: c.get("/api/v1/namespaces/gpugate/secrets")),
                      (agent, lambda c: c.get("/api/v1/pods")),
                      (keeper, lambda c: c.get("/api/v1/pods")),
                      (stranger, lambda c: c.patch(node_path("gpu09"), {"metadata": {"annotations": {"x": "2"}}})),
                      # The sweep evicts; it never deletes another's pod nor reads secrets.
                      (sweep, lambda c: c.request("DELETE", "/api/v1/namespaces/default/pods/any")),
                      (sweep, lambda c: c.get("/api/v1/namespaces/gpugate/secrets")),
                      (sweep, lambda c: c.create("/api/v1/namespaces/default/pods", {"metadata": {"name": "x"}})),
                      (sweep, lambda c: c.create("/api/v1/namespaces/gpugate/pods", {"metadata": {"name": "x"}}))):
        with pytest.raises(KubeError) as info:
            call(who)
        assert info.value.status == 403, info.value
    assert keeper.get("/api/v1/nodes")["items"]
    # Where the sweep may make Pods, Pod Security refuses a privileged one: its token is not root on a node.
    with pytest.raises(KubeError) as info:
        sweep.create("/api/v1/namespaces/gpugate-smoke/pods", {"metadata": {"name": "root"}, "spec": {
            "nodeName": "gpu09", "containers": [{"name": "c", "image": "x", "securityContext": {"privileged": True}}]}})
    assert info.value.status == 403 and "PodSecurity" in str(info.value), info.value
    # The server's own validation took them: the DaemonSet and the Deployment exist as written.
    ds = admin.get("/apis/apps/v1/namespaces/gpugate/daemonsets/gpugate-node-agent")
    assert ds["spec"]["template"]["spec"]["serviceAccountName"] == "gpugate-node-agent"
    assert admin.get("/apis/apps/v1/namespaces/gpugate/deployments/gpugate-keeper")["spec"]["replicas"] == 2
    with pytest.raises(KubeError) as info:  # strict validation is real: an unknown field is refused
        admin.request("POST", "/api/v1/namespaces/gpugate/serviceaccounts",
                      {"metadata": {"name": "x"}, "bogus": 1}, query={"fieldValidation": "Strict"})
    assert info.value.status in (400, 422)


def test_an_acute_finding_taints_and_cordons_its_node_only_and_fit_nodes_say_so(site):
    site.sim("gpu01", "gpu.3.ecc.uncorrected.volatile=2")  # a counter: the finding stands run after run
    agent = site.config("agent")
    for name in NODES:
        result = site.healthcheck(agent, name)
        assert result.returncode in (0, 1), result.stderr
    n1 = site.admin.get(node_path("gpu01"))
    ours = nv.our_taints(n1)
    assert [(t["key"], t["value"], t["effect"]) for t in ours] == [(nv.TAINT_KEY, "health", "NoSchedule")]
    assert DEDICATED in n1["spec"]["taints"]  # the site's stays
    assert n1["spec"]["unschedulable"] is True
    reason = json.loads(n1["metadata"]["annotations"][nv.OWNED])["reason"]
    assert reason.startswith("gpugate: health ecc:gpu3="), reason
    cond = condition(n1)
    assert (cond["status"], cond["reason"], cond["message"]) == ("False", "EccFault", reason)
    for name in ("gpu02", "gpu03"):
        other = site.admin.get(node_path(name))
        assert not other["spec"].get("unschedulable") and nv.our_taints(other) == []
        assert (condition(other)["status"], condition(other)["reason"]) == ("True", "Fit")
    # A second run with the same findings writes the condition's heartbeat only (node-problem-detector's
    # convention: a dead agent shows as a stale heartbeat), on the unfit node and on a fit one alike.
    fit_before = condition(site.admin.get(node_path("gpu02")))
    time.sleep(1.1)  # the heartbeat has a second's resolution
    for name in ("gpu01", "gpu02"):
        site.healthcheck(agent, name)
    again = site.admin.get(node_path("gpu01"))
    assert condition(again)["lastHeartbeatTime"] > cond["lastHeartbeatTime"]
    assert condition(again)["lastTransitionTime"] == cond["lastTransitionTime"]
    assert (again["spec"], again["metadata"]["annotations"]) == (n1["spec"], n1["metadata"]["annotations"])
    fit_after = condition(site.admin.get(node_path("gpu02")))
    assert fit_after["lastHeartbeatTime"] > fit_before["lastHeartbeatTime"]
    assert (fit_after["status"], fit_after["reason"], fit_after["lastTransitionTime"]) == (
        "True", "Fit", fit_before["lastTransitionTime"])


def test_a_one_time_event_leaves_the_node_held_and_says_it_is_fit_now(site):
    """An Xid is read once: the next run finds the node fit, and health is
    not a class that clears itself: held until the sweep proves it, which
    the condition says."""
    agent = site.config("agent")
    site.sim("gpu03", "gpu.2.xid=79")
    site.healthcheck(agent, "gpu03")
    reason = json.loads(site.admin.get(node_path("gpu03"))["metadata"]["annotations"][nv.OWNED])["reason"]
    assert reason.startswith("gpugate: health xid:gpu2=79"), reason
    site.healthcheck(agent, "gpu03")
    n3 = site.admin.get(node_path("gpu03"))
    assert [t["value"] for t in nv.our_taints(n3)] == ["health"] and n3["spec"]["unschedulable"] is True
    cond = condition(n3)
    assert (cond["status"], cond["reason"]) == ("True", "FitHeld") and reason in cond["message"]


def test_a_probe_finding_clears_itself_and_lifts_only_gpugates_hold(site):
    agent = site.config("agent")
    before = site.admin.get(node_path("gpu02"))["spec"]["taints"]  # the site's, and the API server's own
    garbage = os.path.join(site.dir, "garbage")
    with open(garbage, "w") as handle:
        handle.write("Error: unable to establish a connection to the host engine\n")
    replay = [sys.executable, "-m", "gpugate", "sim", "replay", site.fleet, "gpu02"]
    subprocess.run(replay + ["--stdout-file", garbage, "--exit-code", "255", "--", "dcgmi", "health", "-c", "-j"],
                   check=True, timeout=60, capture_output=True)  # DCGM's host engine is down: could not tell
    site.healthcheck(agent, "gpu02")
    n2 = site.admin.get(node_path("gpu02"))
    reason = json.loads(n2["metadata"]["annotations"][nv.OWNED])["reason"]
    assert reason.startswith("gpugate: probe dcgm_health="), reason
    assert [t["value"] for t in nv.our_taints(n2)] == ["probe"] and n2["spec"]["unschedulable"] is True
    # Could not tell: Unknown (node-problem-detector's convention), never False.
    assert (condition(n2)["status"], condition(n2)["reason"], condition(n2)["message"]) == (
        "Unknown", "DcgmHealthUnknown", reason)
    subprocess.run(replay + ["--clear", "--", "dcgmi", "health", "-c", "-j"], check=True, timeout=60, capture_output=True)
    site.healthcheck(agent, "gpu02")  # DCGM answers again: fit, and probe clears itself
    n2 = site.admin.get(node_path("gpu02"))
    assert nv.our_taints(n2) == [] and not n2["spec"].get("unschedulable")
    assert n2["spec"]["taints"] == before
    assert (condition(n2)["status"], condition(n2)["reason"]) == ("True", "Fit")


def test_an_admins_cordon_is_left_alone_and_gpugate_holds_the_node_once_it_is_lifted(site):
    site.admin.patch(node_path("gpu02"), {"spec": {"unschedulable": True}})
    site.sim("gpu02", "gpu.1.xid=79")
    agent = site.config("agent")
    site.healthcheck(agent, "gpu02")
    n2 = site.admin.get(node_path("gpu02"))
    assert nv.our_taints(n2) == [] and nv.OWNED not in (n2["metadata"].get("annotations") or {})
    assert condition(n2)["status"] == "False"  # the verdict is published all the same
    site.admin.patch(node_path("gpu02"), {"spec": {"unschedulable": None}})  # the admin uncordons
    site.healthcheck(agent, "gpu02")
    n2 = site.admin.get(node_path("gpu02"))
    assert [t["value"] for t in nv.our_taints(n2)] == ["health"] and n2["spec"]["unschedulable"] is True


def test_budgeted_drift_is_published_and_the_keeper_taints_within_the_pools_budget(site):
    site.sim("gpu[01-03]", "driver=550.54.15")
    agent = site.config("agent", share=0.34)
    for name in NODES:
        result = site.healthcheck(agent, name)
        assert result.returncode in (0, 1), result.stderr
    for name in NODES:
        node = site.admin.get(node_path(name))
        assert nv.our_taints(node) == [] and not node["spec"].get("unschedulable")  # held, not drained
        assert node["metadata"]["annotations"].get(nv.PENDING)  # published, signed, for the keeper
        assert condition(node)["reason"] == "DriverDrift"
    keeper = site.config("keeper", share=0.34)
    figures = site.keeper(keeper)
    assert figures["_exit"] == 0 and figures["fleet_reads"] >= 1, figures
    tainted = [n for n in NODES if nv.our_taints(site.admin.get(node_path(n)))]
    assert tainted == figures["drained"] and len(tainted) == 1, figures  # 34% of a pool of three
    assert json.loads(site.admin.get(node_path(tainted[0]))["metadata"]["annotations"][nv.OWNED])[
        "reason"].startswith("gpugate: drift driver=550.54.15")
    # A second keeper elsewhere finds the Lease held and drains nothing.
    lease = site.admin.get("/apis/coordination.k8s.io/v1/namespaces/gpugate/leases/gpugate-budget-keeper")
    assert lease["spec"]["holderIdentity"] == socket.gethostname()
    site.admin.replace("/apis/coordination.k8s.io/v1/namespaces/gpugate/leases/gpugate-budget-keeper",
                       dict(lease, spec=dict(lease["spec"], holderIdentity="keeper-on-another-host",
                                             renewTime=time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime()))))
    figures = site.keeper(keeper)
    assert figures.get("standby", "").startswith("another keeper leads: keeper-on-another-host"), figures
    assert figures["drained"] == []


def test_the_keeper_s_memory_rides_on_its_lease_so_a_failover_keeps_it(site):
    """The keeper drains one node of three; an admin lifts that hold by
    hand; the replica that takes over (a fresh pod: no files of the first)
    still knows the span was returned and does not drain it again until
    the node signs its finding anew (gpugate.budget.memory)."""
    lease_path = "/apis/coordination.k8s.io/v1/namespaces/gpugate/leases/gpugate-budget-keeper"
    try:
        site.admin.request("DELETE", lease_path)  # another test's keeper may hold it
    except KubeError:
        pass
    site.sim("gpu[01-03]", "driver=550.54.15")
    agent = site.config("agent", share=0.34)
    for name in NODES:
        site.healthcheck(agent, name)
    keeper = site.config("keeper", share=0.34)
    first = site.keeper(keeper)
    assert first["_exit"] == 0 and len(first["drained"]) == 1, first
    returned = first["drained"][0]
    lease = site.admin.get(lease_path)
    stored = json.loads(lease["metadata"]["annotations"]["gpugate.io/keeper-memory"])["nodes"]
    assert list(stored) == [returned] and stored[returned]["returned"] is None
    # The admin lifts gpugate's hold by hand (taint and record gone).
    node = site.admin.get(node_path(returned))
    site.admin.patch(node_path(returned), {"metadata": {"annotations": {nv.OWNED: None}},
                                           "spec": {"taints": [t for t in node["spec"].get("taints") or []
                                                               if t.get("key") != nv.TAINT_KEY],
                                                    "unschedulable": False}})
    # A failover: the next keeper has none of the first one's files.
    controller = os.path.join(site.dir, "controller")
    for name in os.listdir(controller):
        if name.startswith("budget-keeper"):
            os.unlink(os.path.join(controller, name))
    second = site.keeper(keeper)
    assert second["_exit"] == 0 and returned not in second["drained"], second
    assert len(second["drained"]) == 1  # the budget goes to another published node instead
    assert nv.our_taints(site.admin.get(node_path(returned))) == []


def test_an_admins_cordon_then_a_fit_node_the_condition_follows_the_verdict(site):
    """Held by someone else, gpugate writes only its condition; once the
    node is fit again the condition says so, though gpugate held nothing."""
    site.admin.patch(node_path("gpu01"), {"spec": {"unschedulable": True}})
    agent = site.config("agent")
    site.sim("gpu01", "gpu.4.ecc.uncorrected.volatile=3")
    site.healthcheck(agent, "gpu01")
    assert condition(site.admin.get(node_path("gpu01")))["status"] == "False"
    site.sim("gpu01", "gpu.4.ecc.uncorrected.volatile=0")  # the admin replaced the GPU
    site.healthcheck(agent, "gpu01")
    n1 = site.admin.get(node_path("gpu01"))
    assert (condition(n1)["status"], condition(n1)["reason"]) == ("True", "Fit")
    assert n1["spec"]["unschedulable"] is True and nv.our_taints(n1) == []  # the admin's cordon, theirs


def test_no_execute_only_for_an_acute_finding_where_the_site_asks(site):
    agent = site.config("agent", extra="no_execute = true")
    site.sim("gpu01", "gpu.3.ecc.uncorrected.volatile=2")
    site.sim("gpu02", "kernel=6.8.0-1")  # drift: budgeted; the budget is off here, so the node drains itself
    for name in ("gpu01", "gpu02"):
        site.healthcheck(agent, name)
    effects = {n: sorted(t["effect"] for t in nv.our_taints(site.admin.get(node_path(n)))) for n in ("gpu01", "gpu02")}
    assert effects == {"gpu01": ["NoExecute", "NoSchedule"], "gpu02": ["NoSchedule"]}, effects


def test_a_keeper_that_cannot_hold_its_lease_fails_its_run_and_drains_nothing(site):
    """Wrong namespace (its RBAC is gpugate's): not a quiet standby, a
    failed run, so the keeper-stale alert fires."""
    site.sim("gpu[01-03]", "driver=550.54.15")
    agent = site.config("agent", share=0.34)
    for name in NODES:
        site.healthcheck(agent, name)
    keeper = site.config("keeper", share=0.34, extra='namespace = "kube-system"')
    figures = site.keeper(keeper)
    assert figures["_exit"] != 0 and figures["ok"] is False and "Lease" in figures["error"], figures
    assert "403" in figures["error"] and figures["drained"] == []
    assert not any(nv.our_taints(site.admin.get(node_path(n))) for n in NODES)


def test_a_condition_that_cannot_be_written_leaves_the_drain_standing_and_says_why(site):
    """The condition is best effort after the write it describes: an agent
    whose token may patch Nodes but not their status (the keeper's here)
    still taints the node, and its log line names the refusal."""
    site.sim("gpu02", "gpu.5.ecc.uncorrected.volatile=1")
    result = site.healthcheck(site.config("keeper"), "gpu02")
    assert result.returncode == 1, result.stderr
    n2 = site.admin.get(node_path("gpu02"))
    assert [t["value"] for t in nv.our_taints(n2)] == ["health"] and condition(n2) is None
    with open(os.path.join(site.dir, "state", "gpu02", "gpugate.log")) as handle:
        record = json.loads(handle.read().strip().splitlines()[-1])
    assert record["action"] == "drain" and "403" in record["condition_error"], record


def test_the_gpu_operator_s_labels_are_held_to_the_same_pin(site):
    """GPU Feature Discovery's labels on the Node (as GFD writes them) say
    another driver than the pin: drift, with the label's value in the
    reason; a Node whose labels agree is fit."""
    gfd = {"nvidia.com/cuda.driver-version.full": "580.65.06", "nvidia.com/cuda.runtime-version.full": "13.0",
           "nvidia.com/mig.strategy": "single"}
    site.admin.patch(node_path("gpu01"), {"metadata": {"labels": dict(
        gfd, **{"nvidia.com/cuda.driver-version.full": "570.172.08"})}})
    site.admin.patch(node_path("gpu02"), {"metadata": {"labels": gfd}})
    agent = site.config("agent")
    for name in ("gpu01", "gpu02"):
        site.healthcheck(agent, name)
    n1 = site.admin.get(node_path("gpu01"))
    reason = json.loads(n1["metadata"]["annotations"][nv.OWNED])["reason"]
    assert reason == "gpugate: drift operator_driver=570.172.08 (want 580.65.06)", reason
    assert (condition(n1)["status"], condition(n1)["reason"]) == ("False", "OperatorDriverDrift")
    n2 = site.admin.get(node_path("gpu02"))
    assert (condition(n2)["status"], condition(n2)["reason"]) == ("True", "Fit") and nv.our_taints(n2) == []


def test_the_gpu_operator_s_pods_on_the_node_run_the_pinned_images(api, tmp_path):
    """The baseline pins the device plugin and DCGM exporter; the operator's
    pods bound to gpu01 run an older device plugin (a rolling update that did
    not reach it): drift, naming the image.  gpu02's pods agree: fit.  The
    agent reads them with operator-rbac.yaml's Role in gpu-operator only."""
    from gpugate.testbed.kube import KubeFleet

    baseline = tmp_path / "baseline.toml"
    baseline.write_text(open(DEMO_BASELINE).read()
                        + '\n[operator]\ndevice_plugin = "v0.17.1"\ndcgm_exporter = "4.2.3-4.1.3"\n')
    site = KubeFleet(api, str(tmp_path), NODES, str(baseline))
    images = {"gpu01": "nvcr.io/nvidia/k8s-device-plugin:v0.16.2", "gpu02": "nvcr.io/nvidia/k8s-device-plugin:v0.17.1"}
    made = []
    for name, plugin in sorted(images.items()):
        for pod, image in (("nvidia-device-plugin-daemonset-" + name, plugin),
                           ("nvidia-dcgm-exporter-" + name, "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04")):
            site.admin.create("/api/v1/namespaces/gpu-operator/pods", {
                "metadata": {"name": pod, "namespace": "gpu-operator"},
                "spec": {"nodeName": name, "containers": [{"name": "main", "image": image}]}})
            made.append(pod)
    try:
        agent = site.config("agent")
        for name in ("gpu01", "gpu02"):
            site.healthcheck(agent, name)
        n1 = site.admin.get(node_path("gpu01"))
        assert (condition(n1)["status"], condition(n1)["message"]) == (
            "False", "gpugate: drift operator_device_plugin=v0.16.2 (want v0.17.1)"), condition(n1)
        n2 = site.admin.get(node_path("gpu02"))
        assert (condition(n2)["status"], condition(n2)["reason"]) == ("True", "Fit"), condition(n2)
        # The agent's token lists pods in the operator's namespace only.
        with pytest.raises(KubeError) as refused:
            site.api.client("agent").get("/api/v1/namespaces/default/pods")
        assert refused.value.status == 403
    finally:
        for pod in made:
            site.admin.request("DELETE", "/api/v1/namespaces/gpu-operator/pods/" + pod,
                               {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})


def test_the_admission_policy_keeps_the_node_agent_to_gpugate_s_own_fields(site):
    """deploy/kubernetes/agent-policy.yaml, on the real API server: the
    agent's token may set gpugate's taint, annotations and condition (the
    other tests here run under it), and nothing else of a Node."""
    from gpugate.kube.client import KubeClient
    from gpugate.testbed.kube_tokens import node_token

    agent = KubeClient(site.api.server, node_token(site.admin, "gpu01"), site.api.ca_file)  # naming its Node
    node = site.admin.get(node_path("gpu01"))
    version = node["metadata"]["resourceVersion"]
    refused = [({"spec": {"taints": []}}, "gpugate.io/unfit taints"),  # the site's dedicated taint removed
               ({"metadata": {"labels": {"nvidia.com/gpu.product": "other"}}}, "labels"),
               ({"metadata": {"annotations": {"example.com/owner": "me"}}}, "changes only the annotations")]
    for patch, said in refused:
        with pytest.raises(KubeError) as info:
            agent.patch(node_path("gpu01"), patch)
        assert info.value.status in (403, 422) and said in str(info.value), info.value
    with pytest.raises(KubeError) as info:
        agent.patch(node_path("gpu01", "status"), {"status": {"conditions": [
            {"type": "Ready", "status": "False", "reason": "x", "message": "x"}]}}, "strategic")
    assert "GpugateHealthy" in str(info.value), info.value
    assert site.admin.get(node_path("gpu01"))["metadata"]["resourceVersion"] == version  # nothing written
    # Its own fields it may write (the other tests drain and clear through the same policy).
    agent.patch(node_path("gpu01"), {"metadata": {"annotations": {"gpugate.io/pending": "x"}}})
    assert site.admin.get(node_path("gpu01"))["metadata"]["annotations"]["gpugate.io/pending"] == "x"


def _bound_agent_token(site, node: str):
    """The node agent's token as its DaemonSet pod on `node` gets it: a
    TokenRequest bound to a Pod there, which the API server stamps with
    the pod's node (authentication.kubernetes.io/node-name).  No kubelet:
    the Pod is only an object, bound to the node by spec.nodeName.
    Returns (the token, the Pod's path)."""
    pod = site.admin.create("/api/v1/namespaces/gpugate/pods", {
        "metadata": {"generateName": "gpugate-node-agent-"},
        "spec": {"nodeName": node, "serviceAccountName": "gpugate-node-agent",
                 "containers": [{"name": "agent", "image": "registry.example/gpugate:1"}]}})
    answer = site.admin.create(
        "/api/v1/namespaces/gpugate/serviceaccounts/gpugate-node-agent/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
         "spec": {"expirationSeconds": 600,
                  "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"],
                                     "uid": pod["metadata"]["uid"]}}})
    return answer["status"]["token"], "/api/v1/namespaces/gpugate/pods/" + pod["metadata"]["name"]


def test_a_node_agent_in_its_pod_writes_only_its_own_node(site):
    """The policy's node rule, with the token a DaemonSet pod really gets
    (bound to its Pod, naming its node): its own Node it may hold and
    clear, another Node not at all, though RBAC alone would let it."""
    from gpugate.kube.client import KubeClient

    token, pod = _bound_agent_token(site, "gpu01")
    try:
        _own_node_only(site, KubeClient(site.api.server, token, site.api.ca_file))
    finally:  # no kubelet ends it: a later test's eviction would wait on it
        site.admin.request("DELETE", pod, {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})


def _own_node_only(site, agent):
    review = agent.create("/apis/authentication.k8s.io/v1/selfsubjectreviews",
                          {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    who = review["status"]["userInfo"]
    assert who["username"] == "system:serviceaccount:gpugate:gpugate-node-agent"
    assert who["extra"]["authentication.kubernetes.io/node-name"] == ["gpu01"], who
    agent.patch(node_path("gpu01"), {"metadata": {"annotations": {"gpugate.io/pending": "own"}}})
    assert site.admin.get(node_path("gpu01"))["metadata"]["annotations"]["gpugate.io/pending"] == "own"
    before = site.admin.get(node_path("gpu02"))["metadata"]["resourceVersion"]
    for path, patch in [(node_path("gpu02"), {"metadata": {"annotations": {"gpugate.io/pending": "other"}}}),
                        (node_path("gpu02"), {"spec": {"taints": [
                            DEDICATED, {"key": "gpugate.io/unfit", "value": "xid", "effect": "NoSchedule"}]}})]:
        with pytest.raises(KubeError) as info:
            agent.patch(path, patch)
        assert info.value.status in (403, 422), info.value
        # Another Node's taints break two policies; the API server names whichever it evaluated first.
        assert "writes only the Node its pod runs on" in str(info.value) or (
            "taints" in patch.get("spec", {}) and "changes only its own gpugate.io/unfit taints" in str(info.value)), info.value
    with pytest.raises(KubeError) as info:
        agent.patch(node_path("gpu02", "status"), {"status": {"conditions": [
            {"type": "GpugateHealthy", "status": "False", "reason": "Xid", "message": "forged"}]}}, "strategic")
    assert "writes only the Node its pod runs on" in str(info.value), info.value
    assert site.admin.get(node_path("gpu02"))["metadata"]["resourceVersion"] == before  # nothing written
    # The same gpugate-healthcheck, with that token, on its own node: held, with its reason.
    token_file = os.path.join(site.dir, "bound-token-gpu01")
    with open(token_file, "w") as handle:
        handle.write(agent.token + "\n")
    site.sim("gpu01", "gpu.3.ecc.uncorrected.volatile=2")
    config = site.config("agent")
    with open(config) as handle:
        text = handle.read()
    assert site.api.token_file("agent") in text
    with open(config, "w") as handle:
        handle.write(text.replace(site.api.token_file("agent"), token_file))
    done = site.healthcheck(config, "gpu01")
    assert done.returncode in (0, 1), done.stderr
    held = site.admin.get(node_path("gpu01"))
    assert [t["value"] for t in nv.our_taints(held)] == ["health"], held["spec"]
    assert json.loads(held["metadata"]["annotations"][nv.OWNED])["reason"].startswith("gpugate: health ecc:gpu3=")


def test_gpugate_status_shows_the_kubernetes_fleet_as_it_shows_slurm_s(site):
    """`gpugate status` with scheduler = "kubernetes": one list of the Nodes
    (the keeper's RBAC), each held node under its class, the budget's
    published nodes, and the pools as partitions."""
    site.sim("gpu01", "gpu.3.ecc.uncorrected.volatile=2")  # acute: held at once
    site.sim("gpu02", "driver=550.54.15")  # drift: published within the budget
    agent = site.config("agent", share=0.34)
    for name in ("gpu01", "gpu02"):
        site.healthcheck(agent, name)
    out = subprocess.run([sys.executable, "-m", "gpugate", "status", "--json", "--config",
                          site.config("keeper", share=0.34)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["slurm_backend"]["name"] == "kubernetes"
    text = json.dumps(summary["gpugate"])
    assert "gpu01" in text and "ecc" in text, summary["gpugate"]
    assert "gpu02" in json.dumps(summary.get("held")), summary.get("held")
    assert "NVIDIA-H100-80GB-HBM3" in summary["partitions"], summary["partitions"]


def test_a_health_check_that_does_not_run_leaves_the_condition_unknown(site):
    """The agent's check ends outside its exit codes (killed, timed out):
    the condition says gpugate cannot tell, rather than the last verdict."""
    from gpugate.model.config import load_settings
    from gpugate.node.kube_agent import Agent

    agent = site.config("agent")
    site.healthcheck(agent, "gpu01")
    assert condition(site.admin.get(node_path("gpu01")))["status"] == "True"
    failing = [sys.executable, "-c", "import sys; sys.exit(9)"]
    own = getattr(site, "node_config", lambda config, name: config)(agent, "gpu01")  # a token naming gpu01
    Agent(load_settings(own), "gpu01", own, failing, interval=300, poll=1).health_check()
    cond = condition(site.admin.get(node_path("gpu01")))
    assert (cond["status"], cond["reason"]) == ("Unknown", "HealthCheckNotRun"), cond
    assert "did not run" in cond["message"] and cond["lastTransitionTime"] == cond["lastHeartbeatTime"]
