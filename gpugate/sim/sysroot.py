"""The kernel's own files a simulated node lays out under its sysroot, with
the real names and formats: the PCI devices in sysfs, the loaded module's
/sys/module/nvidia/version, the daemons' /proc/PID/{comm,cmdline}, and
/run/systemd/system where systemd is the init.  Written from the model by
gpugate.sim.fleet.render; what a change removes is removed here."""

import os
import shutil
from typing import Any, Callable, Dict, List, Tuple

from gpugate.model.facts import DAEMONS

# PCI ids: NVIDIA's vendor, an H100 SXM and an H100-era NVSwitch (lspci -n: "10de:2330", "10de:22a3"),
# and a host bridge that is not NVIDIA's (skipped by vendor).
_GPU = ("0x10de", "0x2330", "0x030200")  # 3D controller
_NVSWITCH = ("0x10de", "0x22a3", "0x068000")  # bridge, other
_HOST_BRIDGE = ("0x8086", "0x09a2", "0x060000")
_PCI_ROOT = "sys/devices/pci0000:00"
_PCI_BUS = "sys/bus/pci/devices"
# The unit names of gpugate.toml's defaults ([services]) -> the program their daemon runs.
UNIT_PROCESS = {"nvidia-%s" % role: program for role, program in DAEMONS.items()}

# Every user's to write, as on a node (a test may mount a small tmpfs there): what is written there
# is not the model's, and each generation of the node's files shares them (gpugate.sim.generations).
SHARED_DIRS = ("dev/shm", "tmp")


def pci_devices(model: Dict[str, Any]) -> List[Tuple[str, Tuple[str, str, str]]]:
    """(sysfs address, (vendor, device, class)) for the node's PCI bus: its
    GPUs where NVML has their bus ids ("00000000:18:00.0" -> "0000:18:00.0"),
    then the rest of model["pci"]["gpus"] and the NVSwitches."""
    gpus = [g for g in model["nvml"]["gpus"] if isinstance(g.get("pci_bus_id"), str)]
    ident = lambda g: ("0x10de", "0x%04x" % (g["pci_device_id"] >> 16) if g.get("pci_device_id")  # noqa: E731
                       else _GPU[1], _GPU[2])
    out = [("0000:00:00.0", _HOST_BRIDGE)]
    for i in range(model["pci"]["gpus"]):
        if i < len(gpus):
            out.append((gpus[i]["pci_bus_id"][-12:].lower(), ident(gpus[i])))
        else:
            out.append(("0000:%02x:00.0" % (0xe0 + i), _GPU))
    out += [("0000:%02x:00.0" % (0xc0 + i), _NVSWITCH) for i in range(model["pci"]["nvswitches"])]
    return out


def render(root: str, model: Dict[str, Any], write: Callable[[str, str], None]) -> None:
    # An AMD node's functions are gpugate.vendors.amd.sim_node's to write and prune:
    # removed here and laid out again there, a check running meanwhile read
    # a bus without them (GPUs "FRU empty", "not supported").
    _render_pci(root, pci_devices(model), write, keep_amd=model.get("amd") is not None)
    module = os.path.join(root, "sys/module/nvidia/version")
    if model["module"]["resident"]:
        write(module, model["module"]["resident"] + "\n")
    elif os.path.lexists(module):
        os.unlink(module)
    _render_processes(root, model, write)
    for shared in SHARED_DIRS:
        path = os.path.join(root, shared)
        if not os.path.isdir(path):
            os.makedirs(path, exist_ok=True)
            os.chmod(path, 0o1777)
    systemd = os.path.join(root, "run/systemd/system")
    if model.get("systemd", True):
        os.makedirs(systemd, mode=0o755, exist_ok=True)
    elif os.path.isdir(systemd):
        shutil.rmtree(systemd)


def _render_pci(root: str, devices, write, keep_amd: bool = False) -> None:
    bus = os.path.join(root, _PCI_BUS)
    os.makedirs(bus, mode=0o755, exist_ok=True)
    wanted = {address for address, _ in devices}
    for gone in set(os.listdir(bus)) - wanted:  # a GPU that fell off the bus
        if keep_amd and _vendor(root, gone) == "0x1002":
            continue
        os.unlink(os.path.join(bus, gone))
        shutil.rmtree(os.path.join(root, _PCI_ROOT, gone), ignore_errors=True)
    for address, (vendor, device, cls) in devices:
        for name, value in (("vendor", vendor), ("device", device), ("class", cls)):
            write(os.path.join(root, _PCI_ROOT, address, name), value + "\n")
        link = os.path.join(bus, address)
        if not os.path.islink(link):  # as in sysfs: the bus lists links to the device tree
            os.symlink(os.path.join("../../..", _PCI_ROOT[len("sys/"):], address), link)


def _vendor(root: str, address: str) -> str:
    try:
        with open(os.path.join(root, _PCI_ROOT, address, "vendor")) as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _render_processes(root: str, model: Dict[str, Any], write) -> None:
    """PID 1 and one process per active daemon (the stopped ones have none);
    the GPUs' processes and the jobs' slurmstepds, with their cgroups
    (gpugate.sim.jobs)."""
    from gpugate.sim import jobs

    procs = {1: ("systemd" if model.get("systemd", True) else "tini", "/sbin/init")}
    for i, (unit, state) in enumerate(sorted(model["services"].items())):
        program = UNIT_PROCESS.get(unit)
        if program and state == "active":
            procs[4100 + i] = (program[:15], "/usr/bin/%s\0--verbose\0" % program)
    in_jobs = jobs.processes(model)
    procs.update({pid: p[:2] for pid, p in in_jobs.items() if pid not in procs})
    confs = (("etc/slurm/cgroup.conf", jobs.cgroup_conf(model)), ("etc/slurm/slurm.conf", jobs.slurm_conf(model)))
    for rel, conf in confs:
        if conf is not None:
            write(os.path.join(root, rel), conf)
        elif os.path.lexists(os.path.join(root, rel)):
            os.unlink(os.path.join(root, rel))
    proc = os.path.join(root, "proc")
    if os.path.isdir(proc):
        for gone in {p for p in os.listdir(proc) if p.isdigit()} - {str(p) for p in procs}:
            shutil.rmtree(os.path.join(proc, gone), ignore_errors=True)
    for pid, (comm, cmdline) in procs.items():
        write(os.path.join(proc, str(pid), "comm"), comm + "\n")
        write(os.path.join(proc, str(pid), "cmdline"), cmdline)
        write(os.path.join(proc, str(pid), "cgroup"), in_jobs[pid][2] if pid in in_jobs else "0::/system.slice\n")
        # Real uid: the jobs' user's for their processes, else whoever owns this /proc (root on a node).
        uid = in_jobs[pid][3] if pid in in_jobs and in_jobs[pid][3] is not None else os.stat(proc).st_uid
        ppid, pgrp = in_jobs[pid][4:6] if pid in in_jobs else (0 if pid == 1 else 1, pid)
        write(os.path.join(proc, str(pid), "status"), "Name:\t%s\nPPid:\t%d\nUid:\t%d\t%d\t%d\t%d\n"
              % ((comm, ppid) + (uid,) * 4))
        write(os.path.join(proc, str(pid), "stat"), "%d (%s) S %d %d %d 0 -1\n" % (pid, comm, ppid, pgrp, pgrp))
