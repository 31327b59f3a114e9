"""What a simulated AMD node's `amd-smi` and `rvs` print, from its model
(gpugate.vendors.amd.sim_node), in the real tools' formats: amd-smi 7.x `static
--json` as the captured 8x MI300X printed it (tests/fixtures/amd/
amd-smi-static-json-8xMI300X-rocm7.2.1-delldai.txt: keys, "N/A", values with
units), `version --json` (a list of one object), `xgmi --link-status
--json` (per GPU "U"/"D"/"X" per link), `reset -G -g all --json` (per GPU
"Successfully reset GPU N"), and RVS result lines.  Only the executables are
simulated: gpugate's probes and parsers read these as they read the real
ones.

Model keys beyond sim_node's (each optional, default healthy):
    amd["smi"]: "ok" | "kfd" (no /dev/kfd access: the banner, then every
        ioctl field "N/A") | "hang" | "absent" (not installed) | "nolibdrm"
        (libdrm not installed: the library's warning on stderr, IFWI name
        and date and DRIVER "N/A", as rocm-systems PR 2987's MI350X printed)
    amd["amd_smi_version"]: "26.2.2"; amd["xgmi_status"]: False (an amd-smi
        before 25.3: no --link-status)
    gpu["ifwi"]: "00159017"; gpu["xgmi_down"]: links down (of 7);
    gpu["threshold_exceeded"]: bool; amd["rvs"]: {"installed": bool,
        "fail": {level: gpu index}}
"""

import json
from typing import Any, Dict, List

DEFAULT_IFWI = "00159017"
DEFAULT_AMD_SMI = "26.2.2"
_KFD_BANNER = ("Permission needed to access required GPU device node(s):\n"
               "  \u2022 /dev/kfd: Permission denied\n"
               "Please add your user to the 'render' and 'video' groups or run as root.\n")
# amd-smi's own words when amdgpu is not loaded, on stderr, exit 255 (Debian trixie's amd-smi 6.1.2:
# tests/fixtures/amd/debian-trixie-amd-smi-static-json.stderr.txt).
_DRIVER_NOT_LOADED = ("ERROR: Unable to get devices, driver not initialized (amdgpu not found in modules)\n"
                      "ERROR: Unable to detect any GPU devices, check amdgpu version and module status\n"
                      "ERROR: Unable to detect any CPU devices, check amd_hsmp version and module status\n")
_NO_LIBDRM = ("Fail to open libdrm_amdgpu.so.1: libdrm_amdgpu.so.1: cannot open shared object file: "
              "No such file or directory\n")
RVS_LEVELS = (1, 2, 3, 4, 5)


def _na_unless(kfd: bool, value: Any) -> Any:
    return "N/A" if kfd else value


def static_gpu(i: int, gpu: Dict[str, Any], kfd: bool, libdrm: bool = True) -> Dict[str, Any]:
    product = gpu.get("product") or "N/A"
    market = product.replace(" OAM", "") if isinstance(product, str) else "N/A"
    cap = gpu.get("power_cap_w")
    return {
        "gpu": i,
        "asic": {"market_name": _na_unless(kfd, market), "vendor_id": "0x1002",
                 "device_id": gpu.get("device_id", "0x74a1"), "target_graphics_version": "gfx942"},
        "bus": {"bdf": gpu["bdf"], "max_pcie_width": gpu["pcie"]["max_width"],
                "max_pcie_speed": {"value": 32, "unit": "GT/s"}, "pcie_interface_version": "Gen 5",
                "slot_type": "OAM"},
        "ifwi": {"name": _na_unless(kfd or not libdrm, "AMD MI300X_HW_SRIOV_CVS_1VF"),
                 "build_date": _na_unless(kfd or not libdrm, "2025/07/27 14:45"),
                 "part_number": _na_unless(kfd, gpu.get("vbios") or "N/A"),
                 "version": _na_unless(kfd, gpu.get("ifwi", DEFAULT_IFWI))},
        "limit": {"ppt0": {"max_power_limit": _na_unless(kfd, {"value": 750, "unit": "W"}),
                           "min_power_limit": _na_unless(kfd, {"value": 0, "unit": "W"}),
                           "socket_power_limit": "N/A" if kfd or cap is None
                           else {"value": int(cap) if float(cap).is_integer() else cap, "unit": "W"}}},
        "driver": {"name": _na_unless(not libdrm, "amdgpu"), "version": "N/A"},
        "board": {"product_serial": gpu.get("serial") or "N/A", "product_name": product},
        "ras": {"bad_page_threshold": _na_unless(kfd, 128),
                "bad_page_threshold_exceeded": _na_unless(kfd, str(bool(gpu.get("threshold_exceeded")))),
                "ecc_block_state": {block.upper(): "ENABLED" for block in (gpu.get("ras") or {})}},
        "process_isolation": "Disabled",
    }


def _bound(amd: Dict[str, Any]) -> List[Dict[str, Any]]:
    return [g for g in amd.get("gpus", ()) if g.get("bound")]


def replays(model: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """amd-smi's and rvs's replay entries (gpugate.sim.replay_stub) for an AMD node."""
    amd = model.get("amd")
    if not amd:
        return {}
    table: Dict[str, Dict[str, Any]] = {}
    mode = amd.get("smi", "ok")
    gpus = _bound(amd)
    kfd = mode == "kfd"
    if amd.get("initstate") != "live":
        down = {"stdout": "", "stderr": _DRIVER_NOT_LOADED, "rc": 255}
        for key in ("static --json", "xgmi --link-status --json", "version --json", "reset -G -g all --json"):
            table["amd-smi " + key] = dict(down)
    elif mode == "hang":
        for key in ("static --json", "xgmi --link-status --json", "version --json"):
            table["amd-smi " + key] = {"hang": True}
    else:
        banner = _KFD_BANNER if kfd else ""
        table["amd-smi static --json"] = {"stdout": banner + json.dumps(
            {"gpu_data": [static_gpu(i, g, kfd, mode != "nolibdrm") for i, g in enumerate(gpus)]},
            indent=4) + "\n"}
        if amd.get("xgmi_status", True):
            links = [{"gpu": i, "bdf": g["bdf"],
                      "link_status": ["N/A"] * 8 if kfd else
                      ["D"] * int(g.get("xgmi_down", 0)) + ["U"] * (7 - int(g.get("xgmi_down", 0)))}
                     for i, g in enumerate(gpus)]
            table["amd-smi xgmi --link-status --json"] = {"stdout": banner + json.dumps(
                {"link_status": links}, indent=4) + "\n"}
        else:  # argparse's refusal of an option this amd-smi does not have
            table["amd-smi xgmi --link-status --json"] = {
                "stderr": "amd-smi xgmi: error: unrecognized arguments: --link-status\n", "rc": 2}
        version = amd.get("amd_smi_version", DEFAULT_AMD_SMI)
        table["amd-smi version --json"] = {"stdout": json.dumps([{
            "tool": "AMDSMI Tool", "version": "%s+e1a6bc5663" % version, "amdsmi_library_version": version,
            "rocm_version": amd.get("rocm") or "N/A", "amdgpu_version": amd.get("amdgpu") or "N/A",
            "amd_hsmp_driver_version": "N/A"}], indent=4) + "\n"}
        table["amd-smi metric --ecc --ecc-blocks --pcie --json"] = {"stdout": banner + json.dumps(
            {"gpu_data": [_metric(i, g, kfd) for i, g in enumerate(gpus)]}, indent=4) + "\n"}
        table["amd-smi bad-pages --json"] = {"stdout": banner + json.dumps(
            [_bad_pages(i, g, kfd) for i, g in enumerate(gpus)], indent=4) + "\n"}
        # The reset changes the node (RAS counters cleared, pending pages retired): gpugate.sim.gpureset.
        table["amd-smi reset -G -g all --json"] = {"exec": ["gpugate-sim-reset"]}
        if mode == "nolibdrm":
            for entry in table.values():
                entry["stderr"] = _NO_LIBDRM + entry.get("stderr", "")
    table.update(_rvs(amd, gpus))
    return table


def _metric(i: int, gpu: Dict[str, Any], kfd: bool) -> Dict[str, Any]:
    """`metric --ecc --ecc-blocks --pcie --json`: per RAS-enabled block, as 7.x prints it."""
    ras = gpu.get("ras") or {}
    blocks = {block.upper(): {"correctable_count": _na_unless(kfd, c[1]), "uncorrectable_count": _na_unless(kfd, c[0]),
                              "deferred_count": _na_unless(kfd, c[2])} for block, c in sorted(ras.items())}
    total = [sum(c[k] for c in ras.values()) for k in range(3)]
    return {"gpu": i,
            "pcie": {"width": gpu["pcie"]["width"], "speed": {"value": 2.5 * 2 ** (gpu["pcie"]["gen"] - 1), "unit": "GT/s"},
                     "replay_count": gpu.get("pcie_replays", 0)},
            "ecc": {"total_correctable_count": _na_unless(kfd, total[1]),
                    "total_uncorrectable_count": _na_unless(kfd, total[0]),
                    "total_deferred_count": _na_unless(kfd, total[2])},
            "ecc_blocks": blocks if ras else "N/A"}


def _bad_pages(i: int, gpu: Dict[str, Any], kfd: bool) -> Dict[str, Any]:
    """`bad-pages --json`: the string when none, one object for one page, a list for more."""
    pages = gpu.get("bad_pages") or {}
    out: Dict[str, Any] = {"gpu": i}
    for key, name, status in (("retired", "retired", "RESERVED"), ("pending", "pending", "PENDING"),
                              ("unreservable", "un_res", "UNRESERVABLE")):
        found = [{"page_address": 0x7f5000 + 0x1000 * n, "page_size": 4096, "status": status}
                 for n in range(int(pages.get(key, 0)))]
        out[name] = "N/A" if kfd else "No bad pages found." if not found else found[0] if len(found) == 1 else found
    return out


def reset_output(gpus: List[Dict[str, Any]], failed: bool = False) -> str:
    """`amd-smi reset -G -g all --json` as amd-smi 6.x-7.x print it: a failure
    is the library's words under gpu_reset, with exit 0."""
    return json.dumps([{"gpu": i, "gpu_reset": "Failed to reset GPU" if failed else "Successfully reset GPU %d" % i}
                       for i in range(len(gpus))], indent=4) + "\n"


def _rvs(amd: Dict[str, Any], gpus: List[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """rvs -r LEVEL as RVS 7.x prints it: a `[RESULT]` verdict line per test
    and GPU (the GPU named by its KFD gpu_id), then the summary table (System
    Overview naming each GPU's id, index and BDF; one row per action),
    closed by its boundary line.  A GPU the model fails at a level
    (amd["rvs"]["fail"]["LEVEL"] = [index, ...]) answers `pass: FALSE`."""
    rvs = amd.get("rvs") or {"installed": True, "fail": {}}
    if not rvs.get("installed", True) or not gpus:
        return {}
    if rvs.get("nolevels"):  # RVS before ROCm 7.2, or a GPU before MI300X: no predefined levels (rvsexec.cpp)
        said = "RVS-ERROR [CLI] No test levels support for the detected GPU or no GPU detected !\n"
        return {"rvs -r %d" % level: {"stdout": "", "stderr": said, "rc": 255} for level in RVS_LEVELS}
    rule, double = "+" + "-" * 69 + "+", "+" + "=" * 69 + "+"
    overview = []
    for i, gpu in enumerate(gpus):
        overview.append("| %-32s |" % ("%s - %d" % ((gpu.get("product") or "AMD GPU")[:24], _gpu_id(gpu, i))))
        overview.append("| %-32s |" % ("%d - %d - %s" % (i, i + 2, gpu["bdf"])))
    out = {}
    for level in RVS_LEVELS:
        bad = {int(g) for g in (rvs.get("fail") or {}).get(str(level), ())}
        action, module = ("pcie_capability", "PEQT") if level == 1 else ("hbm_basic", "BABEL")
        lines = ["[RESULT] [%7d.%-6d] [%s] [GPU:: %5d] pass: %s"
                 % (1234, level * 10 + i, action, _gpu_id(gpu, i), "FALSE" if i in bad else "TRUE")
                 for i, gpu in enumerate(gpus)]
        lines += [double, "| %-67s |" % "ROCm Validation Suite (RVS) Summary", double] + overview + [
            double, "| %-32s | %-14s | %-15s |" % ("Action Name", "Module", "Result"), double,
            "| %-32s | %-14s | %-15s |" % (action, module, "FAIL" if bad else "PASS"), rule]
        out["rvs -r %d" % level] = {"stdout": "\n".join(lines) + "\n", "rc": 0}  # RVS 7.x exits 0 either way
    return out


def _gpu_id(gpu: Dict[str, Any], index: int) -> int:
    return int(gpu.get("kfd_gpu_id") or 1000 + index)
