"""The preflight's injection (deploy/helm/gpugate/templates/preflight.yaml,
`helm template --set preflight.enabled=true`) on a real kube-apiserver: its
MutatingAdmissionPolicy and bindings give exactly the opted-in GPU Pods the
init container gpugate-preflight, first, unprivileged, once; and the
container it injects is the one `gpugate kube-preflight
--print-init-container` prints for a site's own template.

Kubernetes 1.36 and later serve admissionregistration.k8s.io/v1
MutatingAdmissionPolicies (1.37.2 here).  1.34 serves them as v1beta1 only
behind the MutatingAdmissionPolicy feature gate: run there with the gate on
where the testbed can pass the API server flags, else skipped saying so."""

import inspect
import json
import os
import time

import pytest
from click.testing import CliRunner
from kube_builds import require_helm, require_kube

from gpugate.kube.client import KubeError
from gpugate.testbed import manifests

pytestmark = pytest.mark.kube

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGE = "registry.site.example/gpugate:9.9"
LABEL = "gpugate.io/preflight"
GROUP = "/apis/admissionregistration.k8s.io/"
BETA_FLAGS = ["--feature-gates=MutatingAdmissionPolicy=true",
              "--runtime-config=admissionregistration.k8s.io/v1beta1=true"]


def _serves_policies(admin, version):
    try:
        found = admin.get(GROUP + version)["resources"]
    except KubeError:
        return False
    return any(r["name"] == "mutatingadmissionpolicies" for r in found)


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    """(KubeAPI, the policy API version it serves) with the chart's preflight objects applied."""
    require_kube()
    helm = require_helm()
    from gpugate.testbed.kube import KubeAPI

    server = KubeAPI(str(tmp_path_factory.mktemp("kube"))).start()
    group = "v1"
    if not _serves_policies(server.admin(), "v1"):
        server.stop()
        if "apiserver_args" not in inspect.signature(KubeAPI).parameters:
            pytest.skip("kube-apiserver %s serves no admissionregistration.k8s.io/v1 MutatingAdmissionPolicy "
                        "and the testbed cannot turn its beta gate on" % server.version)
        server = KubeAPI(str(tmp_path_factory.mktemp("kube-beta")), apiserver_args=BETA_FLAGS).start()
        group = "v1beta1"
        if not _serves_policies(server.admin(), group):
            server.stop()
            pytest.skip("kube-apiserver %s serves no MutatingAdmissionPolicy, even with its beta gate"
                        % server.version)
    try:
        docs = manifests.parse(manifests.helm_template(
            helm, os.path.join(ROOT, manifests.CHART), "--set", "preflight.enabled=true",
            "--set", "image.repository=registry.site.example/gpugate", "--set", "image.tag=9.9",
            "--set", "preflight.policyApiVersion=admissionregistration.k8s.io/" + group,
            "--show-only", "templates/preflight.yaml"), "helm template")
        admin = server.admin()
        for doc in docs:
            kind = doc["kind"]
            if kind == "Service":  # in gpugate's namespace (the testbed's API server makes it)
                where = "/api/v1/namespaces/%s/services" % doc["metadata"]["namespace"]
            else:
                where = GROUP + group + "/" + {"MutatingAdmissionPolicy": "mutatingadmissionpolicies",
                                               "MutatingAdmissionPolicyBinding": "mutatingadmissionpolicybindings"}[kind]
            admin.request("POST", where, doc, query={"fieldValidation": "Strict"})
        for name, labels in (("optin", {LABEL: "true"}), ("plain", {}),
                             ("strict", {LABEL: "true", "pod-security.kubernetes.io/enforce": "restricted"})):
            admin.create("/api/v1/namespaces", {"metadata": {"name": name, "labels": labels}})
        server.docs = docs
        _wait_enforced(admin)
        yield server
    finally:
        server.stop()


def _pod(name, namespace="optin", gpus="nvidia.com/gpu", labels=None, init=None, claims=False):
    container = {"name": "main", "image": "trainer:1", "command": ["train"]}
    if gpus:
        container["resources"] = {"limits": {gpus: "8"}}
    spec = {"containers": [container], "restartPolicy": "Never"}
    if init:
        spec["initContainers"] = init
    if claims:
        spec["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "eight-gpus"}]
        container["resources"] = {"claims": [{"name": "gpus"}]}
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels or {}}, "spec": spec}


def _create(admin, pod):
    made = admin.create("/api/v1/namespaces/%s/pods" % pod["metadata"]["namespace"], pod)
    return made["spec"].get("initContainers") or []


def _wait_enforced(admin, timeout=30.0):
    """A new policy is enforced a moment after it is created (the API server loads it): probed as it is used."""
    deadline = time.monotonic() + timeout
    n = 0
    while time.monotonic() < deadline:
        n += 1
        init = _create(admin, _pod("probe-%d" % n))
        admin.request("DELETE", "/api/v1/namespaces/optin/pods/probe-%d" % n)
        if init:
            return
        time.sleep(0.3)
    raise AssertionError("the gpugate-preflight policy was not enforced in %.0fs" % timeout)


def _names(init):
    return [c["name"] for c in init]


def test_exactly_the_opted_in_gpu_pods_get_the_init_container(api):
    admin = api.admin()
    cases = {
        "optin-limits": (_pod("optin-limits"), True),
        "optin-amd": (_pod("optin-amd", gpus="amd.com/gpu"), True),
        "optin-dra": (_pod("optin-dra", gpus=None, claims=True), True),
        "optin-cpu": (_pod("optin-cpu", gpus=None), False),
        "optin-other-resource": (_pod("optin-other-resource", gpus="example.com/fpga"), False),
        "optin-opted-out": (_pod("optin-opted-out", labels={LABEL: "false"}), False),
        "plain-gpu": (_pod("plain-gpu", "plain"), False),
        "plain-gpu-labelled": (_pod("plain-gpu-labelled", "plain", labels={LABEL: "true"}), True),
        "plain-cpu-labelled": (_pod("plain-cpu-labelled", "plain", gpus=None, labels={LABEL: "true"}), False),
        "plain-gpu-other-label": (_pod("plain-gpu-other-label", "plain", labels={LABEL: "yes"}), False),
    }
    got = {name: _names(_create(admin, pod)) for name, (pod, _) in cases.items()}
    assert got == {name: ["gpugate-preflight"] if wanted else [] for name, (_, wanted) in cases.items()}
    # A Pod labelled so in an opted-in namespace is matched by one binding only: one init container.
    assert _names(_create(admin, _pod("optin-labelled", labels={LABEL: "true"}))) == ["gpugate-preflight"]


def test_it_goes_first_before_the_pods_own_init_containers(api):
    own = [{"name": "fetch-data", "image": "fetch:1", "command": ["fetch"]}]
    assert _names(_create(api.admin(), _pod("with-init", init=own))) == ["gpugate-preflight", "fetch-data"]


def test_a_second_admission_does_not_add_it_twice(api):
    """The injected Pod's spec admitted again (a controller copying it, a re-create): still one."""
    admin = api.admin()
    first = admin.create("/api/v1/namespaces/optin/pods", _pod("once"))
    again = {"metadata": {"name": "once-again", "namespace": "optin"}, "spec": first["spec"]}
    assert _names(_create(admin, again)) == ["gpugate-preflight"]


def test_a_users_own_gpugate_preflight_is_kept(api):
    """A Pod that names an init container gpugate-preflight itself keeps its own (and so skips the
    preflight for itself only: docs/how-to/kubernetes-preflight.md)."""
    own = [{"name": "gpugate-preflight", "image": "busybox:1", "command": ["true"]}]
    init = _create(api.admin(), _pod("own-preflight", init=own))
    assert _names(init) == ["gpugate-preflight"] and init[0]["image"] == "busybox:1"


def test_the_injected_container_is_unprivileged_and_the_sites_snippet(api):
    """What the policy injects equals `--print-init-container`'s, both as the API server stores them
    (its defaults applied alike); and a namespace enforcing Pod Security "restricted" admits it."""
    from gpugate.cli.main import main

    admin = api.admin()
    injected = _create(admin, _pod("injected"))[0]
    printed = CliRunner().invoke(main, ["kube-preflight", "--print-init-container", "--format", "json",
                                        "--image", IMAGE, "--agent", "gpugate-preflight.gpugate.svc:9412"])
    assert printed.exit_code == 0, printed.output
    by_hand = _create(admin, _pod("by-hand", "plain", init=[json.loads(printed.output)]))[0]
    assert injected == by_hand
    assert injected["command"] == ["gpugate", "kube-preflight"] and injected["image"] == IMAGE
    security = injected["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] == 65534
    assert security["allowPrivilegeEscalation"] is False and security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]} and security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "privileged" not in security and "volumeMounts" not in injected and "ports" not in injected
    strict = _pod("strict", "strict")
    strict["spec"]["securityContext"] = {"runAsNonRoot": True, "runAsUser": 1000,
                                         "seccompProfile": {"type": "RuntimeDefault"}}
    strict["spec"]["containers"][0]["securityContext"] = {"allowPrivilegeEscalation": False,
                                                          "capabilities": {"drop": ["ALL"]}}
    assert _names(_create(admin, strict)) == ["gpugate-preflight"]
    # ... where the same Pod with a privileged init container of the user's own is refused there.
    strict["metadata"]["name"] = "strict-privileged"
    strict["spec"]["initContainers"] = [{"name": "mine", "image": "x:1", "securityContext": {"privileged": True}}]
    with pytest.raises(KubeError) as refused:
        _create(admin, strict)
    assert refused.value.status == 403 and "privileged" in str(refused.value)


def test_the_agents_service_stays_on_the_node(api):
    service = api.admin().get("/api/v1/namespaces/gpugate/services/gpugate-preflight")["spec"]
    assert service["internalTrafficPolicy"] == "Local"
    assert service["ports"] == [{"name": "preflight", "protocol": "TCP", "port": 9412, "targetPort": 9412}]
    assert service["selector"] == {"app.kubernetes.io/name": "gpugate-node-agent"}
