"""gpugate's holds against the rest of a real control plane (issue 45,
item 8): kube-scheduler, kube-controller-manager (node lifecycle and taint
eviction, disruption, DaemonSets, ReplicaSets, garbage collector,
namespaces) and KWOK's fake kubelets, all from the Go module proxy
(scripts/kube-build), started once for the module (gpugate.testbed.kube,
``control_plane=True``).  Nothing here writes what those components write:
which Pod goes where, which is evicted, a PodDisruptionBudget's status and a
DaemonSet's Pods are theirs.  gpugate holds its nodes by its own code: the
node agent (gpugate-healthcheck as installed, the agent's token and RBAC),
the sweep, the keeper (`gpugate budget`) and gpugate.kube.nodes / client."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from gpugate.kube import nodeview as nv
from gpugate.kube.client import KubeClient, KubeError, node_path
from test_kube_agent import DEMO_BASELINE, MANIFESTS, _require_kube

pytestmark = pytest.mark.kube

GPU = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
LEASE = "/apis/coordination.k8s.io/v1/namespaces/gpugate/leases/gpugate-budget-keeper"
PODS = "/api/v1/namespaces/default/pods"
PDBS = "/apis/policy/v1/namespaces/default/poddisruptionbudgets"


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    """One API server with its scheduler, controllers and KWOK for the
    module; the manifests applied (the agent's RBAC, its DaemonSet).  The
    keepers' race (test_two_keepers...) starts here: its Lease takes a
    minute to expire, which the other tests' time covers."""
    base = tmp_path_factory.mktemp("plane")
    api = start_control_plane(str(base / "api"))
    race = None
    try:
        api.apply(MANIFESTS)
        race = KeeperRace(api, str(base / "keepers"))
        api.race = race
        yield api
    finally:
        if race is not None:
            race.stop()
        api.stop()


def start_control_plane(workdir: str):
    """The release's API server with its scheduler, controllers and KWOK
    (GPUGATE_KUBE_VERSION, else the newest built); skipped where the control
    plane is not built, except in CI, which builds it (there KubeAPI's error fails)."""
    _require_kube()
    from gpugate.testbed import kube_control
    from gpugate.testbed.kube import KubeAPI, built_versions, cache_dir

    version = os.environ.get("GPUGATE_KUBE_VERSION") or built_versions()[-1]
    gone = kube_control.missing(os.path.join(cache_dir(), version), cache_dir())
    if gone and os.environ.get("CI") != "true":
        pytest.skip("the control plane is not built (%s): scripts/kube-build %s" % (", ".join(gone), version))
    return KubeAPI(workdir, control_plane=True).start()


def wait_for(what, predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError("timed out after %.0fs waiting for %s" % (timeout, what))


def make_pod(admin, name, node, tolerations=(), labels=None):
    """A Pod for the scheduler to place, only on ``node`` (its hostname label)."""
    admin.create(PODS, {"metadata": {"name": name, "labels": dict(labels or {"app": name})}, "spec": {
        "nodeSelector": {"kubernetes.io/hostname": node}, "tolerations": list(tolerations),
        "containers": [{"name": "main", "image": "registry.example.com/train:1"}]}})


def pod(admin, name):
    try:
        return admin.get(PODS + "/" + name)
    except KubeError as exc:
        if exc.status == 404:
            return None
        raise


def running_on(admin, name, node):
    got = pod(admin, name)
    return got is not None and got["spec"].get("nodeName") == node and got["status"].get("phase") == "Running"


def unschedulable(admin, name):
    """The scheduler's own word that it found no node for the Pod ("" while it has not said)."""
    got = pod(admin, name)
    for cond in got["status"].get("conditions") or []:
        if cond["type"] == "PodScheduled" and cond["status"] == "False" and cond.get("reason") == "Unschedulable":
            return cond.get("message") or "?"
    return ""


def held(admin, node):
    return sorted((t["value"], t["effect"]) for t in nv.our_taints(admin.get(node_path(node))))


def fleet_of(api, tmp_path, names, labels=GPU):
    from gpugate.testbed.kube import KubeFleet

    return KubeFleet(api, str(tmp_path), names, DEMO_BASELINE, labels=labels, kwok=True)


def hold(fleet, node, extra=""):
    """An Xid 79 on ``node``, judged by the node agent (gpugate-healthcheck
    as installed; acute: it holds its own Node).  With the admin's token:
    the agent's own token and its admission policy are test_kube_agent's
    concern, and a static token names no Node for the policy to match."""
    fleet.sim(node, "gpu.1.xid=79")
    out = fleet.healthcheck(fleet.config("admin", extra=extra), node)
    assert held(fleet.admin, node), (out.returncode, out.stdout[-1000:], out.stderr[-1000:])


def sweep(fleet, node, drain_timeout=20):
    """`gpugate sweep -w NODE` (no smoke Pod: KWOK runs no command).  The
    site's reboot is the testbed's (a new bootID, the GPUs offered again by
    the testbed's device plugin: KWOK has none)."""
    from gpugate.testbed.kubelet import Kubelets

    class DevicePlugins(Kubelets):
        def _round(self):
            self._device_plugins()  # the rest of a kubelet is KWOK's

    plugins = DevicePlugins(fleet.api, [node])
    plugins.start()
    lines, kube = fleet.sweep_settings(drain_timeout=drain_timeout, smoke=False)
    try:
        out, report = fleet.sweep(fleet.config("sweep", sweep=lines, extra=kube), "-w", node)
    finally:
        plugins.stop()
    assert report is not None, "gpugate sweep printed no report (exit %d): %s" % (out.returncode, out.stderr[-2000:])
    return report["outcomes"].get(node, {})


def test_the_scheduler_keeps_pods_off_a_held_node_until_the_sweep_returns_it(plane, tmp_path):
    admin = plane.admin()
    fleet = fleet_of(plane, tmp_path, ["gpu41"])
    hold(fleet, "gpu41")
    assert held(admin, "gpu41") == [("health", "NoSchedule")]
    # One Pod tolerates nothing; one tolerates the cordon (as DaemonSet Pods do), not gpugate's taint.
    make_pod(admin, "plain-a", "gpu41")
    make_pod(admin, "cordon-ok-a", "gpu41", [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists",
                                              "effect": "NoSchedule"}])
    message = wait_for("the scheduler's answer", lambda: unschedulable(admin, "cordon-ok-a"))
    # The scheduler may not name the taint: the only one there that the Pod does not tolerate is gpugate's.
    assert "untolerated taint" in message and "unschedulable" not in message, message
    taints = [t["key"] for t in admin.get(node_path("gpu41"))["spec"]["taints"]]
    assert [k for k in taints if k != "node.kubernetes.io/unschedulable"] == [nv.TAINT_KEY], taints
    assert "unschedulable" in wait_for("the scheduler's answer", lambda: unschedulable(admin, "plain-a"))
    time.sleep(2)  # the scheduler retries unschedulable Pods on every Node change: still not bound
    assert [pod(admin, n)["spec"].get("nodeName") for n in ("plain-a", "cordon-ok-a")] == [None, None]

    outcome = sweep(fleet, "gpu41")
    assert outcome.get("result") == "resumed", outcome
    assert held(admin, "gpu41") == []
    for name in ("plain-a", "cordon-ok-a"):  # bound by the scheduler, started by the (KWOK) kubelet
        wait_for("%s running on gpu41" % name, lambda: running_on(admin, name, "gpu41"))


def test_no_execute_evicts_running_pods_through_the_taint_manager(plane, tmp_path):
    admin = plane.admin()
    fleet = fleet_of(plane, tmp_path, ["gpu42"])
    make_pod(admin, "train-b", "gpu42")
    make_pod(admin, "tolerant-b", "gpu42", [{"key": nv.TAINT_KEY, "operator": "Exists"}])
    for name in ("train-b", "tolerant-b"):
        wait_for("%s running" % name, lambda: running_on(admin, name, "gpu42"))
    hold(fleet, "gpu42", extra="no_execute = true")
    assert held(admin, "gpu42") == [("health", "NoExecute"), ("health", "NoSchedule")]
    # The taint eviction controller deletes what does not tolerate it; KWOK confirms the deletion.
    wait_for("train-b evicted", lambda: pod(admin, "train-b") is None)
    assert running_on(admin, "tolerant-b", "gpu42")


def pdb_status(admin, name):
    got = admin.get(PDBS + "/" + name)
    status = got.get("status") or {}
    if status.get("observedGeneration") != got["metadata"]["generation"]:
        return None  # the disruption controller has not computed this spec yet
    return status


def test_a_disruption_budget_the_controller_computes_defers_the_sweep(plane, tmp_path):
    admin = plane.admin()
    fleet = fleet_of(plane, tmp_path, ["gpu43"])
    make_pod(admin, "db-c", "gpu43", labels={"app": "db-c"})
    wait_for("db-c running", lambda: running_on(admin, "db-c", "gpu43"))
    admin.create(PDBS, {"metadata": {"name": "db-c"}, "spec": {"minAvailable": 1,
                                                               "selector": {"matchLabels": {"app": "db-c"}}}})
    status = wait_for("the PDB's status", lambda: pdb_status(admin, "db-c"))
    assert (status["currentHealthy"], status["expectedPods"], status["disruptionsAllowed"]) == (1, 1, 0), status
    hold(fleet, "gpu43")  # NoSchedule only: the pod keeps running, the sweep must evict it

    outcome = sweep(fleet, "gpu43", drain_timeout=3)
    assert outcome.get("result") == "deferred", outcome
    assert "default/db-c" in outcome["detail"] and "disruption budget" in outcome["detail"], outcome
    assert running_on(admin, "db-c", "gpu43") and "deletionTimestamp" not in pod(admin, "db-c")["metadata"]
    assert held(admin, "gpu43") == [("health", "NoSchedule")]

    admin.patch(PDBS + "/db-c", {"spec": {"minAvailable": 0}})  # the controller now allows one
    wait_for("disruptionsAllowed 1", lambda: (pdb_status(admin, "db-c") or {}).get("disruptionsAllowed") == 1)
    outcome = sweep(fleet, "gpu43")
    assert outcome.get("result") == "resumed", outcome
    assert pod(admin, "db-c") is None and held(admin, "gpu43") == []


def daemonset_pods(admin, namespace, owner):
    return {p["spec"].get("nodeName"): p for p in admin.list_pages("/api/v1/namespaces/%s/pods" % namespace)
            if any(o.get("kind") == "DaemonSet" and o.get("name") == owner
                   for o in p["metadata"].get("ownerReferences") or [])}


def test_the_node_agent_daemonset_runs_on_a_held_node_through_its_tolerations(plane, tmp_path):
    """deploy/kubernetes/node-agent.yaml's DaemonSet (applied by the
    module): the daemonset controller makes its Pod for a held node, the
    scheduler binds it, KWOK runs it.  The same DaemonSet without its
    tolerations gets a Pod on the node beside it only."""
    import yaml

    admin = plane.admin()
    labels = dict(GPU, **{"nvidia.com/gpu.present": "true"})
    fleet = fleet_of(plane, tmp_path, ["gpu44", "gpu45"], labels=labels)
    hold(fleet, "gpu44")
    with open(os.path.join(MANIFESTS, "node-agent.yaml")) as handle:
        agent_ds = [d for d in yaml.safe_load_all(handle) if d and d["kind"] == "DaemonSet"][0]
    bare = json.loads(json.dumps(agent_ds))
    bare["metadata"] = {"name": "no-tolerations", "namespace": "default"}
    bare["spec"]["selector"] = {"matchLabels": {"app": "no-tolerations"}}
    bare["spec"]["template"]["metadata"] = {"labels": {"app": "no-tolerations"}}
    bare["spec"]["template"]["spec"].pop("tolerations", None)
    bare["spec"]["template"]["spec"]["serviceAccountName"] = "default"
    admin.create("/apis/apps/v1/namespaces/default/daemonsets", bare)
    try:
        name = agent_ds["metadata"]["name"]
        namespace = agent_ds["metadata"]["namespace"]
        wait_for("the agent's Pod running on the held gpu44", lambda: daemonset_pods(admin, namespace, name).get(
            "gpu44", {}).get("status", {}).get("phase") == "Running", timeout=45)
        wait_for("the bare DaemonSet's Pod running on gpu45", lambda: daemonset_pods(
            admin, "default", "no-tolerations").get("gpu45", {}).get("status", {}).get("phase") == "Running")
        assert held(admin, "gpu44") == [("health", "NoSchedule")]
        assert "gpu44" not in daemonset_pods(admin, "default", "no-tolerations")
    finally:
        admin.request("DELETE", "/apis/apps/v1/namespaces/default/daemonsets/no-tolerations")


def test_a_409_on_a_node_write_reads_again_and_writes_only_while_gpugates_hold_stands(plane, tmp_path):
    """gpugate.kube.nodes writes with the resourceVersion it read.  A Node
    changed in between by someone else (a label, the kubelet's status: the
    real API server answers 409 Conflict) is read again and the hold
    written on the new read, the other change kept: an acute hold does not
    wait for the next run.  A Node whose gpugate hold changed in between is
    refused and not written over: the next run decides on it again."""
    from gpugate.kube.nodes import KubeNodes

    admin = plane.admin()
    fleet_of(plane, tmp_path, ["gpu47", "gpu48"])
    nodes = KubeNodes(plane.admin(), {"pool_label": "nvidia.com/gpu.product"}, "gpugate:")
    assert {"gpu47", "gpu48"} <= set(nodes.nodes())  # the keeper's read: one paginated list
    before = admin.get(node_path("gpu47"))["metadata"]["resourceVersion"]
    admin.patch(node_path("gpu47"), {"metadata": {"labels": {"site.example.com/rack": "r7"}}})
    admin.patch(node_path("gpu47", "status"), {"status": {"nodeInfo": {"kubeletVersion": "v9.9.9"}}}, "strategic")
    reason = "gpugate: health ecc:gpu6=4 uncorrected (want <= 0)"
    nodes.drain("gpu47", reason)  # the read's resourceVersion is stale: 409, read again, written
    node = admin.get(node_path("gpu47"))
    assert node["metadata"]["resourceVersion"] != before
    assert [t["value"] for t in nv.our_taints(node)] == ["health"] and nv.owned(node)["reason"] == reason
    assert node["metadata"]["labels"]["site.example.com/rack"] == "r7"

    # Another gpugate writer held gpu48 between this one's read and its write.
    other = KubeNodes(plane.admin(), {"pool_label": "nvidia.com/gpu.product"}, "gpugate:")
    other_reason = "gpugate: health xid:gpu1=79 fallen off the bus"
    other.drain("gpu48", other_reason)
    with pytest.raises(KubeError) as refused:
        nodes.drain("gpu48", "gpugate: drift driver=550.1 (want 570.2)")
    assert "Node gpu48 changed since it was read: not written" in str(refused.value), refused.value
    assert nv.owned(admin.get(node_path("gpu48")))["reason"] == other_reason  # not written over


class Compacting(KubeClient):
    """gpugate's client; after each list page that has a continue token,
    etcd is compacted (as kube-apiserver's compactor does every 5 minutes,
    here at once).  Every answer is the API server's; ``refused``: the
    statuses it answered with."""

    def __init__(self, api, times):
        with open(api.token_file("admin")) as handle:
            super().__init__(api.server, handle.read().strip(), api.ca_file)
        self.etcd, self.times, self.refused = api.etcd_url, times, []

    def request(self, method, path, body=None, content_type="application/json", query=None, text=False):
        from gpugate.testbed.kube_control import compact

        try:
            answer = super().request(method, path, body, content_type, query, text)
        except KubeError as exc:
            self.refused.append(exc.status)
            raise
        if self.times and (answer.get("metadata") or {}).get("continue"):
            self.times -= 1
            compact(self.etcd)
        return answer


def test_a_list_whose_continue_token_expired_410_is_read_again_whole(plane, tmp_path):
    admin = plane.admin()
    fleet_of(plane, tmp_path, ["gpu51", "gpu52", "gpu53", "gpu54"])
    everything = sorted(n["metadata"]["name"] for n in admin.list_pages("/api/v1/nodes"))
    client = Compacting(plane, times=1)
    got = sorted(n["metadata"]["name"] for n in client.list_pages("/api/v1/nodes", limit=2))
    assert client.refused == [410] and got == everything, (client.refused, got, everything)
    # Expired again on the second try: an error, never half a list.
    client = Compacting(plane, times=2)
    with pytest.raises(KubeError) as expired:
        list(client.list_pages("/api/v1/nodes", limit=2))
    assert expired.value.status == 410 and client.refused == [410, 410]


class KeeperRace:
    """Two keepers (`gpugate budget --watch 5`, each under its own host
    name: the Lease's identity) on one fleet: keeper-a starts first and
    takes the Lease, is killed (SIGKILL: no goodbye), then keeper-b starts."""

    def __init__(self, api, directory):
        from gpugate.testbed.kube import KubeFleet

        self.api, self.dir, self.procs, self.outs = api, directory, {}, {}
        os.makedirs(directory)
        fleet = KubeFleet(api, directory, ["gpu46"], DEMO_BASELINE, labels=GPU, kwok=True)
        config = fleet.config("keeper", extra='node_selector = "gpugate.test/keeper=race"')
        with open(config) as handle:
            text = handle.read()
        self.configs = {}
        for who in ("keeper-a", "keeper-b"):  # each its own state (the host lock, the status file)
            self.configs[who] = os.path.join(directory, "gpugate-%s.toml" % who)
            with open(self.configs[who], "w") as handle:
                handle.write(text.replace("/controller/sweep.db", "/controller-%s/sweep.db" % who))
            os.chmod(self.configs[who], 0o600)
        self.start("keeper-a")
        wait_for("keeper-a holding the Lease", lambda: self.lease("keeper-a"), timeout=60)
        os.killpg(self.procs["keeper-a"].pid, signal.SIGKILL)
        self.procs["keeper-a"].wait(timeout=15)
        self.last = self.lease("keeper-a")  # its last renewal
        self.start("keeper-b")

    def lease(self, holder):
        try:
            lease = self.api.admin().get(LEASE)
        except KubeError:
            return None
        return lease if lease["spec"].get("holderIdentity") == holder else None

    def start(self, who):
        self.outs[who] = open(os.path.join(self.dir, who + ".out"), "w+")
        # unshare --uts: its own host name, which the keeper takes for its identity
        self.procs[who] = subprocess.Popen(
            ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', who, sys.executable, "-m", "gpugate",
             "budget", "--config", self.configs[who], "--watch", "5", "--json"],
            stdout=self.outs[who], stderr=subprocess.STDOUT, start_new_session=True)

    def runs(self, who):
        self.outs[who].flush()
        with open(self.outs[who].name) as handle:
            return [json.loads(line) for line in handle if line.startswith("{")]

    def stop(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=15)
        for out in self.outs.values():
            out.close()


def test_two_keepers_one_killed_the_other_takes_the_lease_once_it_expired(plane):
    from gpugate.kube.lease import SKEW_SECONDS

    from gpugate.kube.lease import _parse

    race = plane.race
    assert race.last is not None and race.last["spec"]["leaseTransitions"] == 0, race.last
    taken = wait_for("keeper-b holding the Lease", lambda: race.lease("keeper-b"), timeout=150)
    runs = race.runs("keeper-b")
    # Until keeper-a's Lease expired, keeper-b stood by (exit 0, nothing drained), naming keeper-a.
    standby = [r for r in runs if r.get("standby")]
    assert standby and all(r["standby"].startswith("another keeper leads: keeper-a holds") for r in standby), runs
    assert all(not r.get("drained") for r in runs), runs
    spec = taken["spec"]
    assert spec["leaseTransitions"] == 1, spec
    # Not before the Lease expired: keeper-a's last renewal, its 60 s and the allowance for skew.
    waited = _parse(spec["acquireTime"]) - _parse(race.last["spec"]["renewTime"])
    assert waited >= race.last["spec"]["leaseDurationSeconds"] + SKEW_SECONDS, (waited, spec)
    assert race.procs["keeper-b"].poll() is None and race.procs["keeper-a"].returncode == -signal.SIGKILL
