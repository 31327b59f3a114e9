"""gpugate.vendors.amd.parse_smi on real amd-smi captures (tests/fixtures/amd, each
with its .src.txt) from ROCm 6.1-7.2, MI210, MI300X, MI300A and MI350X; on
files CONSTRUCTED from the CLI's source where no capture exists (their name
says so); and property tests: no input raises, "N/A" never becomes a value.
"""

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpugate.model.facts import ProbeFailure
from gpugate.vendors.amd import parse_smi
from gpugate.vendors.amd import parse_smi_fields as fields

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "amd")
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KFD = " (no /dev/kfd access)"


def read(name):
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as f:
        return f.read()


def na(detail):
    return ProbeFailure("amd_smi", "na", detail)


def test_every_amd_smi_fixture_has_its_source():
    names = [n for n in os.listdir(FIXTURES) if n.startswith("amd-smi-") and not n.endswith(".src.txt")]
    assert len(names) >= 25
    for name in names:
        assert os.path.exists(os.path.join(FIXTURES, name + ".src.txt")), name
        src = read(name + ".src.txt")
        assert ("CONSTRUCTED" in name) == src.startswith("CONSTRUCTED FROM SOURCE"), name


# ---- static ------------------------------------------------------------------------

MI300X_BDFS = ["0000:1b:00.0", "0000:3d:00.0", "0000:4e:00.0", "0000:5f:00.0",
               "0000:9d:00.0", "0000:bd:00.0", "0000:cd:00.0", "0000:dd:00.0"]


def test_static_json_rocm72_mi300x():
    got = parse_smi.parse_static(read("amd-smi-static-json-8xMI300X-rocm7.2.1-delldai.txt"))
    assert sorted(got) == list(range(8))
    assert [got[i]["bdf"] for i in range(8)] == MI300X_BDFS
    assert got[0] == {
        "bdf": "0000:1b:00.0", "product": "AMD Instinct MI300X", "device_id": "0x74a1",
        "ifwi_version": "00159017", "ifwi_part_number": "113-M3000108-103", "power_cap_w": 750.0,
        # 7.2.1 prints partitions only under `static --partition`: absent is not a value.
        "compute_partition": na("compute_partition: absent"), "memory_partition": na("memory_partition: absent"),
        "bad_page_threshold_exceeded": False, "serial": "692409006566"}
    assert all(g["ifwi_version"] == "00159017" and g["power_cap_w"] == 750.0 for g in got.values())


def test_static_json_no_kfd_access_banner():
    text = read("amd-smi-static-json-nonroot-permdenied-MI300X-rocm7.2.1-delldai.txt")
    banner, payload = parse_smi.json_payload(text)
    assert banner.startswith("Permission needed to access required GPU device node(s):")
    assert "/dev/kfd: Permission denied" in banner and len(payload["gpu_data"]) == 8
    assert parse_smi.failure(0, text, "") is None
    got = parse_smi.parse_static(text)[0]
    # What sysfs gives is still real; every ioctl field is N/A for want of /dev/kfd.
    assert got["bdf"] == "0000:1b:00.0" and got["serial"] == "692409006566" and got["power_cap_w"] == 750.0
    for key in ("product", "device_id", "ifwi_version", "ifwi_part_number", "bad_page_threshold_exceeded"):
        assert got[key] == na("%s: N/A%s" % (key, KFD)), key
    assert got["compute_partition"] == na("compute_partition: absent" + KFD)


def test_static_json_mi210_vbios_era_fragment():
    got = parse_smi.parse_static(read("amd-smi-static-json-MI210-inbox6.14-dmetestrunner.FRAGMENT.txt"))
    assert got == {0: {
        "bdf": na("bdf: absent"),  # the publisher cut bus.bdf
        "product": "AMD Instinct MI210", "device_id": "0x740f",
        "ifwi_version": na("ifwi_version: absent"), "ifwi_part_number": na("ifwi_part_number: absent"),
        "power_cap_w": 300.0,  # 6.x key limit.socket_power
        "compute_partition": None, "memory_partition": None,  # MI200 has no partitions
        "bad_page_threshold_exceeded": ProbeFailure("amd_smi", "unchecked",
                                                    "bad_page_threshold_exceeded: not printed by this amd-smi"),
        "serial": "0"}}


def test_static_text_mi300a_ifwi_na_and_apu_power_cap():
    got = parse_smi.parse_static(read("amd-smi-static-MI300A-amdgpu6.19.4-amdsmidocs.FRAGMENT.txt"))[0]
    assert got["bdf"] == "0000:01:00.0" and got["product"] == "AMD Instinct MI300A"
    assert got["device_id"] == "0x74a0"
    assert got["ifwi_version"] == na("ifwi_version: N/A") and got["ifwi_part_number"] == na("ifwi_part_number: N/A")
    assert got["power_cap_w"] is None  # SOCKET_POWER_LIMIT: 0 W on an APU: no per-GPU cap
    assert got["bad_page_threshold_exceeded"] == na("bad_page_threshold_exceeded: N/A")
    assert got["serial"] == na("serial: N/A")


def test_static_text_mi350x_with_libdrm():
    got = parse_smi.parse_static(read("amd-smi-static-MI350X-amdgpu6.18.3-rocmsys2987.FRAGMENT.txt"))[0]
    assert (got["bdf"], got["product"], got["device_id"]) == ("0000:05:00.0", "AMD Instinct MI350X", "0x75a0")
    assert (got["ifwi_version"], got["ifwi_part_number"]) == ("00154951", "113-M350-01-1K0-920A")
    assert got["power_cap_w"] == na("power_cap_w: absent")  # --limit was not asked


def test_static_without_libdrm_reads_what_it_prints():
    # The real MI350X answer without libdrm (rocm-systems PR 2987): the
    # library's dlopen warning, then PART_NUMBER and the IFWI VERSION (the
    # same as with libdrm); only IFWI NAME, BUILD_DATE and DRIVER are N/A.
    text = read("amd-smi-static-MI350X-nolibdrm-amdgpu6.18.3-rocmsys2987.FRAGMENT.txt")
    warning, _ = text.split("\n", 1)
    got = parse_smi.parse_static(text)[0]
    assert (got["bdf"], got["device_id"]) == ("0000:05:00.0", "0x75a0")
    assert (got["ifwi_version"], got["ifwi_part_number"]) == ("00154951", "113-M350-01-1K0-920A")
    # The warning on stderr (or before the JSON) is no failure of the answer.
    doc = read("amd-smi-static-json-8xMI300X-rocm7.2.1-delldai.txt")
    assert parse_smi.failure(0, doc, warning) is None
    assert parse_smi.failure(0, warning + "\n" + doc, "") is None
    assert parse_smi.failure(0, doc, "Fail to open libdrm.so.2: libdrm.so.2: cannot open shared object file") is None
    # libamd_smi itself missing still is.
    assert parse_smi.failure(1, "", warning + "\nOSError: libamd_smi.so: cannot open shared object file").detail \
        .startswith("library not found: OSError: libamd_smi.so")


@settings(max_examples=100, deadline=None)
@given(lib=st.sampled_from(["libdrm_amdgpu.so", "libdrm_amdgpu.so.1", "libdrm.so.2"]),
       verb=st.sampled_from(["Fail", "Failed"]), where=st.sampled_from(["stderr", "banner", "both"]),
       rc=st.sampled_from([0, 1, 2, 255]), gpus=st.integers(1, 8))
def test_a_libdrm_warning_never_decides_the_answer(lib, verb, where, rc, gpus):
    """The warning anywhere (stderr, or before the JSON) leaves failure() and
    the parsed answer as they are without it, whatever the exit code."""
    doc = json.loads(read("amd-smi-static-json-8xMI300X-rocm7.2.1-delldai.txt"))
    doc["gpu_data"] = doc["gpu_data"][:gpus]
    out = json.dumps(doc, indent=4)
    line = "%s to open %s: %s: cannot open shared object file: No such file or directory" % (verb, lib, lib)
    err = line if where in ("stderr", "both") else ""
    warned = line + "\n" + out if where in ("banner", "both") else out
    assert parse_smi.failure(rc, warned, err) == parse_smi.failure(rc, out, "")
    if rc == 0:
        assert parse_smi.parse_static(warned) == parse_smi.parse_static(out)


def test_static_without_libdrm_never_takes_the_sysfs_vbios_string():
    # What amd_smi.cc does without libdrm where the part number is empty too
    # (name/date/part number -> the CLI's "N/A", version from sysfs
    # vbios_version); PR 2987's MI350X still printed both (test above).
    doc = json.loads(read("amd-smi-static-json-8xMI300X-rocm7.2.1-delldai.txt"))
    gpu = doc["gpu_data"][0]
    gpu["ifwi"] = {"name": "N/A", "build_date": "N/A", "part_number": "N/A", "version": "113-M3000108-103"}
    got = parse_smi.parse_static(json.dumps(doc))[0]
    assert isinstance(got["ifwi_version"], ProbeFailure) and got["ifwi_version"].kind == "na"
    assert "no libdrm" in got["ifwi_version"].detail
    assert got["ifwi_part_number"] == na("ifwi_part_number: N/A")


def test_static_rocm6_list_shape_and_vbios_key():
    doc = json.loads(read("amd-smi-static-json-8xMI300X-rocm7.2.1-delldai.txt"))["gpu_data"][:2]
    for gpu in doc:  # the 6.x names of the same sections (amdsmi_commands.py rocm-6.1.2..6.3)
        gpu["vbios"] = gpu.pop("ifwi")
        gpu["limit"] = {"max_power": {"value": 750, "unit": "W"}, "min_power": {"value": 0, "unit": "W"},
                        "socket_power": {"value": 700, "unit": "W"}}
        gpu["partition"] = {"compute_partition": "spx", "memory_partition": "NPS1", "partition_id": 0}
    got = parse_smi.parse_static(json.dumps(doc, indent=4))
    assert got[1]["ifwi_version"] == "00159017" and got[1]["power_cap_w"] == 700.0
    # 6.0 printed the cap as "current_power", the library's microwatts with no unit.
    doc[0]["limit"] = {"max_power": 750000000, "current_power": 750000000}
    assert parse_smi.parse_static(json.dumps(doc))[0]["power_cap_w"] == 750.0
    assert (got[0]["compute_partition"], got[0]["memory_partition"]) == ("SPX", "NPS1")


def test_static_partition_text_cpx_nps4():
    got = parse_smi.parse_static(read("amd-smi-static-partition-CPX-NPS4-MI300X-rocm6.3.0-amdsmichangelog.txt"))
    assert (got[0]["compute_partition"], got[0]["memory_partition"]) == ("CPX", "NPS4")
    assert got[0]["bdf"] == na("bdf: absent")


def test_static_cpu_then_gpu_documents():
    # 6.x with amd_hsmp loaded prints the CPU list, then the GPU list.
    cpu = json.dumps([{"cpu": 0, "smu": {"fw_version": "85.103.0"}}], indent=4)
    gpu = read("amd-smi-static-json-8xMI300X-rocm7.2.1-delldai.txt")
    gpus = json.dumps(json.loads(gpu)["gpu_data"][:1], indent=4)
    assert parse_smi.parse_static(cpu + "\n" + gpus)[0]["bdf"] == "0000:1b:00.0"


# ---- failure -------------------------------------------------------------------------


def test_failure_driver_not_loaded_exit_255():
    err = read("amd-smi-static-driver-not-loaded-stderr-CONSTRUCTED.txt")
    got = parse_smi.failure(255, "", err)
    assert got == ProbeFailure("amd_smi", "missing", "driver not loaded: ERROR: Drivers not loaded "
                                                     "(amdgpu and amd_hsmp drivers not found in modules)")
    assert parse_smi.failure(255, "", "").kind == "missing"
    assert parse_smi.failure(1, "", "AmdSmiLibraryException: AMDSMI_STATUS_DRIVER_NOT_LOADED").kind == "missing"
    assert parse_smi.failure(0, '{"error": "AMDSMI has returned error", "code": -1034}', "").kind == "missing"


def test_failure_traceback_library_and_other_exits():
    tb = "Traceback (most recent call last):\n  File \"/opt/rocm/bin/amd-smi\", line 3\nKeyError: 'AMDSMI_STATUS_X'\n"
    assert parse_smi.failure(1, "", tb) == ProbeFailure("amd_smi", "error", "KeyError: 'AMDSMI_STATUS_X'")
    lib = "OSError: libamd_smi.so: cannot open shared object file: No such file or directory"
    assert parse_smi.failure(1, "", lib).detail.startswith("library not found: OSError: libamd_smi.so")
    assert parse_smi.failure(2, "", "usage: amd-smi\namd-smi: error: unrecognized arguments: --link-status") == \
        ProbeFailure("amd_smi", "error", "exit 2: usage: amd-smi")
    assert parse_smi.failure(0, "GPU: 0\n    BDF: x\n", "") == ProbeFailure("amd_smi", "error", "no JSON in output: GPU: 0")
    assert parse_smi.failure(0, '{"error": "Invalid parameters", "code": -1}', "") == \
        ProbeFailure("amd_smi", "error", "Invalid parameters (code -1)")
    assert parse_smi.failure(0, read("amd-smi-version-json-MI300X-rocm7.2.1-delldai.txt"), "") is None


def test_failure_needs_root():
    err = read("amd-smi-reset-nonroot-stderr-CONSTRUCTED.txt")
    assert parse_smi.failure(1, "", err) == ProbeFailure("amd_smi", "error", "needs root")


def test_json_payload_without_json():
    with pytest.raises(ValueError):
        parse_smi.json_payload("Permission needed ...\n[WARNING] nothing\n")


# ---- metric -----------------------------------------------------------------------------


def test_metric_ecc_blocks_text_all_zero_rocm612():
    got = parse_smi.parse_metric(read("amd-smi-metric-eccblocks-allzero-MI300X-rocm6.1.2-amdsmichangelog.txt"))
    assert got[0]["ecc_blocks"] == {b: (0, 0, 0) for b in ("umc", "sdma", "gfx", "mmhub", "pcie_bif", "hdp", "xgmi_wafl")}
    assert got[0]["ecc_total"] == na("ecc_total: absent") and got[0]["pcie"] == na("pcie: absent")


def test_metric_json_nonzero_and_na():
    got = parse_smi.parse_metric(read("amd-smi-metric-ecc-blocks-pcie-json-nonzero-CONSTRUCTED.json"))
    g0 = got[0]
    assert g0["ecc_total"] == (2, 1538, 1)
    assert g0["ecc_blocks"]["umc"] == (2, 5, 1) and g0["ecc_blocks"]["xgmi_wafl"] == (0, 1533, 0)
    assert g0["pcie"] == {"width": 16, "speed_gts": 32.0, "replay_count": 0, "l0_to_recovery_count": 12,
                          "replay_roll_over_count": 0, "nak_sent_count": 0, "nak_received_count": 0,
                          "lc_perf_other_end_recovery_count": 0}
    g1 = got[1]
    assert g1["ecc_total"] == na("ecc_total ue: N/A")
    assert g1["ecc_blocks"] == na("ecc_blocks: N/A") and g1["pcie"] == na("pcie width: N/A")
    g2 = got[2]
    assert g2["ecc_blocks"]["umc"] == na("ecc_blocks.umc ue: N/A") and g2["ecc_blocks"]["gfx"] == (3, 0, 0)
    assert g2["pcie"]["replay_count"] == na("pcie replay_count: N/A") and g2["pcie"]["width"] == 16
    assert got[3]["ecc_blocks"] is None  # no RAS-enabled block is listed


# ---- bad pages --------------------------------------------------------------------------


def test_bad_pages_four_shapes():
    got = parse_smi.parse_bad_pages(read("amd-smi-bad-pages-json-4shapes-CONSTRUCTED.json"))
    assert got[0] == (0, 0, 0) and got[1] == (1, 0, 0) and got[2] == (2, 1, 1)
    assert got[3] == na("bad pages retired: N/A; pending: N/A; un_res: N/A")
    assert parse_smi.parse_bad_pages(read("amd-smi-bad-pages-json-hex-CONSTRUCTED.json")) == {0: (2, 0, 0)}


def test_bad_pages_text_captures():
    assert parse_smi.parse_bad_pages(read("amd-smi-bad-pages-none-MI300X-rocm6.x-rocmblog.FRAGMENT.txt")) == \
        {0: (0, 0, 0), 1: (0, 0, 0)}
    # The changelog's --hex example: one retired page, pending and un_res "N/A".
    got = parse_smi.parse_bad_pages(read("amd-smi-bad-pages-hex-retired1-unknownGPU-rocm7.x-amdsmichangelog.txt"))
    assert got == {0: na("bad pages retired: 1; pending: N/A; un_res: N/A")}


def test_bad_pages_text_list_of_pages():
    text = ("GPU: 0\n    RETIRED:\n        PAGE_ADDRESS: 8355840\n        PAGE_SIZE: 4096\n        STATUS: RESERVED\n"
            "        PAGE_ADDRESS: 8359936\n        PAGE_SIZE: 4096\n        STATUS: RESERVED\n"
            "    PENDING: No bad pages found.\n    UN_RES: No bad pages found.\n")
    assert parse_smi.parse_bad_pages(text) == {0: (2, 0, 0)}


# ---- xgmi link status ---------------------------------------------------------------------


def test_xgmi_link_status_text_link_down_rocm64():
    got = parse_smi.parse_xgmi_link_status(
        read("amd-smi-xgmi-linkstatus-linkdown-unknownGPU-rocm6.4-amdsmichangelog.FRAGMENT.txt"))
    assert got == {0: (5, 2, 1), 1: (5, 2, 1)}


def test_xgmi_link_status_not_supported_is_not_a_value():
    for name in ("amd-smi-xgmi-linkstatus-notsupported-mVF-MI3x-rocm7.x-amdsmichangelog.FRAGMENT.txt",
                 "amd-smi-xgmi-linkstatus-json-notsupported-CONSTRUCTED.json"):
        got = parse_smi.parse_xgmi_link_status(read(name))
        assert got and all(isinstance(v, ProbeFailure) and v.kind == "na" for v in got.values()), name


def test_xgmi_link_status_json_matrix():
    got = parse_smi.parse_xgmi_link_status(read("amd-smi-xgmi-linkstatus-json-linkdown-CONSTRUCTED.json"))
    assert got == {0: (3, 0, 0), 1: (2, 1, 0), 2: (2, 1, 0), 3: (3, 0, 1)}
    assert parse_smi.parse_xgmi_link_status('[{"gpu": 0, "bdf": "0000:01:00.0", "link_status": []}]') == {0: None}
    assert parse_smi.parse_xgmi_link_status('{"link_status": [{"gpu": 0, "link_status": ["SELF"]}]}') == {0: None}


def test_xgmi_metric_table_of_rocm61_has_no_link_status():
    assert parse_smi.parse_xgmi_link_status(read("amd-smi-xgmi-MI300X-rocm6.1.0-amdsmichangelog.txt")) == {}


# ---- version, list, firmware, reset --------------------------------------------------------


def test_version_json_and_text():
    assert parse_smi.parse_version(read("amd-smi-version-json-MI300X-rocm7.2.1-delldai.txt")) == {
        "tool": "26.2.2+e1a6bc5663", "amdsmi_library_version": "26.2.2", "rocm_version": "7.2.1",
        "amdgpu_version": "6.16.13"}
    assert parse_smi.parse_version(read("amd-smi-version-MI300X-rocm7.1.1-dme367.txt")) == {
        "tool": "26.2.0+021c61fc", "amdsmi_library_version": "26.2.0", "rocm_version": "7.1.1",
        "amdgpu_version": "6.16.13"}
    got = parse_smi.parse_version(read("amd-smi-version-json-nonroot-fileerror-MI300X-rocm7.2.1-delldai.txt"))
    assert got["amdsmi_library_version"] == "26.2.2"
    assert got["amdgpu_version"] == ProbeFailure(
        "amd_smi", "error", "amdgpu_version: AMDSMI_STATUS_FILE_ERROR - Error opening file")
    # 6.3 prints no amdgpu version; ROCm "N/A" when librocm-core is missing.
    assert parse_smi.parse_version("AMDSMI Tool: 24.7.1+8dc45db | AMDSMI Library version: 25.1.0.0 | "
                                "ROCm version: N/A") == {
        "tool": "24.7.1+8dc45db", "amdsmi_library_version": "25.1.0.0", "rocm_version": na("rocm_version: N/A")}


def test_list_text_rocm63_and_rocm6x():
    got = parse_smi.parse_list(read("amd-smi-list-MI300X-rocm6.3.0-amdsmichangelog.txt"))
    assert got == {0: {"bdf": "0000:23:00.0", "uuid": "<redacted>", "partition_id": 0},
                   1: {"bdf": "0000:26:00.0", "uuid": "<redacted>", "partition_id": 0}}
    got = parse_smi.parse_list(read("amd-smi-list-MI300X-rocm6.x-rocmblog.FRAGMENT.txt"))
    assert sorted(got) == [0, 1, 2]
    assert got[2] == {"bdf": "0000:46:00.0", "uuid": "97ff74a1-0000-1000-8065-fa81273af9ce",
                      "partition_id": na("partition_id: absent")}
    js = json.dumps([{"gpu": 0, "bdf": "0000:0B:00.0", "uuid": "N/A", "kfd_id": 7, "node_id": 3, "partition_id": 0}])
    assert parse_smi.parse_list(js) == {0: {"bdf": "0000:0b:00.0", "uuid": na("uuid: N/A"), "partition_id": 0}}


def test_firmware_text_mi300a_and_mi300x_and_json():
    got = parse_smi.parse_firmware(read("amd-smi-firmware-MI300A-rocm6.3.3-rocm4477.txt"))
    assert sorted(got) == [0, 1, 2, 3]
    assert got[3] == {"mec": "166", "mec2": "166", "rlc": "65", "sdma": "22", "sdma2": "22", "vcn": "06.11.30.0C",
                      "sos": "00.36.01.50", "ta_ras": "1B.36.02.0F", "ta_xgmi": "20.00.01.13", "smc": "04.85.103.184"}
    got = parse_smi.parse_firmware(read("amd-smi-firmware-MI300X-rocm6.x-rocmblog.FRAGMENT.txt"))
    assert got[0]["mec"] == "147" and got[0]["sos"] == "36.02.4C" and got[0]["smc"] == "85.110.0"
    js = json.dumps([{"gpu": 0, "fw_list": [{"fw_id": "CP_MEC1", "fw_version": 166},
                                            {"fw_id": "TA_RAS", "fw_version": "N/A"}]},
                     {"gpu": 1, "fw_list": "N/A"}])
    assert parse_smi.parse_firmware(js) == {0: {"mec": "166", "ta_ras": na("fw ta_ras: N/A")},
                                         1: na("fw_list: N/A")}


def test_reset_forms():
    got = parse_smi.parse_reset(0, read("amd-smi-reset-json-ok-failed-CONSTRUCTED.json"), "")
    assert got == {0: True, 1: ProbeFailure("amd_smi", "error", "gpu_reset: Failed to reset GPU")}
    assert parse_smi.parse_reset(0, "GPU: 0\n    GPU_RESET: Successfully reset GPU\n", "") == {0: True}
    newer = '[{"gpu": 0, "gpu_reset": "[AMDSMI_STATUS_BUSY] Unable to reset GPU"}]'
    assert parse_smi.parse_reset(0, newer, "")[0].kind == "error"
    err = read("amd-smi-reset-nonroot-stderr-CONSTRUCTED.txt")
    assert parse_smi.parse_reset(1, "", err) == {-1: ProbeFailure("amd_smi", "error", "needs root")}
    assert parse_smi.parse_reset(255, "", "ERROR: Driver not loaded (amdgpu not found in modules)")[-1].kind == "missing"


# ---- properties ---------------------------------------------------------------------------

NA_VALUES = st.sampled_from(["N/A", "n/a", "", " N/A ", {"value": "N/A", "unit": "W"}])
LEAVES = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=True),
                   st.text(max_size=12), NA_VALUES, st.sampled_from(["U", "D", "X", "SELF", "U/D", "True", "0x10"]))
KEYS = st.sampled_from(["gpu", "gpu_data", "bdf", "asic", "bus", "ifwi", "vbios", "limit", "ppt0", "ras",
                        "ecc", "ecc_blocks", "pcie", "retired", "pending", "un_res", "page_address",
                        "link_status", "fw_list", "fw_id", "fw_version", "version", "gpu_reset", "partition",
                        "socket_power_limit", "total_uncorrectable_count", "UMC", "width", "speed", "x"])
TREES = st.recursive(LEAVES, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                    st.dictionaries(KEYS, kids, max_size=6)), max_leaves=30)
PARSERS = [parse_smi.parse_static, parse_smi.parse_metric, parse_smi.parse_bad_pages, parse_smi.parse_xgmi_link_status,
           parse_smi.parse_version, parse_smi.parse_list, parse_smi.parse_firmware]


def _leaves(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


@FUZZ
@given(tree=TREES, banner=st.sampled_from(["", "Permission needed:\n  /dev/kfd: Permission denied\n", "[x]\n"]))
def test_any_json_tree_gives_values_or_failures(tree, banner):
    text = banner + json.dumps(tree)
    for parse in PARSERS:
        for leaf in _leaves(parse(text)):
            assert leaf is None or isinstance(leaf, (str, int, float, ProbeFailure)), (parse, leaf)
    parse_smi.parse_reset(0, text, "")
    parse_smi.failure(0, text, "")


@FUZZ
@given(text=st.text(max_size=300), rc=st.integers(-20, 300))
def test_any_text_gives_values_or_failures(text, rc):
    for parse in PARSERS:
        parse(text)
    parse_smi.parse_reset(rc, text, text)
    got = parse_smi.failure(rc, text, "")
    assert got is None or isinstance(got, ProbeFailure)


@FUZZ
@given(gpus=st.lists(st.integers(0, 7), min_size=1, max_size=4, unique=True), na_value=NA_VALUES,
       where=st.sampled_from(["ifwi_version", "power_cap", "threshold", "ecc", "block", "pcie", "pages", "links"]))
def test_na_anywhere_is_never_zero_or_true(gpus, na_value, where):
    static = [{"gpu": g, "bus": {"bdf": "0000:1b:00.0"},
               "ifwi": {"version": na_value if where == "ifwi_version" else "001", "part_number": "1",
                        "build_date": "2025"},
               "limit": {"ppt0": {"socket_power_limit": na_value if where == "power_cap" else 750}},
               "ras": {"bad_page_threshold_exceeded": na_value if where == "threshold" else "False"}} for g in gpus]
    for gpu in parse_smi.parse_static(json.dumps(static)).values():
        for key, target in (("ifwi_version", "ifwi_version"), ("power_cap_w", "power_cap"),
                            ("bad_page_threshold_exceeded", "threshold")):
            if where == target:
                assert isinstance(gpu[key], ProbeFailure) and gpu[key].kind == "na"
    metric = [{"gpu": g, "ecc": {"total_correctable_count": 0, "total_uncorrectable_count":
                                 na_value if where == "ecc" else 0},
               "ecc_blocks": {"UMC": {"correctable_count": 0, "uncorrectable_count": na_value if where == "block" else 0}},
               "pcie": {"width": na_value if where == "pcie" else 16, "speed": 32}} for g in gpus]
    for gpu in parse_smi.parse_metric(json.dumps({"gpu_data": metric})).values():
        value = {"ecc": gpu["ecc_total"], "block": gpu["ecc_blocks"]["umc"], "pcie": gpu["pcie"]}.get(where)
        if value is not None:
            assert isinstance(value, ProbeFailure) and 0 not in list(_leaves(value))
    pages = [{"gpu": g, "retired": na_value if where == "pages" else "No bad pages found.",
              "pending": "No bad pages found.", "un_res": "No bad pages found."} for g in gpus]
    for got in parse_smi.parse_bad_pages(json.dumps(pages)).values():
        assert isinstance(got, ProbeFailure) if where == "pages" else got == (0, 0, 0)
    links = [{"gpu": g, "link_status": [na_value if where == "links" else "U"] * 3} for g in gpus]
    for got in parse_smi.parse_xgmi_link_status(json.dumps(links)).values():
        assert isinstance(got, ProbeFailure) if where == "links" else got == (3, 0, 0)


PAGE = st.builds(lambda a, s: {"page_address": a, "page_size": 4096, "status": s},
                 st.integers(0, 2**40), st.sampled_from(["RESERVED", "PENDING", "UNRESERVABLE"]))


@FUZZ
@given(retired=st.lists(PAGE, max_size=5), pending=st.lists(PAGE, max_size=3), hexa=st.booleans())
def test_one_object_and_list_count_the_same_pages(retired, pending, hexa):
    def shape(pages, one_object):
        if hexa:
            pages = [dict(p, page_address="0x%x" % p["page_address"], page_size="0x1000") for p in pages]
        if not pages:
            return "No bad pages found."
        return pages[0] if one_object and len(pages) == 1 else pages
    for one_object in (True, False):
        doc = [{"gpu": 0, "retired": shape(retired, one_object), "pending": shape(pending, one_object),
                "un_res": "No bad pages found."}]
        assert parse_smi.parse_bad_pages(json.dumps(doc, indent=4)) == {0: (len(retired), len(pending), 0)}


@FUZZ
@given(tree=TREES)
def test_text_form_of_any_tree_never_raises(tree):
    # amd-smi's human-readable form of the same tree (keys upper-cased, YAML-like).
    lines = ["GPU: 0"]

    def emit(node, indent):
        if isinstance(node, dict):
            for k, v in node.items():
                if isinstance(v, (dict, list)):
                    lines.append(" " * indent + k.upper() + ":")
                    emit(v, indent + 4)
                else:
                    lines.append(" " * indent + "%s: %s" % (k.upper(), v))
        elif isinstance(node, list):
            for item in node:
                emit(item, indent)
    emit(tree if isinstance(tree, dict) else {"x": tree}, 4)
    text = "\n".join(lines)
    for parse in PARSERS:
        parse(text)
    assert fields.text_records(text)[1][0]["gpu"] == 0
