"""What an AMD Instinct node is: the records gpugate.vendors.amd.probe_sysfs (the
kernel's files) and gpugate.vendors.amd.probe_smi (amd-smi JSON) fill, and
gpugate.vendors.amd.judge reads.  The sibling of NvmlFacts: ``NodeFacts.amd``.
The records themselves are in gpugate.model.facts (its decoder needs them).

The same rule as gpugate.model.facts: a value that could not be read is a
``ProbeFailure`` (never 0, never "ok"); ``None`` means "this GPU or stack
has no such thing" (a fact).  Values are plain (str, int, tuple, dict) so
facts files decode without a decoder per field.
"""

from __future__ import annotations

from gpugate.model.facts import NOT_READ_AMD, AmdFacts, AmdGpu, ProbeFailure  # noqa: F401 - the records live in facts

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Any

VENDORS = ("nvidia", "amd")
# The kernel's RAS blocks (/sys/class/drm/cardN/device/ras/<block>_err_count),
# as amd-smi names them lower-cased (ecc_blocks: UMC, XGMI_WAFL, ...).
RAS_BLOCKS = ("umc", "sdma", "gfx", "mmhub", "athub", "pcie_bif", "hdp", "xgmi_wafl", "df", "smn", "sem",
              "mp0", "mp1", "fuse", "mca", "vcn", "jpeg", "ih", "mpio")


def gpu_count(amd: Any) -> int:
    """GPUs the driver drives, 0 when the facts are not there."""
    if amd is None or isinstance(amd, ProbeFailure):
        return 0
    return sum(1 for gpu in amd.gpus if gpu.bound)
