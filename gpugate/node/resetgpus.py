"""`gpugate reset-gpus`: the reset rung of the vendor the baseline names
for this node (gpugate.node.gpureset: NVIDIA's nvidia-smi -r;
gpugate.node.amdreset: amd-smi reset, the node's GPUs as one unit)."""

from typing import List


def reset(settings, node: str, gpus: List[int], timeout: float) -> dict:
    if _vendor(settings, node) == "amd":
        from .amdreset import reset as amd_reset

        return amd_reset(settings, node, gpus, timeout)
    from .gpureset import reset as nvidia_reset

    return nvidia_reset(settings, node, gpus, timeout)


def _vendor(settings, node) -> str:
    """The node's vendor as the baseline says ("nvidia" when it does not
    load: nvidia-smi then fails on an AMD node, and the sweep reboots)."""
    from ..errors import ConfigError

    try:
        from .lastgood import load_baseline

        return load_baseline(settings, {}, node).vendor_for(node)
    except (ConfigError, OSError):
        return "nvidia"
