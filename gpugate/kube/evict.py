"""A node's pods out through the Eviction API (policy/v1), as `kubectl
drain` does it: every pod bound to the node except DaemonSet pods that
request no GPU (their controller would put them back; they tolerate the
cordon: the node agent, the GPU operator's device plugin, DCGM exporter),
mirror pods (the kubelet's static pods) and pods that have ended.  A
DaemonSet's pod that requests a GPU resource (``gpu_resource``) is evicted
like any other: anyone may make a DaemonSet that tolerates everything, and
one that holds the GPUs would refuse every smoke Pod and keep the node out
for good; if its DaemonSet makes it again, it is still there at the
sweep's drain_timeout and the node is deferred with it named.  A PodDisruptionBudget
that refuses (429) is asked again on the next poll; gpugate never deletes a
pod around it: at the sweep's drain_timeout the node is reported and left
held for the next run.  Pure judging apart (``must_go``) from the requests.

The ``gpugate.io/smoke`` label spares a pod only where it is gpugate's own
smoke Pod (``OwnSmoke``): in ``[kubernetes] smoke_namespace`` (where only
the sweep may make Pods) and made by this sweep (a name it chose this run)
or signed by it (annotation ``gpugate.io/smoke-proof``: an HMAC with the
drain budget key, gpugate.safety.budgetkey, of the namespace, the Pod's name and
the node it is bound to).  Anyone may put the label on their own pod; such
a pod is evicted like any other, through its PodDisruptionBudget (issue 44)."""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import quote

from gpugate.kube.client import KubeError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, Iterable, List, Optional, Tuple

SMOKE_LABEL = "gpugate.io/smoke"  # gpugate's own proof Pod: deleted by the sweep itself, never evicted
PROOF = "gpugate.io/smoke-proof"  # its signature (OwnSmoke)


def proof(key: bytes, namespace: str, name: str, node: str) -> str:
    """The smoke Pod's signature: what a user cannot write without the drain budget key."""
    text = "\0".join(("gpugate-smoke-pod", namespace, name, node)).encode()
    return hmac.new(key, text, hashlib.sha256).hexdigest()


class OwnSmoke:
    """Which pods are gpugate's own smoke Pods: in ``namespace`` with the
    label, and either named in ``names`` (made by this run) or carrying a
    proof that verifies with ``key`` for the node the Pod is bound to."""

    def __init__(self, namespace: str, key: Optional[bytes], names: Iterable[str] = ()):
        self.namespace, self.key, self.names = namespace, key, set(names)

    def __call__(self, pod: dict) -> bool:
        meta = pod.get("metadata") or {}
        if meta.get("namespace") != self.namespace or SMOKE_LABEL not in (meta.get("labels") or {}):
            return False
        name = str(meta.get("name") or "")
        if name and name in self.names:
            return True
        signed = (meta.get("annotations") or {}).get(PROOF)
        node = (pod.get("spec") or {}).get("nodeName")
        if not self.key or not isinstance(signed, str) or not isinstance(node, str):
            return False
        return hmac.compare_digest(signed, proof(self.key, self.namespace, name, node))


def _none(pod: dict) -> bool:
    return False


GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")  # the device plugins' own, whatever the site configures


def gpu_resource(name: str, named: Iterable[str] = ()) -> bool:
    """Is this extended resource a GPU (or a part of one)?  ``named``: the
    site's ([kubernetes] smoke_resource, smoke_resource_amd); also
    nvidia.com/gpu, amd.com/gpu, any ``<domain>/gpu`` or ``<domain>/gpu.*``,
    ``<domain>/gpu-*`` (time-slicing's renamed nvidia.com/gpu.shared, a
    partition) and NVIDIA's MIG slices (nvidia.com/mig-*)."""
    if name in named or name in GPU_RESOURCES:
        return True
    domain, slash, rest = name.rpartition("/")
    return bool(slash) and (rest == "gpu" or rest.startswith(("gpu.", "gpu-"))
                            or (domain == "nvidia.com" and rest.startswith("mig-")))


def gpus_requested(pod: dict, named: Iterable[str] = ()) -> List[str]:
    """The GPU resources any of the pod's containers (init containers too)
    requests or is limited to, with a count other than zero."""
    spec = pod.get("spec") or {}
    found = set()
    holders = [spec] + [c for key in ("initContainers", "containers", "ephemeralContainers")
                        for c in (spec.get(key) or ()) if isinstance(c, dict)]
    for holder in holders:
        resources = holder.get("resources") or {}
        for kind in ("limits", "requests"):
            amounts = resources.get(kind) or {}
            if not isinstance(amounts, dict):
                continue
            for name, amount in amounts.items():
                if str(amount).strip() not in ("0", "") and gpu_resource(str(name), named):
                    found.add(str(name))
    return sorted(found)


def daemonset_pod(pod: dict) -> bool:
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    return any(isinstance(o, dict) and o.get("kind") == "DaemonSet" and o.get("controller") for o in owners)


def must_go(pod: dict, ours: Callable[[dict], bool] = _none, gpus: Iterable[str] = ()) -> bool:
    """Must this pod leave the node before its repair?  ``ours``: which
    pods are gpugate's own smoke Pods (OwnSmoke); by default none is.
    ``gpus``: the site's GPU resource names (gpu_resource adds the rest).
    A DaemonSet's pod stays only while it requests no GPU."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return False
    if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        return False
    if ours(pod):
        return False
    return not daemonset_pod(pod) or bool(gpus_requested(pod, gpus))


def label_of(pod: dict) -> str:
    """namespace/name"""
    meta = pod.get("metadata") or {}
    return "%s/%s" % (meta.get("namespace", "?"), meta.get("name", "?"))


def pods_on(client, node: str) -> List[dict]:
    return list(client.list_pages("/api/v1/pods", fieldSelector="spec.nodeName=" + node))


def evict_round(client, node: str, ours: Callable[[dict], bool] = _none,
                gpus: Iterable[str] = ()) -> Tuple[List[str], Dict[str, str]]:
    """One round on one node: ask each pod that must go to leave (once
    it is terminating, it is only waited for).  Returns (the pods still
    there, {pod: why its eviction was refused})."""
    left, refused = [], {}
    for pod in pods_on(client, node):
        if not must_go(pod, ours, gpus):
            continue
        label = label_of(pod)
        left.append(label)
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue  # leaving: its grace period runs
        meta = pod["metadata"]
        path = "/api/v1/namespaces/%s/pods/%s/eviction" % (quote(meta["namespace"], safe=""),
                                                           quote(meta["name"], safe=""))
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]}}
        try:
            client.create(path, body)
        except KubeError as exc:
            if exc.status == 404:
                left.remove(label)  # gone meanwhile
            else:  # 429: a PodDisruptionBudget; 500: more than one covers it; 403: not allowed
                refused[label] = str(exc).split(": ", 1)[-1][:300]
    return left, refused
