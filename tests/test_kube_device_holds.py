"""One GPU held instead of its Node ([kubernetes] device_holds), against a
real control plane (gpugate.testbed.kube, control_plane=True: the release's
kube-apiserver, kube-scheduler and kube-controller-manager, KWOK's
kubelets).  A KWOK node publishes its 8 GPUs in a ResourceSlice in the
shape NVIDIA's DRA driver writes (tests/fixtures/dra-resourceslice-nvidia-h100x8.json,
the devices named by /dev/nvidia minor, not in NVML's order); the node
agent (gpugate-healthcheck as installed) judges a GPU's row-remap failure.

On a release that serves DeviceTaintRule (1.37): that GPU alone is held
(one rule, gpugate's, NoSchedule), the Node is neither tainted nor
cordoned, and the real scheduler gives 7 Pods claiming one GPU each the
node's 7 other GPUs, and the eighth none.  A GPU's ECC finding is held the
same way and the sweep's proof lifts it (its rule deleted with the Node's
record).  On a release that does not (1.34), the same finding holds the
Node, and its GpugateHealthy condition says why."""

import copy
import json
import os

import pytest

from gpugate.kube import dra
from gpugate.testbed.kube_dra import MINOR  # the driver's minor of NVML's gpu index i
from gpugate.kube import nodeview as nv
from gpugate.kube.client import KubeError, node_path
from test_kube_agent import DEMO_BASELINE, MANIFESTS
from test_kube_control_plane import GPU, PODS, pod, start_control_plane, sweep, unschedulable, wait_for

pytestmark = pytest.mark.kube

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
CLASS = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
         "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}}


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    api = start_control_plane(str(tmp_path_factory.mktemp("dra") / "api"))
    try:
        api.apply(MANIFESTS)
        api.admin().create("/apis/resource.k8s.io/v1/deviceclasses", CLASS)
        yield api
    finally:
        api.stop()


def serves_device_taints(api) -> bool:
    return dra.served(api.admin()) == ""


def fleet_with_slice(api, tmp_path, node, baseline=DEMO_BASELINE):
    """A KWOK node of the demo fleet and its ResourceSlice as NVIDIA's DRA
    driver publishes it (gpugate.testbed.kube_dra.publish_slice)."""
    from gpugate.testbed.kube import KubeFleet
    from gpugate.testbed.kube_dra import publish_slice

    fleet = KubeFleet(api, str(tmp_path), [node], baseline, labels=GPU, kwok=True)
    publish_slice(api.admin(), fleet.fleet, node)
    return fleet


def rules(admin, node):
    try:
        return [r for r in admin.list_pages(dra.RULES) if r["spec"]["deviceSelector"].get("pool") == node]
    except KubeError as exc:
        if exc.status == 404:
            return []
        raise


def condition(admin, node):
    for cond in admin.get(node_path(node))["status"].get("conditions") or []:
        if cond["type"] == "GpugateHealthy":
            return cond
    return {}


def check(fleet, node, *assignments, extra=""):
    if assignments:
        fleet.sim(node, *assignments)
    out = fleet.healthcheck(fleet.config("agent", extra="device_holds = true\n" + extra), node)
    assert out.returncode in (0, 1), (out.returncode, out.stdout[-1500:], out.stderr[-1500:])
    return out


def last_log(fleet, node):
    """The health check's last log line (log = "file": state_dir/gpugate.log)."""
    with open(os.path.join(fleet.dir, "state", node, "gpugate.log")) as handle:
        return json.loads(handle.read().splitlines()[-1])


def claim_pod(admin, name, node):
    """A Pod claiming one GPU (a ResourceClaim of its own), only on ``node``."""
    admin.create(CLAIMS, {"metadata": {"name": name}, "spec": {"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}]}}})
    admin.create(PODS, {"metadata": {"name": name}, "spec": {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
        "containers": [{"name": "main", "image": "registry.example.com/train:1",
                        "resources": {"claims": [{"name": "gpu"}]}}]}})


def allocated(admin, name):
    """The devices the scheduler allocated to a claim ([] while none)."""
    status = admin.get(CLAIMS + "/" + name).get("status") or {}
    return [r["device"] for r in ((status.get("allocation") or {}).get("devices") or {}).get("results") or []]


def judged_with_device_taints(plane, tmp_path, node, assignment):
    """The node with its ResourceSlice, its GPU's finding judged by the agent
    (a release that serves no DeviceTaintRule: skipped, the last test's)."""
    if not serves_device_taints(plane):
        pytest.skip("kube-apiserver %s serves no DeviceTaintRule: the Node is held (the last test)" % plane.version)
    fleet = fleet_with_slice(plane, tmp_path, node)
    check(fleet, node, assignment)
    return fleet, plane.admin()


def test_a_remap_failure_holds_its_gpu_alone_and_the_scheduler_uses_the_other_seven(plane, tmp_path):
    node = "gpu71"
    fleet, admin = judged_with_device_taints(plane, tmp_path, node, "gpu.3.remapped_rows.failure=1")
    held = rules(admin, node)
    device = "gpu-%d" % MINOR[3]
    assert [(r["metadata"]["name"], r["spec"]["deviceSelector"]["device"], r["spec"]["taint"]["effect"])
            for r in held] == [(dra.rule_name(node, "gpu.nvidia.com", device), device, "NoSchedule")]
    assert dra.ours(held[0], node)
    got = admin.get(node_path(node))
    assert nv.our_taints(got) == [] and not got["spec"].get("unschedulable")  # the Node itself serves on
    assert nv.devices_held(got) == [held[0]["metadata"]["name"]]
    assert "row_remap:gpu3=failure" in nv.owned(got)["reason"]
    cond = condition(admin, node)
    assert cond["status"] == "False" and "held: gpu3 %s/%s NoSchedule, not the Node" % (node, device) in cond["message"]
    assert last_log(fleet, node)["scope"] == "held: gpu3 %s/%s NoSchedule, not the Node" % (node, device)

    names = ["claim%d" % i for i in range(8)]
    for name in names:
        claim_pod(admin, name, node)
    wait_for("7 Pods running on the GPUs not held",
             lambda: sum(1 for n in names if admin.get(PODS + "/" + n)["status"].get("phase") == "Running") == 7,
             timeout=60)
    given = [d for n in names for d in allocated(admin, n)]
    assert sorted(given) == sorted("gpu-%d" % m for m in MINOR if m != MINOR[3])
    waiting = [n for n in names if not allocated(admin, n)]
    assert len(waiting) == 1
    assert wait_for("the scheduler's word on the eighth Pod", lambda: unschedulable(admin, waiting[0]))
    # A second run with the same finding writes nothing: the rule as it was (its resourceVersion, the
    # server's timeAdded), the same record.
    before, before_rules = nv.owned(admin.get(node_path(node))), rules(admin, node)
    assert before_rules[0]["spec"]["taint"].get("timeAdded")  # the server's own field
    check(fleet, node)
    assert rules(admin, node) == before_rules and nv.owned(admin.get(node_path(node))) == before
    for name in names:
        admin.request("DELETE", PODS + "/" + name, query={"gracePeriodSeconds": "0"})
        admin.request("DELETE", CLAIMS + "/" + name)


def test_the_sweeps_proof_lifts_a_gpus_hold(plane, tmp_path):
    node = "gpu72"
    fleet, admin = judged_with_device_taints(plane, tmp_path, node, "gpu.5.ecc.uncorrected.volatile=2")
    assert [r["spec"]["deviceSelector"]["device"] for r in rules(admin, node)] == ["gpu-%d" % MINOR[5]]
    # Someone else's rule for the node's pool: never touched by gpugate.
    foreign = dra.rule(node, 1, ("gpu.nvidia.com", node, "gpu-%d" % MINOR[1]), "None", "health", "theirs")
    foreign["metadata"] = {"name": "site-rule-%s" % node}
    admin.create(dra.RULES, foreign)
    outcome = sweep(fleet, node)
    assert outcome.get("result") == "resumed", outcome
    assert [r["metadata"]["name"] for r in rules(admin, node)] == ["site-rule-%s" % node]
    got = admin.get(node_path(node))
    assert nv.owned(got) == {} and nv.state_of(got).reason == ""


def test_the_sweeps_escalation_of_a_remap_failure_keeps_the_gpu_held_alone(plane, tmp_path):
    """A row-remap failure is an RMA: the sweep escalates it at once, and the
    GPU stays held alone under the rma reason; the Node keeps serving."""
    node = "gpu76"
    fleet, admin = judged_with_device_taints(plane, tmp_path, node, "gpu.6.remapped_rows.failure=1")
    before = rules(admin, node)
    outcome = sweep(fleet, node)
    assert outcome.get("result") == "escalated", outcome
    got = admin.get(node_path(node))
    assert rules(admin, node) == before and nv.devices_held(got) == [before[0]["metadata"]["name"]]
    assert nv.owned(got)["reason"].startswith("gpugate: rma row_remap:gpu6=failure")
    assert nv.our_taints(got) == [] and not got["spec"].get("unschedulable")


def test_no_execute_empties_the_gpu_not_the_node(plane, tmp_path):
    """no_execute = true: the acute finding's rule is NoExecute, and the
    device taint eviction controller evicts the Pod using that GPU; the Pod
    on another GPU of the node runs on."""
    if not serves_device_taints(plane):
        pytest.skip("kube-apiserver %s serves no DeviceTaintRule" % plane.version)
    node, admin = "gpu77", plane.admin()
    fleet = fleet_with_slice(plane, tmp_path, node)
    for name in ("on-bad", "on-good"):
        claim_pod(admin, name, node)
    wait_for("both Pods running", lambda: all(admin.get(PODS + "/" + n)["status"].get("phase") == "Running"
                                              for n in ("on-bad", "on-good")), timeout=60)
    bad = MINOR.index(int(allocated(admin, "on-bad")[0].split("-")[1]))
    check(fleet, node, "gpu.%d.remapped_rows.failure=1" % bad, extra="no_execute = true")
    assert [r["spec"]["taint"]["effect"] for r in rules(admin, node)] == ["NoExecute"]
    wait_for("the Pod on the held GPU evicted", lambda: pod(admin, "on-bad") is None, timeout=60)
    assert admin.get(PODS + "/on-good")["status"].get("phase") == "Running"
    got = admin.get(node_path(node))
    assert nv.our_taints(got) == [] and not got["spec"].get("unschedulable")


def test_the_same_finding_holds_the_node_where_no_device_taints_are_served(plane, tmp_path):
    if serves_device_taints(plane):
        pytest.skip("kube-apiserver %s serves DeviceTaintRule: the tests above" % plane.version)
    node, admin = "gpu73", plane.admin()
    fleet = fleet_with_slice(plane, tmp_path, node)
    check(fleet, node, "gpu.3.remapped_rows.failure=1")
    got = admin.get(node_path(node))
    assert [t["effect"] for t in nv.our_taints(got)] == ["NoSchedule"] and got["spec"].get("unschedulable")
    assert nv.devices_held(got) == []
    cond = condition(admin, node)
    assert cond["status"] == "False" and "the Node is held: " + dra.NOT_SERVED in cond["message"]
    assert last_log(fleet, node)["scope"] == ("the Node is held: " + dra.NOT_SERVED)[:300]


def refusal(client, method, path, body=None, timeout=30.0):
    """The admission policy's words refusing a dry-run write (a new policy
    is enforced a moment after it is created: asked again until then)."""
    import time

    deadline, last = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        try:
            client.request(method, path, body, query={"dryRun": "All"})
            last = "let through"
        except KubeError as exc:
            if exc.status in (403, 422) and "ValidatingAdmissionPolicy" in str(exc):
                return str(exc)
            last = str(exc)[:300]
        time.sleep(0.3)
    raise AssertionError("not refused by a policy in %.0fs: %s" % (timeout, last))


def test_the_agent_and_the_sweep_write_only_gpugates_own_rules(plane):
    """RBAC lets the node agent write any DeviceTaintRule and the sweep delete
    any: the policy (agent-policy.yaml) holds the agent to its own Node's
    devices and both to gpugate's own rules; gpugate's own write passes."""
    if not serves_device_taints(plane):
        pytest.skip("kube-apiserver %s serves no DeviceTaintRule" % plane.version)
    from gpugate.testbed.kube import add_node
    from gpugate.testbed.kube_tokens import node_token

    admin = plane.admin()
    add_node(admin, "gpu74")
    agent = plane.client("agent")
    agent.token = node_token(admin, "gpu74")
    mine = dra.rule("gpu74", 2, ("gpu.nvidia.com", "gpu74", "gpu-2"), "NoSchedule", "health", "r")
    other_node = dra.rule("gpu75", 2, ("gpu.nvidia.com", "gpu75", "gpu-2"), "NoSchedule", "health", "r")
    other_pool = copy.deepcopy(mine)
    other_pool["spec"]["deviceSelector"]["pool"] = "gpu75"
    unlabelled = copy.deepcopy(mine)
    del unlabelled["metadata"]["labels"]["app.kubernetes.io/managed-by"]
    other_key = copy.deepcopy(mine)
    other_key["spec"]["taint"]["key"] = "example.com/broken"
    assert "only the devices of the Node its pod runs on" in refusal(agent, "POST", dra.RULES, other_node)
    assert "only the devices of the Node its pod runs on" in refusal(agent, "POST", dra.RULES, other_pool)
    assert "only its own DeviceTaintRules" in refusal(agent, "POST", dra.RULES, unlabelled)
    assert "its own key only" in refusal(agent, "POST", dra.RULES, other_key)
    # A token that names no Node writes no rule at all.
    assert "only the devices of the Node" in refusal(plane.client("agent"), "POST", dra.RULES, mine)
    agent.request("POST", dra.RULES, mine, query={"dryRun": "All"})  # gpugate's own write passes
    site = dict(other_key, metadata={"name": "site-gpu74-gpu-2"})
    admin.create(dra.RULES, site)
    for client in (agent, plane.client("sweep")):
        assert "only its own DeviceTaintRules" in refusal(client, "DELETE", dra.RULES + "/site-gpu74-gpu-2")
    admin.request("DELETE", dra.RULES + "/site-gpu74-gpu-2")
