"""GPUs lost: fewer GPUs than this very node showed before.

The GPU count a nodeset expects comes from a file, so a mismatch with it is
budgeted (a typo must not drain a partition).  A node that showed N GPUs and
now shows fewer has lost one, whatever the baseline says: that is an
intrinsic event and drains at once.  The high-water mark is the node's own
(kept in its health-check record); it is reset once the count matches what
the baseline expects, so an admin who removes a GPU on purpose and updates
the baseline is not held to the old count."""

from __future__ import annotations


from gpugate.model.facts import failed
from gpugate.model.findings import HEALTH, REBOOT, Finding

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import List, Optional, Tuple


def counts(facts) -> Tuple[Optional[int], Optional[int]]:
    """(fewest, most) GPUs this run saw, over NVML and the PCI bus; None when neither answered."""
    seen = []
    nvml = facts.nvml
    if nvml is not None and not failed(nvml) and isinstance(nvml.gpu_count, int):
        seen.append(nvml.gpu_count)
    amd = getattr(facts, "amd", None)
    if amd is not None and not failed(amd) and amd.initstate == "live":  # the GPUs amdgpu drives (none: no driver)
        from gpugate.vendors.amd.facts import gpu_count

        seen.append(gpu_count(amd))
    if isinstance(facts.pci_gpus, int):
        seen.append(facts.pci_gpus)
    return (min(seen), max(seen)) if seen else (None, None)


def judge(high: Optional[int], expected: Optional[int], facts) -> List[Finding]:
    fewest, _ = counts(facts)
    if not isinstance(high, int) or fewest is None or fewest >= high or fewest == expected:
        return []
    return [Finding(HEALTH, "gpus_lost", str(fewest), "%d as before" % high, REBOOT)]


def high_for(last, vendor: str) -> Optional[int]:
    """The high-water mark the node's last record kept, when it counted the
    same vendor's GPUs: a baseline that names the node another vendor (a
    typo'd vendor = "amd") counts other devices, and must not read as GPUs
    lost (acute, outside the drain budget) on every node it names."""
    if not isinstance(last, dict) or last.get("gpus_vendor", "nvidia") != vendor:
        return None
    return last.get("gpus_high")


def next_high(high: Optional[int], expected: Optional[int], facts) -> Optional[int]:
    """The high-water mark to keep after this run."""
    fewest, most = counts(facts)
    if most is None:
        return high if isinstance(high, int) else None
    if fewest == expected:
        return fewest  # matches the baseline: the node's normal, whatever it was
    return max(most, high) if isinstance(high, int) else most
