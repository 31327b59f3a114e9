"""What an AMD Instinct node is: the records gpugate.probes.amdsysfs (the
kernel's files) and gpugate.probes.amdsmi (amd-smi JSON) fill, and
gpugate.judges.amd reads.  The sibling of NvmlFacts: ``NodeFacts.amd``.

The same rule as gpugate.facts: a value that could not be read is a
``ProbeFailure`` (never 0, never "ok"); ``None`` means "this GPU or stack
has no such thing" (a fact).  Values are plain (str, int, tuple, dict) so
facts files decode without a decoder per field.
"""

from __future__ import annotations

from .facts import NOT_READ, ProbeFailure
from .record import dataclass, field

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Any, Tuple

VENDORS = ("nvidia", "amd")
# The kernel's RAS blocks (/sys/class/drm/cardN/device/ras/<block>_err_count),
# as amd-smi names them lower-cased (ecc_blocks: UMC, XGMI_WAFL, ...).
RAS_BLOCKS = ("umc", "sdma", "gfx", "mmhub", "athub", "pcie_bif", "hdp", "xgmi_wafl", "df", "smn", "sem",
              "mp0", "mp1", "fuse", "mca", "vcn", "jpeg", "ih", "mpio")
# "ROCm is not read: nothing pinned needs it" and the like.
NOT_READ_AMD = ProbeFailure("amd", "unchecked", "not read by this gpugate version")


@dataclass(frozen=True)
class AmdGpu:
    """One physical AMD GPU (a PCI function of an Instinct device), whatever
    its compute partition: the index is its place in PCI order on the node,
    as amd-smi numbers physical GPUs."""

    index: int
    bdf: str  # "0000:1b:00.0" (sysfs name, lower case)
    device_id: Any  # "0x74a1" (PCI device id): the silicon, when the FRU is unreadable
    bound: bool  # amdgpu drives it (a drm card exists for it)
    product: Any  # str (FRU product_name, e.g. "AMD Instinct MI300X OAM"); None: FRU empty
    serial: Any  # str | None
    unique_id: Any  # str | None
    vbios: Any  # str: sysfs vbios_version (the part number on current kernels, "113-M3000108-103")
    compute_partition: Any  # "SPX" | "DPX" | "TPX" | "QPX" | "CPX"; None: not partitionable
    memory_partition: Any  # "NPS1" | "NPS2" | "NPS4" | "NPS8"; None: not partitionable
    power_cap_w: Any  # float (hwmon power1_cap); None: no power reading (MI250X secondary die)
    # block -> (ue, ce, de): RAS error counts since the driver loaded; de is
    # None where the driver prints no "de:" line.  None: RAS not enabled at all.
    ras: Any
    # (retired, pending, unreservable) page counts (ras/gpu_vram_bad_pages); None: no RAS.
    bad_pages: Any
    pcie: Any  # gpugate.facts.Pcie
    pcie_replays: Any = None  # int (pcie_replay_count); None: no such file
    # From amd-smi (the health check and verify only): NOT_READ elsewhere.
    ifwi: Any = field(default_factory=lambda: NOT_READ_AMD)  # str: amd-smi static ifwi/vbios "version"
    bad_page_threshold_exceeded: Any = field(default_factory=lambda: NOT_READ_AMD)  # bool
    xgmi: Any = field(default_factory=lambda: NOT_READ_AMD)  # (up, down, disabled) | None (no links)
    firmware: Any = None  # dict fw id ("mec", "sos", ...) -> version (sysfs fw_version/*_fw_version)
    processes: Any = ()  # pids of KFD processes (/sys/class/kfd/kfd/proc/*) on this GPU


@dataclass(frozen=True)
class AmdFacts:
    """What amdgpu, ROCm and amd-smi say of the node."""

    initstate: Any  # "live" (/sys/module/amdgpu/initstate) | ProbeFailure (driver not loaded)
    amdgpu_version: Any  # str (/sys/module/amdgpu/version: DKMS) | "inbox" (the kernel's own driver)
    rocm_version: Any  # str (/opt/rocm/.info/version) | ProbeFailure
    pci_functions: Any  # int: Instinct GPU functions on the PCI bus (bound or not) | ProbeFailure
    gpus: Tuple[AmdGpu, ...] = ()
    amd_smi_version: Any = field(default_factory=lambda: NOT_READ)  # amd-smi version: amdsmi_library_version
    # amd-smi as a whole: None when it answered (or was not asked), a
    # ProbeFailure when it could not (driver not loaded, no /dev/kfd access, hung).
    smi: Any = None
    kfd_processes: Any = ()  # pids holding /dev/kfd (any GPU)


def gpu_count(amd: Any) -> int:
    """GPUs the driver drives, 0 when the facts are not there."""
    if amd is None or isinstance(amd, ProbeFailure):
        return 0
    return sum(1 for gpu in amd.gpus if gpu.bound)
