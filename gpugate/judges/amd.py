"""The judges of an AMD node (baseline nodeset ``vendor = "amd"``).

The vendor is a seam at this one place and at the probes: what means the
same on both vendors is judged by the same code with the same component
names (kernel, image, gpu_count, pci_gpus, product, vbios, pcie_*,
power_limit, processes, gpus_lost; gpugate.judges.versions / stack / gpus /
settings), and only what the hardware does differently is judged here:
the amdgpu module, RAS blocks, bad pages, XGMI links, partitions, IFWI and
the firmware set, the amdgpu kernel-log events (judges.amdevents) and the
ROCm Validation Suite (judges.dcgm.diagnostic).
"""

from __future__ import annotations

from ..amdfacts import gpu_count
from ..facts import ProbeFailure, failed, unchecked
from ..findings import BROKEN, DRIFT, RECONVERGE, RELOAD_OR_REBOOT, Finding
from . import amdgpus, stack, versions
from .common import probe_finding

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only
    from typing import List


def judge(baseline, expect, facts) -> List[Finding]:
    out: List[Finding] = []
    out += versions.judge(baseline, expect, facts)  # kernel, image (nothing NVIDIA's: no NVML, no packages read)
    amd = facts.amd
    from . import amdevents

    out += amdevents.judge(baseline.health, facts)
    if amd is None:
        return out
    if isinstance(amd, ProbeFailure):
        return out + [probe_finding("amdgpu", amd)]
    out += _stack(expect, facts, amd)
    if not isinstance(amd.initstate, str):
        return out  # no driver: every GPU reading below would be noise
    out += _versions(baseline, amd)
    out += amdgpus.judge(baseline, expect, facts, amd)
    rvs = amd.rvs
    if rvs is not None:
        from .dcgm import diagnostic

        out += diagnostic("rvs", rvs, "rvs -r %d")
    return out


def _stack(expect, facts, amd) -> List[Finding]:
    """The driver loaded and driving every Instinct function on the bus."""
    out = stack._bus(expect, facts)  # pci_gpus: fewer functions on the bus than the nodeset has
    functions = amd.pci_functions
    if isinstance(functions, ProbeFailure):
        return out + [probe_finding("pci", functions)]
    if isinstance(amd.initstate, ProbeFailure):
        if functions:
            out.append(Finding(BROKEN, "module", "amdgpu not loaded", "live", RELOAD_OR_REBOOT,
                               detail=amd.initstate.describe()))
        else:
            out.append(probe_finding("module", amd.initstate))
        return out
    if amd.initstate != "live":
        out.append(Finding(BROKEN, "module", "amdgpu %s" % amd.initstate, "live", RELOAD_OR_REBOOT))
        return out
    bound = gpu_count(amd)
    if functions and bound < functions:
        # On the bus, not driven: amdgpu failed at probe (dmesg "Fatal error during GPU init").
        out.append(Finding(BROKEN, "bound_gpus", "%d of %d on bus" % (bound, functions), str(functions),
                           RELOAD_OR_REBOOT))
    smi = amd.smi
    if isinstance(smi, ProbeFailure) and not unchecked(smi):
        out.append(probe_finding("amd_smi", smi))
    return out


def _versions(baseline, amd) -> List[Finding]:
    """amdgpu, ROCm and amd-smi against the pin; VBIOS, IFWI and the
    firmware set per product (the FRU name, as [pin.vbios] keys NVIDIA's)."""
    out: List[Finding] = []
    products = {gpu.index: gpu.product for gpu in amd.gpus if isinstance(gpu.product, str)}
    compare = versions.comparer(baseline, out, products.get)
    compare("amdgpu", amd.amdgpu_version)
    compare("rocm", amd.rocm_version)
    compare("amd_smi", amd.amd_smi_version)
    pin = baseline.pin
    for gpu in amd.gpus:
        product = products.get(gpu.index)
        if product is None or not gpu.bound:
            continue
        if product in pin.vbios:
            compare("vbios", gpu.vbios, gpu.index, expected=pin.vbios[product])
        if product in pin.ifwi:
            compare("ifwi", gpu.ifwi, gpu.index, expected=pin.ifwi[product])
        out += _firmware(pin.amdgpu_firmware.get(product), gpu)
    return out


def _firmware(wanted, gpu) -> List[Finding]:
    """Only the firmware ids the pin lists: one finding naming every id off it."""
    if not wanted:
        return []
    have = gpu.firmware
    if unchecked(have):
        return []  # not read in this mode (the prolog reads no firmware files)
    if failed(have):
        return [probe_finding("amdgpu_firmware", have, gpu.index)]
    if not isinstance(have, dict):
        return [Finding(DRIFT, "amdgpu_firmware", "unreadable", "pinned ids", RECONVERGE, gpu=gpu.index)]
    off = ["%s=%s" % (fw, have.get(fw, "absent")) for fw, version in sorted(wanted.items())
           if str(have.get(fw, "absent")).lower() != str(version).lower()]
    if not off:
        return []
    return [Finding(DRIFT, "amdgpu_firmware", ",".join(off), ",".join("%s=%s" % kv for kv in sorted(wanted.items())),
                    RECONVERGE, gpu=gpu.index)]

