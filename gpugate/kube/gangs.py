"""A GPU Pod's gang: the other Pods that must start with it, found as
each gang scheduler writes them, one plugin a kind (gpugate.kube.gangs_kinds,
where each name's source is cited), tried in order:

- workload: Kubernetes' own: ``spec.schedulingGroup.podGroupName`` (1.36+)
  names a scheduling.k8s.io PodGroup, size ``spec.schedulingPolicy.gang.minCount``;
  ``spec.workloadRef`` {name, podGroup, podGroupReplicaKey} (1.35) names a
  Workload, size its ``spec.podGroups[].policy.gang.minCount``.  A basic
  (not gang) policy is no gang.
- jobset: labels ``jobset.sigs.k8s.io/jobset-name`` and ``.../restart-attempt``;
  size from the JobSet: the sum of replicas x min(parallelism, completions).
- kueue: label ``kueue.x-k8s.io/pod-group-name``; size the annotation
  ``kueue.x-k8s.io/pod-group-total-count``; its key from the Workload Kueue
  made for the group (kueue.x-k8s.io).
- volcano: annotation ``scheduling.k8s.io/group-name`` (or
  ``scheduling.volcano.sh/group-name``) names a PodGroup; size ``spec.minMember``.

A gang's key is ``<kind>/<namespace>/<the Pod's own identity of it>/<uid>``,
the uid of the object read (Workload, PodGroup, JobSet, Kueue's Workload):
a gang deleted and made again under the same name is a new key.

of_pod() never guesses: a Pod that names a gang whose object cannot be read,
or whose declared size is not a count (0, over MAX_SIZE, not a number),
raises GangError (the caller's "undecided"), never "no gang".  Malformed
input raises GangError, never a TypeError.

Gang and GangError are defined with the plugins (gpugate.kube.gangs_kinds);
callers import them from here, the module they call."""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from gpugate.kube.gangs_kinds import (FINISHED, MAX_SIZE, PLUGINS, Gang, GangError, Read, field, meta_of,
                                      namespace_of)

KINDS: Tuple[str, ...] = ("workload", "jobset", "kueue", "volcano")


# ------------------------------------------------------------------ the API
def of_pod(pod: dict, read: Read, kinds: Sequence[str] = KINDS) -> Optional[Gang]:
    """The Pod's gang, or None (a single Pod).  The first kind in ``kinds``
    that claims the Pod decides.  ``read(path)``: the object at that API
    path (KubeError, status 404, where absent).  GangError: the Pod names a
    gang that cannot be decided."""
    unknown = [k for k in kinds if k not in PLUGINS]
    if unknown:
        raise GangError("unknown gang kinds %s (known: %s)" % (", ".join(map(repr, unknown)), ", ".join(KINDS)))
    namespace = namespace_of(pod)
    for kind in kinds:
        plugin = PLUGINS[kind]
        claim = plugin.claim(pod)
        if claim is None:
            continue
        gang = plugin.resolve(pod, namespace, claim, read)
        if gang is not None:
            if not 1 <= gang.size <= MAX_SIZE:  # each plugin checks; this holds the contract whatever it says
                raise GangError("%s gang %s: size %d" % (kind, gang.key, gang.size))
            return gang
    return None


def _identity(plugin, pod) -> Optional[Tuple[str, str]]:
    """(the Pod's own identity of its gang of this kind, a uid it carries or ""); None: none."""
    try:
        claim = plugin.claim(pod)
    except GangError:
        return None
    return None if claim is None else (claim.local, claim.uid)


def is_member(gang: Gang, pod: dict) -> bool:
    """The Pod is in ``gang`` (the same gang identity, the same uid where the
    Pod carries one), not being deleted, not finished."""
    try:
        meta = meta_of(pod)
        phase = field(pod, "status", "phase", kind=str)
    except GangError:
        return False
    if meta.get("deletionTimestamp") or phase in FINISHED:
        return False
    return in_gang(gang, pod)


def in_gang(gang: Gang, pod: dict) -> bool:
    """The Pod names ``gang`` (the same gang identity, the same uid where it
    carries one), whatever its phase: a finished one too."""
    try:
        if namespace_of(pod) != gang.namespace:
            return False
    except GangError:
        return False
    plugin = PLUGINS.get(gang.kind)
    found = _identity(plugin, pod) if plugin is not None else None
    if found is None:
        return False
    local, uid = found
    prefix = "%s/%s/%s" % (gang.kind, gang.namespace, local)
    head, _, gang_uid = gang.key.rpartition("/")
    return head == prefix and uid in ("", gang_uid)


def members(gang: Gang, pods: List[dict]) -> List[dict]:
    """Of the candidate Pods (listed with gang.selector in gang.namespace),
    those in this gang: is_member() of each, in the order given."""
    if not isinstance(pods, list):
        raise GangError("the candidate Pods are not a list (%s)" % type(pods).__name__)
    return [pod for pod in pods if is_member(gang, pod)]
