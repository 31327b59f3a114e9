"""The Helm chart deploy/helm/gpugate (issue 45, "installed as sites
install it"): `helm lint`, and `helm template`'s output applied to a real
kube-apiserver with strict field validation, with its default values and
with a site's; the raw manifests (deploy/kubernetes/, and the List shipped
in the wheel) are the chart's own output; the values for pools and budget
reach a real keeper run.  Helm is built from the Go module proxy
(scripts/helm-build), as kube-apiserver is (scripts/kube-build)."""

import json
import os
import re
import subprocess
import sys
import time

import pytest
from kube_builds import require_helm, require_kube

from gpugate.testbed import manifests

pytestmark = pytest.mark.kube

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHART = os.path.join(ROOT, manifests.CHART)
DEMO_BASELINE = os.path.join(ROOT, "gpugate", "data", "demo-baseline.toml")
GPU_LABELS = {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


@pytest.fixture(scope="module")
def helm():
    return require_helm()


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    from gpugate.testbed.kube import KubeAPI

    require_kube()
    server = KubeAPI(str(tmp_path_factory.mktemp("kube"))).start()
    yield server
    server.stop()


def _render(helm, *args):
    return manifests.parse(manifests.helm_template(helm, CHART, *args), "helm template")


def _key(doc):
    return (doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])


def test_helm_lint(helm):
    out = subprocess.run([helm, "lint", "--strict", CHART], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in out.stdout


def test_chart_version_is_gpugates():
    import gpugate

    with open(os.path.join(CHART, "Chart.yaml")) as handle:
        text = handle.read()
    assert re.search(r"^version: %s$" % re.escape(gpugate.__version__), text, re.M)
    assert re.search(r'^appVersion: "%s"$' % re.escape(gpugate.__version__), text, re.M)


def test_raw_manifests_are_the_charts_output(helm):
    """deploy/kubernetes/*.yaml and gpugate/data/kubernetes.json hold the
    objects `helm template` makes with the default values, no more, no
    fewer (read here apart from scripts/helm-render, which must agree too)."""
    rendered = sorted(_render(helm), key=_key)
    assert sorted(manifests.load_dir(os.path.join(ROOT, "deploy", "kubernetes")), key=_key) == rendered
    assert sorted(manifests.packaged(), key=_key) == rendered
    check = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "helm-render"), "--check"],
                           capture_output=True, text=True, timeout=180)
    assert check.returncode == 0, check.stdout + check.stderr


def test_helm_render_check_names_a_hand_edit(helm, tmp_path, monkeypatch):
    """A raw manifest edited by hand, not in the chart: --check says which file."""
    import importlib.util
    from importlib.machinery import SourceFileLoader

    loader = SourceFileLoader("helm_render", os.path.join(ROOT, "scripts", "helm-render"))
    render = importlib.util.module_from_spec(importlib.util.spec_from_loader("helm_render", loader))
    loader.exec_module(render)
    out = tmp_path / "kubernetes"
    out.mkdir()
    monkeypatch.setattr(render, "OUT", str(out))
    monkeypatch.setattr(manifests, "PACKAGED", str(tmp_path / "kubernetes.json"))
    assert render.main([]) == 0  # written into the copy
    path = out / "node-agent.yaml"
    path.write_text(path.read_text().replace("--interval", "--interval-by-hand"))
    (out / "extra.yaml").write_text("kind: ConfigMap\n")
    assert render.main(["--check"]) == 1
    assert render.main(["--check"]) == 1  # --check writes nothing
    assert "--interval-by-hand" in path.read_text()


def test_default_values_apply_to_the_real_api_server(helm, api):
    """Every object strictly validated by a real kube-apiserver: the
    ServiceAccounts, RBAC and admission policies the chart grants."""
    docs = _render(helm)
    applied = manifests.apply(api.admin(), docs)
    assert len(applied) == len(docs)
    kinds = {kind for kind, _ in applied}
    assert {"DaemonSet", "Deployment", "CronJob", "ValidatingAdmissionPolicy", "ClusterRole"} <= kinds
    admin = api.admin()
    keeper = admin.get("/apis/apps/v1/namespaces/gpugate/deployments/gpugate-keeper")["spec"]["template"]["spec"]
    assert keeper["nodeSelector"] == {"node-role.kubernetes.io/control-plane": ""}
    assert {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists",
            "effect": "NoSchedule"} in keeper["tolerations"]
    sweep = admin.get("/apis/batch/v1/namespaces/gpugate/cronjobs/gpugate-sweep")
    assert sweep["spec"]["jobTemplate"]["spec"]["template"]["spec"]["nodeSelector"] == keeper["nodeSelector"]
    agent = admin.get("/apis/apps/v1/namespaces/gpugate/daemonsets/gpugate-node-agent")["spec"]["template"]
    assert agent["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    import gpugate

    assert agent["spec"]["containers"][0]["image"] == "registry.example.com/gpugate:%s" % gpugate.__version__
    # Metrics on the port the chart's headless Services scrape (no ServiceMonitor by default: no CRD here).
    assert "ServiceMonitor" not in kinds
    keeper_pod = admin.get("/apis/apps/v1/namespaces/gpugate/deployments/gpugate-keeper")["spec"]["template"]
    for name, pod in (("gpugate-keeper-metrics", keeper_pod), ("gpugate-node-agent-metrics", agent)):
        service = admin.get("/api/v1/namespaces/gpugate/services/" + name)["spec"]
        assert service["clusterIP"] == "None" and service["ports"][0]["targetPort"] == 9477
        assert service["selector"].items() <= pod["metadata"]["labels"].items()
    for pod in (agent, keeper_pod):
        assert pod["metadata"]["annotations"]["prometheus.io/port"] == "9477"
        assert pod["spec"]["containers"][0]["ports"] == [{"name": "metrics", "containerPort": 9477, "protocol": "TCP"}]
    assert agent["spec"]["containers"][0]["command"][-2:] == ["--metrics-port", "9477"]
    config = admin.get("/api/v1/namespaces/gpugate/configmaps/gpugate-keeper")["data"]["gpugate.toml"]
    assert "metrics_port = 9477" in config.splitlines()


SITE = ["--set", "namespace=gpu-health", "--set", "smokeNamespace=gpu-health-smoke",
        "--set", "image.repository=registry.site.example/ops/gpugate",
        "--set", "image.digest=sha256:" + "ab" * 32,
        "--set", "policies.enabled=false", "--set", "operatorNamespaces={gpu-operator}",
        # A map merges with the default's: null drops a key (Helm's rule).
        "--set-json", 'keeper.nodeSelector={"pool":"system","node-role.kubernetes.io/control-plane":null}',
        "--set-json", "keeper.tolerations=[]",
        "--set-json", 'nodeAgent.nodeSelector={"amd.com/gpu.present":"true","nvidia.com/gpu.present":null}',
        "--set", "pools.label=site.example/pool", "--set", "budget.maxShare=0.25",
        "--set", "sweep.schedule=*/5 * * * *", "--set", "metrics.port=0",
        "--set", "metrics.serviceMonitor.enabled=true"]


def test_a_sites_values_apply_to_the_real_api_server(helm, api):
    """Another namespace, an image pinned by digest, the policies off, a
    system pool for the keeper, AMD nodes, no metrics: still valid, and
    each value lands where it is meant to."""
    docs = _render(helm, *SITE)
    # Cluster-scoped names (ClusterRoles) are the defaults' too: taken as made once validated.
    manifests.apply(api.admin(), docs, existing_ok=True)
    assert not [d for d in docs if d["kind"].startswith("ValidatingAdmissionPolicy")]
    namespaced = [d for d in docs if d["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding")]
    assert {d["metadata"]["namespace"] for d in namespaced} == {"gpu-health", "gpu-health-smoke", "gpu-operator"}
    subjects = [s for d in docs for s in d.get("subjects", [])]
    assert subjects and {s["namespace"] for s in subjects} == {"gpu-health"}
    admin = api.admin()
    keeper = admin.get("/apis/apps/v1/namespaces/gpu-health/deployments/gpugate-keeper")["spec"]["template"]["spec"]
    assert keeper["nodeSelector"] == {"pool": "system"} and "tolerations" not in keeper
    image = keeper["containers"][0]["image"]
    assert image == "registry.site.example/ops/gpugate@sha256:" + "ab" * 32
    agent = admin.get("/apis/apps/v1/namespaces/gpu-health/daemonsets/gpugate-node-agent")["spec"]["template"]
    assert agent["spec"]["nodeSelector"] == {"amd.com/gpu.present": "true"}
    assert agent["spec"]["containers"][0]["image"] == image
    cron = admin.get("/apis/batch/v1/namespaces/gpu-health/cronjobs/gpugate-sweep")
    assert cron["spec"]["schedule"] == "*/5 * * * *"
    config = admin.get("/api/v1/namespaces/gpu-health/configmaps/gpugate-keeper")["data"]["gpugate.toml"]
    assert 'pool_label = "site.example/pool"' in config and "max_share = 0.25" in config
    assert "metrics_port = 0" in config.splitlines()  # no metrics: nothing served, nothing annotated
    for pod in (keeper, agent["spec"]):
        assert "ports" not in pod["containers"][0]
    assert "annotations" not in agent["metadata"]
    assert not [d for d in docs if d["kind"] in ("Service", "ServiceMonitor")]  # nothing to scrape


# The Prometheus Operator's ServiceMonitor CRD cut to the fields the chart writes, each as its
# schema types it: strict validation refuses any other field (a misspelt one), as theirs would.
_STRINGS = {"type": "array", "items": {"type": "string"}}
SERVICE_MONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
             "names": {"kind": "ServiceMonitor", "listKind": "ServiceMonitorList", "plural": "servicemonitors",
                       "singular": "servicemonitor"},
             "versions": [{"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                 "type": "object", "properties": {"spec": {"type": "object", "required": ["selector"], "properties": {
                     "selector": {"type": "object", "properties": {"matchLabels": {
                         "type": "object", "additionalProperties": {"type": "string"}}}},
                     "podTargetLabels": _STRINGS,
                     "endpoints": {"type": "array", "items": {"type": "object", "properties": {
                         "port": {"type": "string"}, "path": {"type": "string"}, "interval": {"type": "string"},
                         "relabelings": {"type": "array", "items": {"type": "object", "properties": {
                             "sourceLabels": _STRINGS, "targetLabel": {"type": "string"}}}}}}}}}}}}}]}}


def _with_service_monitors(admin):
    """The CRD above, created and established (once per API server)."""
    from gpugate.kube.client import KubeError

    try:
        admin.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", SERVICE_MONITOR_CRD)
    except KubeError as exc:
        if exc.status != 409:
            raise
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        crd = admin.get("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/" + SERVICE_MONITOR_CRD["metadata"]["name"])
        conditions = (crd.get("status") or {}).get("conditions") or []
        if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
            return
        time.sleep(0.5)
    raise AssertionError("the ServiceMonitor CRD was never established: %s" % crd.get("status"))


def test_a_sites_monitoring_follows_its_namespace_and_port(helm, api):
    """Another namespace and metrics port, the ServiceMonitors on: the
    headless Services and the ServiceMonitors land in that namespace,
    scrape that port, and select the keeper's and the agents' pods (the
    ServiceMonitors applied through a minimal CRD: the Operator's is not here)."""
    from gpugate.kube.client import KubeError

    docs = _render(helm, "--set", "namespace=gpu-scrape", "--set", "smokeNamespace=gpu-scrape-smoke",
                   "--set", "metrics.port=9500", "--set", "metrics.serviceMonitor.enabled=true",
                   "--set-json", 'metrics.serviceMonitor.labels={"release":"kube-prometheus"}')
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    admin = api.admin()
    manifests.apply(admin, [d for d in docs if d["kind"] != "ServiceMonitor"], existing_ok=True)
    _with_service_monitors(admin)
    where = "/apis/monitoring.coreos.com/v1/namespaces/gpu-scrape/servicemonitors"
    misspelt = dict(monitors[0], spec=dict(monitors[0]["spec"], podTargetLabel=["x"]))
    with pytest.raises(KubeError):  # the CRD's schema does hold the fields to their names
        admin.request("POST", where, misspelt, query={"fieldValidation": "Strict"})
    for monitor in monitors:
        admin.request("POST", where, monitor, query={"fieldValidation": "Strict"})
    pods = {d["metadata"]["name"]: d["spec"]["template"] for d in docs if d["kind"] in ("Deployment", "DaemonSet")}
    assert sorted(pods) == ["gpugate-keeper", "gpugate-node-agent"]
    for name, pod in pods.items():
        service = admin.get("/api/v1/namespaces/gpu-scrape/services/%s-metrics" % name)
        assert service["spec"]["clusterIP"] == "None"
        assert service["spec"]["ports"] == [{"name": "metrics", "port": 9500, "targetPort": 9500, "protocol": "TCP"}]
        assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
        assert pod["metadata"]["annotations"]["prometheus.io/port"] == "9500"
        assert pod["spec"]["containers"][0]["ports"][0]["containerPort"] == 9500
        monitor = admin.get("/apis/monitoring.coreos.com/v1/namespaces/gpu-scrape/servicemonitors/" + name)
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        # The port by the Service's name for it; the pod label the alert rules match on.
        assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
        assert monitor["spec"]["podTargetLabels"] == ["app.kubernetes.io/name"]
    agent = admin.get("/apis/monitoring.coreos.com/v1/namespaces/gpu-scrape/servicemonitors/gpugate-node-agent")
    assert agent["spec"]["endpoints"][0]["relabelings"] == [
        {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "instance"}]


def test_bad_values_are_refused_by_helm(helm):
    with pytest.raises(manifests.ManifestError) as err:
        manifests.helm_template(helm, CHART, "--set", "keeper.replicas=two")
    assert "helm template" in str(err.value)


@pytest.mark.parametrize("share,drained", [("0.1", 1), ("0.5", 2)])
def test_the_budget_value_is_what_the_keeper_keeps(helm, tmp_path, share, drained):
    """The keeper's gpugate.toml as the chart renders it (its ConfigMap),
    run as `gpugate budget` with the keeper's ServiceAccount against the
    chart's RBAC: four drifted nodes of one pool, the budget's share from
    the values decides how many it takes (the policies off: the tests'
    static agent token names no node)."""
    from gpugate.testbed.kube import KubeAPI, KubeFleet

    api = KubeAPI(str(tmp_path / "api")).start()  # its own: no policy of another test's in force
    try:
        _budget_run(helm, api, tmp_path, share, drained)
    finally:
        api.stop()


def _budget_run(helm, api, tmp_path, share, drained):
    from gpugate.testbed.kube import KubeFleet

    pool = "pool-%s" % share
    docs = _render(helm, "--set", "policies.enabled=false", "--set", "budget.maxShare=" + share)
    config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]["gpugate.toml"]
    manifests.apply(api.admin(), docs)
    names = ["gpu%02d" % i for i in range(1, 5)]
    fleet = KubeFleet(api, str(tmp_path), names, DEMO_BASELINE,
                      labels=dict(GPU_LABELS, **{"nvidia.com/gpu.product": pool}))
    agent = fleet.config("agent", float(share))  # a budget on: each agent publishes, none drains itself
    fleet.sim(",".join(names), "driver=550.54.15")
    for name in names:
        fleet.healthcheck(agent, name)
    kube = api.kube_settings("keeper")
    keeper_toml = config.replace("[kubernetes]\n", "[kubernetes]\nserver = %s\ntoken_file = %s\nca_file = %s\n"
                                 % (json.dumps(kube["server"]), json.dumps(kube["token_file"]),
                                    json.dumps(kube["ca_file"])))
    keeper_toml = keeper_toml.replace('"/etc/gpugate/drain-budget.key"', json.dumps(fleet.key))
    keeper_toml = keeper_toml.replace('"/var/lib/gpugate"', json.dumps(str(tmp_path / "keeper")))
    # Its status and last view beside the sweep journal: this test's own, never the machine's.
    keeper_toml += "[sweep]\njournal = %s\n" % json.dumps(str(tmp_path / "controller" / "sweep.db"))
    path = tmp_path / "keeper.toml"
    path.write_text(keeper_toml)
    os.chmod(str(path), 0o600)
    figures = fleet.keeper(str(path))
    assert figures["_exit"] == 0, json.dumps(figures)
    assert len(figures.get("drained") or []) == drained, json.dumps(figures)
