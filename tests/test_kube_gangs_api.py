"""gpugate.kube.gangs against a real kube-apiserver: the CRDs of JobSet,
Kueue's Workload and Volcano's PodGroup (tests/fixtures/gangs/crds/: their
real group, version, kind and plural), the objects and Pods as those
controllers write them (tests/fixtures/gangs/), Kubernetes' own PodGroup
where the release serves it, and every read made with the node agent's own token ("agent"), holding
only the chart's preflight RBAC (templates/preflight-rbac.yaml, on with
preflight.enabled; its rbac.yaml grants the agent no Pod reads).

Kubernetes' PodGroup (spec.schedulingGroup) is served by 1.37 with
GenericWorkload on and scheduling.k8s.io/v1beta1 enabled (KubeAPI's
apiserver_args); 1.34 has no such API, and no release built here has 1.35's
spec.workloadRef: those cases skip, saying so (tests/test_kube_gangs.py
holds their shapes)."""

import copy
import json
import os
import subprocess
import time

import pytest
from kube_builds import require_kube

from gpugate.kube.client import KubeError
from gpugate.kube.gangs import GangError, members, of_pod
from gpugate.testbed import manifests

pytestmark = pytest.mark.kube

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "gangs")
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
RBAC = os.path.join(ROOT, "deploy", "kubernetes", "preflight", "preflight-rbac.yaml")
SERVER_OWNED = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields")


def load(name):
    with open(os.path.join(FIXTURES, name)) as handle:
        return json.load(handle)


def _workload_args(version: str):
    """kube-apiserver flags that serve Kubernetes' PodGroup on this release
    ([] where its kube-apiserver knows no GenericWorkload feature gate)."""
    from gpugate.testbed.kube import cache_dir

    helped = subprocess.run([os.path.join(cache_dir(), version, "kube-apiserver"), "-h"], capture_output=True,
                            text=True, timeout=60).stdout
    if "GenericWorkload=true|false (BETA" in helped:  # 1.37: scheduling.k8s.io/v1beta1
        return ["--feature-gates=GenericWorkload=true", "--runtime-config=scheduling.k8s.io/v1beta1=true"]
    if "GenericWorkload=true|false (ALPHA" in helped:  # 1.35, 1.36
        return ["--feature-gates=GenericWorkload=true", "--runtime-config=api/alpha=true"]
    return []


def _wait(check, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = check()
            if found:
                return found
        except KubeError:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError("%s: not so in %.0fs" % (what, timeout))
        time.sleep(0.2)


def _served(admin, group_version, plural):
    try:
        return plural in [r["name"] for r in admin.get("/apis/" + group_version)["resources"]]
    except KubeError as exc:
        if exc.status == 404:
            return False
        raise


class Rig:
    def __init__(self, api, admin):
        self.api, self.admin, self.agent = api, admin, api.client("agent")

    def create(self, obj, collection):
        """``obj`` as its controller wrote it, less what the server owns; its status written after."""
        body = copy.deepcopy(obj)
        for key in SERVER_OWNED:
            body["metadata"].pop(key, None)
        status = body.pop("status", None)
        made = self.admin.create(collection, body)
        if status and not collection.startswith("/apis/scheduling.volcano.sh"):  # Volcano's CRD has no status subresource
            made = self.admin.patch(collection + "/" + made["metadata"]["name"] + "/status", {"status": status})
        return made

    def pods(self, pods):
        for pod in pods:
            self.create(pod, "/api/v1/namespaces/%s/pods" % pod["metadata"]["namespace"])

    def read(self, path):
        return self.agent.get(path)

    def candidates(self, gang):
        """The gang's candidate Pods as the node agent lists them (its selector, in its namespace)."""
        query = {"labelSelector": gang.selector} if gang.selector else {}
        return list(self.agent.list_pages("/api/v1/namespaces/%s/pods" % gang.namespace, **query))

    def pod(self, namespace, name):
        return self.agent.get("/api/v1/namespaces/%s/pods/%s" % (namespace, name))


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    from gpugate.testbed.kube import KubeAPI, built_versions

    require_kube()
    version = os.environ.get("GPUGATE_KUBE_VERSION") or built_versions()[-1]
    api = KubeAPI(str(tmp_path_factory.mktemp("kube")), version, apiserver_args=_workload_args(version)).start()
    try:
        admin = api.admin()
        # The chart's preflight RBAC, as scripts/helm-render renders it (tests/test_helm_chart.py holds them equal).
        with open(RBAC) as handle:
            docs = manifests.parse(handle.read(), RBAC)
        assert {d["kind"] for d in docs} == {"ClusterRole", "ClusterRoleBinding"}
        manifests.apply(admin, docs)
        for name in sorted(os.listdir(os.path.join(FIXTURES, "crds"))):
            with open(os.path.join(FIXTURES, "crds", name)) as handle:
                admin.create(CRDS, manifests.parse(handle.read(), name)[0])
        _wait(lambda: _served(admin, "jobset.x-k8s.io/v1alpha2", "jobsets")
              and _served(admin, "kueue.x-k8s.io/v1beta1", "workloads")
              and _served(admin, "scheduling.volcano.sh/v1beta1", "podgroups"), "the CRDs served")
        for ns in ("ml", "team-a", "hpc"):
            admin.create("/api/v1/namespaces", {"metadata": {"name": ns}})
        rig = Rig(api, admin)
        _wait(lambda: rig.agent.get("/api/v1/namespaces/ml/pods") is not None, "the agent's RBAC in force")
        yield rig
    finally:
        api.stop()


def test_jobset_gang_through_the_agents_token(rig):
    fx = load("jobset-v1alpha2.json")
    jobset = rig.create(fx["jobset"], "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ml/jobsets")
    rig.pods(fx["pods"])
    pod = rig.pod("ml", fx["pods"][0]["metadata"]["name"])
    gang = of_pod(pod, rig.read)
    assert (gang.kind, gang.size) == ("jobset", 5)
    assert gang.key == "jobset/ml/pytorch/0/" + jobset["metadata"]["uid"]  # the server's uid, not the fixture's
    names = sorted(p["metadata"]["name"] for p in members(gang, rig.candidates(gang)))
    assert names == sorted(p["metadata"]["name"] for p in fx["pods"])

    # Restarted (the controller's status.restarts, then its new Jobs' Pods): a new gang; the old Pods undecided.
    rig.admin.patch("/apis/jobset.x-k8s.io/v1alpha2/namespaces/ml/jobsets/pytorch/status",
                    {"status": {"restarts": 1}})
    rig.pods(fx["restarted_pods"])
    new = of_pod(rig.pod("ml", fx["restarted_pods"][0]["metadata"]["name"]), rig.read)
    assert new.key == "jobset/ml/pytorch/1/" + jobset["metadata"]["uid"] and new.key != gang.key
    assert [p["metadata"]["name"] for p in members(new, rig.candidates(new))] == [
        fx["restarted_pods"][0]["metadata"]["name"]]
    with pytest.raises(GangError, match="restart attempt 0; the JobSet is at 1"):
        of_pod(pod, rig.read)


def test_kueue_members_drop_the_deleted_and_the_finished(rig):
    fx = load("kueue-pod-group.json")
    rig.pods(fx["pods"] + fx["other_group_pods"])
    first, second, third = (p["metadata"]["name"] for p in fx["pods"])
    with pytest.raises(GangError, match="Kueue Workload team-a/sample-group .* does not exist"):
        of_pod(rig.pod("team-a", first), rig.read)  # Kueue has not made the group's Workload yet
    workload = rig.create(fx["workload"], "/apis/kueue.x-k8s.io/v1beta1/namespaces/team-a/workloads")
    gang = of_pod(rig.pod("team-a", first), rig.read)
    assert (gang.kind, gang.size, gang.key) == ("kueue", 3, "kueue/team-a/sample-group/" + workload["metadata"]["uid"])
    assert sorted(p["metadata"]["name"] for p in members(gang, rig.candidates(gang))) == [first, second, third]
    # One being deleted (a finalizer keeps it, with its deletionTimestamp), one finished.
    base = "/api/v1/namespaces/team-a/pods/"
    rig.admin.patch(base + second, {"metadata": {"finalizers": ["example.com/keep"]}})
    rig.admin.request("DELETE", base + second)
    rig.admin.patch(base + third + "/status", {"status": {"phase": "Succeeded"}})
    try:
        assert rig.pod("team-a", second)["metadata"].get("deletionTimestamp")
        assert [p["metadata"]["name"] for p in members(gang, rig.candidates(gang))] == [first]
    finally:
        rig.admin.patch(base + second, {"metadata": {"finalizers": None}})


def test_volcano_gang_through_the_agents_token(rig):
    fx = load("volcano-vcjob.json")
    group = rig.create(fx["podgroup"], "/apis/scheduling.volcano.sh/v1beta1/namespaces/hpc/podgroups")
    rig.pods(fx["pods"])
    gang = of_pod(rig.pod("hpc", "mpi-worker-1"), rig.read)
    assert (gang.kind, gang.size, gang.selector) == ("volcano", 3, "volcano.sh/job-name=mpi")
    assert gang.key == "volcano/hpc/%s/%s" % (group["metadata"]["name"], group["metadata"]["uid"])
    assert sorted(p["metadata"]["name"] for p in members(gang, rig.candidates(gang))) == [
        "mpi-master-0", "mpi-worker-0", "mpi-worker-1"]
    # The PodGroup deleted and made again: a new key.
    rig.admin.request("DELETE", "/apis/scheduling.volcano.sh/v1beta1/namespaces/hpc/podgroups/"
                      + group["metadata"]["name"])
    _wait(lambda: not _exists(rig.admin, "/apis/scheduling.volcano.sh/v1beta1/namespaces/hpc/podgroups/"
                              + group["metadata"]["name"]), "the PodGroup deleted")
    with pytest.raises(GangError, match="does not exist"):
        of_pod(rig.pod("hpc", "mpi-worker-1"), rig.read)
    again = rig.create(fx["podgroup"], "/apis/scheduling.volcano.sh/v1beta1/namespaces/hpc/podgroups")
    new = of_pod(rig.pod("hpc", "mpi-worker-1"), rig.read)
    assert new.key == "volcano/hpc/%s/%s" % (group["metadata"]["name"], again["metadata"]["uid"])
    assert new.key != gang.key and new.size == gang.size


def _exists(admin, path):
    try:
        admin.get(path)
        return True
    except KubeError as exc:
        if exc.status == 404:
            return False
        raise


def test_kubernetes_podgroup_gang(rig):
    served = [v for v in ("v1beta1", "v1alpha2") if _served(rig.admin, "scheduling.k8s.io/" + v, "podgroups")]
    if not served:
        pytest.skip("kube-apiserver %s serves no scheduling.k8s.io PodGroup (v1beta1 nor v1alpha2): Kubernetes' "
                    "PodGroup API is 1.36's (GenericWorkload)" % rig.api.version)
    fx = load("workload-podgroup-v1beta1.json")
    fx["podgroup"]["apiVersion"] = "scheduling.k8s.io/" + served[0]
    group = rig.create(fx["podgroup"], "/apis/scheduling.k8s.io/%s/namespaces/ml/podgroups" % served[0])
    rig.pods(fx["pods"])
    pod = rig.pod("ml", fx["pods"][0]["metadata"]["name"])
    assert pod["spec"]["schedulingGroup"] == {"podGroupName": "training-worker-0"}  # the server kept the field
    gang = of_pod(pod, rig.read)
    assert (gang.kind, gang.size, gang.selector) == ("workload", 4, "")
    assert gang.key == "workload/ml/podgroup/training-worker-0/" + group["metadata"]["uid"]
    names = sorted(p["metadata"]["name"] for p in members(gang, rig.candidates(gang)))
    assert names == sorted(p["metadata"]["name"] for p in fx["pods"])  # not the JobSet's Pods beside them


def test_workload_ref_of_1_35(rig):
    schemas = rig.admin.get("/openapi/v3/api/v1")["components"]["schemas"]
    if "workloadRef" not in schemas["io.k8s.api.core.v1.PodSpec"]["properties"]:
        pytest.skip("kube-apiserver %s has no Pod spec.workloadRef (1.35's; 1.36 replaced it with "
                    "spec.schedulingGroup)" % rig.api.version)
    fx = load("workload-workloadref-v1alpha1.json")
    rig.create(fx["workload"], "/apis/scheduling.k8s.io/v1alpha1/namespaces/ml/workloads")
    rig.pods(fx["pods"])
    gang = of_pod(rig.pod("ml", fx["pods"][0]["metadata"]["name"]), rig.read)
    assert (gang.kind, gang.size) == ("workload", 4)


def test_an_identity_without_the_preflight_rights_leaves_the_gang_undecided(rig):
    """The keeper's token (no pods, no gang objects): of_pod() raises
    GangError naming the refusal, never "no gang"; the agent, with the
    preflight's rights, still reads no secrets."""
    fx = load("volcano-vcjob.json")
    keeper = rig.api.client("keeper")
    with pytest.raises(KubeError) as info:
        keeper.get("/api/v1/namespaces/hpc/pods")
    assert info.value.status == 403
    pod = copy.deepcopy(fx["pods"][0])
    with pytest.raises(GangError, match="could not be read.*403"):
        of_pod(pod, keeper.get)
    with pytest.raises(KubeError) as info:
        rig.agent.get("/api/v1/namespaces/gpugate/secrets")
    assert info.value.status == 403
