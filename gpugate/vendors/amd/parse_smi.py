"""Read the AMD ``amd-smi`` CLI's output (issue 29; docs/explanation/amd-design.md 1.2-1.4).

gpugate runs amd-smi as a command and never imports the amdsmi library
(docs/explanation/amd-design.md 1.3); gpugate.vendors.amd.probe_smi runs it, this module only
reads what it printed.  Every format is the CLI's own
(``amdsmi_cli/amdsmi_commands.py`` in ROCm/amdsmi for 6.x, ROCm/rocm-systems
``projects/amdsmi`` for 7.x), JSON first, the human-readable form too.

The rule of gpugate.model.facts: a value amd-smi could not give ("N/A", a library
error string, a key the release prints but this output lacks) is a
``ProbeFailure``, never 0 and never "ok"; ``None`` only where the hardware is
known not to have the thing (each case says which sample shows it).

Pure functions: text in, values out, no I/O.
"""

from __future__ import annotations

import re

from gpugate.model.facts import ProbeFailure
from gpugate.vendors.amd import parse_smi_fields as F
from gpugate.vendors.amd.parse_smi_fields import SOURCE, json_payload

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only
    from typing import Any, Dict, Optional, Tuple

__all__ = ["SOURCE", "json_payload", "failure", "parse_static", "parse_metric", "parse_bad_pages",
           "parse_xgmi_link_status", "parse_version", "parse_list", "parse_firmware", "parse_reset"]

# amdsmi_init.py: "Driver not loaded (amdgpu not found in modules)", "Drivers not
# loaded (amdgpu and amd_hsmp ...)", then sys.exit(-1) = 255; amdsmi_commands.py:
# "Unable to get devices, driver not initialized (amdgpu not found in modules)".
_DRIVER = re.compile(r"drivers? not (?:loaded|initialized)|AMDSMI_STATUS_DRIVER_NOT_LOADED"
                     r"|amdgpu not found in modules", re.I)
# reset/set: PermissionError('Command requires elevation'), uncaught: exit 1.
_ROOT = re.compile(r"requires (?:elevation|root|sudo)", re.I)
_LIBRARY = re.compile(r"libamd_smi\S*\.so|cannot open shared object|couldn't import 'amdsmi"
                      r"|No module named '?amdsmi", re.I)
# libdrm is a soft dependency (rocm-systems PR 2987): without it the library
# says "Fail to open libdrm_amdgpu.so.1: ... cannot open shared object file"
# (or libdrm.so.2) and answers anyway, IFWI name/date and DRIVER as N/A
# (fixture amd-smi-static-MI350X-nolibdrm-...): a warning, never the answer's failure.
_NO_LIBDRM = re.compile(r"^Fail(?:ed)? to open libdrm\S*\.so", re.I)
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception)): (.*)$")
# AMDSMI_STATUS_DRIVER_NOT_LOADED = 34 (amdsmi_wrapper.py); the CLI prints a
# library error as {"error": ..., "code": -1000 - 34} (amdsmi_cli_exceptions.py).
_DRIVER_CODE = -1034
# MI50/MI60, MI100, MI200 have no compute or memory partitions (they came with
# MI300, gfx942): amd-smi prints N/A (MI50 in gpustack issue 3509) or no
# partition section (fixture amd-smi-static-json-MI210-...).
_NO_PARTITIONS = ("gfx906", "gfx908", "gfx90a")
# amd-smi firmware ids -> the names of sysfs fw_version/<name>_fw_version, as
# amd_smi.cc amdsmi_get_fw_info maps them onto rocm_smi's blocks (l.934-955).
_FW_SYSFS = {"cp_ce": "ce", "cp_me": "me", "cp_mec1": "mec", "cp_mec2": "mec2", "cp_pfp": "pfp",
             "rlc_restore_list_cntl": "rlc_srlc", "rlc_restore_list_gpm_mem": "rlc_srlg",
             "rlc_restore_list_srm_mem": "rlc_srls", "sdma0": "sdma", "sdma1": "sdma2",
             "pm": "smc", "psp_sosdrv": "sos"}
_VERSION_TEXT = {"amdsmi tool": "tool", "amdsmi library version": "amdsmi_library_version",
                 "rocm version": "rocm_version", "amdgpu version": "amdgpu_version"}


def failure(rc: int, stdout: str, stderr: str) -> Optional[ProbeFailure]:
    """Why the whole command gave nothing to parse, or None to parse it."""
    out, err = stdout or "", stderr or ""
    lines = [line.strip() for line in (out + "\n" + err).splitlines()
             if line.strip() and not _NO_LIBDRM.match(line.strip())]  # a warning, never why
    said = lines[0] if lines else "no output"
    try:
        payload = json_payload(out)[1]  # type: Any
    except ValueError:
        payload = None
    driver = next((line for line in lines if _DRIVER.search(line)), None)
    if rc == 255 or (driver and (rc != 0 or payload is None)):
        return ProbeFailure(SOURCE, "missing", "driver not loaded: " + F.short(driver or said, 120))
    if any(_ROOT.search(line) for line in lines):
        return ProbeFailure(SOURCE, "error", "needs root")
    library = next((line for line in lines if _LIBRARY.search(line)), None)
    if library:
        return ProbeFailure(SOURCE, "error", "library not found: " + F.short(library, 120))
    error = _error_document(payload)
    if error is not None:
        return error
    exceptions = [m for m in (_EXCEPTION.match(line) for line in lines) if m]
    if rc != 0 and exceptions:
        return ProbeFailure(SOURCE, "error", F.short(exceptions[-1].group(0), 140))
    if rc != 0:
        return ProbeFailure(SOURCE, "error", "exit %s: %s" % (rc, F.short(said, 120)))
    if payload is None:
        return ProbeFailure(SOURCE, "error", "no JSON in output: " + F.short(said, 120))
    return None


def _error_document(payload: Any) -> Optional[ProbeFailure]:
    # An AmdSmiException under --json prints {"error": "...", "code": N}, exit 0.
    docs = payload if isinstance(payload, list) else [payload]
    if not docs or not all(isinstance(d, dict) and "error" in d and "code" in d for d in docs):
        return None
    code = docs[0]["code"]
    detail = "%s (code %s)" % (F.short(docs[0]["error"], 120), F.short(code, 12))
    if code == _DRIVER_CODE or _DRIVER.search(str(docs[0]["error"])):
        return ProbeFailure(SOURCE, "missing", "driver not loaded: " + detail)
    return ProbeFailure(SOURCE, "error", detail)


# ---- static -------------------------------------------------------------------


def parse_static(stdout: str) -> Dict[int, Dict[str, Any]]:
    """`amd-smi static --json` (any release, with or without the kfd banner)."""
    note, recs = F.records(stdout)
    return {idx: _static_gpu(rec, note) for idx, rec in recs.items()}


def _static_gpu(rec: Dict[str, Any], note: str) -> Dict[str, Any]:
    def leaf(path: Tuple[str, ...], field: str) -> Any:
        return F.get(rec, path, field, note)

    gfx = F.text(leaf(("asic", "target_graphics_version"), "gfx"), "gfx")
    unpartitioned = isinstance(gfx, str) and gfx.lower() in _NO_PARTITIONS
    product = F.text(leaf(("asic", "market_name"), "product"), "product", note)
    out = {
        "bdf": F.bdf(leaf(("bus", "bdf"), "bdf"), "bdf", note),
        "product": product,
        "device_id": _device_id(leaf(("asic", "device_id"), "device_id"), note),
        "serial": F.text(leaf(("board", "product_serial"), "serial"), "serial", note),
        "power_cap_w": _power_cap(rec, product, note),
        "bad_page_threshold_exceeded": _threshold(rec, note),
    }  # type: Dict[str, Any]
    out.update(_ifwi(rec, note))
    for key in ("compute_partition", "memory_partition"):
        value = F.text(leaf(("partition", key), key), key, note)
        if isinstance(value, str):
            value = value.upper()
        elif unpartitioned:
            value = None
        out[key] = value
    return out


def _device_id(raw: Any, note: str) -> Any:
    got = F.number(raw, "device_id", note)
    if isinstance(got, ProbeFailure):
        return got
    if isinstance(raw, str) and not raw.strip().lower().startswith("0x"):
        return F.failed("device_id", "not hex: %s" % raw, note)
    if not isinstance(got, int) or not 0 <= got <= 0xFFFF:
        return F.failed("device_id", "not a PCI device id: %s" % got, note)
    return "0x%04x" % got


def _ifwi(rec: Dict[str, Any], note: str) -> Dict[str, Any]:
    # ROCm 6.x prints the section as "vbios" (amdsmi_commands.py l.455), 7.x as "ifwi".
    key = "vbios" if "vbios" in rec and "ifwi" not in rec else "ifwi"
    got = {}
    for part in ("version", "part_number", "build_date"):
        field = "ifwi_" + part
        got[field] = F.text(F.get(rec, (key, part), field, note), field, note)
    version, number, date = got["ifwi_version"], got["ifwi_part_number"], got["ifwi_build_date"]
    # Without libdrm the library leaves name, date and part number empty (the
    # CLI prints N/A) and fills "version" from sysfs vbios_version (amd_smi.cc
    # l.2019-2040; rocm-systems PR 2987): that string is not the IFWI version.
    if (isinstance(version, str) and isinstance(number, ProbeFailure) and isinstance(date, ProbeFailure)
            and "absent" not in number.detail + date.detail):
        version = ProbeFailure(SOURCE, "na", "ifwi_version: unreadable (no libdrm: part number and build"
                                             " date N/A, version is the sysfs vbios string)" + note)
    return {"ifwi_version": version, "ifwi_part_number": number}


def _power_cap(rec: Dict[str, Any], product: Any, note: str) -> Any:
    limit = F.section(rec, "limit", "power_cap_w", note)
    if not isinstance(limit, dict):
        return limit
    if "ppt0" in limit:  # 7.x: limit.ppt0.socket_power_limit
        raw = F.get(limit, ("ppt0", "socket_power_limit"), "power_cap_w", note)
    else:  # 6.1-6.3 socket_power, 6.0 current_power, 5.7 power
        key = next((k for k in ("socket_power", "current_power", "power") if k in limit), None)
        raw = limit[key] if key else F.absent("power_cap_w", note)
    watts = F.number(raw, "power_cap_w", note)
    if isinstance(watts, ProbeFailure):
        return watts
    if watts > 10000 and not isinstance(raw, dict):
        watts = watts / 1e6  # 6.0 printed the library's microwatts with no unit
    if watts <= 0:
        # MI300A: SOCKET_POWER_LIMIT 0 W beside MAX 550 W (fixture
        # amd-smi-static-MI300A-...): the APU's cap is on the socket, not per GPU.
        if isinstance(product, str) and "MI300A" in product.upper():
            return None
        return F.failed("power_cap_w", "%s W" % watts, note)
    return float(watts)


def _threshold(rec: Dict[str, Any], note: str) -> Any:
    field = "bad_page_threshold_exceeded"
    raw = F.get(rec, ("ras", field), field, note)
    if isinstance(raw, ProbeFailure) and isinstance(rec.get("ras"), dict) and "absent" in raw.detail:
        # Older amd-smi print ras.bad_page_threshold only (the MI210 fixture).
        return ProbeFailure(SOURCE, "unchecked", field + ": not printed by this amd-smi")
    if isinstance(raw, bool):
        return raw
    got = F.text(raw, field, note)  # the CLI prints the strings "True"/"False"
    if isinstance(got, str):
        return {"true": True, "false": False}.get(got.lower(), F.failed(field, got, note))
    return got


# ---- metric -------------------------------------------------------------------


def parse_metric(stdout: str) -> Dict[int, Dict[str, Any]]:
    """`amd-smi metric --ecc --ecc-blocks --pcie --json`."""
    note, recs = F.records(stdout)
    return {idx: {"ecc_total": _ecc_total(rec, note), "ecc_blocks": _ecc_blocks(rec, note),
                  "pcie": _pcie(rec, note)} for idx, rec in recs.items()}


def _ecc_total(rec: Dict[str, Any], note: str) -> Any:
    node = F.section(rec, "ecc", "ecc_total", note)
    return node if isinstance(node, ProbeFailure) else F.triple(node, "total_", "ecc_total", note)


def _ecc_blocks(rec: Dict[str, Any], note: str) -> Any:
    node = F.section(rec, "ecc_blocks", "ecc_blocks", note)
    if isinstance(node, ProbeFailure):
        return node
    if not node:
        return None  # only RAS-enabled blocks are listed (l.1867-1893): none enabled
    # A block whose counts could not be read stays a ProbeFailure beside the others.
    return {str(name).lower(): F.triple(counts, "", "ecc_blocks.%s" % str(name).lower(), note)
            for name, counts in node.items()}


def _pcie(rec: Dict[str, Any], note: str) -> Any:
    node = F.section(rec, "pcie", "pcie", note)
    if isinstance(node, ProbeFailure):
        return node
    width = F.count(F.get(node, ("width",), "pcie width", note), "pcie width", note)
    speed = F.number(F.get(node, ("speed",), "pcie speed", note), "pcie speed", note)
    bad = F.first_failure(width, speed)
    if bad:
        return bad
    out = {"width": width, "speed_gts": float(speed)}  # type: Dict[str, Any]
    keys = ["replay_count"] + [k for k in ("l0_to_recovery_count", "replay_roll_over_count", "nak_sent_count",
                                          "nak_received_count", "lc_perf_other_end_recovery_count",
                                          "lc_perf_other_end_recovery") if k in node]
    for key in keys:  # 6.3 "lc_perf_other_end_recovery", 7.x "..._count"
        name = "lc_perf_other_end_recovery_count" if key.startswith("lc_perf") else key
        out[name] = F.count(F.get(node, (key,), "pcie " + key, note), "pcie " + key, note)
    return out


# ---- bad pages, xgmi ----------------------------------------------------------


def parse_bad_pages(stdout: str) -> Dict[int, Any]:
    """`amd-smi bad-pages --json`: (retired, pending, unreservable) per GPU."""
    note, recs = F.records(stdout)
    out = {}  # type: Dict[int, Any]
    for idx, rec in recs.items():
        counts = [_pages(rec, key, note) for key in ("retired", "pending", "un_res")]
        if all(isinstance(c, int) for c in counts):
            out[idx] = tuple(counts)
            continue
        said = "; ".join(c.detail if isinstance(c, ProbeFailure) else "%s: %d" % (k, c)
                         for k, c in zip(("retired", "pending", "un_res"), counts))
        kinds = {c.kind for c in counts if isinstance(c, ProbeFailure)}
        out[idx] = ProbeFailure(SOURCE, "na" if kinds == {"na"} else "error", "bad pages " + F.short(said))
    return out


def _pages(rec: Dict[str, Any], key: str, note: str) -> Any:
    # "No bad pages found.", ONE object when exactly one page ("Remove brackets
    # if there is only one value", amdsmi_commands.py bad_pages), a list, or "N/A".
    value = F.get(rec, (key,), key, note)
    if isinstance(value, dict):
        value = [value]
    if isinstance(value, list):
        if all(isinstance(p, dict) and "page_address" in p for p in value):
            return len(value)
        return F.failed(key, "not a list of pages", note)
    got = F.text(value, key, note)
    if isinstance(got, str):
        return 0 if got.lower().startswith("no bad pages") else F.failed(key, got, note)
    return got


def parse_xgmi_link_status(stdout: str) -> Dict[int, Any]:
    """`amd-smi xgmi --link-status --json` (AMD SMI 25.3 / ROCm 6.4+): (up, down,
    disabled) links per GPU, None where it has none."""
    try:
        banner, payload = json_payload(stdout)
        note, rows = F.banner_note(banner), F.xgmi_rows_json(payload)
    except ValueError:
        note, rows = "", F.xgmi_rows_text(stdout)
    return {idx: F.links(statuses, note) for idx, statuses in rows.items()}


# ---- version, list, firmware, reset -------------------------------------------


def parse_version(stdout: str) -> Dict[str, Any]:
    """`amd-smi version [--json]`: tool (the CLI's version), amdsmi_library_version,
    rocm_version, amdgpu_version; a key the output lacks is left out."""
    fields = {}  # type: Dict[str, Any]
    try:
        banner, payload = json_payload(stdout)
        note = F.banner_note(banner)
        doc = payload[0] if isinstance(payload, list) and payload else payload
        if isinstance(doc, dict):
            # JSON: "tool" is the constant "AMDSMI Tool"; the version is "version".
            fields = {"tool": doc.get("version")}
            fields.update((k, doc.get(k)) for k in ("amdsmi_library_version", "rocm_version", "amdgpu_version"))
    except ValueError:
        note = ""
        line = next((ln for ln in (stdout or "").splitlines() if "AMDSMI Tool:" in ln), "")
        for part in line.split("|"):
            key, _, value = part.partition(":")
            if key.strip().lower() in _VERSION_TEXT:
                fields[_VERSION_TEXT[key.strip().lower()]] = value
    return {k: F.text(v, k, note) for k, v in fields.items() if v is not None}


def parse_list(stdout: str) -> Dict[int, Dict[str, Any]]:
    """`amd-smi list [--json]`: bdf, uuid, partition_id per GPU."""
    note, recs = F.records(stdout)
    return {idx: {"bdf": F.bdf(F.get(rec, ("bdf",), "bdf", note), "bdf", note),
                  "uuid": F.text(F.get(rec, ("uuid",), "uuid", note), "uuid", note),
                  "partition_id": F.count(F.get(rec, ("partition_id",), "partition_id", note),
                                          "partition_id", note)}
            for idx, rec in recs.items()}


def parse_firmware(stdout: str) -> Dict[int, Any]:
    """`amd-smi firmware [--json]`: fw id -> version per GPU, ids named as
    sysfs names them (mec, sos, smc, ...); a ProbeFailure for a GPU whose
    list amd-smi could not read."""
    note, recs = F.records(stdout)
    out = {}  # type: Dict[int, Any]
    for idx, rec in recs.items():
        node = F.get(rec, ("fw_list",), "fw_list", note)
        if isinstance(node, dict):  # text: FW_LIST: {FW 0: {...}, FW 1: {...}}
            node = list(node.values())
        if not isinstance(node, list):
            out[idx] = F.section({"x": node}, "x", "fw_list", note)
            continue
        versions = {}  # type: Dict[str, Any]
        for entry in node:
            if not isinstance(entry, dict):
                continue
            name = F.text(entry.get("fw_id", entry.get("fw_name")), "fw_id", note)
            if isinstance(name, str):
                name = name.lower().replace("amdsmi_fw_id_", "")
                name = _FW_SYSFS.get(name, name)
                versions[name] = F.text(entry.get("fw_version"), "fw " + name, note)
        out[idx] = versions
    return out


def parse_reset(rc: int, stdout: str, stderr: str) -> Dict[int, Any]:
    """`amd-smi reset -G -g N [--json]`: True per GPU reset, else why not.  A
    failed reset is the string under gpu_reset with exit 0 ("Failed to reset
    GPU", the library's error text, "[...] Unable to reset GPU")."""
    note, recs = F.records(stdout)
    whole = failure(rc, stdout, stderr) if (rc != 0 or _ROOT.search((stdout or "") + (stderr or ""))) else None
    if whole is None and not recs:
        whole = ProbeFailure(SOURCE, "error", "no gpu_reset in output")
    if whole is not None:  # -1: the command as a whole, when it printed no GPU block
        return {idx: whole for idx in recs} or {-1: whole}
    out = {}  # type: Dict[int, Any]
    for idx, rec in recs.items():
        said = F.text(F.get(rec, ("gpu_reset",), "gpu_reset", note), "gpu_reset", note)
        if isinstance(said, str):
            said = True if said.lower().startswith("successfully reset") else F.failed("gpu_reset", said, note)
        out[idx] = said
    return out
