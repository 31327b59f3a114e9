"""`gpugate sim set` keys: each KEY=VALUE changes a simulated node's model
the way the real fault or drift would change a real node."""

import re
import time
from typing import Any, Callable, Dict, List, Tuple

from gpugate.errors import ConfigError
from gpugate.sim.kmsg import KMSG_RING, append as _append_kmsg, flood, set_ring  # noqa: F401 - KMSG_RING: the tests' ring size
from gpugate.sim.outputs import RCCL_SMOKE, SMOKE
from gpugate.sim.values import parse_flag as _flag, parse_int as _int

_CLOCKS = {"hw_slowdown": 0x8, "hw_thermal": 0x40, "power_brake": 0x80, "sw_thermal": 0x20, "none": 0}
XID_TEXT = {79: "GPU has fallen off the bus.", 48: "An uncorrectable double bit error (DBE) has been detected.",
            13: "Graphics SM Warp Exception on (GPC 1, TPC 0, SM 0): Out Of Range Address",
            94: "Contained ECC error.", 95: "Uncontained ECC error.", 119: "Timeout after 6s of waiting for RPC response from GPU0 GSP!",
            74: "NVLink: fatal error detected on link 3"}


def _choice(value: str, allowed):
    if value not in allowed:
        raise ConfigError("expected one of %s, got %r" % (", ".join(allowed), value))
    return value


def _optional(value: str):
    return None if value.lower() in ("none", "null", "") else value


def _set_driver(m: Dict[str, Any], v: str) -> None:
    # A whole driver install: userspace, module on disk and loaded, GSP firmware.
    m["nvml"]["driver"] = v
    m["module"] = {"resident": v, "on_disk": v}
    for gpu in m["nvml"]["gpus"]:
        if gpu.get("gsp") is not None:
            gpu["gsp"] = v


def _set_all_gpus(m: Dict[str, Any], key: str, value: Any) -> None:
    for gpu in m["nvml"]["gpus"]:
        gpu[key] = value


def _set_gpus(m: Dict[str, Any], v: str) -> None:
    count = _int(v)
    gpus = m["nvml"]["gpus"]
    if count < 0 or count > len(gpus):
        raise ConfigError("gpus can only remove GPUs (0..%d); re-run sim init for more" % len(gpus))
    del gpus[count:]
    m["pci"]["gpus"] = count  # the GPU fell off the bus: lspci no longer shows it


def _set_package(role: str) -> Callable[[Dict[str, Any], str], None]:
    def setter(m: Dict[str, Any], v: str) -> None:
        pkg = m["packages"].get(role)
        if _optional(v) is None:
            m["packages"][role] = None
        elif pkg is None:
            m["packages"][role] = {"name": "nvidia-%s" % role.replace("_", "-"), "version": v, "held": True}
        else:
            pkg["version"] = v
    return setter


def _append_xid(m: Dict[str, Any], index: int, xid: int) -> None:
    gpu = m["nvml"]["gpus"][index]
    bus = gpu["pci_bus_id"].lower()[4:-2]  # "00000000:3a:00.0" -> "0000:3a:00"
    text = XID_TEXT.get(xid, "simulated Xid %d" % xid)
    _append_kmsg(m, "NVRM: Xid (PCI:%s): %d, pid=4242, name=python3, %s" % (bus, xid, text))


def _append_sxid(m: Dict[str, Any], value: str) -> None:
    """sxid=CODE[:nonfatal][@SWITCH]: the line nvidia-nvswitchN prints (Fabric Manager guide)."""
    value, _, switch = value.partition("@")
    code, _, severity = value.partition(":")
    if severity not in ("", "fatal", "nonfatal"):
        raise ConfigError("sxid=CODE[:fatal|:nonfatal][@SWITCH], e.g. sxid=20034 or sxid=12028:nonfatal@2")
    number = _int(switch or "0")
    words = "Non-fatal, Link 46 egress non-posted PRIV error" if severity == "nonfatal" else \
        "Fatal, Link 48 LTSSM Fault Up"
    _append_kmsg(m, "nvidia-nvswitch%d: SXid (PCI:0000:%02x:00.0): %05d, %s" % (number, 5 + number, _int(code), words))


def reboot(m: Dict[str, Any]) -> None:
    """What a reboot changes: new boot, empty kernel log, volatile counters
    cleared, pending remaps applied, the on-disk module loaded."""
    import uuid

    m["boot_id"] = str(uuid.uuid4())
    m["boot_time"] = int(time.time())
    m["kmsg"] = []
    m["module"]["resident"] = m["module"]["on_disk"]
    if m["module"]["on_disk"]:
        m["nvml"]["driver"] = m["module"]["on_disk"]
    m["nvml"]["init_error"] = None
    m["nvml"]["hang"] = None
    for gpu in m["nvml"]["gpus"]:
        gpu["ecc_uncorrected"]["volatile"] = 0
        if gpu.get("clock_event_ns"):  # NVML counts from the driver's load
            gpu["clock_event_ns"] = {name: 0 for name in gpu["clock_event_ns"]}
        if gpu.get("remapped_rows"):
            gpu["remapped_rows"][2] = 0
        gpu["recovery_action"] = 0
        for key in ("ecc_mode", "mig"):  # a pending mode takes effect at the reset
            if gpu.get(key):
                gpu[key][0] = gpu[key][1]
        gpu["processes"] = []
        gpu["lost"] = False
        gpu["hang"] = None
    if m.get("amd") is not None:
        from gpugate.vendors.amd.sim_ops import reboot as amd_reboot

        amd_reboot(m["amd"])


# GPU keys: gpu.N.<key> -> setter(gpu_dict, value, model, index)
def _gpu_path(*path: Any, convert: Callable[[str], Any] = _int):
    def setter(gpu: Dict[str, Any], value: str, model: Dict[str, Any], index: int) -> None:
        target = gpu
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = convert(value)
    return setter


def _gpu_xid(gpu, value, model, index):
    _append_xid(model, index, _int(value))


def _gpu_nvlink_down(gpu, value, model, index):
    links = len(gpu["nvlink"]) or 18
    down = _int(value)
    gpu["nvlink"] = [0] * down + [1] * (links - down)


def _gpu_clocks(gpu, value, model, index):
    mask = 0
    for name in value.split("+"):
        if name not in _CLOCKS:
            raise ConfigError("clock reasons: %s (join with +)" % ", ".join(sorted(_CLOCKS)))
        mask |= _CLOCKS[name]
    gpu["clock_event_reasons"] = mask


THROTTLE_REASONS = ("sw_power_cap", "sync_boost", "sw_thermal", "hw_thermal", "power_brake")


def _throttle(reason):
    """throttle.REASON=+S adds S seconds slowed to NVML's cumulative counter
    (the GPU spent them throttled); =S sets it (0: as after a driver reload)."""
    def setter(gpu, value, model=None, index=None):
        try:
            seconds = float(value)
        except ValueError:
            raise ConfigError("throttle.%s: seconds, or +seconds to add, got %r" % (reason, value)) from None
        counters = gpu.get("clock_event_ns")
        if counters is None:
            counters = gpu["clock_event_ns"] = {name: 0 for name in THROTTLE_REASONS}
        counters[reason] = int(seconds * 1e9) + (int(counters.get(reason) or 0) if value.startswith("+") else 0)
    return setter


def _throttle_all(reason):
    def setter(m, value):
        for gpu in m["nvml"]["gpus"]:
            _throttle(reason)(gpu, value)
    return setter


def _clock_advance(m, value):
    """clock.advance=S: the node's NVML clock moves S seconds on (the
    counters' timestamps), as if the next check ran that much later."""
    try:
        m["nvml"]["clock_offset_s"] = float(m["nvml"].get("clock_offset_s") or 0) + float(value)
    except ValueError:
        raise ConfigError("clock.advance: seconds, got %r" % value) from None


def _gpu_processes(gpu, value, model, index):
    gpu["processes"] = [_int(p) for p in value.split(",") if p]


def _gpu_persistence(gpu, value, model, index):
    gpu["persistence"] = _flag(value)


_COMPUTE_MODES = {"default": 0, "exclusive_thread": 1, "prohibited": 2, "exclusive_process": 3}


def _compute_mode(value):
    if value in _COMPUTE_MODES:
        return _COMPUTE_MODES[value]
    if value.lower() in ("none", "unsupported"):
        return None
    raise ConfigError("compute_mode: expected one of %s or none, got %r" % (", ".join(_COMPUTE_MODES), value))


def _watts(value):
    # nvidia-smi -pl takes watts; NVML keeps milliwatts.
    if value.lower() in ("none", "unsupported"):
        return None
    try:
        return int(round(float(value) * 1000))
    except ValueError:
        raise ConfigError("power_limit: expected watts (e.g. 700 or 612.5) or none, got %r" % value) from None


def _gpu_mode_pair(key, which):
    """ECC or MIG: which 0 sets the mode now and pending (as after a reset),
    1 only the pending mode (as `nvidia-smi -e/-mig` before the reset)."""
    def setter(gpu, value, model, index):
        if value.lower() in ("none", "unsupported"):
            gpu[key] = None
            return
        pair = gpu.get(key) or [0, 0]
        pair[which] = _flag(value)
        if which == 0:
            pair[1] = pair[0]
        gpu[key] = pair
    return setter


GPU_KEYS: Dict[str, Callable] = {
    "vbios": _gpu_path("vbios", convert=str),
    "gsp": _gpu_path("gsp", convert=_optional),
    "name": _gpu_path("name", convert=str),
    "xid": _gpu_xid,
    "remapped_rows.pending": _gpu_path("remapped_rows", 2),
    "remapped_rows.failure": _gpu_path("remapped_rows", 3),
    "remapped_rows.uncorrectable": _gpu_path("remapped_rows", 1),
    "ecc.uncorrected.volatile": _gpu_path("ecc_uncorrected", "volatile"),
    "ecc.uncorrected.aggregate": _gpu_path("ecc_uncorrected", "aggregate"),
    "retired_pages_pending": _gpu_path("retired_pages_pending"),
    "pcie.width": _gpu_path("pcie", "width"),
    "pcie.gen": _gpu_path("pcie", "gen"),
    "recovery_action": _gpu_path("recovery_action"),
    "fabric_state": _gpu_path("fabric_state"),
    "nvlink.down": _gpu_nvlink_down,
    "clocks": _gpu_clocks,
    **{"throttle." + r: _throttle(r) for r in THROTTLE_REASONS},
    "processes": _gpu_processes,
    "persistence": _gpu_persistence,
    "mig": _gpu_mode_pair("mig", 0),
    "mig.pending": _gpu_mode_pair("mig", 1),
    "ecc": _gpu_mode_pair("ecc_mode", 0),
    "ecc.pending": _gpu_mode_pair("ecc_mode", 1),
    "compute_mode": _gpu_path("compute_mode", convert=_compute_mode),
    "power_limit": _gpu_path("power_limit_mw", convert=_watts),
    "lost": _gpu_path("lost", convert=lambda v: bool(_flag(v))),
    "hang": _gpu_path("hang", convert=_optional),
    "nvml_error": None,  # handled below: gpu.N.nvml_error.<function>=code
}


def _node_path(*path: str, convert: Callable[[str], Any] = str):
    def setter(m: Dict[str, Any], value: str) -> None:
        target = m
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = convert(value)
    return setter


def _nvml_hang(m, v):
    m["nvml"]["hang"] = None if v in ("0", "none", "") else ("init" if v in ("1", "init") else v)


def _diag_fail(m, v):
    gpu, _, message = v.partition(":")
    m["dcgm"].setdefault("diag_fail", {})[str(_int(gpu))] = message or "Detected 2 volatile double-bit ECC error(s)."


NODE_KEYS: Dict[str, Callable[[Dict[str, Any], str], None]] = {
    "driver": _set_driver,
    "gsp": lambda m, v: _set_all_gpus(m, "gsp", _optional(v)),
    "cuda": _node_path("nvml", "cuda", convert=_int),
    "kernel": _node_path("kernel"),
    "image_version": _node_path("image", "version"),
    "fabricmanager": _set_package("fabricmanager"),
    "container_toolkit": _set_package("container_toolkit"),
    "dcgm": _node_path("dcgm", "version"),
    "dcgm.health": _node_path("dcgm", "health"),
    "dcgm.diag_fail": _diag_fail,
    "gpus": _set_gpus,
    "pci.gpus": _node_path("pci", "gpus", convert=_int),
    "nvml.init_error": _node_path("nvml", "init_error", convert=lambda v: None if v in ("0", "none") else _int(v)),
    "nvml.hang": _nvml_hang,
    "nvml.binding": _node_path("nvml", "binding"),  # the nvidia-ml-py version: 12.535 knows no clock-event counter
    "module.resident": _node_path("module", "resident", convert=_optional),
    "module.on_disk": _node_path("module", "on_disk", convert=_optional),
    "dkms": _node_path("dkms", convert=lambda v: bool(_flag(v))),
    "converge": _node_path("converge", convert=lambda v: _choice(v, ("ok", "noop", "error"))),
    "reboot": lambda m, v: reboot(m) if _flag(v) else None,
    "sxid": _append_sxid,
    "kmsg": _append_kmsg,  # one raw kernel-log message, as the driver prints it
    "kmsg.user": lambda m, v: _append_kmsg(m, v, pri=14),  # written to /dev/kmsg from user space: LOG_USER
    "kmsg.flood": lambda m, v: flood(m, _int(v)),
    "kmsg.ring": lambda m, v: set_ring(m, _int(v)),  # records the ring holds
    "compute_mode": lambda m, v: _set_all_gpus(m, "compute_mode", _compute_mode(v)),
    "power_limit": lambda m, v: _set_all_gpus(m, "power_limit_mw", _watts(v)),
    "smoke": _node_path("smoke", convert=lambda v: _choice(v, SMOKE + RCCL_SMOKE)),
    "absent": _node_path("absent", convert=lambda v: _absent(v)),  # tools not installed: absent=lspci,systemctl
    "bug_report": _node_path("bug_report", convert=lambda v: bool(_flag(v))),  # nvidia-bug-report.sh installed
    "reset_delay": _node_path("reset_delay", convert=float),  # seconds nvidia-smi -r takes (a kill -9 in the middle)
    "systemd": _node_path("systemd", convert=lambda v: bool(_flag(v))),  # 0: systemd is not the init (a container)
    "clock.advance": _clock_advance,
    **{"throttle." + r: _throttle_all(r) for r in THROTTLE_REASONS},  # every GPU: the room's power brake
}


def _absent(value: str) -> List[str]:
    from gpugate.sim.fleet import EXECUTABLES

    names = sorted({n for n in value.split(",") if n})
    unknown = [n for n in names if n not in EXECUTABLES]
    if unknown:
        raise ConfigError("absent: unknown tool %s; tools: %s" % (", ".join(unknown), ", ".join(EXECUTABLES)))
    return names


_GPU_KEY = re.compile(r"^gpu\.(\d{1,3})\.(.+)$")


def known_keys() -> List[str]:
    from gpugate.vendors.amd import sim_keys
    from gpugate.vendors.amd import sim_node
    from gpugate.sim import jobs
    from gpugate.sim.ib import KEYS

    return sorted(NODE_KEYS) + ["service.<unit>"] + list(KEYS) + list(jobs.KEYS) + ["gpu.N.%s" % k for k in sorted(GPU_KEYS) if k != "nvml_error"] \
        + ["gpu.N.nvml_error.<nvmlFunction>"] + list(sim_node.KEYS) + list(sim_keys.KEYS)


def parse_assignments(items: List[str]) -> List[Tuple[str, str]]:
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError("expected KEY=VALUE, got %r" % item)
        check_key(key)
        out.append((key, value))
    return out


def check_key(key: str) -> None:
    if key in NODE_KEYS or key.startswith("service.") and len(key) > 8:
        return
    from gpugate.vendors.amd import sim_keys
    from gpugate.vendors.amd import sim_node
    from gpugate.sim import jobs
    from gpugate.sim.ib import known

    if known(key) or sim_node.known(key) or sim_keys.known(key) or jobs.known(key):
        return
    m = _GPU_KEY.match(key)
    if m and (m.group(2) in GPU_KEYS or m.group(2).startswith("nvml_error.nvml")):
        return
    raise ConfigError("unknown key %r; known keys: %s" % (key, ", ".join(known_keys())))


def apply(model: Dict[str, Any], key: str, value: str) -> None:
    if key in NODE_KEYS:
        NODE_KEYS[key](model, value)
        return
    if key.startswith("service."):
        model["services"][key[len("service."):]] = value
        return
    if key.startswith(("ib.", "imex.")):
        from gpugate.sim.ib import set_key

        set_key(model, key, value)
        return
    if key.startswith("slurm."):  # the node's Slurm jobs and cgroups (gpugate.sim.jobs)
        from gpugate.sim import jobs
        return jobs.set_key(model, key, value)
    if key.startswith("amd."):  # an AMD node's (gpugate.vendors.amd.sim_node: sysfs; sim_keys: tools and kernel log)
        from gpugate.vendors.amd import sim_keys
        from gpugate.vendors.amd import sim_node

        sim_keys.set_key(model, key, value) or sim_node.set_key(model, key, value)
        return
    m = _GPU_KEY.match(key)
    index, sub = int(m.group(1)), m.group(2)
    gpus = model["nvml"]["gpus"]
    if index >= len(gpus):
        raise ConfigError("%s: node %s has %d GPUs (0..%d)" % (key, model["node"], len(gpus), len(gpus) - 1))
    if sub.startswith("nvml_error."):
        code = _int(value)
        errors = gpus[index].setdefault("errors", {})
        if code:
            errors[sub[len("nvml_error."):]] = code
        else:
            errors.pop(sub[len("nvml_error."):], None)
        return
    GPU_KEYS[sub](gpus[index], value, model, index)
