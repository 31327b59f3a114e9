"""Simulated nodes: one directory per node name under a fleet directory.

    FLEET/NODE/node.json   the model: NVML state ("nvml") and everything else
    FLEET/NODE/root/       sysroot rendered from the model (/proc, /etc, /dev/kmsg)
    FLEET/NODE/bin/        replaying executables (dcgmi, modinfo, lspci, ...); the model's
                           "absent" list names those not installed (`sim set absent=lspci,systemctl`)
    FLEET/NODE/replay.json what each executable prints for which argv

FLEET/NODE is a link to the node's current generation of these files
(FLEET/.gens/NODE/GEN): each change is a new one, so a run reads one whole
(gpugate.model.simview); FLEET/.shared/NODE holds the directories every user
writes (/dev/shm, /tmp), one for all generations.

Only NVML, the file-system root and the external executables are simulated:
the probes, judges and Slurm code above them run unchanged.  ``render``
rewrites root/ and replay.json from the model after every change.
"""

import json
import os
import stat
import sys
import time
import uuid
import zlib
from typing import Any, Dict, List, Optional

from gpugate.errors import ConfigError
from gpugate.model import simview
from gpugate.sim import generations
from gpugate.sim import ib as sim_ib
from gpugate.sim import outputs
from gpugate.sim import quiet
from gpugate.sim import sysroot
from gpugate.sim.kmsg import ring_text

DEFAULT_PRODUCT = "NVIDIA H100 80GB HBM3"
DEFAULT_VBIOS = "96.00.99.00.01"
EXECUTABLES = ("modinfo", "dkms", "lspci", "dpkg-query", "rpm", "systemctl", "dcgmi", "nvidia-smi", "nvidia-imex-ctl",
               "all_reduce_perf", "nvidia-bug-report.sh")
NVIDIA_TOOLS = ("dcgmi", "nvidia-smi", "nvidia-imex-ctl", "nvidia-bug-report.sh")
AMD_TOOLS = ("amd-smi", "rvs")  # an AMD node's instead of NVIDIA_TOOLS (gpugate.vendors.amd.sim_node)
_BUS = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")  # an 8-GPU HGX's bus numbers


def node_dir(fleet: str, node: str) -> str:
    return os.path.join(fleet, node)


def nodes(fleet: str) -> List[str]:
    try:
        return sorted(n for n in os.listdir(fleet)
                      if not n.startswith(".") and os.path.isfile(os.path.join(fleet, n, "node.json")))
    except OSError:
        return []


def load(fleet: str, node: str) -> Dict[str, Any]:
    path = os.path.join(node_dir(fleet, node), "node.json")
    try:
        with open(path) as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise ConfigError("%s: no simulated node %s here (gpugate sim init %s --nodes ...)"
                          % (fleet, node, fleet)) from None


def save(fleet: str, node: str, model: Dict[str, Any]) -> None:
    """The node's model and files, as a new generation (gpugate.model.simview):
    made beside the one runs read now, then FLEET/NODE pointed at it in one
    rename.  A run begun before reads the old one whole, a run begun after
    the new one.  Runs already reading the node are waited for first
    (quiet's doc), bounded: the change lands after them, as it did before."""
    live = node_dir(fleet, node)
    quiet.wait_quiet(node)
    new, now = generations.begin(fleet, node)
    _write(os.path.join(new, "node.json"), json.dumps(model, indent=1, sort_keys=True))
    render(new, model, live=live)
    _write(os.path.join(new, simview.SAVED_BY), " ".join(str(pid) for pid in sorted(quiet.lineage())) + "\n")
    generations.publish(fleet, node, new, now)


FLEET_FILE = "fleet.json"  # the fleet's own metadata: the baseline `sim init` used


def record_baseline(fleet: str, baseline_path: str) -> None:
    os.makedirs(fleet, mode=0o755, exist_ok=True)
    _write(os.path.join(fleet, FLEET_FILE), json.dumps({"baseline": os.path.abspath(baseline_path)}, indent=1) + "\n")


def recorded_baseline(fleet: str) -> Optional[str]:
    """The baseline the fleet was created with (None: a fleet made before this was kept)."""
    try:
        with open(os.path.join(fleet, FLEET_FILE)) as handle:
            value = json.load(handle).get("baseline")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None


def new_model(node: str, baseline, seq: int = 0, vendor: Optional[str] = None) -> Dict[str, Any]:
    """A healthy node matching the baseline: pinned versions, expected GPUs
    (vendor: "amd" or "nvidia" whatever the baseline says, else the baseline's)."""
    if (vendor or baseline.vendor_for(node)) == "amd":
        return _new_amd_model(node, baseline)
    expect = baseline.expect_for(node)
    pin = baseline.pin
    product = expect.product or DEFAULT_PRODUCT
    count = expect.gpus if expect.gpus is not None else 8
    driver = pin.driver
    gsp = pin.gsp_firmware or driver
    nvswitch = bool(expect.nvswitch)
    gpus = [_gpu(node, i, product, pin.vbios.get(product, DEFAULT_VBIOS), gsp, nvswitch, seq)
            for i in range(count)]
    for gpu in gpus:
        apply_settings(gpu, expect, reset=True)
    return {
        "node": node,
        "nvml": {"init_error": None, "hang": None, "driver": driver, "cuda": _cuda_int(pin.cuda_driver),
                 "gpus": gpus, "errors": {}},
        "kernel": pin.kernel or "6.1.0-27-amd64",
        "boot_id": str(uuid.uuid4()),
        "boot_time": int(time.time()) - 3600,
        "module": {"resident": driver, "on_disk": driver},
        "dkms": True,
        "image": {"version": pin.image or "gpu-image-1", "built": "2026-11-01"},
        "packages": {
            "container_toolkit": {"name": "nvidia-container-toolkit",
                                  "version": pin.container_toolkit or "1.17.8", "held": True},
            "fabricmanager": {"name": "nvidia-fabricmanager-%s" % driver.split(".")[0],
                              "version": pin.fabricmanager or driver, "held": True} if nvswitch else None,
        },
        "services": {"nvidia-fabricmanager": "active" if nvswitch else "inactive",
                     "nvidia-persistenced": "active"},
        "pci": {"gpus": count, "nvswitches": 4 if nvswitch else 0},
        "dcgm": {"version": pin.dcgm or "4.2.3", "health": "Healthy", "diag_fail": {}},
        "kmsg": [],
        "replays": {},
        "smoke": "healthy",  # what all_reduce_perf replays: gpugate/data/smoke/<value>.txt
        "converge": "ok",  # sim converge: ok | noop (exits 0, fixes nothing) | error
        "persistence_required": bool(expect.persistence),
        "ib": sim_ib.new_hcas(expect, pin),  # /sys/class/infiniband; None: no [hca] table
        "imex": sim_ib.new_imex(node, expect),  # nvidia-imex-ctl; None: not an IMEX member
    }


def _new_amd_model(node: str, baseline) -> Dict[str, Any]:
    """An AMD Instinct node (gpugate.vendors.amd.sim_node): no NVML, no NVIDIA tools,
    amd-smi and rvs instead; the rest (kernel, image, kernel log) as NVIDIA's."""
    from gpugate.vendors.amd import sim_node

    expect, amd_expect, pin = baseline.expect_for(node), baseline.amd_expect_for(node), baseline.pin
    if amd_expect.vendor != "amd":  # --vendor amd on a node an NVIDIA nodeset names: none of its shape applies
        from gpugate.model.baseline import NodeExpect

        expect = NodeExpect()
    product = expect.product or sim_node.DEFAULT_PRODUCT
    gpu_args = {"device_id": amd_expect.device_id or sim_node.DEFAULT_DEVICE}
    if amd_expect.compute_partition:
        gpu_args["compute_partition"] = amd_expect.compute_partition
    if amd_expect.memory_partition:
        gpu_args["memory_partition"] = amd_expect.memory_partition
    if expect.power_limit_watts is not None:
        gpu_args["power_cap_w"] = expect.power_limit_watts
    amd = sim_node.new_amd(pin, node=node, count=expect.gpus if expect.gpus is not None else 8, product=product,
                          **gpu_args)
    for gpu in amd["gpus"]:
        gpu["ifwi"] = pin.ifwi.get(product) or "00159017"
    if pin.amd_smi:
        amd["amd_smi_version"] = pin.amd_smi
    return {
        "node": node, "vendor": "amd", "amd": amd,
        # No libnvidia-ml on an AMD node: NVML_ERROR_LIBRARY_NOT_FOUND (12), as pynvml says it there.
        "nvml": {"init_error": 12, "hang": None, "driver": None, "cuda": 0, "gpus": [], "errors": {}},
        "kernel": pin.kernel or "6.8.0-60-generic", "boot_id": str(uuid.uuid4()),
        "boot_time": int(time.time()) - 3600, "module": {"resident": None, "on_disk": None}, "dkms": True,
        "image": {"version": pin.image or "gpu-image-1", "built": "2026-11-01"},
        "packages": {}, "services": {}, "pci": {"gpus": 0, "nvswitches": 0},
        "dcgm": {"version": "none", "health": "Healthy", "diag_fail": {}},
        "kmsg": [], "replays": {}, "smoke": "rccl-healthy-mi300x", "converge": "ok",
        "persistence_required": False, "ib": sim_ib.new_hcas(expect, pin), "imex": None,
    }


def _gpu(node: str, i: int, product: str, vbios: str, gsp: str, nvswitch: bool, seq: int) -> Dict[str, Any]:
    bus = _BUS[i] if i < len(_BUS) else "%02x" % (0xc0 + i)
    ident = uuid.uuid5(uuid.NAMESPACE_DNS, "%s.gpu%d" % (node, i))
    return {
        "name": product, "uuid": "GPU-%s" % ident, "serial": "1652%09d" % (zlib.crc32(("%s.%d" % (node, i)).encode()) % 10 ** 9),
        "pci_bus_id": "00000000:%s:00.0" % bus.upper(), "vbios": vbios, "gsp": gsp,
        "ecc_mode": [1, 1], "ecc_uncorrected": {"volatile": 0, "aggregate": 0},
        "retired_pages_pending": None, "remapped_rows": [0, 0, 0, 0],
        "nvlink": [1] * 18 if nvswitch else [],
        "pcie": {"gen": 5, "width": 16, "max_gen": 5, "max_width": 16},
        "clock_event_reasons": 0, "persistence": 1, "mig": [0, 0],
        # NVML's cumulative counters (ns) a real H200 answers (`nvidia-smi -q`: Clocks Event Reasons Counters).
        "clock_event_ns": {"sw_power_cap": 0, "sync_boost": 0, "sw_thermal": 0, "hw_thermal": 0, "power_brake": 0},
        "compute_mode": 0, "power_limit_mw": 700000, "power_limits_mw": [200000, 700000, 700000],
        "fabric_state": 3 if nvswitch else None, "recovery_action": 0, "processes": [],
        "lost": False, "errors": {},
    }


def apply_settings(gpu: Dict[str, Any], expect, reset: bool = False) -> None:
    """What config management sets where the nodeset pins it: compute mode
    and power limit at once; ECC and MIG pending until the next GPU reset
    (``reset``: one has happened since, as for a node set up before its boot)."""
    if expect.compute_mode is not None:
        gpu["compute_mode"] = {"default": 0, "prohibited": 2, "exclusive_process": 3}[expect.compute_mode]
    if expect.power_limit_watts is not None:
        gpu["power_limit_mw"] = expect.power_limit_watts * 1000
    for key, pin in (("ecc_mode", expect.ecc), ("mig", expect.mig)):
        if pin is not None and gpu.get(key):
            gpu[key][1] = int(pin)
            if reset:
                gpu[key][0] = int(pin)


def _cuda_int(text: Optional[str]) -> int:
    if not text:
        return 13000
    major, _, minor = text.partition(".")
    try:
        return int(major) * 1000 + int(minor or 0) * 10
    except ValueError:
        return 13000


def render(directory: str, model: Dict[str, Any], live: str = "") -> None:
    """Write the sysroot files and the replay table the model implies
    (live: FLEET/NODE, where the node's tools say they are; else ``directory``)."""
    root = os.path.join(directory, "root")
    files = {
        "proc/sys/kernel/osrelease": model["kernel"] + "\n",
        "proc/sys/kernel/random/boot_id": model["boot_id"] + "\n",
        "proc/stat": "cpu  0 0 0 0\nbtime %d\n" % model["boot_time"],
    }
    if model["image"] is not None:  # None: no golden-image record on this node
        files["etc/cluster-image.json"] = json.dumps(model["image"]) + "\n"
    else:
        _remove(os.path.join(root, "etc/cluster-image.json"))
    if model["module"]["resident"]:
        files["proc/driver/nvidia/version"] = outputs.proc_driver_version(model["module"]["resident"])
    else:
        _remove(os.path.join(root, "proc/driver/nvidia/version"))
    for rel, text in files.items():
        _write(os.path.join(root, rel), text)
    sim_ib.render_sysfs(root, model.get("ib"), _write)
    sysroot.render(root, model, _write)
    if model.get("amd") is not None:
        from gpugate.vendors.amd import sim_node

        sim_node.render(root, model["amd"], _write)  # after sysroot's PCI bus, which keeps only NVIDIA's
    table = outputs.replays(model)
    table.update(sim_ib.imex_replays(model.get("imex")))
    table.update(_amd_replays(model))
    table.update(model.get("replays", {}))
    _write(os.path.join(directory, "replay.json"), json.dumps(table, indent=1, sort_keys=True))
    imex = model.get("imex")
    absent = tuple(model.get("absent", ())) + (() if imex and imex["installed"] else ("nvidia-imex-ctl",))
    if not model.get("bug_report"):  # not installed unless asked for (sim set ... bug_report=1), as on most nodes
        absent += ("nvidia-bug-report.sh",)
    absent += NVIDIA_TOOLS if model.get("amd") is not None else AMD_TOOLS  # a node has its vendor's tools
    if model.get("amd") is not None and (model["amd"].get("smi") == "absent"):
        absent += ("amd-smi",)
    if model.get("amd") is not None and not (model["amd"].get("rvs") or {}).get("installed", True):
        absent += ("rvs",)
    _install_executables(os.path.join(directory, "bin"), absent=absent, named=os.path.join(live or directory, "bin"))
    # The kernel log last, as the kernel writes it: a driver logs a fault
    # after its state shows it (amdgpu's RAS count, a GPU off the bus), so a
    # check between two writes may see the state without its line, never
    # the line without its state.
    _write(os.path.join(root, "dev/kmsg"), ring_text(model))


def _amd_replays(model: Dict[str, Any]) -> Dict[str, Any]:
    if model.get("amd") is None:
        return {}
    from gpugate.vendors.amd.sim_smi_out import replays

    table = replays(model)
    for key, entry in table.items():
        if entry.get("exec"):  # the reset changes the node: gpugate.sim.gpureset
            entry["exec"] = list(outputs._SIM_EXEC)
    return table


def _install_executables(bindir: str, absent=(), named: str = "") -> None:
    os.makedirs(bindir, mode=0o755, exist_ok=True)
    stub = os.path.join(os.path.dirname(__file__), "replay_stub.py")
    with open(stub) as handle:
        body = handle.read()
    # -IS (one word: the kernel passes one argument): start fast and ignore the environment; the stub needs only the stdlib.
    for name in EXECUTABLES + AMD_TOOLS:
        path = os.path.join(bindir, name)
        if name in absent:  # not installed on this node
            _remove(path)
            continue
        script = "#!%s -IS\nSELF = %r\n%s" % (sys.executable, os.path.join(named or bindir, name), body)
        try:
            with open(path) as handle:
                if handle.read() == script:
                    continue
        except OSError:
            pass
        _write(path, script, mode=0o755)


def _write(path: str, text: str, mode: int = 0o644) -> None:
    """Atomic replace: a probe never reads a half-written simulated file,
    and a generation's file hard-linked from the one before is replaced,
    never written into (gpugate.sim.generations).  A file that already says
    the same is left alone: a change rewrites only what it changes."""
    from gpugate.safety.safeio import write_atomic

    data = text.encode()
    try:
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == mode and st.st_size == len(data):
            with open(path, "rb") as handle:
                if handle.read(len(data) + 1) == data:
                    return
    except OSError:
        pass
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    write_atomic(path, data, mode=mode, durable=False, exact_mode=True)  # random O_EXCL temp name


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def converge(model: Dict[str, Any], baseline, previous: bool = False) -> None:
    """What a re-image or config converge does: every pinned version, as the
    baseline (or its [previous] block) says.  Hardware faults stay."""
    target = baseline.as_previous() if previous else baseline
    pin = target.pin
    if model.get("amd") is not None:  # an AMD node: its stack, and what both vendors share
        from gpugate.vendors.amd.sim_ops import converge as amd_converge

        amd_converge(model["amd"], target, model["node"])
        model["kernel"] = pin.kernel or model["kernel"]
        if pin.image and model.get("image") is not None:
            model["image"]["version"] = pin.image
        sim_ib.converge(model, pin)
        return
    if pin.driver:
        model["nvml"]["driver"] = pin.driver
        model["module"]["on_disk"] = pin.driver  # the resident module changes at the reboot
    for gpu in model["nvml"]["gpus"]:
        if gpu.get("gsp") is not None and pin.gsp_firmware:
            gpu["gsp"] = pin.gsp_firmware
        if gpu["name"] in pin.vbios:
            gpu["vbios"] = pin.vbios[gpu["name"]]
        gpu["persistence"] = 1
        apply_settings(gpu, target.expect_for(model["node"]))
    if pin.cuda_driver:
        model["nvml"]["cuda"] = _cuda_int(pin.cuda_driver)
    if pin.kernel:
        model["kernel"] = pin.kernel
    if pin.image:
        model["image"]["version"] = pin.image
    if pin.dcgm:
        model["dcgm"]["version"] = pin.dcgm
    for role in ("container_toolkit", "fabricmanager"):
        version = pin.get(role)
        if version and model["packages"].get(role):
            model["packages"][role]["version"] = version
    sim_ib.converge(model, pin)
    model["dkms"] = True
    for unit in model["services"]:
        if unit == "nvidia-fabricmanager" and model["packages"].get("fabricmanager"):
            model["services"][unit] = "active"


def replay_entry(fleet: str, node: str, key: str) -> Dict[str, Any]:
    """What the node's tool prints for this argv key now (rendered default)."""
    model = load(fleet, node)
    table = outputs.replays(model)
    table.update(sim_ib.imex_replays(model.get("imex")))
    table.update(model.get("replays", {}))
    return dict(table.get(key, {"stdout": "", "rc": 0}))
