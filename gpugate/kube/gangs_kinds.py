"""The four gang kinds of gpugate.kube.gangs, each as its controller writes
its Pods and objects, and the Gang, GangError and careful readers they
share.  A plugin's claim(pod) reads the Pod alone (None: not this kind;
GangError: this kind, malformed); resolve() reads the gang's object and
returns its Gang (None: the object says it is no gang).

Sources of each name (checked, not guessed):

- Kubernetes' Workload API, KEP-4671 and KEP-5832.  1.36+: Pod
  ``spec.schedulingGroup`` {podGroupName} (kubernetes.io/docs/concepts/
  workloads/pods/scheduling-group/) names a PodGroup of scheduling.k8s.io
  v1alpha2 (1.36, kubernetes.io/docs/concepts/workloads/podgroup-api/) or
  v1beta1 (1.37: kube-apiserver 1.37.2's own /openapi/v3, schemas
  io.k8s.api.core.v1.PodSchedulingGroup and io.k8s.api.scheduling.v1beta1.
  PodGroupSpec: ``schedulingPolicy`` {gang: {minCount}} | {basic: {}}).
  1.35: Pod ``spec.workloadRef`` {name, podGroup, podGroupReplicaKey}
  (kubernetes-client/python docs/V1WorkloadReference.md) names a Workload of
  scheduling.k8s.io/v1alpha1 whose ``spec.podGroups[]`` are {name, policy:
  {gang: {minCount}} | {basic: {}}} (kubernetes.io/docs/concepts/workloads/
  workload-api/ and .../workload-api/policies).
- JobSet: kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go
  (JobSetNameKey, JobSetUIDKey), pkg/constants/constants.go (RestartsKey),
  pkg/controllers/jobset_controller.go labelAndAnnotateObject (the labels on
  each Job and its Pod template: jobset-name, replicatedjob-name,
  restart-attempt = status.restarts, ...; jobset-uid in newer releases).
  The JobSet is jobset.x-k8s.io/v1alpha2 ``jobsets``; a Job's Pods number
  min(parallelism, completions), parallelism 1 by default.
- Kueue plain Pod groups: kubernetes-sigs/kueue pkg/controller/jobs/pod/
  constants/constants.go (GroupNameLabel, GroupTotalCountAnnotation),
  pod_controller.go (workloadName: the prebuilt workload's name, else the
  group's; the Pods gated until the Workload is admitted) and
  kueue.sigs.k8s.io/docs/tasks/run/plain_pods/.  The Workload is
  kueue.x-k8s.io ``workloads``.
- Volcano: volcano-sh/apis pkg/apis/scheduling/v1beta1/labels.go
  (KubeGroupNameAnnotationKey, VolcanoGroupNameAnnotationKey), types.go
  (PodGroupSpec.minMember); volcano-sh/volcano pkg/controllers/job/
  job_controller_util.go createJobPod (annotation scheduling.k8s.io/group-name
  = <job>-<job uid>, label volcano.sh/job-name, from volcano-sh/apis
  pkg/apis/batch/v1alpha1/labels.go JobNameKey)."""

from __future__ import annotations

import re
from gpugate.core.record import dataclass
from typing import Callable, Dict, NamedTuple, Optional, Sequence
from urllib.parse import quote

from gpugate.errors import GpugateError
from gpugate.kube.client import KubeError

SCHEDULING_GROUP, WORKLOAD_REF = "schedulingGroup", "workloadRef"
PODGROUP_VERSIONS = ("v1beta1", "v1alpha2")  # 1.37 serves v1beta1, 1.36 v1alpha2
WORKLOAD_VERSION = "v1alpha1"  # 1.35
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID = "jobset.sigs.k8s.io/jobset-uid"
JOBSET_RESTART = "jobset.sigs.k8s.io/restart-attempt"
JOBSET_API = "/apis/jobset.x-k8s.io/v1alpha2"
KUEUE_GROUP = "kueue.x-k8s.io/pod-group-name"
KUEUE_TOTAL = "kueue.x-k8s.io/pod-group-total-count"
KUEUE_PREBUILT = "kueue.x-k8s.io/prebuilt-workload-name"
KUEUE_VERSIONS = ("v1beta2", "v1beta1")  # newer Kueue releases serve v1beta2 beside v1beta1
VOLCANO_GROUP = ("scheduling.k8s.io/group-name", "scheduling.volcano.sh/group-name")
VOLCANO_JOB = "volcano.sh/job-name"
VOLCANO_API = "/apis/scheduling.volcano.sh/v1beta1"
MAX_SIZE = 100000  # no gang preflight pairs more Pods; a larger count is a typo or a hostile annotation
FINISHED = ("Succeeded", "Failed")
_LABEL_VALUE = re.compile(r"(?=.{1,63}\Z)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")


class GangError(GpugateError):
    """The Pod names a gang that cannot be decided (its object unreadable,
    its size not a count, the Pod malformed): undecided, never "no gang"."""


@dataclass(frozen=True)
class Gang:
    kind: str        # "workload" | "jobset" | "kueue" | "volcano"
    key: str         # stable, unique id of this gang (gpugate.kube.gangs says how it is made)
    namespace: str
    size: int        # how many Pods the gang needs to start (its declared minimum / total count), >= 1
    selector: str    # a labelSelector listing candidate Pods of the gang in its namespace ("" if none)


Read = Callable[[str], dict]


# ------------------------------------------------------------------ reading a Pod
def meta_of(obj, what: str = "the Pod") -> dict:
    if not isinstance(obj, dict):
        raise GangError("%s is not a JSON object (%s)" % (what, type(obj).__name__))
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise GangError("%s has no metadata" % what)
    return meta


def strings(meta: dict, which: str, what: str = "the Pod") -> Dict[str, str]:
    """metadata.labels or .annotations: {} when absent; GangError when not a map of strings."""
    found = meta.get(which)
    if found is None:
        return {}
    if not isinstance(found, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in found.items()):
        raise GangError("%s's metadata.%s is not a map of strings" % (what, which))
    return found


def namespace_of(pod) -> str:
    namespace = meta_of(pod).get("namespace")
    if not isinstance(namespace, str) or not namespace:
        raise GangError("the Pod has no namespace")
    return namespace


def field(obj, *path, kind=dict, what: str = "the Pod"):
    """obj[path...] when each step is a map and the last is of ``kind``; None when absent."""
    for i, step in enumerate(path):
        if not isinstance(obj, dict):
            raise GangError("%s: %s is not an object" % (what, ".".join(path[:i]) or "it"))
        obj = obj.get(step)
        if obj is None:
            return None
    if not isinstance(obj, kind) or (isinstance(obj, bool) and kind is not bool):
        raise GangError("%s: %s is not %s" % (what, ".".join(path), getattr(kind, "__name__", kind)))
    return obj


def name_in(value, what: str) -> str:
    """A name a Pod gives (DNS subdomain or label): a non-empty string without '/'."""
    if not isinstance(value, str) or not value or "/" in value or len(value) > 253:
        raise GangError("%s is not a name: %r" % (what, value if not isinstance(value, str) else value[:80]))
    return value


def count(value, what: str, low: int = 0) -> int:
    """A count the API or an annotation states: an integer (or its decimal
    digits) from ``low`` to MAX_SIZE; GangError otherwise."""
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 9:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise GangError("%s is not a count: %r" % (what, value if not isinstance(value, str) else value[:40]))
    if not low <= value <= MAX_SIZE:
        raise GangError("%s is %d: a gang's count is %d to %d" % (what, value, low, MAX_SIZE))
    return value


def label_value(value, what: str) -> str:
    """A label's value as a selector may name it (the API's own rule); GangError otherwise."""
    if not isinstance(value, str) or not _LABEL_VALUE.match(value):
        raise GangError("%s is not a label value: %r" % (what, value if not isinstance(value, str) else value[:80]))
    return value


def read_object(read: Read, paths: Sequence[str], what: str) -> dict:
    """The object at the first of ``paths`` (one per API version a release
    may serve) that has it; GangError naming it when none has it, or when
    it cannot be read (refused, no answer: never taken as absent)."""
    for path in paths:
        try:
            obj = read(path)
        except KubeError as exc:
            if exc.status == 404:
                continue
            raise GangError("%s could not be read: %s" % (what, exc)) from None
        except GpugateError as exc:
            raise GangError("%s could not be read: %s" % (what, exc)) from None
        meta_of(obj, what)
        return obj
    raise GangError("%s does not exist (%s)" % (what, " nor ".join(paths)))


def uid_of(obj: dict, what: str) -> str:
    uid = meta_of(obj, what).get("uid")
    if not isinstance(uid, str) or not uid or "/" in uid:
        raise GangError("%s has no uid" % what)
    return uid


class Claim(NamedTuple):
    local: str   # the Pod's own identity of its gang (no namespace, no uid)
    uid: str     # a uid of the gang's object the Pod itself carries ("" where none)
    names: tuple  # what resolve() reads


def _path(api: str, namespace: str, plural: str, name: str) -> str:
    return "%s/namespaces/%s/%s/%s" % (api, quote(namespace, safe=""), plural, quote(name, safe=""))


def _gang(kind: str, namespace: str, claim: Claim, uid: str, size: int, selector: str = "") -> Gang:
    return Gang(kind, "%s/%s/%s/%s" % (kind, namespace, claim.local, uid), namespace, size, selector)


def _policy_size(policy, what: str) -> Optional[int]:
    """A Workload API scheduling policy's minCount; None for basic (no gang)."""
    if not isinstance(policy, dict):
        raise GangError("%s has no scheduling policy" % what)
    if policy.get("gang") is not None:
        return count(field(policy, "gang", "minCount", kind=object, what=what), what + " gang.minCount", low=1)
    if policy.get("basic") is not None:
        return None
    raise GangError("%s's scheduling policy is neither gang nor basic: %s" % (what, list(policy)[:4]))


class Workload:
    """Kubernetes' own gang scheduling (the Workload API)."""

    kind = "workload"

    @staticmethod
    def claim(pod) -> Optional[Claim]:
        group = field(pod, "spec", SCHEDULING_GROUP)
        if group is not None:
            name = name_in(group.get("podGroupName"), "the Pod's spec.schedulingGroup.podGroupName")
            return Claim("podgroup/" + name, "", ("podgroup", name))
        ref = field(pod, "spec", WORKLOAD_REF)
        if ref is None:
            return None
        name = name_in(ref.get("name"), "the Pod's spec.workloadRef.name")
        group = name_in(ref.get("podGroup"), "the Pod's spec.workloadRef.podGroup")
        replica = ref.get("podGroupReplicaKey")
        local = "workload/%s/%s" % (name, group)
        if replica not in (None, ""):
            local += "/" + name_in(replica, "the Pod's spec.workloadRef.podGroupReplicaKey")
        return Claim(local, "", ("workload", name, group))

    @staticmethod
    def resolve(pod, namespace: str, claim: Claim, read) -> Optional[Gang]:
        if claim.names[0] == "podgroup":
            what = "PodGroup %s/%s (scheduling.k8s.io)" % (namespace, claim.names[1])
            paths = [_path("/apis/scheduling.k8s.io/" + v, namespace, "podgroups", claim.names[1])
                     for v in PODGROUP_VERSIONS]
            obj = read_object(read, paths, what)
            size = _policy_size(field(obj, "spec", "schedulingPolicy", what=what), what)
        else:
            _, name, group = claim.names
            what = "Workload %s/%s (scheduling.k8s.io/%s)" % (namespace, name, WORKLOAD_VERSION)
            obj = read_object(read, [_path("/apis/scheduling.k8s.io/" + WORKLOAD_VERSION, namespace, "workloads",
                                           name)], what)
            groups = field(obj, "spec", "podGroups", kind=list, what=what) or []
            found = [g for g in groups if isinstance(g, dict) and g.get("name") == group]
            if not found:
                raise GangError("%s has no pod group %r" % (what, group))
            size = _policy_size(found[0].get("policy"), "%s pod group %s" % (what, group))
        if size is None:
            return None  # a basic policy: its Pods are scheduled one by one
        return _gang("workload", namespace, claim, uid_of(obj, what), size)


def _label(pod, key: str):
    """(the Pod's label ``key`` as a selector may name it, or None; all its labels)."""
    labels = strings(meta_of(pod), "labels")
    return (label_value(labels[key], "the Pod's label " + key) if key in labels else None), labels


def _job_pods(rjob, what: str) -> int:
    """How many Pods one replicated job's Jobs run together: replicas x
    min(parallelism, completions) (a Job's parallelism is 1 by default)."""
    if not isinstance(rjob, dict):
        raise GangError("%s: a replicated job is not an object" % what)
    name = rjob.get("name")
    where = "%s replicated job %s" % (what, name if isinstance(name, str) else "?")
    replicas = count(rjob.get("replicas", 1), where + " replicas")
    spec = field(rjob, "template", "spec", what=where) or {}
    parallelism = count(spec.get("parallelism", 1), where + " parallelism")
    completions = spec.get("completions")
    if completions is not None:
        parallelism = min(parallelism, count(completions, where + " completions"))
    if rjob.get("dependsOn"):
        raise GangError("%s waits for another (dependsOn): the JobSet's Pods never all start together"
                        % where)
    return replicas * parallelism


class JobSet:
    kind = "jobset"

    @staticmethod
    def claim(pod) -> Optional[Claim]:
        name, labels = _label(pod, JOBSET_NAME)
        if name is None:
            return None
        if JOBSET_RESTART not in labels:
            raise GangError("the Pod of JobSet %s has no %s label" % (name, JOBSET_RESTART))
        attempt = count(labels[JOBSET_RESTART], "the Pod's label " + JOBSET_RESTART)
        uid = labels.get(JOBSET_UID, "")
        if "/" in uid:
            raise GangError("the Pod's label %s is not a uid" % JOBSET_UID)
        return Claim("%s/%d" % (name, attempt), uid, (name, attempt))

    @staticmethod
    def resolve(pod, namespace: str, claim: Claim, read) -> Gang:
        name, attempt = claim.names
        what = "JobSet %s/%s" % (namespace, name)
        obj = read_object(read, [_path(JOBSET_API, namespace, "jobsets", name)], what)
        uid = uid_of(obj, what)
        if claim.uid and claim.uid != uid:
            raise GangError("%s is another JobSet (uid %s) than the Pod's (%s): the Pod's was deleted"
                            % (what, uid, claim.uid))
        restarts = count(field(obj, "status", "restarts", kind=object, what=what) or 0, what + " status.restarts")
        if attempt < restarts:
            raise GangError("the Pod is of %s's restart attempt %d; the JobSet is at %d (the Pod is being replaced)"
                            % (what, attempt, restarts))
        spec = field(obj, "spec", what=what) or {}
        if (field(spec, "startupPolicy", "startupPolicyOrder", kind=str, what=what) or "") == "InOrder":
            raise GangError("%s starts its replicated jobs in order (startupPolicy InOrder): its Pods never all "
                            "start together" % what)
        rjobs = field(spec, "replicatedJobs", kind=list, what=what) or []
        size = sum(_job_pods(rjob, what) for rjob in rjobs)
        size = count(size, what + "'s Pods (replicas x parallelism)", low=1)
        return _gang("jobset", namespace, claim, uid, size,
                     "%s=%s,%s=%d" % (JOBSET_NAME, name, JOBSET_RESTART, attempt))


class Kueue:
    """A Kueue plain Pod group: sized by its Pods' annotation, keyed by the
    Workload Kueue made for it (named as the group, or the Pods' prebuilt
    workload label), which exists before Kueue lets any of its Pods schedule."""

    kind = "kueue"

    @staticmethod
    def claim(pod) -> Optional[Claim]:
        name, labels = _label(pod, KUEUE_GROUP)
        if name is None:
            return None
        workload = name_in(labels.get(KUEUE_PREBUILT, name), "the Pod's label " + KUEUE_PREBUILT)
        return Claim(name, "", (name, workload))

    @staticmethod
    def resolve(pod, namespace: str, claim: Claim, read) -> Gang:
        annotations = strings(meta_of(pod), "annotations")
        if KUEUE_TOTAL not in annotations:
            raise GangError("the Pod of Kueue pod group %s has no %s annotation" % (claim.local, KUEUE_TOTAL))
        size = count(annotations[KUEUE_TOTAL], "the Pod's annotation " + KUEUE_TOTAL, low=1)
        what = "Kueue Workload %s/%s (pod group %s)" % (namespace, claim.names[1], claim.local)
        obj = read_object(read, [_path("/apis/kueue.x-k8s.io/" + v, namespace, "workloads", claim.names[1])
                                 for v in KUEUE_VERSIONS], what)
        return _gang("kueue", namespace, claim, uid_of(obj, what), size, "%s=%s" % (KUEUE_GROUP, claim.local))


class Volcano:
    kind = "volcano"

    @staticmethod
    def claim(pod) -> Optional[Claim]:
        annotations = strings(meta_of(pod), "annotations")
        for key in VOLCANO_GROUP:
            if key in annotations:
                name = name_in(annotations[key], "the Pod's annotation " + key)
                return Claim(name, "", (name,))
        return None

    @staticmethod
    def resolve(pod, namespace: str, claim: Claim, read) -> Gang:
        what = "Volcano PodGroup %s/%s" % (namespace, claim.local)
        obj = read_object(read, [_path(VOLCANO_API, namespace, "podgroups", claim.local)], what)
        size = count(field(obj, "spec", "minMember", kind=object, what=what), what + " spec.minMember", low=1)
        job = strings(meta_of(pod), "labels").get(VOLCANO_JOB)
        selector = "%s=%s" % (VOLCANO_JOB, label_value(job, "the Pod's label " + VOLCANO_JOB)) if job else ""
        return _gang("volcano", namespace, claim, uid_of(obj, what), size, selector)


PLUGINS = {plugin.kind: plugin for plugin in (Workload, JobSet, Kueue, Volcano)}
