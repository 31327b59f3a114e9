"""What changed on the job's GPUs during the job (the epilog): new
uncorrected ECC errors and new row remaps, against the prolog's counters."""

from __future__ import annotations


from gpugate.model.facts import failed
from gpugate.model.findings import HEALTH, RESET_GPU, Finding

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Dict, List


def start_counters(facts) -> Dict[str, Dict[str, int]]:
    """Per GPU index (as str, for JSON): the counters the epilog compares."""
    out: Dict[str, Dict[str, int]] = {}
    nvml = facts.nvml
    if nvml is None or failed(nvml):
        return out
    for gpu in nvml.gpus:
        entry = {}
        if isinstance(gpu.ecc_uncorrected_volatile, int):
            entry["ecc"] = gpu.ecc_uncorrected_volatile
        rows = gpu.remapped_rows
        if rows is not None and not failed(rows):
            entry["remap_unc"] = rows.uncorrectable
        out[str(gpu.index)] = entry
    return out


def deltas(start: Dict[str, Dict[str, int]], facts) -> List[Finding]:
    out: List[Finding] = []
    now = start_counters(facts)
    for index, before in start.items():
        after = now.get(index, {})
        for key, component in (("ecc", "ecc_during_job"), ("remap_unc", "remap_during_job")):
            if key in before and key in after and after[key] > before[key]:
                out.append(Finding(HEALTH, component, "+%d" % (after[key] - before[key]), "+0", RESET_GPU,
                                   gpu=int(index)))
    return out
