"""docs/runbooks/driver-upgrade-kubernetes.md run on a real kube-apiserver
and etcd (gpugate.testbed.kube) with a real kubectl: its ```console blocks
and hidden rig steps, read from the runbook (tests/runbook_doc.py), in order,
by tests/test_slurm_runbooks.py's runner.

The rig creates what the runbook assumes: deploy/kubernetes/ applied (the
gpugate namespace, the gpugate-keeper Deployment), a minimal ClusterPolicy
CustomResourceDefinition and its object ``cluster-policy``, and GPU Nodes
gpu01 and gpu02 over simulated GPUs, labelled as GPU Feature Discovery
labels a node on the demo baseline's driver.  ``kubectl`` is the one
scripts/kube-build builds beside kube-apiserver, with a kubeconfig for the
admin; the node agent is gpugate-healthcheck as installed, with its own
ServiceAccount's token ($HEALTHCHECK, $AGENT_CONFIG in the rig steps)."""

import os
import shutil
import time
from types import SimpleNamespace

import pytest

import runbook_doc as doc

pytestmark = pytest.mark.kube

NAME = "driver-upgrade-kubernetes.md"
NODES = ("gpu01", "gpu02")
DEMO_BASELINE = os.path.join(doc.ROOT, "gpugate", "data", "demo-baseline.toml")
GFD = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/cuda.driver-version.full": "580.65.06",
       "nvidia.com/cuda.runtime-version.full": "13.0", "nvidia.com/gpu-driver-upgrade-state": "upgrade-done"}
CRD = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
       "metadata": {"name": "clusterpolicies.nvidia.com"},
       "spec": {"group": "nvidia.com", "scope": "Cluster",
                "names": {"plural": "clusterpolicies", "singular": "clusterpolicy", "kind": "ClusterPolicy",
                          "listKind": "ClusterPolicyList"},
                "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                    "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]}}


def _kubectl():
    from gpugate.testbed.kube import built_versions, cache_dir

    versions = [v for v in built_versions() if os.access(os.path.join(cache_dir(), v, "kubectl"), os.X_OK)]
    wanted = os.environ.get("GPUGATE_KUBE_VERSION")
    if wanted in versions or (versions and not wanted):
        return wanted or versions[-1]
    message = "no kubectl built beside kube-apiserver in %s (scripts/kube-build)" % cache_dir()
    if os.environ.get("CI") == "true":
        pytest.fail(message + "; CI=true: CI builds it", pytrace=False)
    pytest.skip(message)


def _kubeconfig(api, path):
    with open(api.token_file("admin")) as handle:
        token = handle.read().strip()
    with open(path, "w") as handle:
        handle.write("apiVersion: v1\nkind: Config\nclusters:\n- name: rig\n  cluster:\n    server: %s\n"
                     "    certificate-authority: %s\nusers:\n- name: admin\n  user:\n    token: %s\n"
                     "contexts:\n- name: rig\n  context: {cluster: rig, user: admin}\ncurrent-context: rig\n"
                     % (api.server, api.ca_file, token))


def _cluster_policy(admin):
    """The ClusterPolicy CRD and its object, once the API server serves it."""
    from gpugate.kube.client import KubeError

    admin.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", CRD)
    deadline, last = time.monotonic() + 30, ""
    while time.monotonic() < deadline:
        try:
            admin.create("/apis/nvidia.com/v1/clusterpolicies", {
                "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy", "metadata": {"name": "cluster-policy"},
                "spec": {"driver": {"enabled": True, "version": "580.65.06",
                                    "upgradePolicy": {"autoUpgrade": True, "maxParallelUpgrades": 1}}}})
            return
        except KubeError as exc:  # 404 until the CRD is established
            last = str(exc)[:200]
            time.sleep(0.2)
    raise AssertionError("the ClusterPolicy CRD was not served in 30s: %s" % last)


def test_the_kubernetes_driver_upgrade_runbook_runs_on_the_api_server(tmp_path):
    version = _kubectl()
    from gpugate.kube import nodeview as nv
    from gpugate.kube.client import node_path
    from gpugate.testbed.kube import KubeAPI, KubeFleet, cache_dir
    from gpugate.testbed.procs import installed_entry_point
    from test_slurm_runbooks import run_runbook

    api = KubeAPI(str(tmp_path / "kube"), version).start()
    try:
        api.apply(os.path.join(doc.ROOT, "deploy", "kubernetes"))
        rig = tmp_path / "rig"
        rig.mkdir()
        baseline = str(rig / "baseline.toml")
        shutil.copy(DEMO_BASELINE, baseline)
        fleet = KubeFleet(api, str(rig), NODES, baseline, labels=GFD)
        _cluster_policy(fleet.admin)
        agent, keeper = fleet.config("agent"), fleet.config("keeper")
        for name in NODES:  # each node's run with a token naming its Node (<agent>.<node>.toml: the rig's lines)
            fleet.node_config(agent, name)
        shutil.copy(keeper, str(rig / "gpugate.toml"))
        home = tmp_path / "home"
        home.mkdir()
        _kubeconfig(api, str(home / "kubeconfig"))
        env = dict(os.environ, HOME=str(home), KUBECONFIG=str(home / "kubeconfig"), AGENT_CONFIG=agent,
                   HEALTHCHECK=installed_entry_point("healthcheck"),
                   PATH=os.path.join(cache_dir(), version) + ":" + os.environ["PATH"])
        env.pop("GPUGATE_CONFIG", None)
        work = tmp_path / "work"
        work.mkdir()
        run_runbook(NAME, SimpleNamespace(env=env, dir=str(rig), fleet=fleet.fleet,
                                          gpugate_conf=str(rig / "gpugate.toml")), work)
        # After the finish: every node fit with nothing pending, the keeper's Deployment as it was.
        for name in NODES:
            node = fleet.admin.request("GET", node_path(name))
            conds = [c for c in node["status"]["conditions"] if c["type"] == nv.CONDITION]
            assert [(c["status"], c["message"]) for c in conds] == [("True", "fit")], (name, conds)
        policy = fleet.admin.request("GET", "/apis/nvidia.com/v1/clusterpolicies/cluster-policy")
        assert policy["spec"]["driver"]["version"] == "590.48.01"
    finally:
        api.stop()
