"""gpugate's Kubernetes manifests as objects, and applying them to a real
API server (the tests, `gpugate demo kubernetes`).

One source: the Helm chart deploy/helm/gpugate. scripts/helm-render writes
`helm template`'s output with the default values as deploy/kubernetes/*.yaml
(for `kubectl apply -f`) and as gpugate/data/kubernetes.json, a v1 List that
ships inside the wheel, so a pip-installed gpugate's demo has them and reads
them with the standard library alone (PyYAML is a test dependency)."""

import json
import os
from typing import List, Tuple

from gpugate.errors import GpugateError

PACKAGED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data", "kubernetes.json")

# kind -> its collection's path (namespaced ones under {ns}): every kind the chart renders.
COLLECTIONS = {
    "Namespace": "/api/v1/namespaces", "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps", "Service": "/api/v1/namespaces/{ns}/services",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "DaemonSet": "/apis/apps/v1/namespaces/{ns}/daemonsets",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "CronJob": "/apis/batch/v1/namespaces/{ns}/cronjobs",
    "ValidatingAdmissionPolicy": "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
    "PersistentVolumeClaim": "/api/v1/namespaces/{ns}/persistentvolumeclaims",
    # The preflight's (deploy/kubernetes/preflight/: v1, Kubernetes 1.36+).
    "MutatingAdmissionPolicy": "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies",
    "MutatingAdmissionPolicyBinding": "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicybindings",
}


class ManifestError(GpugateError):
    """No manifests where they were looked for, or ones that cannot be read."""


HELM_VERSION = "4.3.2"
CHART = os.path.join("deploy", "helm", "gpugate")  # below the repository's root


def helm_binary() -> str:
    """Helm as scripts/helm-build built it ($GPUGATE_HELM_CACHE/VERSION/helm), or ""."""
    cache = os.environ.get("GPUGATE_HELM_CACHE", "/var/cache/gpugate/helm")
    path = os.path.join(cache, os.environ.get("GPUGATE_HELM_VERSION", HELM_VERSION), "helm")
    return path if os.access(path, os.X_OK) else ""


def helm_template(helm: str, chart: str, *args: str, timeout: float = 120) -> str:
    """`helm template gpugate CHART ARGS...`: the rendered stream; a refusal raises helm's words."""
    import subprocess

    out = subprocess.run([helm, "template", "gpugate", chart] + list(args), capture_output=True, text=True,
                         timeout=timeout)
    if out.returncode != 0:
        raise ManifestError("helm template %s %s failed (exit %d): %s"
                            % (chart, " ".join(args), out.returncode, out.stderr.strip()[-800:]))
    return out.stdout


def packaged() -> List[dict]:
    """The manifests shipped inside gpugate (the chart's defaults)."""
    return load_file(PACKAGED)


def load_file(path: str) -> List[dict]:
    """A JSON v1 List (or array) of objects, or a YAML stream (`helm
    template`'s output: needs PyYAML)."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise ManifestError("cannot read the Kubernetes manifests %s: %s" % (path, exc.strerror or exc)) from None
    return parse(text, path)


def parse(text: str, source: str) -> List[dict]:
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if data is not None:
        docs = data.get("items") if isinstance(data, dict) and data.get("kind") == "List" else data
        docs = docs if isinstance(docs, list) else [docs]
    else:
        try:
            import yaml
        except ImportError:
            raise ManifestError("%s is YAML: reading it needs PyYAML (pip install pyyaml), or give the JSON "
                                "List scripts/helm-render writes" % source) from None
        try:
            docs = list(yaml.safe_load_all(text))
        except yaml.YAMLError as exc:
            raise ManifestError("%s: not YAML: %s" % (source, exc)) from None
    docs = [d for d in docs if d]  # a template that rendered nothing
    bad = [d for d in docs if not (isinstance(d, dict) and d.get("kind") and (d.get("metadata") or {}).get("name"))]
    if bad:
        raise ManifestError("%s: %d document(s) without a kind and a name" % (source, len(bad)))
    if not docs:
        raise ManifestError("%s holds no Kubernetes objects" % source)
    return docs


def load_dir(directory: str) -> List[dict]:
    """Every *.yaml in ``directory`` (deploy/kubernetes), in name order."""
    import glob

    paths = sorted(glob.glob(os.path.join(directory, "*.yaml")))
    if not paths:
        raise ManifestError("no manifests (*.yaml) in %s" % directory)
    docs = []
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            docs.extend(parse(handle.read(), path))
    return docs


def apply(admin, docs: List[dict], existing_ok: bool = False) -> List[Tuple[str, str]]:
    """Each object created by ``admin`` with strict server-side field
    validation (an unknown field is refused), in the order given. A refusal
    raises the API server's own words, naming the object; a Namespace that
    exists already is taken as made (existing_ok: any object; the server
    decodes and validates a create before it finds the name taken).
    Returns the (kind, name) applied."""
    from gpugate.kube.client import KubeError

    applied = []
    for doc in docs:
        kind, meta = doc["kind"], doc["metadata"]
        if kind not in COLLECTIONS:
            raise ManifestError("%s/%s: a kind this rig does not apply" % (kind, meta["name"]))
        where = COLLECTIONS[kind].format(ns=meta.get("namespace", ""))
        try:
            admin.request("POST", where, doc, query={"fieldValidation": "Strict"})
        except KubeError as exc:
            if not (exc.status == 409 and (existing_ok or kind == "Namespace")):
                raise KubeError("the API server refused %s/%s: %s" % (kind, meta["name"], exc), exc.status,
                                exc.reason) from None
        applied.append((kind, meta["name"]))
    return applied
