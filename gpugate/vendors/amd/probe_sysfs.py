"""An AMD Instinct node as the kernel's own files say it: no tool, no
library (docs/explanation/amd-design.md §1.1).  It runs in the prolog before every job:
only os and gpugate's bounded reads, imported lazily by the collector.

What it reads, under ``root`` ('/' or a simulated sysroot):

- /sys/bus/pci/devices/*/{vendor,class,device}: Instinct GPU functions,
  vendor 0x1002 and class 0x0380xx (MI100, MI200 series: lspci "Display
  controller [0380]") or 0x1200xx (MI300 and MI350 series: "Processing
  accelerators [1200]").  Never the 0x0403 audio function, an AMD PCIe
  bridge (0x0604) or a VGA controller (0x0300: a BMC's or a Radeon's).
- per function: ``driver`` (-> amdgpu) and ``drm/card*`` (bound), then
  amdgpu's files: product_name, serial_number, unique_id, vbios_version,
  current_{compute,memory}_partition, hwmon/hwmon*/power1_cap, ras/,
  current/max link speed and width, pcie_replay_count, fw_version/.
- /sys/module/amdgpu/{initstate,version}, /opt/rocm/.info/version.
- /sys/class/kfd/kfd/proc/<pid>/vram_<gpu_id> and, only when a process is
  there, /sys/class/kfd/kfd/topology/nodes/*/{gpu_id,properties}.

A file that cannot be read or parsed is a ProbeFailure (source
"amdgpu_sysfs"), never a healthy default; None is a fact ("this GPU has no
such thing").
"""

from __future__ import annotations

import os

from gpugate.vendors.amd.facts import NOT_READ_AMD, AmdFacts, AmdGpu
from gpugate.errors import ParseError
from gpugate.model.facts import Pcie, ProbeFailure
from gpugate.vendors.amd import parse_sysfs as parse
from gpugate.probes.files import read_text

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Any, Callable, Dict, List, Optional, Tuple

SOURCE = "amdgpu_sysfs"
AMD_VENDOR = "0x1002"
# PCI class and subclass (the upper 16 of the 24 bits in .../class).
GPU_CLASSES = (0x0380, 0x1200)  # display controller (MI100, MI200), processing accelerator (MI300, MI350)
# MI250X/MI250 (two dies per OAM): the secondary die shows power1_cap 0
# ("Valid power data is available only from primary die. For secondary die
# show the value as 0.": aldebaran_ppt.c aldebaran_get_power_limit).
TWO_DIE_DEVICES = frozenset(("0x7408", "0x740c"))
PARTITIONS = {"compute": ("SPX", "DPX", "TPX", "QPX", "CPX"), "memory": ("NPS1", "NPS2", "NPS4", "NPS8")}
PCI_DEVICES = "/sys/bus/pci/devices"
MODULE = "/sys/module/amdgpu"
ROCM_VERSION = "/opt/rocm/.info/version"
KFD = "/sys/class/kfd/kfd"


def _rel(*parts: str) -> str:
    return "/".join(parts)


def _failure(rel: str, why: str, kind: str = "error") -> ProbeFailure:
    return ProbeFailure(SOURCE, kind, "%s: %s" % (rel, why))


_FAIL = object()  # _read's "a missing file is a failure"


def _read(root: str, rel: str, convert: Callable[[str], Any], absent: Any = _FAIL) -> Any:
    """convert(text) of one file; ``absent`` (when given) is what a missing
    file means, else the ProbeFailure saying it is missing."""
    text = read_text(root, rel, SOURCE)
    if isinstance(text, ProbeFailure):
        return absent if text.kind == "missing" and absent is not _FAIL else text
    try:
        return convert(text)
    except ParseError as exc:
        return _failure(rel, str(exc))


def _listdir(root: str, rel: str) -> Any:
    """Sorted names in a directory; None when it does not exist."""
    try:
        return sorted(os.listdir(os.path.join(root, rel.lstrip("/"))))
    except FileNotFoundError:
        return None
    except OSError as exc:
        return _failure(rel, exc.strerror or str(exc))


def pci_functions(root: str) -> Any:
    """[(bdf, device id)] of the Instinct GPU functions, in PCI order, or a
    ProbeFailure.  A function removed while we read is not on the bus."""
    names = _listdir(root, PCI_DEVICES)
    if names is None:
        return _failure(PCI_DEVICES, "absent (no sysfs?)", "missing")
    if isinstance(names, ProbeFailure):
        return names
    out = []
    for bdf in names:
        base = _rel(PCI_DEVICES, bdf)
        vendor = read_text(root, base + "/vendor", SOURCE)
        if isinstance(vendor, ProbeFailure):
            if vendor.kind == "missing":
                continue
            return vendor
        if vendor.strip() != AMD_VENDOR:
            continue
        code = _read(root, base + "/class", lambda t: int(parse.parse_hex(t, "PCI class"), 16) >> 8)
        if isinstance(code, ProbeFailure):
            return code
        if code not in GPU_CLASSES:
            continue
        device = _read(root, base + "/device", lambda t: parse.parse_hex(t, "PCI device id"))
        out.append((bdf, device))
    return out


def _driver(root: str, base: str) -> Optional[str]:
    try:
        return os.path.basename(os.readlink(os.path.join(root, base.lstrip("/"), "driver")))
    except OSError:
        return None


def _bound(root: str, base: str) -> Tuple[bool, str]:
    driver = _driver(root, base)
    if driver != "amdgpu":
        return False, "not bound to amdgpu (driver: %s)" % (driver or "none")
    cards = _listdir(root, base + "/drm")
    if not isinstance(cards, list) or not any(c.startswith("card") and c[4:].isdigit() for c in cards):
        return False, "amdgpu holds it but it has no drm card (probe failed?)"
    return True, ""


def _string(text: str) -> str:
    value = text.strip()
    if not value or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value) or "\ufffd" in value:
        raise ParseError("expected a printable string, saw %r" % value[:60])
    return value


def _partition(kind: str) -> Callable[[str], str]:
    def convert(text: str) -> str:
        value = text.strip()
        if value not in PARTITIONS[kind]:
            raise ParseError("expected one of %s, saw %r" % ("/".join(PARTITIONS[kind]), value[:20]))
        return value
    return convert


def _power_cap(root: str, base: str, device: Any) -> Any:
    """power1_cap (microwatts) -> watts; None where the GPU has no power
    reading: a two-die MI200's secondary die (0, or no such file)."""
    two_die = device in TWO_DIE_DEVICES
    hwmons = _listdir(root, base + "/hwmon")
    if isinstance(hwmons, ProbeFailure):
        return hwmons
    names = [h for h in hwmons or () if h.startswith("hwmon")]
    if not names:
        return None if two_die else _failure(base + "/hwmon", "no hwmon directory", "missing")
    rel = _rel(base, "hwmon", names[0], "power1_cap")
    micro = _read(root, rel, lambda t: parse.parse_uint(t, "power1_cap"), absent=None if two_die else _FAIL)
    if micro == 0:
        return None if two_die else _failure(rel, "0 W (PPT feature not enabled: power values can't be fetched)")
    return micro / 1e6 if isinstance(micro, int) else micro


def _ras(root: str, base: str) -> Tuple[Any, Any]:
    """(block -> (ue, ce, de) | ProbeFailure, (retired, pending, unreservable));
    (None, None) when the GPU has no ras/ directory (RAS not enabled)."""
    names = _listdir(root, base + "/ras")
    if names is None:
        return None, None
    if isinstance(names, ProbeFailure):
        return names, names
    blocks: Dict[str, Any] = {}
    for name in names:  # *_err_count first: amd-smi reads aca_<block> only where it has no umc_err_count
        block = name[:-len("_err_count")] if name.endswith("_err_count") else ""
        if block:
            blocks[block] = _read(root, _rel(base, "ras", name), parse.parse_ras_count)
    for name in names:
        if name.startswith("aca_") and name[4:] not in blocks:
            blocks[name[4:]] = _read(root, _rel(base, "ras", name), parse.parse_ras_count)
    pages = _read(root, base + "/ras/gpu_vram_bad_pages", parse.parse_bad_pages)
    if isinstance(pages, ProbeFailure) and pages.kind == "missing":  # amdgpu.bad_page_threshold=0: retirement off
        pages = _failure(base + "/ras/gpu_vram_bad_pages", "absent while ras/ is there (bad page retirement off?)",
                         "missing")
    return blocks, pages


def _pcie(root: str, base: str) -> Any:
    values = []
    for name, convert in (("current_link_speed", parse.parse_link_speed), ("current_link_width", parse.parse_link_width),
                          ("max_link_speed", parse.parse_link_speed), ("max_link_width", parse.parse_link_width)):
        value = _read(root, _rel(base, name), convert)
        if isinstance(value, ProbeFailure):
            return value
        values.append(value)
    return Pcie(gen=values[0], width=values[1], max_gen=values[2], max_width=values[3])


def _firmware(root: str, base: str) -> Any:
    names = _listdir(root, base + "/fw_version")
    if names is None:
        return _failure(base + "/fw_version", "absent", "missing")
    if isinstance(names, ProbeFailure):
        return names
    return {name[:-len("_fw_version")]: _read(root, _rel(base, "fw_version", name), parse.parse_fw_version)
            for name in names if name.endswith("_fw_version")}


def _gpu(root: str, index: int, bdf: str, device: Any, firmware: bool, processes: Any) -> AmdGpu:
    base = _rel(PCI_DEVICES, bdf)
    bound, why = _bound(root, base)
    if not bound:
        unread = _failure(bdf, why, "missing")
        return AmdGpu(index=index, bdf=bdf, device_id=device, bound=False, product=unread, serial=unread,
                      unique_id=unread, vbios=unread, compute_partition=unread, memory_partition=unread,
                      power_cap_w=unread, ras=unread, bad_pages=unread, pcie=unread, pcie_replays=unread,
                      firmware=unread if firmware else NOT_READ_AMD, processes=processes)
    fru = parse.fru_string  # product_name/serial_number/unique_id exist only where the board has a FRU (newer kernels)
    ras, pages = _ras(root, base)
    return AmdGpu(
        index=index, bdf=bdf, device_id=device, bound=True,
        product=_read(root, base + "/product_name", fru, absent=None),
        serial=_read(root, base + "/serial_number", fru, absent=None),
        unique_id=_read(root, base + "/unique_id", fru, absent=None),
        vbios=_read(root, base + "/vbios_version", _string),
        compute_partition=_read(root, base + "/current_compute_partition", _partition("compute"), absent=None),
        memory_partition=_read(root, base + "/current_memory_partition", _partition("memory"), absent=None),
        power_cap_w=_power_cap(root, base, device),
        ras=ras, bad_pages=pages, pcie=_pcie(root, base),
        pcie_replays=_read(root, base + "/pcie_replay_count", lambda t: parse.parse_uint(t, "pcie_replay_count"),
                           absent=None),
        firmware=_firmware(root, base) if firmware else NOT_READ_AMD,
        processes=processes,
    )


def _initstate(root: str) -> Any:
    text = read_text(root, MODULE + "/initstate", SOURCE)
    if isinstance(text, ProbeFailure):
        if text.kind == "missing":
            return _failure(MODULE + "/initstate", "absent: amdgpu is not loaded", "missing")
        return text
    state = text.strip()
    return state if state == "live" else _failure(MODULE + "/initstate", "%r, not 'live'" % state[:20])


def _amdgpu_version(root: str, initstate: Any) -> Any:
    """The DKMS driver's version; "inbox" for the kernel's own driver, which
    has no such file (only when the module is live: an absent module has
    no version file either)."""
    version = _read(root, MODULE + "/version", lambda t: parse.parse_version(t, "amdgpu version"), absent=None)
    if version is not None:
        return version
    if initstate == "live":
        return "inbox"
    return _failure(MODULE + "/version", "absent and amdgpu is not loaded", "missing")


def _rocm_version(root: str) -> Any:
    """/opt/rocm/.info/version (rocm-core): '7.2.1' ('7.2.1-81': the build is dropped)."""
    text = read_text(root, ROCM_VERSION, "rocm")
    if isinstance(text, ProbeFailure):
        return ProbeFailure("rocm", text.kind, text.detail + (" (ROCm not installed?)" if text.kind == "missing" else ""))
    try:
        return parse.parse_version(text, ROCM_VERSION).partition("-")[0]
    except ParseError as exc:
        return ProbeFailure("rocm", "error", str(exc))


def kfd_processes(root: str, live: bool) -> Tuple[Any, Dict[int, List[int]]]:
    """(pids holding /dev/kfd, {pid: [KFD gpu_id, ...]}): the pid directories
    of /sys/class/kfd/kfd/proc (kfd_process.c kfd_procfs_init,
    kfd_create_process_sysfs) and their vram_<gpu_id> files
    (kfd_procfs_add_sysfs_files)."""
    rel = KFD + "/proc"
    names = _listdir(root, rel)
    if names is None:
        return (() if not live else _failure(rel, "absent while amdgpu is live", "missing")), {}
    if isinstance(names, ProbeFailure):
        return names, {}
    pids = sorted(int(n) for n in names if n.isdigit())
    uses = {}
    for pid in pids:
        files = _listdir(root, "%s/%d" % (rel, pid))  # None: the process ended meanwhile
        uses[pid] = sorted(int(f[5:]) for f in files if f[:5] == "vram_" and f[5:].isdigit()) \
            if isinstance(files, list) else []
    return tuple(pids), uses


def kfd_gpu_bdfs(root: str) -> Any:
    """{KFD gpu_id: 'dddd:bb:dd'} from the KFD topology (a partitioned GPU
    has one node per partition, all at its PCI address); a ProbeFailure
    when the topology cannot be read."""
    rel = KFD + "/topology/nodes"
    nodes = _listdir(root, rel)
    if not isinstance(nodes, list):
        return nodes if isinstance(nodes, ProbeFailure) else _failure(rel, "absent", "missing")
    out = {}
    for node in nodes:
        gpu_id = _read(root, "%s/%s/gpu_id" % (rel, node), lambda t: parse.parse_uint(t, "gpu_id"))
        props = _read(root, "%s/%s/properties" % (rel, node), parse.parse_properties)
        if isinstance(gpu_id, ProbeFailure) or isinstance(props, ProbeFailure):
            return gpu_id if isinstance(gpu_id, ProbeFailure) else props
        if gpu_id and "location_id" in props:  # gpu_id 0: a CPU node
            out[gpu_id] = parse.location_bdf(props.get("domain", 0), props["location_id"])
    return out


def _per_gpu_processes(root: str, functions, uses: Dict[int, List[int]]) -> Dict[str, Any]:
    """{bdf: (pids)}: each GPU's KFD processes; a ProbeFailure per GPU when
    the topology that names the gpu_ids cannot be read."""
    if not any(uses.values()):
        return {bdf: () for bdf, _ in functions}
    bdfs = kfd_gpu_bdfs(root)
    if isinstance(bdfs, ProbeFailure):
        return {bdf: bdfs for bdf, _ in functions}
    return {bdf: tuple(pid for pid, ids in sorted(uses.items()) if any(bdfs.get(i) == bdf[:10] for i in ids))
            for bdf, _ in functions}


def read(root: str, firmware: bool = True) -> AmdFacts:
    """The node's AMD facts.  firmware=False: fw_version/ is not read (the
    prolog, where nothing pins it): ``AmdGpu.firmware`` is then NOT_READ_AMD
    (an "unchecked" ProbeFailure, never taken for a value)."""
    initstate = _initstate(root)
    functions = pci_functions(root)
    pids, uses = kfd_processes(root, initstate == "live")
    if isinstance(functions, ProbeFailure):
        return AmdFacts(initstate=initstate, amdgpu_version=_amdgpu_version(root, initstate),
                        rocm_version=_rocm_version(root), pci_functions=functions, kfd_processes=pids)
    per_gpu = _per_gpu_processes(root, functions, uses) if not isinstance(pids, ProbeFailure) else {}
    gpus = tuple(_gpu(root, i, bdf, device, firmware, per_gpu.get(bdf, pids if isinstance(pids, ProbeFailure) else ()))
                 for i, (bdf, device) in enumerate(functions))
    return AmdFacts(initstate=initstate, amdgpu_version=_amdgpu_version(root, initstate), rocm_version=_rocm_version(root),
                    pci_functions=len(functions), gpus=gpus, kfd_processes=pids)


def bus_to_gpu(amd: Any) -> Dict[str, int]:
    """{bus key ('0000:1b:00'): GPU index} for matching kernel-log events
    (``amdgpu 0000:1b:00.0: ...``) to GPUs, bound or not."""
    from gpugate.probes.kernlog import bus_key

    if amd is None or isinstance(amd, ProbeFailure):
        return {}
    return {bus_key(gpu.bdf): gpu.index for gpu in amd.gpus}
