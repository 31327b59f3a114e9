"""One GPU held as a DRA DeviceTaintRule (resource.k8s.io/v1, served from
Kubernetes 1.37): the node's ResourceSlices read, a GPU found in them by
what the node itself read of it (its UUID, its PCI address), and a rule
per device written, owned by gpugate.

A GPU is found by identity, never by its index or a device's name: NVIDIA's
DRA driver names a GPU gpu-<minor> (the /dev/nvidiaN minor, not NVML's
index) and AMD's gpu-<card>-<render>.  What they publish and gpugate reads:
NVIDIA's ``uuid`` (its MIG devices: ``parentUUID``) and ``pcieBusID``;
AMD's and the standard ``resource.kubernetes.io/pciBusID``.  Every device
with that identity is held (a GPU's MIG devices or partitions with it); a
GPU no slice publishes, or whose UUID and PCI address name different
devices, is not found, and the caller holds the Node.

Ownership: a rule gpugate writes carries the label
``app.kubernetes.io/managed-by=gpugate``, its node in ``gpugate.io/node``
and its record in the ``gpugate.io/owned`` annotation; a rule without
those, under a name gpugate would use, is never changed nor deleted."""

from __future__ import annotations

import hashlib
import json

from gpugate.kube.client import KubeError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, List, Optional, Tuple

API = "/apis/resource.k8s.io/v1"
RULES = API + "/devicetaintrules"
SLICES = API + "/resourceslices"
MANAGED_BY = "app.kubernetes.io/managed-by"
NODE_LABEL = "gpugate.io/node"
OWNED = "gpugate.io/owned"
TAINT_KEY = "gpugate.io/unfit"
_PCI_KEYS = ("pcieBusID", "resource.kubernetes.io/pciBusID", "pciAddr")
EMPTY = "-empty"  # the sweep's NoExecute rule beside gpugate's, while it repairs the GPU (KubeNodes.empty_gpus)
NOT_SERVED = ("this API server serves no DeviceTaintRule (resource.k8s.io/v1, Kubernetes 1.37 or later): "
              "the Node is held")


# ------------------------------------------------------------------ pure
def pci(text) -> str:
    """A PCI address as one form: NVML's "00000000:18:00.0" and sysfs'
    "0000:18:00.0" both read "0000:18:00.0" ("": not an address)."""
    if not isinstance(text, str):
        return ""
    parts = text.strip().lower().split(":")
    if len(parts) != 3 or not all(parts):
        return ""
    domain, bus, slot = parts
    return "%s:%s:%s" % (domain[-4:].rjust(4, "0"), bus.rjust(2, "0"), slot if "." in slot else slot + ".0")


def _attribute(device: Dict[str, Any], driver: str, name: str) -> str:
    attributes = device.get("attributes") if isinstance(device.get("attributes"), dict) else {}
    for key in (name, "%s/%s" % (driver, name)):
        value = attributes.get(key)
        if isinstance(value, dict) and isinstance(value.get("string"), str):
            return value["string"]
    return ""


def locate(slices: List[Dict[str, Any]], ident: Dict[str, str]) -> Tuple[List[Tuple[str, str, str]], str]:
    """The (driver, pool, device) of every device the node's slices publish
    for the GPU ``ident`` ({"uuid": .., "pci": ..}, as the node read it),
    and "" ; or [] and why not."""
    uuid, address = str(ident.get("uuid") or "").lower(), pci(ident.get("pci"))
    if not uuid and not address:
        return [], "gpugate read no UUID nor PCI address for it"
    by_uuid, by_pci = set(), set()
    for item in slices:
        spec = item.get("spec") if isinstance(item, dict) and isinstance(item.get("spec"), dict) else {}
        driver, pool = str(spec.get("driver") or ""), str((spec.get("pool") or {}).get("name") or "")
        for device in spec.get("devices") or []:
            if not isinstance(device, dict) or not isinstance(device.get("name"), str) or not driver or not pool:
                continue
            where = (driver, pool, device["name"])
            ids = {_attribute(device, driver, "uuid").lower(), _attribute(device, driver, "parentUUID").lower()}
            if uuid and uuid in ids:
                by_uuid.add(where)
            if address and address in {pci(_attribute(device, driver, key)) for key in _PCI_KEYS}:
                by_pci.add(where)
    if by_uuid and by_pci and not by_uuid & by_pci:
        return [], "its UUID and its PCI address name different devices in the ResourceSlices"
    found = sorted(by_uuid | by_pci)
    if not found:
        return [], "no ResourceSlice of this node publishes it (uuid %s, pci %s)" % (uuid or "-", address or "-")
    return found, ""


def gpu_count(slices: List[Dict[str, Any]]) -> int:
    """The GPUs the node's slices publish: distinct by their UUID (a MIG
    device's parent's) or PCI address; 0 when none names one."""
    seen = set()
    for item in slices:
        spec = item.get("spec") if isinstance(item, dict) and isinstance(item.get("spec"), dict) else {}
        driver = str(spec.get("driver") or "")
        for device in spec.get("devices") or []:
            if isinstance(device, dict):
                key = (_attribute(device, driver, "parentUUID") or _attribute(device, driver, "uuid")).lower() or \
                    next((pci(_attribute(device, driver, k)) for k in _PCI_KEYS if _attribute(device, driver, k)), "")
                if key:
                    seen.add(key)
    return len(seen)


def _node_label(node: str) -> str:
    """A label value (63 characters at most) for the node's name."""
    return node if len(node) <= 63 else "h-" + hashlib.sha256(node.encode()).hexdigest()[:40]


def rule_name(node: str, driver: str, device: str) -> str:
    """The rule's name, the same every run: gpugate.<node>.<driver>.<device>
    (a hash of them where that is longer than a name may be)."""
    name = "gpugate.%s.%s.%s" % (node, driver, device)
    return name if len(name) <= 253 else "gpugate." + hashlib.sha256(name.encode()).hexdigest()[:48]


def rule(node: str, gpu: int, where: Tuple[str, str, str], effect: str, cls: str, reason: str,
         suffix: str = "") -> Dict[str, Any]:
    driver, pool, device = where
    record = json.dumps({"node": node, "gpu": gpu, "reason": reason}, sort_keys=True)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
            "metadata": {"name": rule_name(node, driver, device + suffix),
                         "labels": {MANAGED_BY: "gpugate", NODE_LABEL: _node_label(node)},
                         "annotations": {OWNED: record}},
            "spec": {"deviceSelector": {"driver": driver, "pool": pool, "device": device},
                     "taint": {"key": TAINT_KEY, "value": cls, "effect": effect}}}


def ours(item: Dict[str, Any], node: str) -> bool:
    """Written by gpugate, for this node."""
    meta = item.get("metadata") if isinstance(item.get("metadata"), dict) else {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    if labels.get(MANAGED_BY) != "gpugate" or labels.get(NODE_LABEL) != _node_label(node):
        return False
    try:
        record = json.loads(annotations.get(OWNED) or "")
    except (TypeError, ValueError):
        return False
    return isinstance(record, dict) and record.get("node") == node


# ------------------------------------------------------------ API calls
def served(client) -> str:
    """"" when the API server serves DeviceTaintRule; else why the Node is held."""
    try:
        group = client.get(API)
    except KubeError as exc:
        if exc.status == 404:
            return NOT_SERVED
        raise
    kinds = [r.get("name") for r in group.get("resources") or [] if isinstance(r, dict)]
    return "" if "devicetaintrules" in kinds else NOT_SERVED


def slices_of(client, node: str) -> List[Dict[str, Any]]:
    """The node's ResourceSlices, from the API server's cache (resourceVersion 0):
    a consistent read waits for that cache to catch up with every write
    made since (the rule and Node writes of the GPUs held before it: ~0.1 s
    a GPU, bench/bench_kube_device_holds.py).  A slice the cache does not
    have yet holds the Node (locate finds no GPU): the safe side."""
    return list(client.list_pages(SLICES, fieldSelector="spec.nodeName=" + node, resourceVersion="0"))


def write(client, body: Dict[str, Any], node: str) -> str:
    """Create the rule, or bring gpugate's own rule of that name to it; its
    name.  KubeError when a rule of that name is not gpugate's."""
    name = body["metadata"]["name"]
    try:
        client.create(RULES, body)
        return name
    except KubeError as exc:
        if exc.status != 409:
            raise
    there = client.get(RULES + "/" + name)
    if not ours(there, node):
        raise KubeError("DeviceTaintRule %s was not written by gpugate: left alone" % name, 409, "Conflict")
    if _what(there) != _what(body):  # (the server's own fields, the taint's timeAdded, kept as they are)
        body = dict(body, metadata=dict(body["metadata"], resourceVersion=there["metadata"]["resourceVersion"]))
        client.replace(RULES + "/" + name, body)
    return name


def _what(item: Dict[str, Any]) -> tuple:
    """What gpugate decides of a rule: its device and its taint's key, value and effect."""
    spec = item.get("spec") if isinstance(item.get("spec"), dict) else {}
    taint = spec.get("taint") if isinstance(spec.get("taint"), dict) else {}
    return (json.dumps(spec.get("deviceSelector"), sort_keys=True),
            taint.get("key"), taint.get("value"), taint.get("effect"))


def ours_for(client, node: str) -> List[Dict[str, Any]]:
    """gpugate's rules for this node ([] where the server serves none)."""
    try:
        items = client.list_pages(RULES, labelSelector="%s=gpugate,%s=%s" % (MANAGED_BY, NODE_LABEL,
                                                                              _node_label(node)))
    except KubeError as exc:
        if exc.status == 404:
            return []
        raise
    return [item for item in items if ours(item, node)]


def lift(client, node: str, keep: Optional[List[str]] = None) -> List[str]:
    """Delete gpugate's rules for this node but ``keep``; the names deleted."""
    gone = []
    for item in ours_for(client, node):
        meta = item["metadata"]
        if meta.get("name") in (keep or ()):
            continue
        try:  # only the rule read (its uid): one written anew since is the next run's
            client.request("DELETE", RULES + "/" + meta["name"], {"preconditions": {"uid": meta.get("uid")}})
        except KubeError as exc:
            if exc.status != 404:
                raise
        gone.append(meta["name"])
    return gone
