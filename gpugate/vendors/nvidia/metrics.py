"""An NVIDIA node's pinned components for the textfile metrics
(gpugate.node.metrics.component_states): kernel, image, driver, CUDA driver,
DCGM, GSP firmware and VBIOS per GPU, the container toolkit and Fabric
Manager (judged only on NVSwitch nodes).  Pure."""

from gpugate.judges.common import nvswitch
from gpugate.model.baseline_keys import PIN_COMPONENTS
from gpugate.model.facts import ProbeFailure, failed, unchecked
from gpugate.node.metrics import DIFFERS, MATCHES, UNCHECKED, UNREADABLE


def _gpu_state(nvml, read, pinned_here) -> str:
    """Per-GPU components: every GPU must be read, one unreadable GPU is enough."""
    if nvml is None or failed(nvml) or not nvml.gpus:
        return UNREADABLE
    values = [read(g) for g in nvml.gpus]
    if any(v is not None and not isinstance(v, str) for v in values):
        return UNREADABLE
    return MATCHES if any(pinned_here(g, v) for g, v in zip(nvml.gpus, values)) else UNCHECKED


def _vbios(gpu):
    # Every GPU has a VBIOS, and without the product no pin applies: both must be read.
    if not isinstance(gpu.name, str) or gpu.vbios is None:
        return gpu.name if failed(gpu.name) else ProbeFailure("nvml", "error", "no VBIOS version")
    return gpu.vbios


def _package_state(packages, role) -> str:
    pkg = packages if failed(packages) else None if packages is None else packages.get(role, None)
    if packages is None:
        return UNREADABLE  # the health check always reads packages: missing means not read
    if failed(pkg):
        return UNCHECKED if unchecked(pkg) else UNREADABLE
    return MATCHES  # a Package, or None: not installed, which the judge calls drift


def nvidia_component_states(verdict, facts, baseline, expect) -> dict:
    pin, nvml = baseline.pin, facts.nvml
    nvml_ok = nvml is not None and not failed(nvml)
    readable = {
        "kernel": isinstance(facts.kernel_release, str),
        "image": isinstance(facts.image, dict) and isinstance(facts.image_version, str),
        "driver": nvml_ok and isinstance(nvml.driver_version, str),
        "cuda_driver": nvml_ok and isinstance(nvml.cuda_driver_version, str),
        "dcgm": isinstance(facts.dcgm_version, str),
    }
    states = {c: MATCHES if ok else UNREADABLE for c, ok in readable.items()}
    # A GPU without GSP (None) and a product without a VBIOS pin are not compared.
    states["gsp_firmware"] = _gpu_state(nvml, lambda g: g.gsp_firmware, lambda g, v: v is not None)
    states["vbios"] = _gpu_state(nvml, _vbios, lambda g, v: g.name in pin.vbios)
    states["container_toolkit"] = _package_state(facts.packages, "container_toolkit")
    states["fabricmanager"] = _package_state(facts.packages, "fabricmanager")
    if states["fabricmanager"] == MATCHES and not nvswitch(expect, facts):
        # Only NVSwitch nodes are judged; not knowing whether this is one is unknown.
        states["fabricmanager"] = UNREADABLE if failed(facts.pci_nvswitches) else UNCHECKED
    differs = {f.component for f in list(verdict.findings) + list(verdict.notes) if f.cls in ("drift", "pending")}
    unknown = {f.component for f in verdict.findings if f.cls == "probe"}
    pinned = [c for c in PIN_COMPONENTS if pin.get(c) is not None] + (["vbios"] if pin.vbios else [])
    out = {}
    for c in pinned:
        state = UNREADABLE if c in unknown else states[c]
        out[c] = DIFFERS if state == MATCHES and c in differs else state
    return out
