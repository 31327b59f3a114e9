"""What a simulated node's tools print, derived from its model.  The formats
are those of the real tools (see the parsers and their tests)."""

import json
import os
import sys
import time
from typing import Any, Dict

DIAG_TESTS = {1: ["software"], 2: ["software", "pcie", "memory"],
              3: ["software", "pcie", "memory", "diagnostic", "targeted_stress"],
              4: ["software", "pcie", "memory", "diagnostic", "targeted_stress", "memtest"]}
NVSWITCH_CLASS = "0680"
GPU_CLASS = "0302"


def proc_driver_version(version: str) -> str:
    return ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build  "
            "(dvs-builder@U16-I3-B03-4-3)  Thu Oct 23 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
            % version)


def replays(model: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    table: Dict[str, Dict[str, Any]] = {}
    module = model["module"]
    if module["on_disk"]:
        table["modinfo -F version nvidia"] = _ok(module["on_disk"] + "\n")
        dkms_line = ("nvidia/%s, %s, x86_64: installed\n" % (module["on_disk"], model["kernel"])
                     if model["dkms"] else "nvidia/%s: added\n" % module["on_disk"])
        table["dkms status"] = _ok(dkms_line)
    else:
        table["modinfo -F version nvidia"] = {"stdout": "", "rc": 1,
                                              "stderr": "modinfo: ERROR: Module nvidia not found.\n"}
        table["dkms status"] = _ok("")
    table["lspci -n -d 10de:"] = _ok(_lspci(model["pci"]))
    table["dpkg-query -W *"] = _dpkg(model["packages"])
    table["rpm -qa *"] = _ok(_rpm(model["packages"]))
    for unit, state in model["services"].items():
        table["systemctl is-active %s" % unit] = {"stdout": state + "\n", "rc": 0 if state == "active" else 3}
    dcgm = model["dcgm"]
    table["dcgmi --version"] = _ok("\ndcgmi  version: %s\n\n" % dcgm["version"])
    table["dcgmi health -c -j"] = _ok(_health(dcgm["health"]))
    gpus = len(model["nvml"]["gpus"])
    mig = [i for i, g in enumerate(model["nvml"]["gpus"]) if (g.get("mig") or [0])[0]]
    for level in DIAG_TESTS:
        failing = {int(k): v for k, v in dcgm.get("diag_fail", {}).items()}
        rc = 226 if failing else 0
        entry = {"stdout": _diag(dcgm["version"], level, gpus, failing), "rc": rc}
        if mig:  # DCGM refuses the whole run while a GPU has MIG on
            entry = {"stdout": _diag_refusal(dcgm["version"], mig[0]), "rc": 226}
        table["dcgmi diag -r %d -j" % level] = entry
        table["dcgmi diag -r %d -i *" % level] = entry  # on some GPUs only (the epilog's)
    table["nvidia-smi *"] = _ok("")
    table["nvidia-smi -q"] = _ok(smi_query(model))
    table["nvidia-smi --query-compute-apps=pid,process_name,gpu_bus_id --format=csv,noheader"] = _ok("".join(
        "%d, python3, %s\n" % (pid, g["pci_bus_id"]) for g in model["nvml"]["gpus"] for pid in g.get("processes") or ()))
    # What changes the node (gpugate.sim.gpureset): a GPU reset, services stopped and started, the bug report.
    for key in ("nvidia-smi -r", "nvidia-smi -r *", "systemctl stop *", "systemctl start *",
                "nvidia-bug-report.sh", "nvidia-bug-report.sh *"):
        table[key] = {"exec": _SIM_EXEC}
    kind = model.get("smoke", "healthy")
    table["all_reduce_perf *"] = dict(smoke_replay(kind), multinode=pair_replay(kind))
    return table


_SIM_EXEC = [sys.executable, "-I", "-c", "import sys; sys.path.insert(0, %r); from gpugate.sim.gpureset import main; "
             "sys.exit(main(sys.argv[1:]))" % os.path.dirname(os.path.dirname(os.path.dirname(
                 os.path.abspath(__file__))))]


def smi_query(model: Dict[str, Any]) -> str:
    """`nvidia-smi -q`, the fields a vendor reads first, in its layout."""
    nvml = model["nvml"]
    cuda = nvml.get("cuda") or 0
    lines = ["", "==============NVSMI LOG==============", "",
             "Timestamp                                 : %s" % time.strftime("%a %b %d %H:%M:%S %Y"),
             "Driver Version                            : %s" % nvml.get("driver"),
             "CUDA Version                              : %d.%d" % (cuda // 1000, cuda % 1000 // 10), "",
             "Attached GPUs                             : %d" % len(nvml["gpus"])]
    for gpu in nvml["gpus"]:
        rows = gpu.get("remapped_rows") or [0, 0, 0, 0]
        lines += ["GPU %s" % gpu["pci_bus_id"],
                  "    Product Name                          : %s" % gpu["name"],
                  "    Persistence Mode                      : %s" % ("Enabled" if gpu.get("persistence") else "Disabled"),
                  "    Serial Number                         : %s" % gpu["serial"],
                  "    GPU UUID                              : %s" % gpu["uuid"],
                  "    VBIOS Version                         : %s" % gpu["vbios"],
                  "    GSP Firmware Version                  : %s" % (gpu.get("gsp") or "N/A"),
                  "    ECC Errors",
                  "        Volatile",
                  "            DRAM Uncorrectable            : %d" % gpu["ecc_uncorrected"]["volatile"],
                  "        Aggregate",
                  "            DRAM Uncorrectable            : %d" % gpu["ecc_uncorrected"]["aggregate"],
                  "    Remapped Rows",
                  "        Correctable Error                 : %d" % rows[0],
                  "        Uncorrectable Error               : %d" % rows[1],
                  "        Pending                           : %s" % ("Yes" if rows[2] else "No"),
                  "        Remapping Failure Occurred        : %s" % ("Yes" if rows[3] else "No"), ""]
    return "\n".join(lines) + "\n"


SMOKE = ("healthy", "pcie-degraded", "hang", "nccl-abort", "nccl-wrong", "pair-slow", "pair-abort")
# AMD nodes' rccl-tests runs (gpugate/data/smoke/rccl-SOURCES.txt): a healthy 8 GiB run, a whole
# 8 B-8 GiB sweep (its average below any large-size minimum) and an MI210 abort.
RCCL_SMOKE = ("rccl-healthy-mi300x", "rccl-sweep-mi300x", "rccl-abort-mi210")
_ABORTS = ("nccl-abort", "rccl-abort-mi210", "nccl-wrong")  # nccl-tests exits 1 on #wrong too
# What a node brings to a 2-node run: the recording and how bad it is (the
# replaying stub of the pair's first node plays the worse of the two).
_PAIR = {"healthy": ("pair-healthy", 0), "pair-slow": ("pair-slow", 1), "pcie-degraded": ("pair-slow", 1),
         "pair-abort": ("nccl-abort", 2), "nccl-abort": ("nccl-abort", 2), "nccl-wrong": ("nccl-wrong", 2),
         "hang": ("hang", 3),
         "rccl-healthy-mi300x": ("rccl-healthy-mi300x", 0), "rccl-sweep-mi300x": ("rccl-sweep-mi300x", 1),
         "rccl-abort-mi210": ("rccl-abort-mi210", 2)}


def smoke_replay(kind: str) -> Dict[str, Any]:
    """all_reduce_perf replaying a real recorded run (gpugate/data/smoke/SOURCES.txt).
    pair-* values break only the 2-node run: the single-node one is healthy."""
    if kind == "hang":
        return {"hang": True}
    name = "healthy" if kind.startswith("pair-") else kind
    return {"stdout": _recording(name), "rc": 1 if kind in _ABORTS else 0}


def pair_replay(kind: str) -> Dict[str, Any]:
    """What this node's 2-node (pair) run replays, with its severity."""
    name, severity = _PAIR[kind]
    if name == "hang":
        return {"hang": True, "severity": severity}
    return {"stdout": _recording(name), "rc": 1 if name in _ABORTS else 0, "severity": severity}


def _recording(name: str) -> str:
    with open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "smoke", name + ".txt")) as handle:
        return handle.read()


def _ok(stdout: str) -> Dict[str, Any]:
    return {"stdout": stdout, "rc": 0}


def _lspci(pci: Dict[str, int]) -> str:
    lines = ["%02x:00.0 %s: 10de:2330 (rev a1)" % (0x18 + i, GPU_CLASS) for i in range(pci["gpus"])]
    lines += ["%02x:00.0 %s: 10de:22a3 (rev a1)" % (0xc0 + i, NVSWITCH_CLASS) for i in range(pci["nvswitches"])]
    return "\n".join(lines) + ("\n" if lines else "")


def _dpkg(packages: Dict[str, Any]) -> Dict[str, Any]:
    lines = []
    for pkg in packages.values():
        if pkg:
            status = "hold ok installed" if pkg["held"] else "install ok installed"
            lines.append("%s\t%s-1\t%si\t%s" % (pkg["name"], pkg["version"], "h" if pkg["held"] else "i", status))
    # dpkg-query exits 1 when a pattern matches no package.
    return {"stdout": "\n".join(lines) + ("\n" if lines else ""), "rc": 0 if lines else 1,
            "stderr": "" if lines else "dpkg-query: no packages found matching nvidia-*\n"}


def _rpm(packages: Dict[str, Any]) -> str:
    # rpm -qa --qf '%{NAME}\t%{EPOCH}\t%{VERSION}\t%{RELEASE}\t%{ARCH}\n'; exit 0 even when nothing matches.
    return "".join("%s\t(none)\t%s\t1.el9\tx86_64\n" % (p["name"], p["version"]) for p in packages.values() if p)


def _health(overall: str) -> str:
    body: Dict[str, Any] = {"Overall Health": {"value": overall}}
    if overall != "Healthy":
        body["GPU"] = {"children": {"0": {"Health": {"value": overall}, "children": {
            "Memory": {"Health": {"value": overall},
                       "incidents": [{"error": "Detected 2 volatile double-bit ECC error(s) in GPU 0."}]}}}}}
    return json.dumps({"body": body, "header": ["Health Monitor Report"]}, indent=1)


MIG_REFUSAL = "GPU %d's MIG configuration is incompatible with the diagnostic because it prevents access to the entire GPU."


def _diag_refusal(version: str, gpu: int) -> str:
    """dcgmi diag -j refusing MIG: runtime_error (Diag.cpp's failure message),
    exit 226 (DCGM_ST_NVVS_ERROR, -30)."""
    if _dcgm4(version):
        return json.dumps({"DCGM Diagnostic": {"version": version, "runtime_error": MIG_REFUSAL % gpu}}, indent=1)
    return json.dumps({"DCGM GPU Diagnostic": {"runtime_error": MIG_REFUSAL % gpu}}, indent=1)


def _dcgm4(version: str) -> bool:
    return version.split(".")[0].isdigit() and int(version.split(".")[0]) >= 4


def _diag(version: str, level: int, gpus: int, failing: Dict[int, str]) -> str:
    """A dcgmi diag -j report in the format of the node's DCGM major version."""
    dcgm4 = _dcgm4(version)
    tests = []
    for name in DIAG_TESTS[level]:
        results = []
        for gpu in range(gpus):
            bad = failing.get(gpu) if name == "memory" or (name == "software" and level == 1) else None
            result: Dict[str, Any] = {"status": "Fail" if bad else "Pass"}
            if bad:
                result["warnings"] = [{"warning": bad, "error_id": 4, "error_category": 7, "error_severity": 2}]
            if dcgm4:
                result.update({"entity_group": "GPU", "entity_group_id": 1, "entity_id": gpu})
            else:
                result["gpu_id"] = str(gpu)
            results.append(result)
        test: Dict[str, Any] = {"name": name, "results": results}
        if dcgm4:
            test["test_summary"] = {"status": "Fail" if any(r["status"] == "Fail" for r in results) else "Pass"}
        tests.append(test)
    if dcgm4:
        doc = {"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": tests}]},
               "entity_groups": [{"entity_group": "GPU", "entity_group_id": 1,
                                  "entities": [{"entity_id": g, "device_id": "2330"} for g in range(gpus)]}],
               "metadata": {"version": version}}
    else:
        doc = {"DCGM GPU Diagnostic": {"test_categories": [{"category": "Hardware", "tests": tests}]}}
    return json.dumps(doc, indent=1)
