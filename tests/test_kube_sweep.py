"""`gpugate sweep` on Kubernetes (issue 37), against a real kube-apiserver
and etcd: the sweep runs with its own ServiceAccount's token (the RBAC of
deploy/kubernetes/rbac.yaml is all it has), evicts through the Eviction API
(PodDisruptionBudgets as the API server enforces them), reboots through the
site's command, proves the reboot by the Node's bootID, verifies through
the transport and runs the smoke all_reduce as a Pod bound to the node.
gpugate.testbed.kubelet does what the absent kubelets would: ends deleted
pods, runs the smoke Pod's command on the simulated node, reports a reboot."""

import json
import os
import subprocess
import sys
import time

import pytest

from gpugate.kube import nodeview as nv
from gpugate.kube.client import KubeError, node_path
from test_kube_agent import DEDICATED, DEMO_BASELINE, NODES, api  # noqa: F401 (the module's API server)

pytestmark = pytest.mark.kube


@pytest.fixture
def site(api, tmp_path):  # noqa: F811
    from gpugate.testbed.kube import KubeFleet
    from gpugate.testbed.kubelet import Kubelets

    fleet = KubeFleet(api, str(tmp_path), NODES, DEMO_BASELINE,
                      labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, taints=[DEDICATED])
    kubelets = Kubelets(api, NODES)
    kubelets.start()
    fleet.kubelets = kubelets
    try:
        yield fleet
    finally:
        kubelets.stop()
        for ns in ("default", "gpugate-smoke"):
            for pod in fleet.admin.list_pages("/api/v1/namespaces/%s/pods" % ns):
                fleet.admin.request("DELETE", "/api/v1/namespaces/%s/pods/%s" % (ns, pod["metadata"]["name"]),
                                    {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})
        for pdb in fleet.admin.list_pages("/apis/policy/v1/namespaces/default/poddisruptionbudgets"):
            fleet.admin.request("DELETE", "/apis/policy/v1/namespaces/default/poddisruptionbudgets/"
                                + pdb["metadata"]["name"])


def workload(admin, name, node, labels=None, daemonset=False):
    """A running pod bound to ``node`` (as the scheduler and kubelet would leave it)."""
    meta = {"name": name, "namespace": "default", "labels": dict(labels or {"app": name})}
    if daemonset:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "dcgm-exporter",
                                    "uid": "00000000-0000-0000-0000-000000000001", "controller": True}]
    admin.create("/api/v1/namespaces/default/pods", {"metadata": meta, "spec": {
        "nodeName": node, "containers": [{"name": "main", "image": "registry.example.com/train:1"}]}})
    admin.patch("/api/v1/namespaces/default/pods/%s/status" % name, {"status": {
        "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}, "strategic")


def pdb(admin, name, app, allowed, namespace="default", owner=None):
    """A PodDisruptionBudget (made by ``owner``: a user's client, else the
    admin) and the status the disruption controller would write."""
    path = "/apis/policy/v1/namespaces/%s/poddisruptionbudgets" % namespace
    try:
        (owner or admin).create(path, {"metadata": {"name": name}, "spec": {"minAvailable": 1,
                                                                   "selector": {"matchLabels": {"app": app}}}})
    except KubeError as exc:
        if exc.status != 409:
            raise
    current = admin.get(path + "/" + name)
    admin.patch(path + "/%s/status" % name, {"status": {
        "observedGeneration": current["metadata"].get("generation", 1), "disruptionsAllowed": allowed,
        "currentHealthy": 1, "desiredHealthy": 1, "expectedPods": 1}}, "merge")


def pods(admin, node):
    return sorted(p["metadata"]["name"] for p in admin.list_pages("/api/v1/pods", fieldSelector="spec.nodeName=" + node))


def sweep(site, *args, smoke=True, drain_timeout=20):
    lines, kube = site.sweep_settings(drain_timeout=drain_timeout, smoke=smoke)
    config = site.config("sweep", sweep=lines, extra=kube)
    out, report = site.sweep(config, *args)
    assert report is not None, "gpugate sweep printed no report (exit %d): %s" % (out.returncode, out.stderr[-2000:])
    return out, report, config


def journal(site, node):
    """(step, status, detail) of each of the node's journal events."""
    import os

    from gpugate.sweep.journal import Journal

    kept = Journal(os.path.join(site.dir, "controller", "sweep.db"))
    try:
        return [(step, status, detail) for _, _, step, status, _, _, detail in kept.events(node)]
    finally:
        kept.close()


def held(admin, node):
    return nv.our_taints(admin.get(node_path(node)))


def test_a_drifted_node_is_evicted_repaired_rebooted_proven_and_returned(site):
    admin = site.admin
    agent = site.config("agent")
    taints = admin.get(node_path("gpu01"))["spec"]["taints"]  # the site's (and the API server's not-ready)
    site.sim("gpu01", "driver=550.54.15")  # drift; the budget is off here, so the node holds itself
    for name in NODES:
        site.healthcheck(agent, name)
    assert [t["value"] for t in held(admin, "gpu01")] == ["drift"]
    workload(admin, "train-0", "gpu01")
    workload(admin, "exporter-0", "gpu01", daemonset=True)
    before = admin.get(node_path("gpu01"))["status"]["nodeInfo"]["bootID"]

    out, report, config = sweep(site)
    assert out.returncode == 0, out.stderr[-2000:]
    assert report["outcomes"].get("gpu01", {}).get("result") == "resumed", (report, out.stdout[-3000:])
    node = admin.get(node_path("gpu01"))
    # Returned: gpugate's taint, cordon and record gone; the site's own taint kept.
    assert held(admin, "gpu01") == [] and not node["spec"].get("unschedulable"), node["spec"]
    assert node["spec"]["taints"] == taints and DEDICATED in taints
    assert nv.OWNED not in (node["metadata"].get("annotations") or {})
    # The workload left through the Eviction API; the DaemonSet's pod stayed; no smoke Pod is left.
    assert pods(admin, "gpu01") == ["exporter-0"]
    assert list(admin.list_pages("/api/v1/namespaces/gpugate-smoke/pods")) == []
    # Rebooted (a new bootID) and proven by a smoke Pod that ran on gpu01 and passed.
    assert node["status"]["nodeInfo"]["bootID"] != before
    assert [(n, code) for _, n, code in site.kubelets.ran] == [("gpu01", 0)]
    events = journal(site, "gpu01")
    assert [d for step, _, d in events if step == "wait_up"][-1] == "boot_id %s -> %s" % (
        before, node["status"]["nodeInfo"]["bootID"]), events
    assert any(step == "smoke single" and d.startswith("pod gpugate-smoke-gpu01-") and "passed" in d
               for step, _, d in events), events
    # The node agent says it is fit again.
    site.healthcheck(agent, "gpu01")
    cond = [c for c in admin.get(node_path("gpu01"))["status"]["conditions"] if c["type"] == nv.CONDITION][0]
    assert (cond["status"], cond["reason"]) == ("True", "Fit"), cond



def test_through_the_node_agent_no_ssh_the_verification_runs_on_the_node_and_answers_on_the_node(site):
    """[sweep] transport = "kubernetes": the sweep's verification goes to the
    node agent (`gpugate agent`, as the DaemonSet runs it) as a request on
    the Node and comes back as its answer there; the agent runs only the
    sweep's own commands, and only while gpugate holds its Node."""
    from gpugate.kube import channel

    admin = site.admin
    agent_config = site.config("agent")
    site.sim("gpu02", "driver=550.54.15")
    site.healthcheck(agent_config, "gpu02")
    assert [t["value"] for t in held(admin, "gpu02")] == ["drift"]
    agents = [subprocess.Popen([sys.executable, "-m", "gpugate", "agent", "--config",
                                site.node_config(agent_config, name), "--node", name,
                                "--interval", "3600", "--poll", "0.3"], env=dict(os.environ, GPUGATE_NODE_NAME=name),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
              for name in ("gpu02", "gpu03")]
    try:
        lines, kube = site.sweep_settings()
        config = site.config("sweep", sweep=lines.replace('transport = "local"', 'transport = "kubernetes"'),
                             extra=kube)
        out, report = site.sweep(config, "-w", "gpu02")
        assert out.returncode == 0 and report["outcomes"]["gpu02"]["result"] == "resumed", (
            report, out.stderr[-2000:])
        verified = [d for step, status, d in journal(site, "gpu02") if step.startswith("diag") and status == "done"]
        assert verified, journal(site, "gpu02")
        # Each answer read went from the Node with its request (issue 45, item 7): none is left.
        annotations = admin.get(node_path("gpu02"))["metadata"].get("annotations") or {}
        assert channel.REQUEST not in annotations and channel.ANSWER not in annotations, annotations
        served = [json.loads(line) for line in open(os.path.join(site.dir, "state", "gpu02", "gpugate.log"))
                  if '"mode":"agent"' in line]
        assert served and all(r["ok"] for r in served), served
        assert any(r["argv"][:3] == ["check", "--mode", "verify"] for r in served), served
        # A request the agent must not run, on a held node: refused, in its answer; on a node
        # in service (gpu03): not read at all (the agent serves held nodes only).
        site.sim("gpu02", "driver=550.54.15")
        site.healthcheck(agent_config, "gpu02")
        from gpugate.kube.transport import KubeTransport

        sweep_client = site.api.client("sweep")
        refused = KubeTransport(sweep_client, poll=0.2).run(["gpu02"], ["check", "--mode", "verify"], 20)
        assert isinstance(refused["gpu02"], dict)
        sweep_client.patch(node_path("gpu02"), {"metadata": {"annotations": {channel.REQUEST: channel.request_text(
            "bad0", ["evidence", "--max-bytes", "1"], 5, time.time())}}})
        wait_for(lambda: channel.read_answer(admin.get(node_path("gpu02")), "bad0") is not None, 20)
        assert channel.read_answer(admin.get(node_path("gpu02")), "bad0").startswith("the node agent: refused: not a")
        # A GPU reset while gpu02 is held for its own finding, not by the sweep (its pods not evicted): refused.
        reset = KubeTransport(sweep_client, poll=0.2).run(["gpu02"], ["reset-gpus", "--timeout", "30"], 20)
        assert reset["gpu02"].startswith("the node agent: refused: a GPU reset only while the sweep"), reset
        quiet = KubeTransport(sweep_client, poll=0.2)
        import gpugate.kube.transport as kt

        grace, kt.AGENT_GRACE = kt.AGENT_GRACE, 2.0
        try:
            # A node in service takes no request at all (deploy/kubernetes/sweep-policy.yaml); its agent would
            # not serve one either.
            said = quiet.run(["gpu03"], ["facts", "--max-age", "60"], 1)["gpu03"]
            assert "asks the node agent only on a Node gpugate holds" in said, said
        finally:
            kt.AGENT_GRACE = grace
    finally:
        for proc in agents:
            proc.terminate()
            proc.wait(timeout=15)
    errors = [proc.stderr.read() for proc in agents]
    assert all("Traceback" not in e and "no watch" not in e for e in errors), errors  # a watch, not polling


def wait_for(predicate, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError("timed out")


def test_a_pod_its_disruption_budget_protects_defers_the_node_held_then_it_goes_when_allowed(site):
    admin = site.admin
    agent = site.config("agent")
    site.sim("gpu02", "gpu.1.xid=79")  # fallen off the bus: acute, the node holds itself; a reboot repairs it
    site.healthcheck(agent, "gpu02")
    assert [t["value"] for t in held(admin, "gpu02")] == ["health"]
    workload(admin, "db-0", "gpu02", labels={"app": "db"})
    pdb(admin, "db", "db", allowed=0)

    out, report, _ = sweep(site, drain_timeout=3)
    assert out.returncode == 0, out.stderr[-2000:]
    outcome = report["outcomes"]["gpu02"]
    assert outcome["result"] == "deferred", report
    assert "default/db-0" in outcome["detail"] and "disruption budget" in outcome["detail"], outcome
    # Never bypassed: the pod is there and not terminating; the node still held, not rebooted.
    pod = admin.get("/api/v1/namespaces/default/pods/db-0")
    assert "deletionTimestamp" not in pod["metadata"]
    assert [t["value"] for t in held(admin, "gpu02")] == ["health"]
    assert site.kubelets.ran == []

    pdb(admin, "db", "db", allowed=1)  # the budget allows one now
    out, report, _ = sweep(site)
    assert out.returncode == 0, out.stderr[-2000:]
    assert report["outcomes"]["gpu02"]["result"] == "resumed", report
    assert pods(admin, "gpu02") == [] and held(admin, "gpu02") == []


def test_a_node_that_fails_its_smoke_pod_is_escalated_and_stays_held(site):
    admin = site.admin
    agent = site.config("agent")
    site.sim("gpu03", "gpu.1.xid=79", "smoke=pcie-degraded")  # verifies, but its all_reduce is slow
    site.healthcheck(agent, "gpu03")
    out, report, _ = sweep(site)
    outcome = report["outcomes"]["gpu03"]
    assert outcome["result"] == "escalated", report
    taints = held(admin, "gpu03")
    assert [t["value"] for t in taints] == ["rma"], taints
    reason = json.loads(admin.get(node_path("gpu03"))["metadata"]["annotations"][nv.OWNED])["reason"]
    assert reason.startswith("gpugate: rma ") and "smoke=all_reduce busbw=22.9GB/s (want >= 350)" in reason, reason
    # Two attempts (the retry), each proven by its own Pod on gpu03; none is left.
    assert [(n, code) for _, n, code in site.kubelets.ran] == [("gpu03", 0), ("gpu03", 0)]
    assert list(admin.list_pages("/api/v1/namespaces/gpugate-smoke/pods")) == []


def test_without_a_reboot_command_the_sweep_stops_and_the_node_stays_held(site):
    admin = site.admin
    agent = site.config("agent")
    site.sim("gpu01", "gpu.1.xid=79")
    site.healthcheck(agent, "gpu01")
    lines, _ = site.sweep_settings()
    config = site.config("sweep", sweep=lines)  # no [kubernetes] reboot
    out = subprocess.run([sys.executable, "-m", "gpugate", "sweep", "--config", config, "--apply"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 1 and "[kubernetes] reboot" in out.stderr, (out.stdout, out.stderr)
    assert [t["value"] for t in held(admin, "gpu01")] == ["health"]
    assert admin.get(node_path("gpu01"))["status"]["nodeInfo"]["bootID"] == "boot-0-gpu01"


def test_the_kubernetes_demo_ends_with_nodes_returned_after_their_proof(api, tmp_path):  # noqa: F811
    """`gpugate demo kubernetes` (its own API server): a node tainted with
    the reason, the budget holding the rest, and nodes returned by the sweep."""
    out = subprocess.run([sys.executable, "-m", "gpugate", "demo", "kubernetes", "--nodes", "4", "--dir",
                          str(tmp_path / "demo")], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "gpugate.io/unfit=drift:NoSchedule" in out.stdout and "held in service" in out.stdout
    returned = [line for line in out.stdout.splitlines() if line.strip().startswith("returned: ")]
    assert returned and returned[0].split("returned: ")[1].split(".")[0] not in ("", "none"), out.stdout[-2000:]
