"""gpugate.kube.gangs: a Pod's gang found as each gang scheduler writes it
(tests/fixtures/gangs/, its README names each shape's source), with no API
server: of_pod() reads through a dict of objects.  The same Pods and objects
on a real kube-apiserver: tests/test_kube_gangs_api.py."""

import copy
import json
import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpugate.kube import gangs
from gpugate.kube.client import KubeError
from gpugate.kube.gangs import Gang, GangError, is_member, members, of_pod

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "gangs")
PG_PATH = "/apis/scheduling.k8s.io/v1beta1/namespaces/ml/podgroups/training-worker-0"
WL_PATH = "/apis/scheduling.k8s.io/v1alpha1/namespaces/ml/workloads/pytorch"
JS_PATH = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/ml/jobsets/pytorch"
VC_PATH = "/apis/scheduling.volcano.sh/v1beta1/namespaces/hpc/podgroups/mpi-3b0e9a5c-22d4-4f1e-8e43-9f0a7c6d5b41"
KQ_PATH = "/apis/kueue.x-k8s.io/v1beta1/namespaces/team-a/workloads/sample-group"


def load(name):
    with open(os.path.join(FIXTURES, name)) as handle:
        return json.load(handle)


def reader(objects):
    """read(path) over {path: object}; 404 for anything else, as the API server answers."""
    asked = []

    def read(path):
        asked.append(path)
        if path not in objects:
            raise KubeError("kubernetes GET %s: 404 NotFound: not found" % path, 404, "NotFound")
        return copy.deepcopy(objects[path])

    read.asked = asked
    return read


# ------------------------------------------------------------------ each kind as written
def test_podgroup_gang_of_1_37():
    fx = load("workload-podgroup-v1beta1.json")
    read = reader({PG_PATH: fx["podgroup"]})
    gang = of_pod(fx["pods"][0], read)
    assert gang == Gang("workload", "workload/ml/podgroup/training-worker-0/" + fx["podgroup"]["metadata"]["uid"],
                        "ml", 4, "")
    assert members(gang, fx["pods"]) == fx["pods"]


def test_podgroup_of_1_36_is_read_at_v1alpha2_when_v1beta1_is_not_served():
    fx = load("workload-podgroup-v1beta1.json")
    path = PG_PATH.replace("v1beta1", "v1alpha2")
    read = reader({path: dict(fx["podgroup"], apiVersion="scheduling.k8s.io/v1alpha2")})
    assert of_pod(fx["pods"][0], read).size == 4
    assert read.asked == [PG_PATH, path]


def test_podgroup_basic_policy_is_no_gang():
    fx = load("workload-podgroup-v1beta1.json")
    fx["podgroup"]["spec"]["schedulingPolicy"] = {"basic": {}}
    assert of_pod(fx["pods"][0], reader({PG_PATH: fx["podgroup"]})) is None


def test_workloadref_gang_of_1_35():
    fx = load("workload-workloadref-v1alpha1.json")
    read = reader({WL_PATH: fx["workload"]})
    workers, driver = fx["pods"][:4], fx["pods"][4]
    gang = of_pod(workers[0], read)
    assert gang.size == 4 and gang.kind == "workload"
    assert gang.key == "workload/ml/workload/pytorch/workers/" + fx["workload"]["metadata"]["uid"]
    assert members(gang, fx["pods"]) == workers  # the driver's pod group is another
    assert of_pod(driver, read) is None  # its group's policy is basic


def test_workloadref_replica_key_splits_gangs():
    fx = load("workload-workloadref-v1alpha1.json")
    read = reader({WL_PATH: fx["workload"]})
    a, b = copy.deepcopy(fx["pods"][0]), copy.deepcopy(fx["pods"][1])
    a["spec"]["workloadRef"]["podGroupReplicaKey"] = "r0"
    b["spec"]["workloadRef"]["podGroupReplicaKey"] = "r1"
    ga, gb = of_pod(a, read), of_pod(b, read)
    assert ga.key != gb.key and ga.key.startswith("workload/ml/workload/pytorch/workers/r0/")
    assert members(ga, [a, b]) == [a] and members(gb, [a, b]) == [b]


def test_workloadref_naming_no_such_pod_group_is_undecided():
    fx = load("workload-workloadref-v1alpha1.json")
    pod = copy.deepcopy(fx["pods"][0])
    pod["spec"]["workloadRef"]["podGroup"] = "ps"
    with pytest.raises(GangError, match="no pod group 'ps'"):
        of_pod(pod, reader({WL_PATH: fx["workload"]}))


def test_jobset_gang_size_key_selector():
    fx = load("jobset-v1alpha2.json")
    read = reader({JS_PATH: fx["jobset"]})
    gang = of_pod(fx["pods"][0], read)
    # workers: 2 replicas x 2 Pods, launcher 1 x 1 (jobset_types.go: a Job's Pods are min(parallelism, completions))
    assert gang.size == 5
    assert gang.key == "jobset/ml/pytorch/0/" + fx["jobset"]["metadata"]["uid"]
    assert gang.selector == "jobset.sigs.k8s.io/jobset-name=pytorch,jobset.sigs.k8s.io/restart-attempt=0"
    everyone = fx["pods"] + fx["restarted_pods"]
    assert members(gang, everyone) == fx["pods"]  # not the Pod of restart attempt 1


def test_a_restarted_jobset_is_a_new_gang():
    fx = load("jobset-v1alpha2.json")
    old = of_pod(fx["pods"][0], reader({JS_PATH: fx["jobset"]}))
    fx["jobset"]["status"]["restarts"] = 1
    read = reader({JS_PATH: fx["jobset"]})
    new = of_pod(fx["restarted_pods"][0], read)
    assert new.key == "jobset/ml/pytorch/1/" + fx["jobset"]["metadata"]["uid"] and new.key != old.key
    assert members(new, fx["pods"] + fx["restarted_pods"]) == fx["restarted_pods"]
    with pytest.raises(GangError, match="restart attempt 0; the JobSet is at 1"):
        of_pod(fx["pods"][0], read)  # a Pod of the attempt being replaced


def test_jobset_uid_label_names_its_own_jobset():
    fx = load("jobset-v1alpha2.json")
    pods = copy.deepcopy(fx["pods"])
    for pod in pods:  # newer JobSet releases label Pods with the JobSet's uid too
        pod["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-uid"] = fx["jobset"]["metadata"]["uid"]
    gang = of_pod(pods[0], reader({JS_PATH: fx["jobset"]}))
    stranger = copy.deepcopy(pods[1])
    stranger["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-uid"] = "an-older-jobset"
    assert members(gang, pods + [stranger]) == pods
    recreated = dict(fx["jobset"], metadata=dict(fx["jobset"]["metadata"], uid="a-new-uid"))
    with pytest.raises(GangError, match="the Pod's was deleted"):
        of_pod(pods[0], reader({JS_PATH: recreated}))


def test_jobset_that_starts_in_order_is_undecided():
    fx = load("jobset-v1alpha2.json")
    fx["jobset"]["spec"]["startupPolicy"] = {"startupPolicyOrder": "InOrder"}
    with pytest.raises(GangError, match="InOrder"):
        of_pod(fx["pods"][0], reader({JS_PATH: fx["jobset"]}))
    fx = load("jobset-v1alpha2.json")
    fx["jobset"]["spec"]["replicatedJobs"][0]["dependsOn"] = [{"name": "launcher", "status": "Ready"}]
    with pytest.raises(GangError, match="dependsOn"):
        of_pod(fx["pods"][0], reader({JS_PATH: fx["jobset"]}))


def test_kueue_pod_group():
    fx = load("kueue-pod-group.json")
    read = reader({KQ_PATH: fx["workload"]})
    gang = of_pod(fx["pods"][0], read)
    assert gang == Gang("kueue", "kueue/team-a/sample-group/" + fx["workload"]["metadata"]["uid"], "team-a", 3,
                        "kueue.x-k8s.io/pod-group-name=sample-group")
    assert read.asked == [KQ_PATH.replace("v1beta1", "v1beta2"), KQ_PATH]  # newer Kueue's version first
    assert members(gang, fx["pods"] + fx["other_group_pods"]) == fx["pods"]


def test_kueue_pod_group_of_a_prebuilt_workload():
    fx = load("kueue-pod-group.json")
    pods = copy.deepcopy(fx["pods"])
    for pod in pods:
        pod["metadata"]["labels"]["kueue.x-k8s.io/prebuilt-workload-name"] = "made-before"
    path = KQ_PATH.replace("sample-group", "made-before")
    gang = of_pod(pods[0], reader({path: fx["workload"]}))
    assert gang.key == "kueue/team-a/sample-group/" + fx["workload"]["metadata"]["uid"] and members(gang, pods) == pods
    with pytest.raises(GangError, match="Kueue Workload team-a/made-before .pod group sample-group. does not exist"):
        of_pod(pods[0], reader({KQ_PATH: fx["workload"]}))


def test_volcano_pod_group():
    fx = load("volcano-vcjob.json")
    read = reader({VC_PATH: fx["podgroup"]})
    gang = of_pod(fx["pods"][1], read)
    assert gang.kind == "volcano" and gang.size == 3 and gang.selector == "volcano.sh/job-name=mpi"
    assert gang.key == "volcano/hpc/%s/%s" % (fx["podgroup"]["metadata"]["name"], fx["podgroup"]["metadata"]["uid"])
    assert members(gang, fx["pods"]) == fx["pods"]
    # The same group named by Volcano's own annotation key.
    pod = copy.deepcopy(fx["pods"][0])
    pod["metadata"]["annotations"]["scheduling.volcano.sh/group-name"] = pod["metadata"]["annotations"].pop(
        "scheduling.k8s.io/group-name")
    assert of_pod(pod, read) == gang and is_member(gang, pod)


def test_a_new_podgroup_uid_is_a_new_key():
    fx = load("volcano-vcjob.json")
    first = of_pod(fx["pods"][0], reader({VC_PATH: fx["podgroup"]}))
    fx["podgroup"]["metadata"]["uid"] = "d0e1f2a3-b4c5-4d6e-8f70-8192a3b4c5d6"
    second = of_pod(fx["pods"][0], reader({VC_PATH: fx["podgroup"]}))
    assert first.key != second.key and first.size == second.size


# ------------------------------------------------------------------ members(), the first kind, the unreadable
def test_members_drop_deleted_and_finished_pods():
    fx = load("kueue-pod-group.json")
    pods = copy.deepcopy(fx["pods"])
    gang = of_pod(pods[0], reader({KQ_PATH: fx["workload"]}))
    pods[1]["metadata"]["deletionTimestamp"] = "2026-12-05T09:00:00Z"
    pods[2]["status"]["phase"] = "Succeeded"
    failed = copy.deepcopy(pods[0])
    failed["status"]["phase"] = "Failed"
    running = copy.deepcopy(pods[0])
    running["status"]["phase"] = "Running"
    elsewhere = copy.deepcopy(pods[0])
    elsewhere["metadata"]["namespace"] = "team-b"
    assert members(gang, pods + [failed, running, elsewhere]) == [pods[0], running]


def test_the_first_kind_in_order_decides():
    """A JobSet that uses the Workload API (its GangPolicy) writes both."""
    js, wl = load("jobset-v1alpha2.json"), load("workload-workloadref-v1alpha1.json")
    pod = copy.deepcopy(js["pods"][0])
    pod["spec"]["workloadRef"] = {"name": "pytorch", "podGroup": "workers"}
    read = reader({JS_PATH: js["jobset"], WL_PATH: wl["workload"]})
    assert of_pod(pod, read).kind == "workload"
    assert of_pod(pod, read, kinds=("jobset", "workload")).kind == "jobset"
    assert of_pod(pod, read, kinds=("kueue", "volcano")) is None
    with pytest.raises(GangError, match="unknown gang kinds 'slurm'"):
        of_pod(pod, read, kinds=("slurm",))


def test_every_kind_has_its_plugin():
    from gpugate.kube.gangs_kinds import PLUGINS

    assert tuple(PLUGINS) == gangs.KINDS


def test_a_single_pod_is_no_gang():
    pod = {"metadata": {"name": "lone", "namespace": "ml", "labels": {"app": "x"}}, "spec": {"containers": []}}
    assert of_pod(pod, reader({})) is None


@pytest.mark.parametrize("status", [404, 403, 0])
def test_a_gang_whose_object_cannot_be_read_is_undecided(status):
    fx = load("volcano-vcjob.json")

    def read(path):
        raise KubeError("kubernetes GET %s: %d" % (path, status), status)

    with pytest.raises(GangError, match="Volcano PodGroup hpc/mpi-"):
        of_pod(fx["pods"][0], read)


# ------------------------------------------------------------------ malformed input
def _kueue(total):
    return {"metadata": {"name": "p", "namespace": "ns", "labels": {"kueue.x-k8s.io/pod-group-name": "g"},
                         "annotations": {"kueue.x-k8s.io/pod-group-total-count": total}}}


KUEUE_G = reader({"/apis/kueue.x-k8s.io/v1beta1/namespaces/ns/workloads/g": {"metadata": {"uid": "u"}}})


@pytest.mark.parametrize("total, why", [("0", "is 0"), ("100001", "is 100001"), ("four", "not a count"),
                                        ("-1", "not a count"), ("1.5", "not a count"), ("", "not a count"),
                                        ("99999999999999999999", "not a count"), ("٣", "not a count")])
def test_a_bad_total_count_is_undecided(total, why):
    with pytest.raises(GangError, match=why):
        of_pod(_kueue(total), KUEUE_G)


def test_a_total_count_at_the_bounds_is_taken():
    assert of_pod(_kueue("1"), KUEUE_G).size == 1
    assert of_pod(_kueue(str(gangs.MAX_SIZE)), KUEUE_G).size == gangs.MAX_SIZE


@pytest.mark.parametrize("mutate, why", [
    (lambda o: o["spec"]["schedulingPolicy"]["gang"].update(minCount=0), "is 0"),
    (lambda o: o["spec"]["schedulingPolicy"]["gang"].update(minCount=10 ** 9), "is 1000000000"),
    (lambda o: o["spec"]["schedulingPolicy"]["gang"].update(minCount="4"), None),  # digits: taken
    (lambda o: o["spec"]["schedulingPolicy"]["gang"].update(minCount=True), "not"),
    (lambda o: o["spec"]["schedulingPolicy"]["gang"].pop("minCount"), "not a count"),
    (lambda o: o["spec"].update(schedulingPolicy={}), "neither gang nor basic"),
    (lambda o: o["spec"].update(schedulingPolicy="gang"), "is not dict"),
    (lambda o: o.pop("spec"), "no scheduling policy"),
    (lambda o: o["metadata"].pop("uid"), "has no uid"),
    (lambda o: o.update(metadata=[]), "has no metadata"),
])
def test_a_malformed_podgroup_is_undecided(mutate, why):
    _malformed("workload-podgroup-v1beta1.json", "podgroup", PG_PATH, mutate, why, 4)


def _malformed(fixture, name, path, mutate, why, size):
    """The fixture's object changed by ``mutate``: of_pod() of its first Pod
    raises GangError matching ``why`` (None: still a gang of ``size``)."""
    fx = load(fixture)
    mutate(fx[name])
    read = reader({path: fx[name]})
    if why is None:
        assert of_pod(fx["pods"][0], read).size == size
    else:
        with pytest.raises(GangError, match=why):
            of_pod(fx["pods"][0], read)


@pytest.mark.parametrize("mutate, why", [
    (lambda o: o["spec"]["replicatedJobs"][0].update(replicas="2"), None),
    (lambda o: o["spec"]["replicatedJobs"][0].update(replicas=-1), "not a count|is -1"),
    (lambda o: o["spec"]["replicatedJobs"][0]["template"]["spec"].update(parallelism=None), "not a count"),
    (lambda o: o["spec"].update(replicatedJobs=[]), "is 0"),
    (lambda o: o["spec"].update(replicatedJobs={"workers": 2}), "is not list"),
    (lambda o: o["spec"]["replicatedJobs"].append("launcher"), "not an object"),
    (lambda o: o["spec"]["replicatedJobs"][0].update(replicas=100000), "is 200001"),
    (lambda o: o["status"].update(restarts="x"), "not a count"),
])
def test_a_malformed_jobset_is_undecided(mutate, why):
    _malformed("jobset-v1alpha2.json", "jobset", JS_PATH, mutate, why, 5)


@pytest.mark.parametrize("pod, why", [
    (None, "not a JSON object"), ([], "not a JSON object"), ({}, "no metadata"),
    ({"metadata": {"name": "p"}}, "no namespace"),
    ({"metadata": {"namespace": "ns", "labels": ["a"]}}, "not a map of strings"),
    ({"metadata": {"namespace": "ns", "labels": {"kueue.x-k8s.io/pod-group-name": 3}}}, "not a map of strings"),
    ({"metadata": {"namespace": "ns", "labels": {"kueue.x-k8s.io/pod-group-name": "g"}}}, "no kueue.x-k8s.io/pod"),
    ({"metadata": {"namespace": "ns", "labels": {"kueue.x-k8s.io/pod-group-name": "a,b=c"}}}, "not a label value"),
    ({"metadata": {"namespace": "ns", "labels": {"jobset.sigs.k8s.io/jobset-name": "js"}}}, "no jobset.sigs"),
    ({"metadata": {"namespace": "ns"}, "spec": "x"}, "spec is not an object"),
    ({"metadata": {"namespace": "ns"}, "spec": {"schedulingGroup": {}}}, "podGroupName is not a name"),
    ({"metadata": {"namespace": "ns"}, "spec": {"schedulingGroup": {"podGroupName": "a/b"}}}, "is not a name"),
    ({"metadata": {"namespace": "ns"}, "spec": {"workloadRef": {"name": "w"}}}, "podGroup is not a name"),
    ({"metadata": {"namespace": "ns", "annotations": {"scheduling.k8s.io/group-name": ""}}}, "is not a name"),
])
def test_a_malformed_pod_raises_gang_error(pod, why):
    with pytest.raises(GangError, match=why):
        of_pod(pod, reader({}))


def test_is_member_of_malformed_pods_is_false():
    fx = load("kueue-pod-group.json")
    gang = of_pod(fx["pods"][0], reader({KQ_PATH: fx["workload"]}))
    for pod in (None, [], {}, {"metadata": None}, {"metadata": {"namespace": "team-a", "labels": 1}},
                {"metadata": {"namespace": "team-a"}, "status": {"phase": 3}}):
        assert not is_member(gang, pod)
    with pytest.raises(GangError, match="not a list"):
        members(gang, None)


# ------------------------------------------------------------------ properties over generated Pods
JUNK = st.one_of(st.none(), st.integers(-2, 3), st.text(max_size=4), st.lists(st.integers(), max_size=2),
                 st.sampled_from(["", "x/y", "a,b", "-a", "0", "100001", {}]))
GOOD = st.sampled_from(["a", "b", "g-1"])
SIZE = st.integers(1, 9)


def _corrupt(draw, obj, paths):
    """One of ``paths`` in ``obj`` set to junk (a quarter of the time)."""
    if draw(st.integers(0, 3)) == 0:
        path = draw(st.sampled_from(paths))
        target = obj
        for step in path[:-1]:
            target = target.setdefault(step, {}) if isinstance(target, dict) else {}
        if isinstance(target, dict):
            target[path[-1]] = draw(JUNK)
    return obj


@st.composite
def pods(draw):
    """A Pod of one kind (or none, or two: the first in order decides), as
    its controller writes it, alive or not, one field made junk at times."""
    name, labels, annotations, spec = draw(GOOD), {}, {}, {}
    for kind in draw(st.lists(st.sampled_from(["podgroup", "workloadref", "jobset", "kueue", "volcano", "none"]),
                              min_size=1, max_size=2)):
        if kind == "podgroup":
            spec["schedulingGroup"] = {"podGroupName": name}
        elif kind == "workloadref":
            spec["workloadRef"] = dict({"name": name, "podGroup": draw(GOOD)},
                                       **({"podGroupReplicaKey": draw(GOOD)} if draw(st.booleans()) else {}))
        elif kind == "jobset":
            labels.update({"jobset.sigs.k8s.io/jobset-name": name, "jobset.sigs.k8s.io/restart-attempt": "0"})
            if draw(st.booleans()):
                labels["jobset.sigs.k8s.io/jobset-uid"] = draw(st.sampled_from(["u1", "u2"]))
        elif kind == "kueue":
            labels["kueue.x-k8s.io/pod-group-name"] = name
            annotations["kueue.x-k8s.io/pod-group-total-count"] = str(draw(SIZE))
        elif kind == "volcano":
            annotations[draw(st.sampled_from(["scheduling.k8s.io/group-name", "scheduling.volcano.sh/group-name"]))] = name
            if draw(st.booleans()):
                labels["volcano.sh/job-name"] = name
    pod = {"metadata": {"name": "p", "namespace": "ns", "labels": labels, "annotations": annotations}, "spec": spec,
           "status": {"phase": draw(st.sampled_from(["Pending", "Running", "Succeeded", "Failed"]))}}
    if draw(st.integers(0, 4)) == 0:
        pod["metadata"]["deletionTimestamp"] = "2026-12-05T09:00:00Z"
    paths = [("metadata",), ("metadata", "namespace"), ("metadata", "labels"), ("metadata", "annotations"), ("spec",),
             ("status", "phase")] + [("metadata", "labels", k) for k in labels] + [
             ("metadata", "annotations", k) for k in annotations] + [("spec", k, "name") for k in spec]
    return _corrupt(draw, pod, paths)


@st.composite
def objects(draw):
    """An object that answers for every kind (uid, minMember, a gang policy,
    pod groups, replicated jobs), one field made junk at times."""
    obj = {"metadata": {"uid": draw(st.sampled_from(["u1", "u2"]))},
           "spec": {"minMember": draw(SIZE),
                    "schedulingPolicy": draw(st.sampled_from([{"basic": {}}, {"gang": {"minCount": 3}}])),
                    "podGroups": [{"name": n, "policy": {"gang": {"minCount": draw(SIZE)}}} for n in ("a", "b", "g-1")],
                    "replicatedJobs": [{"name": "w", "replicas": draw(SIZE),
                                        "template": {"spec": {"parallelism": draw(SIZE)}}}]},
           "status": {"restarts": 0}}
    return _corrupt(draw, obj, [("metadata",), ("metadata", "uid"), ("spec",), ("spec", "minMember"),
                                ("spec", "schedulingPolicy", "gang"), ("spec", "podGroups"), ("spec", "replicatedJobs"),
                                ("status", "restarts")])


PODS, OBJECTS = pods(), objects()


def _alive(pod):
    status = pod.get("status") or {}
    phase = status.get("phase")  # absent, or any phase but these two (Pending, Running, Unknown): alive
    return not pod["metadata"].get("deletionTimestamp") and (phase is None or isinstance(phase, str)
                                                               and phase not in ("Succeeded", "Failed"))


@settings(max_examples=400, deadline=None)
@given(pod=PODS, obj=OBJECTS, missing=st.booleans())
def test_of_pod_raises_nothing_but_gang_error(pod, obj, missing):
    """Whatever the Pod and the object read, of_pod() returns None, a Gang
    (a known kind, a size in bounds, a key of its kind and namespace, of
    which the Pod is a member while alive), or raises GangError."""
    def read(path):
        if missing:
            raise KubeError("kubernetes GET %s: 404" % path, 404)
        return copy.deepcopy(obj)

    try:
        gang = of_pod(pod, read)
    except GangError:
        return
    if gang is not None:
        assert gang.kind in gangs.KINDS and 1 <= gang.size <= gangs.MAX_SIZE
        assert gang.key.startswith("%s/%s/" % (gang.kind, gang.namespace))
        assert is_member(gang, pod) == _alive(pod)


def test_the_generated_pods_reach_each_kind_and_each_answer():
    """The property above is not vacuous: its generators make gangs of
    every kind, single Pods and GangErrors."""
    seen = set()

    @settings(max_examples=400, deadline=None, derandomize=True)
    @given(pod=PODS, obj=OBJECTS)
    def sample(pod, obj):
        try:
            gang = of_pod(pod, lambda path: copy.deepcopy(obj))
            seen.add(gang.kind if gang else None)
        except GangError:
            seen.add("GangError")

    sample()
    assert seen == set(gangs.KINDS) | {None, "GangError"}


@settings(max_examples=200, deadline=None)
@given(pods=st.lists(PODS, max_size=10), seed=st.integers(0, 2 ** 16))
def test_members_of_a_shuffled_list_are_the_same_set(pods, seed):
    for gang in (Gang("kueue", "kueue/ns/a/u1", "ns", 2, "kueue.x-k8s.io/pod-group-name=a"),
                 Gang("volcano", "volcano/ns/a/u1", "ns", 2, ""), Gang("jobset", "jobset/ns/a/0/u1", "ns", 2, ""),
                 Gang("workload", "workload/ns/podgroup/a/u1", "ns", 2, "")):
        before = members(gang, pods)
        shuffled = list(pods)
        random.Random(seed).shuffle(shuffled)
        after = members(gang, shuffled)
        assert sorted(map(id, before)) == sorted(map(id, after))
        assert all(is_member(gang, p) and _alive(p) for p in after)
