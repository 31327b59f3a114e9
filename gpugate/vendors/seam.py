"""The one interface the node agent calls for what differs by GPU vendor:
the GPU reset rung, the evidence kept before a node is lost, the pinned
components' states in metrics, and the runbook's words.

Each vendor names its parts in PARTS as "module:function", imported only
when called (the prolog loads none of them).  A part a vendor leaves None
is the node's shared path (NVIDIA's tools: nvidia-smi -q, NVML's
versions).  A third vendor (Intel Gaudi: hl-smi, hlml) is a home of its
own under gpugate.vendors and one entry here; docs/explanation/vendors.md
says what else it touches."""

from __future__ import annotations

import importlib

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, List, Optional

PARTS = {
    "nvidia": {
        "reset": "gpugate.vendors.nvidia.reset:reset",  # nvidia-smi -r, GPU by GPU
        "evidence": "gpugate.vendors.nvidia.evidence:nvidia_parts",  # nvidia-smi -q, nvidia-bug-report.sh
        "component_states": "gpugate.vendors.nvidia.metrics:nvidia_component_states",
        "runbook": None,
    },
    "amd": {
        "reset": "gpugate.vendors.amd.reset:reset",  # amd-smi reset: the node's GPUs as one unit
        "evidence": "gpugate.vendors.amd.evidence:amd_parts",
        "component_states": "gpugate.vendors.amd.metrics:amd_component_states",
        "runbook": "gpugate.vendors.amd.runbook:amd_steps",
    },
}


def part(vendor: str, name: str) -> Optional[Callable]:
    """The vendor's function for one part, or None (the shared path).  An
    unknown vendor is an error, never NVIDIA's part by default."""
    try:
        spec = PARTS[vendor][name]
    except KeyError:
        raise ValueError("no GPU vendor %r with a %r part (gpugate.vendors.seam.PARTS)" % (vendor, name)) from None
    if spec is None:
        return None
    module, _, function = spec.partition(":")
    return getattr(importlib.import_module(module), function)


def vendor_of(settings, node: str) -> str:
    """The node's vendor as the baseline says ("nvidia" when it does not
    load: nvidia-smi then fails on an AMD node, and the sweep reboots)."""
    from gpugate.errors import ConfigError

    try:
        from gpugate.node.lastgood import load_baseline

        return load_baseline(settings, {}, node).vendor_for(node)
    except (ConfigError, OSError):
        return "nvidia"


def reset(settings, node: str, gpus: List[int], timeout: float) -> dict:
    """`gpugate reset-gpus`: the reset rung of the vendor the baseline names for this node."""
    return part(vendor_of(settings, node), "reset")(settings, node, gpus, timeout)


def runbook_steps(finding, vendor: str = "nvidia") -> list:
    """The steps for a finding on a node of this vendor: the vendor's own
    words where it has them, else the shared runbook's."""
    from gpugate.model.runbook import steps

    own = part(vendor, "runbook")
    return (own(finding) if own else None) or steps(finding)
