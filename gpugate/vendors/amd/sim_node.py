"""A simulated AMD Instinct node's files: its model (plain JSON, kept in
node.json under "amd") and the sysroot gpugate.vendors.amd.probe_sysfs reads, with
the kernel's names and formats (docs/explanation/amd-design.md §1.1, §6).  Nothing here
is a capture: the layout follows the kernel sources the probe cites, the
values a healthy 8x MI300X as amd-smi printed one (samples/amd, the Dell
static JSON: BDFs, product, part number, 750 W).

The model's shape (model["amd"]):
    {"initstate": "live" | "absent" (no module) | other text,
     "amdgpu": "6.16.13" | null (the kernel's own driver: no version file),
     "rocm": "7.2.1" | null (not installed),
     "gpus": [{"bdf", "device_id", "class", "bound", "product", "serial",
               "unique_id", "vbios", "compute_partition", "memory_partition",
               "power_cap_w", "ras": {block: [ue, ce, de]} | null,
               "bad_pages": {"retired", "pending", "unreservable"}, "pcie":
               {"gen", "width", "max_gen", "max_width"}, "pcie_replays",
               "firmware": {id: "0x..."}, "kfd_gpu_id", "processes": [pid],
               "files": {path under the device: text | null (removed)}}]}
"""

import os
import re
import shutil
import zlib
from typing import Any, Callable, Dict, List, Optional

from gpugate.errors import ConfigError
from gpugate.sim.values import parse_flag, parse_int

DEFAULT_PRODUCT = "AMD Instinct MI300X OAM"
DEFAULT_DEVICE = "0x74a1"
DEFAULT_VBIOS = "113-M3000108-103"
_BUS = ("1b", "3d", "4e", "5f", "9d", "bd", "cd", "dd")  # the 8x MI300X of samples/amd (amd-smi static --json)
# lspci: MI100/MI200 "Display controller [0380]", MI300/MI350 "Processing accelerators [1200]".
CLASSES = {"0x738c": "0x038000", "0x7408": "0x038000", "0x740c": "0x038000", "0x740f": "0x038000"}
RAS_BLOCKS = ("umc", "sdma", "gfx", "mmhub", "athub", "pcie_bif", "hdp", "xgmi_wafl")
# amd-smi firmware of a MI300A (samples/amd/amd-smi-firmware-MI300A-...) in sysfs's "0x%08x" form;
# which fw_version file carries which FW_ID is this module's mapping.
FIRMWARE = {"mec": "0x000000a6", "mec2": "0x000000a6", "rlc": "0x00000041", "sdma": "0x00000016",
            "sdma2": "0x00000016", "vcn": "0x0611300c", "sos": "0x00360150", "ta_ras": "0x1b36020f",
            "ta_xgmi": "0x20000113", "smc": "0x045567b8"}
PARTS = {"SPX": 1, "DPX": 2, "TPX": 3, "QPX": 4, "CPX": 8}
_PCI = "sys/devices/pci0000:00"
_BUS_LINKS = "sys/bus/pci/devices"
_KFD = "sys/devices/virtual/kfd/kfd"
_OWNED = ("sys/class/drm", "sys/class/kfd", _KFD, "sys/module/amdgpu", "sys/bus/pci/drivers/amdgpu", "opt/rocm")
Write = Callable[[str, str], None]


def _crc(text: str) -> int:
    return zlib.crc32(text.encode())


def new_gpus(node: str, count: int = 8, product: Optional[str] = DEFAULT_PRODUCT, device_id: str = DEFAULT_DEVICE,
             vbios: str = DEFAULT_VBIOS, compute_partition: Optional[str] = "SPX",
             memory_partition: Optional[str] = "NPS1", power_cap_w: Optional[float] = 750) -> List[Dict[str, Any]]:
    """``count`` healthy GPUs: bound, RAS on and clean, PCIe Gen5 x16 at its maximum."""
    gpus, ids = [], set()
    for i in range(count):
        bus = _BUS[i] if i < len(_BUS) else "%02x" % (0xe1 + 2 * (i - len(_BUS)))
        gpu_id = (_crc("%s.%d" % (node, i)) % 60000) + 1024
        while gpu_id in ids or any(gpu_id + k in ids for k in range(8)):
            gpu_id += 17
        ids.update(gpu_id + k for k in range(8))
        gpus.append({
            "bdf": "0000:%s:00.0" % bus, "device_id": device_id, "class": CLASSES.get(device_id, "0x120000"),
            "bound": True, "product": product, "serial": "6924%08d" % (_crc("%s/%d" % (node, i)) % 10 ** 8),
            "unique_id": "%016x" % (_crc(node) << 32 | _crc("%s#%d" % (node, i))), "vbios": vbios,
            "compute_partition": compute_partition, "memory_partition": memory_partition, "power_cap_w": power_cap_w,
            "ras": {block: [0, 0, 0] for block in RAS_BLOCKS},
            "bad_pages": {"retired": 0, "pending": 0, "unreservable": 0},
            "pcie": {"gen": 5, "width": 16, "max_gen": 5, "max_width": 16}, "pcie_replays": 0,
            "firmware": dict(FIRMWARE), "kfd_gpu_id": gpu_id, "processes": [], "files": {},
        })
    return gpus


def new_amd(pin=None, node: str = "amd01", count: int = 8, product: Optional[str] = DEFAULT_PRODUCT,
            initstate: str = "live", amdgpu: Optional[str] = "6.16.13", rocm: Optional[str] = "7.2.1",
            **gpu_args: Any) -> Dict[str, Any]:
    """A healthy node (the baseline's pins where ``pin`` gives them: amdgpu
    ("inbox": no version file), rocm, vbios and amdgpu_firmware per product)."""
    if pin is not None:
        amdgpu = None if pin.amdgpu == "inbox" else (pin.amdgpu or amdgpu)
        rocm = pin.rocm or rocm
        gpu_args.setdefault("vbios", (pin.vbios or {}).get(product, DEFAULT_VBIOS))
    gpus = new_gpus(node, count, product, **gpu_args)
    for gpu in gpus:
        gpu["firmware"].update(((pin.amdgpu_firmware or {}).get(product, {}) if pin is not None else {}))
    return {"initstate": initstate, "amdgpu": amdgpu, "rocm": rocm, "gpus": gpus}


# ------------------------------------------------------------------ render
def _bad_pages(pages: Dict[str, int]) -> str:
    lines = []
    for flag, key in (("R", "retired"), ("P", "pending"), ("F", "unreservable")):
        for _ in range(pages.get(key, 0)):
            lines.append("0x%08x : 0x00001000 : %s\n" % (0x27f5d43 + 8 * len(lines), flag))
    return "".join(lines)


def _speed(gen: int) -> str:
    return {1: "2.5 GT/s PCIe", 2: "5.0 GT/s PCIe", 3: "8.0 GT/s PCIe", 4: "16.0 GT/s PCIe", 5: "32.0 GT/s PCIe",
            6: "64.0 GT/s PCIe"}.get(gen, "Unknown")


def _device_files(gpu: Dict[str, Any]) -> Dict[str, Optional[str]]:
    """What amdgpu shows under the PCI device of a bound GPU (None: removed)."""
    f: Dict[str, Optional[str]] = {"vbios_version": gpu["vbios"] + "\n", "unique_id": gpu["unique_id"] + "\n"}
    fru = gpu["product"] is not None  # no FRU: newer kernels show no product_name/serial_number at all
    f["product_name"] = gpu["product"] + "\n" if fru else None
    f["serial_number"] = (gpu["serial"] or "") + "\n" if fru else None
    for kind, avail in (("compute", "SPX, DPX, QPX, CPX"), ("memory", "NPS1, NPS4")):
        value = gpu[kind + "_partition"]
        f["current_%s_partition" % kind] = value + "\n" if value else None
        f["available_%s_partition" % kind] = avail + "\n" if value else None
    cap = gpu["power_cap_w"]
    f["hwmon/hwmon%d/name" % (2 + _index(gpu))] = "amdgpu\n"
    f["hwmon/hwmon%d/power1_cap" % (2 + _index(gpu))] = "%d\n" % round(cap * 1e6) if cap is not None else None
    for block in RAS_BLOCKS + tuple(set(gpu["ras"] or ()) - set(RAS_BLOCKS)):
        counts = (gpu["ras"] or {}).get(block)
        f["ras/%s_err_count" % block] = ("ue: %d\nce: %d\nde: %d\n" % tuple(counts)) if counts else None
    f["ras/features"] = "feature mask: 0x%x\n" % 0x3fff if gpu["ras"] is not None else None
    f["ras/gpu_vram_bad_pages"] = _bad_pages(gpu["bad_pages"]) if gpu["ras"] is not None else None
    pcie = gpu["pcie"]
    f.update({"current_link_speed": _speed(pcie["gen"]) + "\n", "current_link_width": "%d\n" % pcie["width"],
              "max_link_speed": _speed(pcie["max_gen"]) + "\n", "max_link_width": "%d\n" % pcie["max_width"],
              "pcie_replay_count": "%d\n" % gpu["pcie_replays"]})
    f.update({"fw_version/%s_fw_version" % k: v + "\n" for k, v in sorted(gpu["firmware"].items())})
    f.update(gpu.get("files", {}))
    return f


def _index(gpu: Dict[str, Any]) -> int:
    return int(gpu["bdf"][5:7], 16) & 0x7f  # distinct per GPU: hwmon numbers follow the bus


def render(root: str, amd: Dict[str, Any], write: Write) -> None:
    """Lay out every file the probe reads; remove what the model says is
    absent.  Written first, stale paths removed last: a reader never sees a
    healthy file missing half-way."""
    files: Dict[str, str] = {}
    links: Dict[str, str] = {}
    dirs = set()
    live = amd["initstate"] == "live"
    card = 1  # card0: the BMC's VGA (not an amdgpu device, not laid out)
    topo = [("0", 0, "cpu_cores_count 64\nsimd_count 0\nlocation_id 0\ndomain 0\n")]
    for gpu in amd["gpus"]:
        bdf, bus = gpu["bdf"], int(gpu["bdf"][5:7], 16)
        base = "%s/%s" % (_PCI, bdf)
        audio = "%s.1" % bdf[:-2]  # the HD-audio function consumer AMD boards carry (0x0403): never counted
        bridge = "%s%02x:00.0" % (bdf[:5], bus - 1)  # the OAM's AMD PCIe switch (0x0604): never counted
        for fn, ident in ((bdf, (gpu["device_id"], gpu["class"])), (audio, ("0x1640", "0x040300")),
                          (bridge, ("0x14a1", "0x060400"))):
            for name, value in (("vendor", "0x1002"), ("device", ident[0]), ("class", ident[1])):
                files["%s/%s/%s" % (_PCI, fn, name)] = value + "\n"
            links["%s/%s" % (_BUS_LINKS, fn)] = "../../../devices/pci0000:00/" + fn
        if not (gpu["bound"] and live):
            continue
        links[base + "/driver"] = "../../../bus/pci/drivers/amdgpu"
        files.update({"%s/%s" % (base, k): v for k, v in _device_files(gpu).items() if v is not None})
        parts = PARTS.get(gpu["compute_partition"] or "SPX", 1)
        for p in range(parts):
            drm = "%s/drm" % base if p == 0 else "sys/devices/platform/amdgpu_xcp.%d/drm" % (card - 1)
            files["%s/card%d/dev" % (drm, card)] = "226:%d\n" % card
            files["%s/renderD%d/dev" % (drm, 127 + card)] = "226:%d\n" % (127 + card)
            links["sys/class/drm/card%d" % card] = "../../%s/card%d" % (drm[4:], card)
            links["%s/card%d/device" % (drm, card)] = "../../../" + (bdf if p == 0 else "amdgpu_xcp.%d" % (card - 1))
            location = (p << 28) | (bus << 8)  # pci_dev_id(pdev) | partition node id in bits 31:28
            topo.append((str(len(topo)), gpu["kfd_gpu_id"] + p, "location_id %d\ndomain 0\n" % location))
            card += 1
    if live:
        files["sys/module/amdgpu/initstate"] = "live\n"
        if amd["amdgpu"]:
            files["sys/module/amdgpu/version"] = amd["amdgpu"] + "\n"
        files["sys/bus/pci/drivers/amdgpu/uevent"] = "DRIVER=amdgpu\n"
        links["sys/class/kfd/kfd"] = "../../devices/virtual/kfd/kfd"
        for node, gpu_id, props in topo:
            files["%s/topology/nodes/%s/gpu_id" % (_KFD, node)] = "%d\n" % gpu_id
            files["%s/topology/nodes/%s/properties" % (_KFD, node)] = props
        dirs.add(_KFD + "/proc")  # there with no process in it
        for gpu in amd["gpus"]:
            for pid in gpu["processes"] if gpu["bound"] else ():
                files["%s/proc/%d/pasid" % (_KFD, pid)] = "%d\n" % (pid % 65536)
                files["%s/proc/%d/vram_%d" % (_KFD, pid, gpu["kfd_gpu_id"])] = "1610571776\n"
                files["%s/proc/%d/sdma_%d" % (_KFD, pid, gpu["kfd_gpu_id"])] = "0\n"
    elif amd["initstate"] != "absent":
        files["sys/module/amdgpu/initstate"] = amd["initstate"] + "\n"
    if amd["rocm"]:
        files["opt/rocm/.info/version"] = amd["rocm"] + "\n"
    for rel, text in sorted(files.items()):
        write(os.path.join(root, rel), text)
    for rel in dirs:
        os.makedirs(os.path.join(root, rel), mode=0o755, exist_ok=True)
    for rel, target in sorted(links.items()):
        _symlink(os.path.join(root, rel), target)
    _prune(root, set(files) | set(links), dirs)


def _symlink(path: str, target: str) -> None:
    if os.path.islink(path) and os.readlink(path) == target:
        return
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    if os.path.lexists(path):
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
    os.symlink(target, path)


def _amd_function(root: str, name: str) -> bool:
    try:
        with open(os.path.join(root, _PCI, name, "vendor")) as handle:
            return handle.read().strip() == "0x1002"
    except OSError:
        return False


def _prune(root: str, keep, dirs) -> None:
    """Remove what this module owns and the model no longer has: AMD PCI
    functions and their bus links, the drm and kfd classes, the module."""
    keep_dirs = {os.path.dirname(p) for p in keep} | set(dirs)
    keep_dirs |= {d for p in keep_dirs for d in _parents(p)}
    pci = os.path.join(root, _PCI)
    owned = list(_OWNED) + ["sys/devices/platform/" + n for n in _names(os.path.join(root, "sys/devices/platform"))
                            if n.startswith("amdgpu_xcp.")]
    owned += ["%s/%s" % (_PCI, n) for n in _names(pci) if _amd_function(root, n)]
    for name in _names(os.path.join(root, _BUS_LINKS)):
        rel = "%s/%s" % (_BUS_LINKS, name)
        if rel not in keep and os.path.islink(os.path.join(root, rel)) and \
                (_amd_function(root, name) or not os.path.exists(os.path.join(root, rel))):
            os.unlink(os.path.join(root, rel))
    for top in owned:
        for here, dirs, names in os.walk(os.path.join(root, top), topdown=False):
            rel_dir = os.path.relpath(here, root)
            for name in names + [d for d in dirs if os.path.islink(os.path.join(here, d))]:
                if "%s/%s" % (rel_dir, name) not in keep:
                    os.unlink(os.path.join(here, name))
            if rel_dir not in keep_dirs and rel_dir not in keep and not os.listdir(here):
                os.rmdir(here)


def _names(path: str) -> List[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _parents(rel: str) -> List[str]:
    out = []
    while "/" in rel:
        rel = rel.rsplit("/", 1)[0]
        out.append(rel)
    return out


# ---------------------------------------------------------------- sim keys
KEYS = ["amd.initstate=live|absent|TEXT", "amd.amdgpu=VERSION|inbox", "amd.rocm=VERSION|none", "amd.gpus=N",
        "amd.gpuN.ras.BLOCK.ue|ce|de=N|+N", "amd.gpuN.ras=on|off", "amd.gpuN.bad_pages=retired:N,pending:N,unreservable:N",
        "amd.gpuN.compute_partition=SPX|DPX|TPX|QPX|CPX|none", "amd.gpuN.memory_partition=NPS1|NPS2|NPS4|NPS8|none",
        "amd.gpuN.pcie_gen=N", "amd.gpuN.pcie_width=N", "amd.gpuN.pcie_replays=N", "amd.gpuN.bound=0|1",
        "amd.gpuN.processes=PID[,PID]|none", "amd.gpuN.product=TEXT|none", "amd.gpuN.serial=TEXT",
        "amd.gpuN.vbios=TEXT", "amd.gpuN.power_cap_w=W|none", "amd.gpuN.firmware.ID=0xHEX",
        "amd.gpuN.file.PATH=TEXT|absent"]
_GPU_KEY = re.compile(r"^amd\.gpu(\d{1,3})\.(.+)$")
_NODE_KEYS = ("amd.initstate", "amd.amdgpu", "amd.rocm", "amd.gpus")
_GPU_SUBKEYS = ("ras", "bad_pages", "compute_partition", "memory_partition", "pcie_gen", "pcie_width",
                "pcie_replays", "bound", "processes", "product", "serial", "vbios", "power_cap_w")


def known(key: str) -> bool:
    m = _GPU_KEY.match(key)
    if m is None:
        return key in _NODE_KEYS
    sub = m.group(2)
    if sub.startswith("ras."):
        block, _, which = sub[4:].rpartition(".")
        return bool(re.match(r"^[a-z0-9_]{1,20}$", block)) and which in ("ue", "ce", "de")
    return sub in _GPU_SUBKEYS or bool(re.match(r"^(firmware\.[a-z0-9_]{1,20}|file\.[A-Za-z0-9_][A-Za-z0-9_./]{0,119})$", sub)) \
        and ".." not in sub


def _none(value: str) -> bool:
    return value.lower() in ("none", "null", "")


def _choice(value: str, allowed, none_ok: bool = True) -> Optional[str]:
    if none_ok and _none(value):
        return None
    if value.upper() not in allowed:
        raise ConfigError("expected one of %s, got %r" % ("/".join(allowed), value))
    return value.upper()


def _count(old: int, value: str) -> int:
    step = value[:1] in ("+", "-") and value[1:]  # +N, -N: relative to the count now
    new = old + (parse_int(value[1:]) if value[0] == "+" else -parse_int(value[1:])) if step else parse_int(value)
    if new < 0:
        raise ConfigError("a count cannot go below 0 (%r from %d)" % (value, old))
    return new


def _bad_pages_value(value: str) -> Dict[str, int]:
    out = {"retired": 0, "pending": 0, "unreservable": 0}
    for item in ([] if _none(value) else value.split(",")):
        name, sep, number = item.partition(":")
        if not sep or name.strip() not in out:
            raise ConfigError("bad_pages: expected retired:N,pending:N,unreservable:N, got %r" % value)
        out[name.strip()] = _count(0, number.strip())
    return out


def _set_gpu(gpu: Dict[str, Any], sub: str, value: str) -> None:
    if sub.startswith("ras."):
        block, _, which = sub[4:].rpartition(".")
        if gpu["ras"] is None:
            raise ConfigError("RAS is off on this GPU (amd.gpuN.ras=on first)")
        counts = gpu["ras"].setdefault(block, [0, 0, 0])
        i = ("ue", "ce", "de").index(which)
        counts[i] = _count(counts[i], value)
    elif sub == "ras":
        gpu["ras"] = {b: [0, 0, 0] for b in RAS_BLOCKS} if parse_flag(value) else None
    elif sub == "bad_pages":
        gpu["bad_pages"] = _bad_pages_value(value)
    elif sub in ("compute_partition", "memory_partition"):
        allowed = tuple(PARTS) if sub[0] == "c" else ("NPS1", "NPS2", "NPS4", "NPS8")
        gpu[sub] = _choice(value, allowed)
    elif sub in ("pcie_gen", "pcie_width"):
        gpu["pcie"][sub[5:]] = parse_int(value)
    elif sub == "pcie_replays":
        gpu["pcie_replays"] = _count(gpu["pcie_replays"], value)
    elif sub == "bound":
        gpu["bound"] = bool(parse_flag(value))
    elif sub == "processes":
        gpu["processes"] = [] if _none(value) else sorted({parse_int(p) for p in value.split(",") if p})
    elif sub in ("product", "serial"):
        gpu[sub] = None if value.lower() in ("none", "null") else value  # "": an empty FRU field
    elif sub == "vbios":
        gpu["vbios"] = value
    elif sub == "power_cap_w":
        gpu["power_cap_w"] = None if _none(value) else float(parse_int(value))
    elif sub.startswith("firmware."):
        gpu["firmware"][sub[9:]] = value
    elif sub.startswith("file."):
        gpu.setdefault("files", {})[sub[5:]] = None if value == "absent" else value.replace("\\n", "\n")


def set_key(model: Dict[str, Any], key: str, value: str) -> bool:
    """`gpugate sim set` on an AMD node: True when ``key`` is an AMD key (and
    applied), False when it is not one of this module's."""
    if not known(key):
        return False
    amd = model.get("amd")
    if amd is None:
        raise ConfigError("%s: not an AMD node (sim init --vendor amd)" % key)
    if key == "amd.initstate":
        amd["initstate"] = "absent" if _none(value) else value
    elif key == "amd.amdgpu":
        amd["amdgpu"] = None if value in ("inbox", "none", "") else value
    elif key == "amd.rocm":
        amd["rocm"] = None if _none(value) else value
    elif key == "amd.gpus":
        count = parse_int(value)
        if not 0 <= count <= len(amd["gpus"]):
            raise ConfigError("amd.gpus can only remove GPUs (0..%d): they fall off the bus" % len(amd["gpus"]))
        del amd["gpus"][count:]
    else:
        m = _GPU_KEY.match(key)
        index = int(m.group(1))
        if index >= len(amd["gpus"]):
            raise ConfigError("%s: the node has %d GPUs" % (key, len(amd["gpus"])))
        _set_gpu(amd["gpus"][index], m.group(2), value)
    return True
