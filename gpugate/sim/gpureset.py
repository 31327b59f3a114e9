"""The simulated node's tools that change the node, not just print: a GPU
reset (``nvidia-smi -r [-i N,M]``), ``systemctl stop|start UNIT`` and
``nvidia-bug-report.sh``.  The replaying stub (replay_stub.py) hands these
over here ("exec" entries of replay.json, written by outputs.replays), with
the tool's name and the node's directory before its arguments.

What a reset does, as on a real node: volatile ECC counts cleared, pending
row remaps and page retirements applied, a pending ECC/MIG mode taken, a
recovery action asking for a reset cleared.  What it cannot do: a GPU off the
bus (Xid 79, or lost) stays lost (exit 15, nvidia-smi's "GPU is lost"); a GPU
a process or a daemon holds is refused with the driver's words and exit 255
(the text as NVIDIA/NVSentinel #1690 and NVIDIA/mig-parted #181 recorded it).
"""

import gzip
import os
import re
import sys
import time
from typing import Any, Dict, List

_HOLDERS = {"nvidia-persistenced": "persistence", "nvidia-dcgm": None, "dcgm": None, "nvidia-fabricmanager": None}


def main(argv: List[str]) -> int:
    tool, node_dir, args = argv[0], argv[1], argv[2:]
    from gpugate.sim import fleet

    fleet_dir, node = os.path.dirname(node_dir), os.path.basename(node_dir)
    model = fleet.load(fleet_dir, node)
    if tool == "systemctl":
        return _systemctl(fleet, fleet_dir, node, model, args)
    if tool == "nvidia-bug-report.sh":
        return _bug_report(model, args)
    if tool == "amd-smi":
        from gpugate.vendors.amd.sim_ops import reset

        return reset(fleet, fleet_dir, node, model, args)
    return _reset(fleet, fleet_dir, node, model, args)


def _bus(gpu: Dict[str, Any]) -> str:
    return gpu["pci_bus_id"]


def _off_bus(model: Dict[str, Any], gpu: Dict[str, Any]) -> bool:
    bus = gpu["pci_bus_id"].lower()[4:-2]
    return bool(gpu.get("lost")) or any(re.search(r"Xid \(PCI:%s\): 79\b" % re.escape(bus), r["msg"])
                                        for r in model["kmsg"])


def _reset(fleet, fleet_dir: str, node: str, model: Dict[str, Any], args: List[str]) -> int:
    if model.get("reset_delay"):  # a reset takes a while (sim set ... reset_delay=5): a window to kill -9 in
        time.sleep(float(model["reset_delay"]))
        model = fleet.load(fleet_dir, node)
    gpus = model["nvml"]["gpus"]
    chosen = list(range(len(gpus)))
    if "-i" in args:
        try:
            chosen = [int(x) for x in args[args.index("-i") + 1].split(",")]
        except (IndexError, ValueError):
            sys.stdout.write("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n")
            return 2
        if any(not 0 <= i < len(gpus) for i in chosen):
            sys.stdout.write("No devices were found\n")
            return 6
    for i in chosen:
        if _off_bus(model, gpus[i]):
            sys.stdout.write("Unable to determine the device handle for GPU %s: GPU is lost.  Reboot the system "
                             "to recover this GPU\n" % _bus(gpus[i]))
            return 15
    services = model["services"]
    held = [i for i in chosen if gpus[i].get("processes")]
    if len(chosen) == len(gpus) or model["pci"].get("nvswitches"):
        # Every GPU, or NVLink peers: no compute process anywhere (nvidia-smi(1)).
        held = [i for i in chosen if any(g.get("processes") for g in gpus)]
    daemons = [u for u in _HOLDERS if services.get(u) == "active"]
    if daemons:
        held = chosen
    if model["pci"].get("nvswitches") and len(chosen) < len(gpus) and services.get("nvidia-fabricmanager") != "active":
        sys.stdout.write("GPU reset on this system requires resetting every GPU with NVLink connections to GPU %s "
                         "in the same command: add the GPUs %s\n" % (
                             _bus(gpus[chosen[0]]), ",".join(str(i) for i in range(len(gpus)) if i not in chosen)))
        return 255
    if held:
        sys.stdout.write("The following GPUs could not be reset:\n")
        for i in held:
            sys.stdout.write("  GPU %s: In use by another client\n" % _bus(gpus[i]))
        sys.stdout.write("\n%d device%s currently being used by one or more other processes (e.g., Fabric Manager, "
                         "CUDA application, graphics application such as an X server, or a monitoring application "
                         "such as another instance of nvidia-smi). Please first kill all processes using %s "
                         "and all compute applications running in the system.\n" % (
                             len(held), " is" if len(held) == 1 else "s are",
                             "this device" if len(held) == 1 else "these devices"))
        return 255
    for i in chosen:
        gpu = gpus[i]
        gpu["ecc_uncorrected"]["volatile"] = 0
        if gpu.get("remapped_rows"):
            gpu["remapped_rows"][2] = 0  # the pending remap is applied
        if gpu.get("retired_pages_pending"):
            gpu["retired_pages_pending"] = False
        if gpu.get("recovery_action") in (1, 4, 6):
            gpu["recovery_action"] = 0
        for key in ("ecc_mode", "mig"):
            if gpu.get(key):
                gpu[key][0] = gpu[key][1]
        gpu["hang"] = None
    fleet.save(fleet_dir, node, model)
    for i in chosen:
        sys.stdout.write("GPU %s was successfully reset.\n" % _bus(gpus[i]))
    return 0


def _systemctl(fleet, fleet_dir: str, node: str, model: Dict[str, Any], args: List[str]) -> int:
    if len(args) != 2 or args[0] not in ("stop", "start"):
        sys.stderr.write("sim: systemctl %s: not simulated\n" % " ".join(args))
        return 1
    verb, unit = args
    unit = unit[:-len(".service")] if unit.endswith(".service") else unit
    if unit not in model["services"]:
        sys.stderr.write("Failed to %s %s.service: Unit %s.service not found.\n" % (verb, unit, unit))
        return 5
    model["services"][unit] = "active" if verb == "start" else "inactive"
    if _HOLDERS.get(unit) == "persistence":  # persistenced keeps persistence mode on while it runs
        for gpu in model["nvml"]["gpus"]:
            gpu["persistence"] = 1 if verb == "start" else 0
    fleet.save(fleet_dir, node, model)
    return 0


def _bug_report(model: Dict[str, Any], args: List[str]) -> int:
    """Writes its log (gzip) where --output-file says, as the real one does."""
    target = "nvidia-bug-report.log"
    if "--output-file" in args and args.index("--output-file") + 1 < len(args):
        target = args[args.index("--output-file") + 1]
    from gpugate.sim.outputs import smi_query

    body = ["nvidia-bug-report.sh (simulated) at %s" % time.strftime("%c"), "", "*** dmesg"]
    body += [r["msg"] for r in model["kmsg"]]
    body += ["", "*** nvidia-smi -q", smi_query(model)]
    with gzip.open(target + ".gz", "wb") as handle:
        handle.write("\n".join(body).encode())
    sys.stdout.write("\nnvidia-bug-report.sh will now collect information about your\nsystem and create the file "
                     "'%s.gz' in the current directory.\n\n\nComplete.\n" % target)
    return 0
