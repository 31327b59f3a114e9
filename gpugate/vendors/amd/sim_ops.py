"""What changes a simulated AMD node, beyond `sim set`: a config converge
(the pinned amdgpu, ROCm, VBIOS, IFWI, firmware and partitions) and a GPU
reset through `amd-smi reset -G -g all` (handed over by the replaying stub,
as gpugate.sim.gpureset does for nvidia-smi -r).

What a reset does, as amdgpu does it: every GPU of the node (an XGMI hive
resets as one) has its RAS error counts cleared (the driver's counters live
until a reset or reload), pending bad pages retired, and the kernel log
gets the driver's "GPU reset begin!" and "GPU reset(N) succeeded!" lines.
What it cannot do: a process holding /dev/kfd refuses it, amd-smi printing
"Failed to reset GPU" under gpu_reset with exit 0 (amdsmi_commands.py); a
GPU the model marks "reset_fails" fails the same way; a GPU amdgpu does not
drive stays so (a reboot, not a reset, brings it back).
"""

import sys
import time
from typing import Any, Dict, List

from gpugate.vendors.amd.sim_smi_out import reset_output
from gpugate.sim.kmsg import append


def converge(amd: Dict[str, Any], baseline, node: str) -> None:
    pin, expect, amd_expect = baseline.pin, baseline.expect_for(node), baseline.amd_expect_for(node)
    if pin.amdgpu:
        amd["amdgpu"] = None if pin.amdgpu == "inbox" else pin.amdgpu
    if pin.rocm:
        amd["rocm"] = pin.rocm
    if pin.amd_smi:
        amd["amd_smi_version"] = pin.amd_smi
    for gpu in amd["gpus"]:
        product = gpu.get("product")
        if product in pin.vbios:
            gpu["vbios"] = pin.vbios[product]
        if product in pin.ifwi:
            gpu["ifwi"] = pin.ifwi[product]
        gpu["firmware"].update(pin.amdgpu_firmware.get(product, {}))
        if amd_expect.compute_partition:
            gpu["compute_partition"] = amd_expect.compute_partition
        if amd_expect.memory_partition:
            gpu["memory_partition"] = amd_expect.memory_partition
        if expect.power_limit_watts is not None and gpu.get("power_cap_w") is not None:
            gpu["power_cap_w"] = expect.power_limit_watts


def reboot(amd: Dict[str, Any]) -> None:
    """What a reboot does to an AMD node: amdgpu loads again ("live"; a node
    set to keep it from loading stays so: amd.initstate=blacklisted), its RAS
    counters start at zero, pending pages are retired, no process is left."""
    if amd.get("initstate") in ("absent", "unloaded"):
        amd["initstate"] = "live"
    for gpu in amd["gpus"]:
        if gpu.get("ras"):
            gpu["ras"] = {block: [0, 0, 0] for block in gpu["ras"]}
        pages = gpu.get("bad_pages") or {}
        pages["retired"] = pages.get("retired", 0) + pages.get("pending", 0)
        pages["pending"] = 0
        gpu["processes"] = []


def reset(fleet, fleet_dir: str, node: str, model: Dict[str, Any], args: List[str]) -> int:
    """`amd-smi reset -G -g all --json` on the simulated node."""
    amd = model["amd"]
    if "--json" not in args or "-G" not in args:
        sys.stderr.write("sim: amd-smi reset: only `reset -G -g all --json` is simulated\n")
        return 2
    gpus = [g for g in amd["gpus"] if g.get("bound")]
    held = any(g.get("processes") for g in gpus)
    if held or any(g.get("reset_fails") for g in gpus):
        sys.stdout.write(reset_output(gpus, failed=True))
        return 0  # amd-smi's failure is in-band
    hive = len(gpus) > 1
    for index, gpu in enumerate(gpus):
        prefix = "amdgpu %s: amdgpu: " % gpu["bdf"]
        append(model, prefix + "GPU reset begin!", pri=4)
        if gpu.get("ras"):
            gpu["ras"] = {block: [0, 0, 0] for block in gpu["ras"]}
        pages = gpu.get("bad_pages") or {}
        pages["retired"] = pages.get("retired", 0) + pages.get("pending", 0)
        pages["pending"] = 0
        append(model, prefix + "GPU reset(%d) succeeded!" % (index + 1), pri=6)
        if hive:
            append(model, prefix + "VRAM is lost due to GPU reset!", pri=6)
    amd["resets"] = int(amd.get("resets", 0)) + 1
    amd["last_reset"] = time.time()
    fleet.save(fleet_dir, node, model)
    sys.stdout.write(reset_output(gpus))
    return 0

