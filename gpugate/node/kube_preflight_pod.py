"""Which Pods the node agent proves on Kubernetes, and on which GPUs
(gpugate.node.kube_preflight): a Pod the kubelet admitted to this Node,
in its preflight now, that holds every GPU of the node alone.

A Pod on part of a node, or on GPUs it shares (time-slicing or MPS
replicas of the device plugin, MIG devices, a DRA claim shared with
another Pod, admin access, consumable capacity), is not proved: a proof
there would judge another tenant's load, which is never evidence against
the node.  It starts (undecided)."""

from __future__ import annotations

import time
from typing import List, Optional, Tuple
from urllib.parse import quote

CONTAINER = "gpugate-preflight"  # the init container's name (the chart's policy injects it first)
CLAIMED = "through DRA claims"  # pod_gpus: the Pod's GPUs are in its ResourceClaims (claimed_gpus)
ADMITTED_SECONDS = 15.0  # how long a Pod's status may lag its preflight's call (the kubelet's status sync)


def check_pod(pod: dict, uid: str, kube_node: str) -> str:
    """Why this agent does not serve the Pod ("" where it does): bound here,
    the same uid, not being deleted, gpugate-preflight its first init
    container (so no container of the Pod's own runs beside the proof) and
    not ended.  Pure."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    if str(meta.get("uid") or "") != uid:
        return "the Pod's uid is not the one named (it was recreated)"
    if spec.get("nodeName") != kube_node:
        return "the Pod is not bound to this node (%s)" % kube_node
    if meta.get("deletionTimestamp"):
        return "the Pod is being deleted"
    inits = [c for c in spec.get("initContainers") or [] if isinstance(c, dict)]
    if not inits or inits[0].get("name") != CONTAINER:
        return "%s is not the Pod's first init container" % CONTAINER
    reach = gpu_reach(inits[0])
    if reach:
        return "its %s container could reach the GPUs (%s): not gpugate's" % (CONTAINER, reach)
    if status.get("phase") not in (None, "Pending"):
        return "the Pod is %s, past its preflight" % status.get("phase")
    if (_state(pod) or {}).get("terminated"):
        return "the Pod's preflight has ended"
    return ""


_GPU_ENV = ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def gpu_reach(container: dict) -> str:
    """How a container named gpugate-preflight could load the GPUs while the
    agent proves them ("" where it cannot): a user may write their own, and
    a load of theirs must never read as the node's fault.  The chart's (and
    `gpugate kube-preflight --print-init-container`'s) asks for no GPU, no
    claim, no volume or device, no privilege and no GPU runtime variable.  Pure."""
    resources = container.get("resources") if isinstance(container.get("resources"), dict) else {}
    for kind in ("limits", "requests"):
        asked = resources.get(kind) if isinstance(resources.get(kind), dict) else {}
        gpus = sorted(r for r in asked if "gpu" in str(r).lower())
        if gpus:
            return "%s %s" % (kind, ",".join(gpus)[:60])
    if resources.get("claims"):
        return "resource claims"
    if container.get("volumeMounts") or container.get("volumeDevices"):
        return "volumes"
    security = container.get("securityContext") if isinstance(container.get("securityContext"), dict) else {}
    if security.get("privileged") or (security.get("capabilities") or {}).get("add"):
        return "privilege"
    names = {str((e or {}).get("name")) for e in container.get("env") or [] if isinstance(e, dict)}
    if container.get("envFrom") or names & set(_GPU_ENV):
        return "its environment"
    return ""


def in_preflight(pod: dict) -> bool:
    """The kubelet says the Pod's preflight container runs (it admitted the Pod). Pure."""
    return bool((_state(pod) or {}).get("running"))


def _state(pod: dict) -> Optional[dict]:
    for item in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if isinstance(item, dict) and item.get("name") == CONTAINER:
            return item.get("state") if isinstance(item.get("state"), dict) else {}
    return None


def read_pod(client, namespace: str, name: str) -> dict:
    return client.get("/api/v1/namespaces/%s/pods/%s" % (quote(namespace, safe=""), quote(name, safe="")))


def admitted(client, pod: dict, uid: str, kube_node: str, seconds: float = ADMITTED_SECONDS,
             sleep=time.sleep) -> Tuple[dict, str]:
    """The Pod once its status shows the preflight running (a Pod bound by
    hand and refused by the kubelet never does), read again until then;
    (pod, why not) otherwise."""
    meta = pod.get("metadata") or {}
    until = time.monotonic() + seconds
    while True:
        why = check_pod(pod, uid, kube_node)
        if why or in_preflight(pod):
            return pod, why
        if time.monotonic() >= until:
            return pod, "the kubelet has not reported the Pod's preflight running in %.0fs" % seconds
        sleep(0.5)
        pod = read_pod(client, str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def pod_gpus(pod: dict, whole: Optional[int], resource: str, offered) -> Tuple[List[int], str]:
    """The GPUs this Pod's proof runs on: every GPU of the node where the Pod
    asks for all of them (its containers' limits of ``resource``) and the
    Node offers each GPU once (``offered``: its capacity of ``resource``),
    else none, and why (CLAIMED: its claims decide).  Pure."""
    if not whole:
        return [], "the node's GPU count is not in the baseline: not run"
    spec = pod.get("spec") or {}
    asked = 0
    for container in spec.get("containers") or []:
        limits = ((container or {}).get("resources") or {}).get("limits") or {}
        value = limits.get(resource)
        try:
            asked += int(str(value)) if value is not None else 0
        except ValueError:
            return [], "the Pod's %s limit %r is not a count: not run" % (resource, str(value)[:20])
    if asked == 0 and spec.get("resourceClaims"):
        return [], CLAIMED
    if str(offered) != str(whole):
        return [], ("the Node offers %s %s for its %d GPUs (shared: time-slicing or MPS replicas, or not yet "
                    "registered): not run" % (offered, resource, whole))
    if asked == whole:
        return list(range(whole)), ""
    return [], "the Pod takes %d of the node's %d GPUs (%s): a proof would judge another Pod's (not run)" % (
        asked, whole, resource)


def claimed_share(slices: List[dict], devices) -> Tuple[int, int, str]:
    """(the node's GPUs the allocated ``devices`` cover, the GPUs the node's
    ResourceSlices publish, why they cannot be counted: "" where they can).
    A MIG device or a partition of a GPU is shared with others: it is
    never counted as its GPU.  Pure."""
    from gpugate.kube.dra import _attribute, gpu_count

    wanted, mine = set(devices), []
    for item in slices:
        spec = item.get("spec") if isinstance(item, dict) and isinstance(item.get("spec"), dict) else {}
        driver, pool = spec.get("driver"), (spec.get("pool") or {}).get("name")
        kept = [d for d in spec.get("devices") or [] if isinstance(d, dict) and (driver, pool, d.get("name")) in wanted]
        for device in kept:
            if _attribute(device, str(driver or ""), "parentUUID"):
                return 0, gpu_count(slices), "a claim holds %s, a part of a GPU" % str(device.get("name"))[:60]
        mine.append(dict(item, spec=dict(spec, devices=kept)))
    return gpu_count(mine), gpu_count(slices), ""


def claim_devices(claim: dict, pod_uid: str) -> Tuple[set, str]:
    """The (driver, pool, device) a claim holds for this Pod alone, or why
    not: reserved for another Pod too, admin access, a share of a device.  Pure."""
    status = claim.get("status") if isinstance(claim.get("status"), dict) else {}
    reserved = [r for r in status.get("reservedFor") or [] if isinstance(r, dict)]
    if [r.get("uid") for r in reserved] != [pod_uid]:
        return set(), "its claim %s is not reserved for this Pod alone" % str(
            (claim.get("metadata") or {}).get("name"))[:60]
    found = set()
    for result in ((status.get("allocation") or {}).get("devices") or {}).get("results") or []:
        if not isinstance(result, dict):
            continue
        if result.get("adminAccess") or result.get("shareID"):
            return set(), "its claim holds %s shared (admin access or a share)" % str(result.get("device"))[:60]
        found.add((result.get("driver"), result.get("pool"), result.get("device")))
    return found, ""


def claimed_gpus(client, pod: dict, kube_node: str, whole: int) -> Tuple[List[int], str]:
    """pod_gpus for a Pod whose GPUs come through DRA claims: every GPU of
    the node where its claims hold, for it alone, every GPU the node's
    slices publish (and as many as the baseline says), else none, and why."""
    from gpugate.kube.claims import CLAIMS, claim_names
    from gpugate.kube.dra import slices_of

    meta = pod.get("metadata") or {}
    namespace, uid = str(meta.get("namespace") or ""), str(meta.get("uid") or "")
    devices = set()
    for name in claim_names(pod):
        held, why = claim_devices(client.get(CLAIMS % (quote(namespace, safe=""), quote(name, safe=""))), uid)
        if why:
            return [], why + " (not run)"
        devices |= held
    covered, published, why = claimed_share(slices_of(client, kube_node), devices)
    if why:
        return [], why + " (not run)"
    if published and covered >= published and covered >= whole:
        return list(range(whole)), ""
    return [], "the Pod's claims hold %d of the node's %d GPUs: a proof would judge another Pod's (not run)" % (
        covered, max(published, whole))
