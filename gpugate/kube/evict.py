"""A node's pods out through the Eviction API (policy/v1), as `kubectl
drain` does it: every pod bound to the node except DaemonSet pods (their
controller would put them back; they tolerate the cordon), mirror pods
(the kubelet's static pods) and pods that have ended.  A PodDisruptionBudget
that refuses (429) is asked again on the next poll; gpugate never deletes a
pod around it: at the sweep's drain_timeout the node is reported and left
held for the next run.  Pure judging apart (``must_go``) from the requests."""

from __future__ import annotations

from urllib.parse import quote

from .client import KubeError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Tuple

SMOKE_LABEL = "gpugate.io/smoke"  # gpugate's own proof Pod: deleted by the sweep itself, never evicted


def must_go(pod: dict) -> bool:
    """Must this pod leave the node before its repair?"""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return False
    if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        return False
    if SMOKE_LABEL in (meta.get("labels") or {}):
        return False
    owners = meta.get("ownerReferences") or []
    return not any(isinstance(o, dict) and o.get("kind") == "DaemonSet" and o.get("controller") for o in owners)


def _label(pod: dict) -> str:
    meta = pod.get("metadata") or {}
    return "%s/%s" % (meta.get("namespace", "?"), meta.get("name", "?"))


def pods_on(client, node: str) -> List[dict]:
    return list(client.list_pages("/api/v1/pods", fieldSelector="spec.nodeName=" + node))


def evict_round(client, node: str) -> Tuple[List[str], Dict[str, str]]:
    """One round on one node: ask each pod that must go to leave (once
    it is terminating, it is only waited for).  Returns (the pods still
    there, {pod: why its eviction was refused})."""
    left, refused = [], {}
    for pod in pods_on(client, node):
        if not must_go(pod):
            continue
        label = _label(pod)
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
