"""What a Kubernetes GPU operator publishes about the node, judged against
the same baseline: NVIDIA's GPU Feature Discovery labels (the driver and
the CUDA version it reports, the MIG strategy) and AMD's node labeller
(the amdgpu driver).  A label that disagrees with the pin is drift (the
operator runs another driver than the node is pinned to, or its labels
went stale): a precise reason, budgeted like any drift; while a rollout is
in progress, a label still on ``[previous]``'s version is pending, as the
driver NVML reports is (gpugate.judges.versions).  Pure: the labels
come from the node's own Node object (gpugate.node.kube_operator_labels).

Labels (GFD's README, "Generated Labels"; AMD GPU Operator's node labeller):
``nvidia.com/cuda.driver-version.full`` ("575.57.08"; older GFD:
``nvidia.com/cuda.driver.{major,minor,rev}``),
``nvidia.com/cuda.runtime-version.full`` ("12.9": the CUDA version the
driver supports; older: ``nvidia.com/cuda.runtime.{major,minor}``),
``nvidia.com/mig.strategy``, ``amd.com/gpu.driver-version`` ("6.12.12"); the
GPU Operator's driver upgrade controller's ``nvidia.com/gpu-driver-upgrade-state``
("upgrade-failed": the node was left between drivers; its other states are
an upgrade in progress, which holds the node with the operator's own cordon)."""

from __future__ import annotations

from gpugate.model.findings import DRIFT, INVESTIGATE, PENDING, PROBE, RECONVERGE, Finding
from gpugate.judges.versions import ON_PREVIOUS, previous_pin

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Mapping, Optional, Sequence

GFD = "nvidia.com/"
_DRIVER = ("nvidia.com/cuda.driver-version.full",
           ("nvidia.com/cuda.driver-version.major", "nvidia.com/cuda.driver-version.minor",
            "nvidia.com/cuda.driver-version.revision"),
           ("nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor", "nvidia.com/cuda.driver.rev"))
_CUDA = ("nvidia.com/cuda.runtime-version.full",
         ("nvidia.com/cuda.runtime-version.major", "nvidia.com/cuda.runtime-version.minor"),
         ("nvidia.com/cuda.runtime.major", "nvidia.com/cuda.runtime.minor"))
MIG_STRATEGY = "nvidia.com/mig.strategy"
AMD_DRIVER = "amd.com/gpu.driver-version"
UPGRADE_STATE = "nvidia.com/gpu-driver-upgrade-state"


def _label(labels: Mapping[str, str], full: str, *partial: Sequence[str]) -> Optional[str]:
    """The full label, else one composed from its parts (all present)."""
    if labels.get(full):
        return str(labels[full])
    for keys in partial:
        parts = [labels.get(k) for k in keys]
        if all(parts):
            return ".".join(str(p) for p in parts)
    return None


def _same(observed: str, pinned: str, parts: int = 0) -> bool:
    """Equal version strings, numerically per dot-part ("08" is 8); parts:
    compare only the first N (a CUDA version: major.minor)."""
    a, b = observed.split("."), pinned.split(".")
    if parts:
        a, b = a[:parts], b[:parts]
    norm = [(int(x) if x.isdigit() else x) for x in a], [(int(x) if x.isdigit() else x) for x in b]
    return norm[0] == norm[1]


def published(labels: Mapping[str, str]) -> dict:
    """What the operator's labels say, by gpugate's component names."""
    return {"driver": _label(labels, *_DRIVER), "cuda_driver": _label(labels, *_CUDA),
            "mig_strategy": labels.get(MIG_STRATEGY), "amdgpu": labels.get(AMD_DRIVER)}


def judge(baseline, node: str, labels: Optional[Mapping[str, str]], error: str = "") -> List[Finding]:
    """labels: the Node's (None: not a Kubernetes node); error: why they could not be read."""
    policy = getattr(baseline, "operator", None) or {}
    required = bool(policy.get("labels"))
    if labels is None:
        if error and required:
            return [Finding(PROBE, "operator_labels", "unreadable", "the Node's labels", INVESTIGATE,
                            detail="the node's own Node object could not be read: %s" % error[:200])]
        return []
    seen = published(labels)
    amd = baseline.vendor_for(node) == "amd"
    pin = baseline.pin
    out: List[Finding] = []
    if required and not (seen["amdgpu"] if amd else seen["driver"]):
        who = "AMD's node labeller (amd.com/gpu.driver-version)" if amd else "GPU Feature Discovery (nvidia.com/cuda.*)"
        return [Finding(PROBE, "operator_labels", "absent", "labels from %s" % who, INVESTIGATE,
                        detail="[operator] labels = true: the Node carries none of %s's labels" % who)]

    def drift(component, observed, expected, label):
        out.append(Finding(DRIFT, component, observed, expected, RECONVERGE,
                           detail="the operator's label %s on the Node" % label))

    def compare(component, pinned, label, parts=0):
        """The label against the pin; during a rollout [previous]'s version is pending."""
        observed, expected = seen[pinned], getattr(pin, pinned)
        if not observed or not expected or _same(observed, expected, parts):
            return
        was = previous_pin(baseline, pinned)
        if was and _same(observed, was, parts):
            out.append(Finding(PENDING, component, observed, expected, RECONVERGE,
                               detail="the operator's label %s: %s" % (label, ON_PREVIOUS)))
            return
        drift(component, observed, expected, label)

    if amd:
        compare("operator_amdgpu", "amdgpu", AMD_DRIVER)
        return out
    compare("operator_driver", "driver", _DRIVER[0])
    compare("operator_cuda", "cuda_driver", _CUDA[0], parts=2)
    if labels.get(UPGRADE_STATE) == "upgrade-failed":
        drift("operator_upgrade", "upgrade-failed", "upgrade-done", UPGRADE_STATE)
    want_mig = str(policy.get("mig_strategy") or "")
    if want_mig and (seen["mig_strategy"] or "none") != want_mig:
        drift("mig_strategy", seen["mig_strategy"] or "unset", want_mig, MIG_STRATEGY)
    return out
