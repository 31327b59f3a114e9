"""A gang's preflight on Kubernetes, on the fuller control plane: the
release's kube-apiserver, kube-scheduler and kube-controller-manager, and
KWOK's kubelets (gpugate.testbed.kube, control_plane=True), set up by
gpugate.testbed.kube_preflight_rig (bench/bench_kube_preflight.py's too).  The chart's
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
import time

import pytest

from gpugate.kube.client import node_path

from gpugate.testbed.kube_preflight_rig import GangRig, policy_served, preflight_exit
from test_kube_control_plane import held, start_control_plane, wait_for

pytestmark = pytest.mark.kube

NODES = ["gpu01", "gpu02", "gpu03", "gpu04", "gpu05"]


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    base = tmp_path_factory.mktemp("gang")
    api = start_control_plane(str(base / "api"))
    rig = None
    try:
        if not policy_served(api.admin()):
            pytest.skip("this release serves no MutatingAdmissionPolicy (admissionregistration.k8s.io/v1)")
        rig = GangRig(api, str(base), NODES).start()
        yield rig
    finally:
        if rig is not None:
            rig.stop()
        api.stop()


def test_a_gang_with_one_slow_node_runs_on_four_good_nodes_and_the_culprit_is_held(rig):
    admin = rig.admin
    rig.fleet.sim("gpu03", "smoke=pair-slow")  # slow in every run across nodes it joins
    rig.cordon("gpu05", True)  # the gang lands on gpu01-04, gpu03 among them
    try:
        rig.gang("gang-slow", 4)
        wait_for("the gang's 4 Pods bound", lambda: len(
            [p for p in rig.pods("gang-slow") if p["spec"].get("nodeName")]) == 4, 60)
    finally:
        rig.cordon("gpu05", False)
    first = {p["spec"]["nodeName"]: p for p in rig.pods("gang-slow")}
    assert sorted(first) == ["gpu01", "gpu02", "gpu03", "gpu04"]
    culprit = wait_for("gpu03's Pod failed its preflight", lambda: [
        p for p in rig.pods("gang-slow") if p["spec"].get("nodeName") == "gpu03" and preflight_exit(p) == 1], 120)
    assert culprit[0]["status"]["phase"] == "Failed"
    wait_for("gpu03 held by the keeper", lambda: held(admin, "gpu03"), 60)
    reason = admin.get(node_path("gpu03"))["metadata"]["annotations"]
    assert "preflight_across=busbw=" in json.dumps(reason), reason

    # KWOK completes a Job's Pods once they run: the gang's work done is four Pods Succeeded.
    wait_for("the gang's Job complete", lambda: rig.complete("gang-slow"), 150)
    done = [p for p in rig.pods("gang-slow") if p["status"].get("phase") == "Succeeded"]
    assert len(done) == 4 and "gpu03" not in [p["spec"]["nodeName"] for p in done], [
        (p["spec"]["nodeName"], p["status"].get("phase")) for p in rig.pods("gang-slow")]
    assert all(preflight_exit(p) == 0 for p in done)
    assert [n for n in NODES if n != "gpu03" and held(admin, n)] == []
    records = rig.records("gpu03")
    assert any(r.get("verdict") == "failed" and "culprit" in r.get("why", "") for r in records), records
    # The Pod made anew for gpu03's ran after its gang had started: its own node's proof only.
    first_uids = {p["metadata"]["uid"] for p in first.values()}
    (late,) = [p for p in done if p["metadata"]["uid"] not in first_uids]
    said = [r for r in rig.records(late["spec"]["nodeName"]) if r.get("uid") == late["metadata"]["uid"]]
    assert said and said[-1]["verdict"] == "passed" and "across" not in said[-1]["preflight"], said
    assert said[-1]["preflight"].get("gang_why", "").startswith("the gang has started"), said
    rig.fleet.sim("gpu03", "smoke=healthy")


def test_a_gang_whose_gpus_come_through_dra_claims_is_proved_the_same(rig):
    """Each Pod claims every GPU of its node through a ResourceClaimTemplate
    (allocationMode All); the real scheduler allocates them from the nodes'
    ResourceSlices, and the agent reads the allocation: the whole node."""
    admin = rig.admin
    rig.publish_gpus()
    rig.dra_gang("gang-dra", 2)
    wait_for("the DRA gang's Job complete", lambda: rig.complete("gang-dra"), 120)
    pods = [p for p in rig.pods("gang-dra") if p["status"].get("phase") == "Succeeded"]
    assert len(pods) == 2 and all(preflight_exit(p) == 0 for p in pods), [p["status"] for p in rig.pods("gang-dra")]
    for p in pods:
        assert p["spec"]["initContainers"][0]["name"] == "gpugate-preflight"
        said = [r for r in rig.records(p["spec"]["nodeName"]) if r.get("uid") == p["metadata"]["uid"]]
        assert said and said[-1]["verdict"] == "passed", said
        assert said[-1]["preflight"]["across"]["ran"] and said[-1]["preflight"]["across"]["why"].startswith(
            "passed: 2 nodes"), said
    assert [n for n in NODES if n != "gpu03" and held(admin, n)] == []


def test_ten_healthy_gangs_pass_and_nothing_is_held(rig):
    admin = rig.admin
    good = [n for n in NODES if not held(admin, n)]
    size = min(4, len(good))
    started = time.monotonic()
    for i in range(10):
        name = "gang-ok-%d" % i
        rig.gang(name, size)
        wait_for("%s complete" % name, lambda: rig.complete(name), 120)
        pods = rig.pods(name)
        assert len(pods) == size and all(preflight_exit(p) == 0 for p in pods), [p["status"] for p in pods]
    assert [n for n in good if held(admin, n)] == []
    passed = [r for n in good for r in rig.records(n) if r.get("verdict") == "passed"
              and r.get("preflight", {}).get("across", {}).get("ran")]
    assert len(passed) >= 10 * size
    print("10 healthy gangs of %d in %.1fs" % (size, time.monotonic() - started))
