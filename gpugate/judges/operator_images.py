"""What a GPU operator runs on this node, by its DaemonSets' images, held to
the baseline: NVIDIA's GPU Operator (driver container, container toolkit,
device plugin, DCGM exporter) and AMD's GPU Operator (device plugin,
device metrics exporter).  The pods on the node are the truth for the node:
during the operator's rolling update some nodes run the old image, and the
ClusterPolicy says only what every node will run.  Pure: the images come
from gpugate.node.kube_operator_labels.

An image reference as the operator builds it from ClusterPolicy's
``repository``/``image``/``version``: ``nvcr.io/nvidia/k8s-device-plugin:v0.17.1``,
``nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04``,
``nvcr.io/nvidia/driver:570.124.06-ubuntu22.04``, or by digest
(``version: sha256:...``: ``.../dcgm-exporter@sha256:e374...``), behind a
mirror registry with a port (``registry.example.com:5000/nvidia/...``).
A pin matches a tag equal to it or followed by the image's OS suffix
(``-ubuntu22.04``, ``-ubi9``), a leading ``v`` either side ignored; a
``sha256:`` pin matches the digest."""

from __future__ import annotations

from gpugate.model.findings import DRIFT, INVESTIGATE, PROBE, RECONVERGE, Finding

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Sequence, Tuple

# The image's name (the repository's last part) -> the pin's key, by the node's vendor.
NVIDIA = {"driver": "driver", "container-toolkit": "container_toolkit", "k8s-device-plugin": "device_plugin",
          "dcgm-exporter": "dcgm_exporter"}
AMD = {"k8s-device-plugin": "amd_device_plugin", "device-metrics-exporter": "amd_metrics_exporter"}
KEYS = ("container_toolkit", "device_plugin", "dcgm_exporter", "amd_device_plugin", "amd_metrics_exporter")


def parse_image(ref: str) -> Tuple[str, str, str]:
    """(name, tag, digest) of an image reference; "" for a part it lacks."""
    ref, _, digest = ref.partition("@")
    last = ref.rsplit("/", 1)[-1]  # a registry's :port is before the last "/"
    name, _, tag = last.partition(":")
    return name, tag, digest


def _bare(version: str) -> str:
    return version[1:] if version[:1] in ("v", "V") and version[1:2].isdigit() else version


def matches(tag: str, digest: str, pin: str) -> bool:
    if pin.startswith("sha256:"):
        return digest == pin
    tag, pin = _bare(tag), _bare(pin)
    return bool(tag) and (tag == pin or tag.startswith(pin + "-"))


def pins_for(baseline, node: str) -> Dict[str, str]:
    """The pins that apply to the node's operator images ({} : nothing to read)."""
    policy = getattr(baseline, "operator", None) or {}
    amd = baseline.vendor_for(node) == "amd"
    names = AMD if amd else NVIDIA
    pins = {key: str(policy.get(key) or "") for key in names.values() if key != "driver"}
    if not amd and policy.get("driver_image") and baseline.pin.driver:
        pins["driver"] = baseline.pin.driver  # the driver container: the same pin as the node's driver
    return {k: v for k, v in pins.items() if v}


def judge(baseline, node: str, images: Optional[Sequence[Tuple[str, str]]], error: str = "") -> List[Finding]:
    """images: (pod, image) of the operator's pods on the node (None: not read); error: why not."""
    pins = pins_for(baseline, node)
    if not pins:
        return []
    if images is None:
        if not error:
            return []
        return [Finding(PROBE, "operator_images", "unreadable", "the operator's pods on the node", INVESTIGATE,
                        detail="the baseline pins [operator] images, and the operator's pods on this node could "
                               "not be read: %s" % error[:200])]
    if not images:
        # A wrong [kubernetes] operator_namespace reads as no pods.  A probe only where the site says the
        # operator runs on every GPU node ([operator] labels = true): held for it, a node whose operator
        # pods are not placed yet would keep them off (its taint), and never get them.
        if not (getattr(baseline, "operator", None) or {}).get("labels"):
            return []
        return [Finding(PROBE, "operator_images", "absent", "the operator's pods on the node", INVESTIGATE,
                        detail="[operator] labels = true and images are pinned, and no pod of the operator is "
                               "on this node ([kubernetes] operator_namespace, operator_namespace_amd)")]
    names = AMD if baseline.vendor_for(node) == "amd" else NVIDIA
    out: List[Finding] = []
    seen = set()
    for pod, ref in images:
        name, tag, digest = parse_image(ref)
        key = names.get(name)
        if key not in pins or matches(tag, digest, pins[key]):
            continue
        observed = tag or ("@" + digest[:19] if digest else "untagged")
        if (key, observed) in seen:
            continue
        seen.add((key, observed))
        out.append(Finding(DRIFT, "operator_" + key, observed, pins[key], RECONVERGE,
                           detail="pod %s on the node runs %s" % (pod, ref[:200])))
    return out
