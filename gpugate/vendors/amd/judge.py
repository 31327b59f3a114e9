"""The judges of an AMD node (baseline nodeset ``vendor = "amd"``).

The vendor is a seam at this one place and at the probes: what means the
same on both vendors is judged by the same code with the same component
names (kernel, image, gpu_count, pci_gpus, product, vbios, pcie_*,
power_limit, processes, gpus_lost; gpugate.judges.versions / stack / gpus /
settings), and only what the hardware does differently is judged here:
the amdgpu module, RAS blocks, bad pages, XGMI links, partitions, IFWI and
the firmware set, the amdgpu kernel-log events (judge_events) and the
ROCm Validation Suite (judges.dcgm.diagnostic).
"""

from __future__ import annotations

from gpugate.vendors.amd.facts import gpu_count
from gpugate.model.facts import ProbeFailure, failed, unchecked
from gpugate.model.findings import BROKEN, DRIFT, INVESTIGATE, NOT_RUN, PROBE, RECONVERGE, RELOAD_OR_REBOOT, Finding
from gpugate.vendors.amd import judge_gpus
from gpugate.judges import stack
from gpugate.judges import versions
from gpugate.judges.common import probe_finding

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only
    from typing import List


def judge(baseline, expect, facts) -> List[Finding]:
    out: List[Finding] = []
    out += versions.judge(baseline, expect, facts)  # kernel, image (nothing NVIDIA's: no NVML, no packages read)
    amd = facts.amd
    from gpugate.vendors.amd import judge_events
    from gpugate.judges.xids import lost_finding

    if isinstance(facts.xids, ProbeFailure):  # a kernel log that could not be read: no amdgpu event is known
        out.append(probe_finding("kernel_log", facts.xids))
    out += lost_finding(facts)  # the sweep's verification only (its docstring says why)
    out += judge_events.judge(baseline.health, facts)
    if amd is None:  # facts read as another vendor's (a nodeset that became AMD's): nothing is known
        return out + [Finding(PROBE, "amdgpu", "not read", "amdgpu facts", INVESTIGATE,
                              detail="these facts have no AMD part: read the node again as an AMD node")]
    if isinstance(amd, ProbeFailure):
        return out + [probe_finding("amdgpu", amd)]
    out += _stack(expect, facts, amd)
    if not isinstance(amd.initstate, str):
        return out  # no driver: every GPU reading below would be noise
    out += _versions(baseline, expect, facts.node, amd)
    out += judge_gpus.judge(baseline, expect, facts, amd)
    out += _rvs(amd)
    return out


# RVS's words when it has no predefined levels for this GPU (levels exist from
# ROCm 7.2, for MI300X and later: rvs/src/rvsexec.cpp): not a failure of the
# node, and not a pass either (as DCGM refusing its diagnostic on MIG GPUs).
_NO_LEVELS = "No test levels support for the detected GPU"


def _rvs(amd) -> List[Finding]:
    rvs = amd.rvs
    if rvs is None:
        return []
    if isinstance(rvs, ProbeFailure) and _NO_LEVELS in rvs.detail and gpu_count(amd):
        return [Finding(NOT_RUN, "rvs", "no rvs -r levels for this GPU or ROCm", "pass", INVESTIGATE,
                        detail=rvs.detail[:200] + "; set [health.rvs] verify = [] for this nodeset's GPUs, or "
                        "upgrade to ROCm 7.2+ (MI300X and later)")]
    from gpugate.judges.dcgm import diagnostic

    return diagnostic("rvs", rvs, "rvs -r %d")


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


def _versions(baseline, expect, node, amd) -> List[Finding]:
    """amdgpu, ROCm and amd-smi against the pin; VBIOS, IFWI and the
    firmware set per product (the FRU name, as [pin.vbios] keys NVIDIA's)."""
    out: List[Finding] = []
    pin = baseline.pin
    products = {gpu.index: _product(gpu, expect, baseline.amd_expect_for(node)) for gpu in amd.gpus}
    compare = versions.comparer(baseline, out, products.get)
    compare("amdgpu", amd.amdgpu_version)
    compare("rocm", amd.rocm_version)
    compare("amd_smi", amd.amd_smi_version)
    per_product = bool(pin.vbios or pin.ifwi or pin.amdgpu_firmware)
    for gpu in amd.gpus:
        product = products.get(gpu.index)
        if not gpu.bound:
            continue
        if product is None:
            if per_product:  # the pins are per product: a GPU whose product is unknown is judged on none
                out.append(Finding(PROBE, "product", "FRU empty" if gpu.product is None else "unreadable",
                                   "a product name (or the nodeset's device_id)", INVESTIGATE, gpu=gpu.index,
                                   detail="product_name is empty and the nodeset pins no device_id to stand for it: "
                                          "the VBIOS/IFWI pins of its product are not judged"))
            continue
        if product in pin.vbios:
            compare("vbios", gpu.vbios, gpu.index, expected=pin.vbios[product])
        if product in pin.ifwi:
            compare("ifwi", gpu.ifwi, gpu.index, expected=pin.ifwi[product])
        out += _firmware(pin.amdgpu_firmware.get(product), gpu)
    return out


def _product(gpu, expect, amd_expect):
    """The GPU's product as the pins name it: its FRU's, else (FRU empty or
    unreadable) the nodeset's product when the nodeset pins a device_id and
    the silicon is that one; None when nothing says."""
    if isinstance(gpu.product, str) and gpu.product:
        return gpu.product
    wanted = amd_expect.device_id
    if expect.product and wanted and isinstance(gpu.device_id, str) and gpu.device_id.lower() == wanted.lower():
        return expect.product
    return None


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
    unreadable = [v for fw, v in sorted(have.items()) if fw in wanted and failed(v)]
    if unreadable:
        return [probe_finding("amdgpu_firmware", unreadable[0], gpu.index)]
    off = ["%s=%s" % (fw, have.get(fw, "absent")) for fw, version in sorted(wanted.items())
           if str(have.get(fw, "absent")).lower() != str(version).lower()]
    if not off:
        return []
    return [Finding(DRIFT, "amdgpu_firmware", ",".join(off), ",".join("%s=%s" % kv for kv in sorted(wanted.items())),
                    RECONVERGE, gpu=gpu.index)]

