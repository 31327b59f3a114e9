"""A gang's preflight on a KWOK control plane, for the tests and the
benchmark (tests/test_kube_preflight_gang.py, bench/bench_kube_preflight.py):
on a started KubeAPI(control_plane=True), the chart's manifests as a site
applies them (deploy/kubernetes, and deploy/kubernetes/preflight as
helm-render writes it with preflight.enabled), Volcano's PodGroup CRD, an
opted-in namespace and a plain one, simulated GPU nodes each with its
node agent (`gpugate agent`, a token bound to its Node, serving the
preflight port), the testbed kubelet for the init containers
(gpugate.testbed.kubelet_preflight) and the keeper (`gpugate budget`
every 2 s).  The gangs are batch/v1 Jobs of whole-node Pods in a Volcano
PodGroup (the annotation and the object Volcano writes)."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Dict, List, Optional

from gpugate.kube.client import KubeError, node_path
from gpugate.testbed import manifests
from gpugate.testbed.procs import ClusterError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MANIFESTS = os.path.join(ROOT, "deploy", "kubernetes")
PREFLIGHT_MANIFESTS = os.path.join(MANIFESTS, "preflight")  # helm-render's, preflight.enabled
VOLCANO_CRD = os.path.join(ROOT, "tests", "fixtures", "gangs", "crds", "scheduling.volcano.sh_podgroups.yaml")
BASELINE = os.path.join(ROOT, "gpugate", "data", "demo-baseline.toml")
GPU_LABELS = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
OPTED_IN, PLAIN = "ml", "plain"  # the namespaces: labelled gpugate.io/preflight=true, and not
CONTAINER = "gpugate-preflight"
POLICIES = "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def policy_served(admin) -> bool:
    """The release serves MutatingAdmissionPolicy v1 (1.36+)."""
    try:
        admin.get(POLICIES)
        return True
    except KubeError:
        return False


def wait_for(what: str, predicate, timeout: float = 30.0, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(every)
    raise ClusterError("timed out after %.0fs waiting for %s" % (timeout, what))


class GangRig:
    def __init__(self, api, directory: str, nodes: List[str]):
        self.api, self.dir, self.nodes = api, directory, list(nodes)
        self.admin = api.admin()
        self.agents: List[subprocess.Popen] = []
        self.kubelets = self.keeper = self.fleet = None

    def start(self) -> "GangRig":
        from gpugate.testbed.kube import KubeFleet
        from gpugate.testbed.kubelet_preflight import PreflightKubelets

        self.api.apply(MANIFESTS)
        self.api.apply(PREFLIGHT_MANIFESTS)
        with open(VOLCANO_CRD) as handle:
            self.admin.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                              manifests.parse(handle.read(), VOLCANO_CRD)[0])
        wait_for("the PodGroup CRD served", lambda: self._served(self.podgroups(OPTED_IN)), 30)
        for name, labels in ((OPTED_IN, {"gpugate.io/preflight": "true"}), (PLAIN, {})):
            self.admin.create("/api/v1/namespaces", {"metadata": {"name": name, "labels": labels}})
        wait_for("the preflight policy in force", self._injected, 60)
        self.fleet = KubeFleet(self.api, os.path.join(self.dir, "fleet"), self.nodes, BASELINE, labels=GPU_LABELS,
                               kwok=True)
        ports = {node: free_port() for node in self.nodes}
        meet = free_port()
        self.agents = [self._agent(node, ports[node], meet) for node in self.nodes]
        self.kubelets = PreflightKubelets(self.api, {n: "127.0.0.1:%d" % p for n, p in ports.items()}).start()
        self.keeper = Keeper(self.fleet, self.fleet.config("keeper", share=0.5, extra=self.preflight(0, meet)))
        return self

    def stop(self) -> None:
        if self.keeper is not None:
            self.keeper.stop()
        if self.kubelets is not None:
            self.kubelets.stop()
        for proc in self.agents:
            proc.terminate()
        for proc in self.agents:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()

    # ------------------------------------------------------------ the set-up
    @staticmethod
    def podgroups(namespace: str) -> str:
        return "/apis/scheduling.volcano.sh/v1beta1/namespaces/%s/podgroups" % namespace

    def _served(self, path: str) -> bool:
        try:
            self.admin.get(path)
            return True
        except KubeError:
            return False

    def _injected(self) -> bool:
        """A GPU Pod made in the opted-in namespace gets the init container (then it goes)."""
        pods = "/api/v1/namespaces/%s/pods" % OPTED_IN
        made = self.admin.create(pods, {"metadata": {"generateName": "probe-"}, "spec": {"containers": [
            {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
        self.admin.request("DELETE", pods + "/" + made["metadata"]["name"])
        return [c["name"] for c in made["spec"].get("initContainers") or []] == [CONTAINER]

    def preflight(self, port: int, meet: int) -> str:
        """The [preflight] table of every node's gpugate.toml: the simulated
        nodes' all_reduce_perf, alone and across the gang's nodes."""
        run = os.path.join(self.fleet.fleet, "{node}", "bin", "all_reduce_perf")
        return ('\n[preflight]\nkubernetes = true\nkube_port = %d\ntimeout_seconds = 30\nacross_seconds = 60\n'
                'run_seconds = 20\nrendezvous_host = "127.0.0.1"\nport = %d\nports = 1\n'
                'allreduce = %s\nallreduce_multi = %s\n'
                % (port or 9412, meet, json.dumps([run, "-b", "8", "-e", "8G", "-g", "{gpus}"]),
                   json.dumps([run, "-b", "1G", "-e", "8G", "-f", "2", "-g", "{gpus}"])))

    def _agent(self, node: str, port: int, meet: int) -> subprocess.Popen:
        """`gpugate agent` for ``node``, as the DaemonSet runs it (a token bound to its Node)."""
        config = self.fleet.node_config(self.fleet.config("agent", share=0.5, extra=self.preflight(port, meet)),
                                        node)  # copied for this node at once: each copy keeps its own port
        log = open(os.path.join(self.dir, "agent-%s.log" % node), "w")
        return subprocess.Popen([sys.executable, "-m", "gpugate", "agent", "--config", config, "--interval",
                                 "3600", "--poll", "2"], env=dict(os.environ, GPUGATE_NODE_NAME=node),
                                stdout=log, stderr=subprocess.STDOUT)

    # ------------------------------------------------------------ the gangs
    def gang(self, name: str, size: int, namespace: str = OPTED_IN) -> None:
        """A Volcano PodGroup and a Job of ``size`` whole-node Pods in it (restartPolicy Never)."""
        self._job(name, size, namespace, {}, {"limits": {"nvidia.com/gpu": "8"}})

    def publish_gpus(self) -> None:
        """NVIDIA's DRA driver on every node: its DeviceClass and each node's ResourceSlice."""
        from gpugate.testbed.kube_dra import DEVICE_CLASS, publish_slice

        self.admin.create("/apis/resource.k8s.io/v1/deviceclasses", DEVICE_CLASS)
        for node in self.nodes:
            publish_slice(self.admin, self.fleet.fleet, node)

    def dra_gang(self, name: str, size: int, namespace: str = OPTED_IN) -> None:
        """As gang(), the Pods' GPUs claimed through DRA: each Pod's claim, made from a
        ResourceClaimTemplate by the ResourceClaim controller, takes every GPU of one node."""
        self.admin.create("/apis/resource.k8s.io/v1/namespaces/%s/resourceclaimtemplates" % namespace, {
            "metadata": {"name": name}, "spec": {"spec": {"devices": {"requests": [
                {"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}}]}}}})
        self._job(name, size, namespace, {"resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": name}]},
                  {"claims": [{"name": "gpus"}]})

    def _job(self, name: str, size: int, namespace: str, spec: dict, resources: dict) -> None:
        self.admin.create(self.podgroups(namespace), {
            "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup", "metadata": {"name": name},
            "spec": {"minMember": size}})
        self.admin.create("/apis/batch/v1/namespaces/%s/jobs" % namespace, {
            "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": {
                "completions": size, "parallelism": size, "completionMode": "Indexed", "backoffLimit": 4,
                "template": {"metadata": {"annotations": {"scheduling.k8s.io/group-name": name}}, "spec": dict(
                    spec, restartPolicy="Never", containers=[{"name": "train", "image": "registry.example.com/train:1",
                                                              "resources": resources}])}}})

    def pods(self, job: str, namespace: str = OPTED_IN) -> List[dict]:
        return self.admin.get("/api/v1/namespaces/%s/pods?labelSelector=job-name%%3D%s" % (namespace, job))["items"]

    def complete(self, job: str, namespace: str = OPTED_IN) -> bool:
        got = self.admin.get("/apis/batch/v1/namespaces/%s/jobs/%s" % (namespace, job))
        return any(c["type"] == "Complete" and c["status"] == "True" for c in got["status"].get("conditions") or [])

    def cordon(self, node: str, on: bool) -> None:
        self.admin.patch(node_path(node), {"spec": {"unschedulable": on}})

    def records(self, node: str) -> List[dict]:
        """The node agent's preflight log lines (mode kube-preflight), in order."""
        out = []
        try:
            with open(os.path.join(self.fleet.dir, "state", node, "gpugate.log")) as handle:
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


def preflight_exit(pod: dict) -> Optional[int]:
    """The gpugate-preflight init container's exit code (None: it has not ended)."""
    for item in pod["status"].get("initContainerStatuses") or []:
        if item["name"] == CONTAINER:
            done = (item.get("state") or {}).get("terminated")
            return None if done is None else done.get("exitCode")
    return None


class Keeper:
    """`gpugate budget` every 2 s, as the keeper's Deployment runs it (--watch)."""

    def __init__(self, fleet, config: str):
        self.fleet, self.config, self.done = fleet, config, threading.Event()
        self.errors: Dict[str, int] = {}
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.done.wait(2.0):
            try:
                self.fleet.keeper(self.config)
            except ClusterError as exc:  # the next run tries again, as the keeper's loop does
                key = str(exc)[:80]
                self.errors[key] = self.errors.get(key, 0) + 1

    def stop(self) -> None:
        self.done.set()
        self.thread.join(30)
