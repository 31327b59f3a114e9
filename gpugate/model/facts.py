"""What a node is: frozen records that probes fill and judges read.

A probe never substitutes a healthy-looking default: when it cannot tell, the
field holds a ``ProbeFailure`` instead of a value, and the judges turn that into
a ``probe`` (or ``broken``) finding.  ``None`` means "not applicable / not
supported by this GPU", which is a fact, not a failure.
"""

from __future__ import annotations

from gpugate.core.record import dataclass, field, fields, is_dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Any, Dict, Optional, Tuple, Union


@dataclass(frozen=True)
class ProbeFailure:
    """A fact that could not be read.

    kind: ``timeout`` | ``missing`` (tool or file absent) | ``error`` (non-zero
    exit, unreadable, unparseable) | ``refused`` (the tool is not root's
    alone: gpugate.safety.trust; not run) | ``overflow`` (the tool printed more than
    gpugate.safety.runner's cap: killed) | ``absent`` (the tool answered: the thing
    asked about does not exist) | ``nvml`` (an NVMLError; ``code`` is its value)
    | ``unchecked`` (the configuration says not to read it, e.g.
    ``packages.manager = "none"``: no finding, but never taken for a value).
    """

    source: str
    kind: str
    detail: str = ""
    code: Optional[int] = None

    def describe(self) -> str:
        if self.kind == "nvml":
            return "%s: NVML error %s (%s)" % (self.source, self.code, self.detail)
        text = "%s: %s" % (self.source, self.kind)
        return text + (" (%s)" % self.detail if self.detail else "")


UNCHECKED = "unchecked"
# Service role -> its daemon's program (gpugate.probes.services finds it in /proc).
DAEMONS = {"persistenced": "nvidia-persistenced", "fabricmanager": "nv-fabricmanager"}
NOT_RUNNING = "not running"  # a service's state: no such process, and no systemd to ask
NOT_READ = ProbeFailure("nvml", UNCHECKED, "not read by this gpugate version")


def failed(value: Any) -> bool:
    return isinstance(value, ProbeFailure)


def unchecked(value: Any) -> bool:
    return isinstance(value, ProbeFailure) and value.kind == UNCHECKED


def unchecked_facts(facts: Any) -> Tuple[Tuple[str, str], ...]:
    """(what, why) for each fact left unread on purpose (gpugate.toml says
    "none", or a tool needed for nothing pinned is not installed): shown by
    `gpugate check` and the audit, never taken for a good value."""
    out = []
    if unchecked(facts.module_on_disk):
        out.append(("module_on_disk", facts.module_on_disk.detail))
    for kind in ("service", "package"):
        values = getattr(facts, kind + "s")
        for role, value in sorted(values.items()) if isinstance(values, dict) else ():
            if unchecked(value):
                out.append(("%s:%s" % (kind, role), value.detail))
    out += clock_events_unchecked(getattr(facts, "nvml", None))
    amd = getattr(facts, "amd", None)
    if amd is not None and not failed(amd):
        out += _amd_unchecked(amd)
    return tuple(out)


def clock_events_unchecked(nvml: Any) -> list:
    """[("clock_events", why)] where a GPU's clock-event counters cannot be
    read (an nvidia-ml-py before 12.575, a GPU or driver without them): time
    spent slowed is then judged on no GPU of it (gpugate.judges.throttle)."""
    for gpu in () if nvml is None or failed(nvml) else nvml.gpus:
        value = getattr(gpu, "clock_event_ns", None)
        if unchecked(value):
            return [("clock_events", "gpu%d: %s" % (gpu.index, value.detail))]
    return []


def _amd_unchecked(amd: Any) -> list:
    """An AMD node's facts nothing judged: XGMI links and the driver's
    bad-page verdict an older amd-smi does not give, RAS off on a GPU."""
    out, seen = [], set()
    for gpu in amd.gpus:
        for what, value in (("xgmi", gpu.xgmi), ("bad_page_threshold", gpu.bad_page_threshold_exceeded)):
            if unchecked(value) and value != NOT_READ_AMD and what not in seen:
                seen.add(what)
                out.append((what, value.detail))
        if gpu.bound and gpu.ras is None:
            out.append(("ras:gpu%d" % gpu.index, "no ras/ directory: amdgpu's RAS is off on this GPU (amdgpu.ras_enable=0?"
                                                 "), so no RAS error or bad page is judged"))
    return out


@dataclass(frozen=True)
class RemappedRows:
    """nvmlDeviceGetRemappedRows."""

    correctable: int
    uncorrectable: int
    pending: bool
    failure: bool


@dataclass(frozen=True)
class Pcie:
    """The PCIe link: current and maximum generation and width."""

    gen: int
    width: int
    max_gen: int
    max_width: int


@dataclass(frozen=True)
class GpuFacts:
    """One GPU as NVML reads it."""

    index: int
    name: Any  # str | ProbeFailure
    uuid: Any
    serial: Any
    pci_bus_id: Any  # "00000000:38:00.0"
    vbios: Any
    gsp_firmware: Any  # str, None when the GPU has no GSP
    ecc_enabled: Any  # bool (current mode), None when unsupported
    ecc_uncorrected_volatile: Any  # int
    ecc_uncorrected_aggregate: Any  # int
    retired_pages_pending: Any  # bool, None when unsupported (row-remap GPUs)
    remapped_rows: Any  # RemappedRows, None when unsupported
    nvlink_up: Any  # tuple of bool per link; () when the GPU has no NVLink
    pcie: Any  # Pcie
    clock_event_reasons: Any  # int bitmask
    persistence_mode: Any  # bool
    mig_enabled: Any  # bool, None when unsupported
    fabric_state: Any  # int (NVML_GPU_FABRIC_STATE_*), None when unsupported
    recovery_action: Any  # int (0 none, 1 reset, 2 reboot, 3 drain P2P, 4 drain and reset), None
    processes: Any = ()  # tuple of pids holding the GPU (compute)
    # Runtime settings (gpugate.judges.settings).  Facts written before they
    # were read decode as "not read", never as a value.
    compute_mode: Any = field(default_factory=lambda: NOT_READ)  # int NVML_COMPUTEMODE_*, None unsupported
    power_limit_mw: Any = field(default_factory=lambda: NOT_READ)  # int, None unsupported
    ecc_pending: Any = field(default_factory=lambda: NOT_READ)  # bool (mode after the next reset), None
    mig_pending: Any = field(default_factory=lambda: NOT_READ)  # bool, None
    # Cumulative time slowed per clock-event reason (NVML's counters, ns) and
    # when NVML read them ("t", us since 1970): {"t": .., "hw_thermal": ..}.
    # None: this GPU or an older NVML has none (gpugate.judges.throttle).
    clock_event_ns: Any = None


@dataclass(frozen=True)
class NvmlFacts:
    """What NVML says of the node and its GPUs."""

    driver_version: Any
    cuda_driver_version: Any  # "12.4"
    gpu_count: Any  # int
    gpus: Tuple[GpuFacts, ...] = ()


@dataclass(frozen=True)
class XidEvent:
    """An Xid, NVSwitch SXid or "fallen off the bus" report from the kernel log."""

    xid: int
    pci_bus_id: str  # as printed by NVRM, normalised to "0000:38:00"
    text: str
    seq: Optional[int] = None  # /dev/kmsg sequence number
    timestamp: Optional[float] = None  # epoch seconds when known
    gpu: Optional[int] = None  # GPU index once matched with NVML's PCI bus ids
    kind: str = "xid"  # "xid", "sxid" (pci_bus_id is the NVSwitch's) or "fallen_off_bus"
    where: str = ""  # MIG "GPU-I:05 GPU-CI:01", or the switch "nvidia-nvswitch1"
    fresh: bool = True  # after the cursor; older ones in the window only count toward a rate


# An AMD fact this gpugate version (or this mode) did not read (gpugate.vendors.amd.facts).
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
    pcie: Any  # gpugate.model.facts.Pcie
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
    # The ROCm Validation Suite's verdict (gpugate.parsers.rvs), in DCGM's
    # diagnostic shape (gpugate.model.toolfacts.DcgmDiag); None when not run.
    rvs: Any = None


@dataclass(frozen=True)
class NodeFacts:
    """Everything one check read of a node."""

    node: str
    mode: str
    collected_at: float
    kernel_release: Any = None
    boot_id: Any = None
    boot_time: Any = None  # epoch seconds (/proc/stat btime)
    module_resident: Any = None  # /proc/driver/nvidia/version
    module_on_disk: Any = None  # modinfo -F version nvidia
    dkms: Any = None  # tuple of DkmsEntry
    image: Any = None  # dict from /etc/cluster-image.json
    pci_gpus: Any = None  # int: NVIDIA 3D/VGA controllers on the bus
    pci_nvswitches: Any = None  # int: NVIDIA bridges (NVSwitch)
    packages: Any = None  # dict name -> Package | ProbeFailure
    services: Any = None  # dict unit -> "active" | "inactive" | ... | ProbeFailure
    dcgm_version: Any = None
    dcgm_health: Any = None  # DcgmHealth
    dcgm_diag: Any = None  # DcgmDiag; None when the mode does not run it
    xids: Any = ()  # tuple of XidEvent (fresh ones only)
    kernel_log_seq: int = -1  # newest kernel log record seen: the next run's cursor
    # {"records", "first", "last"}: records overwritten before they were read
    # (gpugate.probes.kernlog.lost_records); None when none are known lost.
    kernel_log_lost: Any = None
    # What the kernel-log follower says of them (gpugate.probes.gpujournal.coverage):
    # {"follower": "following"|"down"|"absent", "covered": bool, "why": ...}; never a finding.
    kernel_log_follower: Any = None
    nvml: Any = None  # NvmlFacts | ProbeFailure
    hcas: Any = None  # tuple of Hca (/sys/class/infiniband); None when not read (the prolog)
    imex: Any = None  # ImexStatus; None unless the nodeset is an IMEX domain member
    # The code run as root (gpugate.probes.install_trust): "trusted" | ProbeFailure; None when not read (the prolog)
    install: Any = None
    amd: Any = None  # gpugate.vendors.amd.facts.AmdFacts | ProbeFailure on an AMD node; None on NVIDIA's
    gpu_processes: Any = None  # gpugate.model.jobfacts.JobProcesses: the epilog's, whose each GPU process is
    job_devices: Any = None  # "constrained" | "not constrained: why" | ProbeFailure (cgroup.conf); the health check's
    durations: Dict[str, float] = field(default_factory=dict)

    @property
    def image_version(self) -> Any:
        if failed(self.image) or self.image is None:
            return self.image
        return self.image.get("version")


def to_jsonable(value: Any) -> Any:
    """Facts as plain JSON types; a ProbeFailure becomes {"error": {...}}."""
    if isinstance(value, ProbeFailure):
        return {"error": {"source": value.source, "kind": value.kind,
                          "detail": value.detail, "code": value.code}}
    if is_dataclass(value):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


def _failure(value: Any) -> Optional[ProbeFailure]:
    if isinstance(value, dict) and set(value) == {"error"} and isinstance(value["error"], dict):
        e = value["error"]
        return ProbeFailure(str(e.get("source", "")), str(e.get("kind", "error")), str(e.get("detail") or ""),
                            e.get("code"))
    return None


def _plain(value: Any) -> Any:
    """Lists back to tuples (the judges test for tuples), errors back to
    ProbeFailure; other JSON as it is."""
    failure = _failure(value)
    if failure is not None:
        return failure
    if isinstance(value, list):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _record(kind, nested=None):
    def decode(value: Any) -> Any:
        failure = _failure(value)
        if failure is not None or value is None:
            return failure
        if not isinstance(value, dict):
            raise TypeError("%s: expected an object, got %s" % (kind.__name__, type(value).__name__))
        args = {f.name: (nested or {}).get(f.name, _plain)(value[f.name]) for f in fields(kind) if f.name in value}
        return kind(**args)
    return decode


def _each(decode):
    def many(value: Any) -> Any:
        if isinstance(value, list):
            return tuple(decode(v) for v in value)
        return _plain(value)
    return many


def _per_key(decode):
    def per(value: Any) -> Any:
        if isinstance(value, dict) and _failure(value) is None:
            return {k: decode(v) for k, v in value.items()}
        return _plain(value)
    return per


_NODE = None


def _node_decoder():
    global _NODE
    if _NODE is None:
        from gpugate.model import toolfacts as t
        from gpugate.model.jobfacts import GpuProcess, JobProcesses

        gpu = _record(GpuFacts, {"remapped_rows": _record(RemappedRows), "pcie": _record(Pcie)})
        _NODE = _record(NodeFacts, {
            "nvml": _record(NvmlFacts, {"gpus": _each(gpu)}),
            "dkms": _each(_record(t.DkmsEntry)),
            "packages": _per_key(_record(t.Package)),
            "dcgm_health": _record(t.DcgmHealth),
            "dcgm_diag": _record(t.DcgmDiag, {"results": _each(_record(t.DcgmTestResult))}),
            "xids": _each(_record(XidEvent)),
            "hcas": _each(_record(t.Hca, {"ports": _each(_record(t.HcaPort, {"counters": _plain}))})),
            "imex": _record(t.ImexStatus),
            "amd": _record(AmdFacts, {"gpus": _each(_record(AmdGpu, {"pcie": _record(Pcie)})),
                                        "rvs": _record(t.DcgmDiag, {"results": _each(_record(t.DcgmTestResult))})}),
            "gpu_processes": _record(JobProcesses, {"processes": _each(_record(GpuProcess))}),
            "durations": dict,
        })
    return _NODE


def from_jsonable(data: Any) -> NodeFacts:
    """The inverse of ``to_jsonable`` for a node's facts (as `gpugate
    facts --json` and the audit keep them), so the judges can run on them.
    Raises TypeError or ValueError on something else."""
    if not isinstance(data, dict) or _failure(data) is not None:
        raise TypeError("node facts: expected an object")
    return _node_decoder()(data)


if TYPE_CHECKING:
    Fact = Union[Any, ProbeFailure]
