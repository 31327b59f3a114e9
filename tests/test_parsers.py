"""Table and property tests for gpugate.parsers (dcgm, kernlog, system).

Fixtures are written here, modelled on what the tools print; the real captures
in tests/fixtures (each with its .src.txt) are read too.
"""

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpugate.errors import ParseError
from gpugate.model.facts import XidEvent
from gpugate.model.toolfacts import DcgmHealth, DkmsEntry, Package
from gpugate.parsers import dcgm
from gpugate.parsers import kernlog
from gpugate.parsers import system

from conftest import SAMPLES

PROPS = settings(max_examples=120, deadline=None)

# --------------------------------------------------------------------------
# dcgmi version

DCGMI_V_3 = """\
Version : 3.3.6
Build ID : 11
Build Date : 2024-05-14
Build Type : Release
Commit ID : 0123456789abcdef0123456789abcdef01234567
Branch Name : rel_dcgm_3_3
CPU Arch : x86_64
Build Platform : Linux 4.15.0-180-generic #189-Ubuntu SMP Wed May 18 14:13:57 UTC 2022 x86_64
CRC : 0f1e2d3c4b5a69788796a5b4c3d2e1f0

Hostengine build info:
Version : 3.3.5
Build ID : 14
"""

DCGMI_V_44 = """\
Local build info:
Version : 4.4.1
Build ID : 3
Build Platform : Linux 4.15.0-180-generic x86_64
"""


@pytest.mark.parametrize("text, expected", [
    ("\ndcgmi  version: 4.7.0\n\n", "4.7.0"),
    ("dcgmi version: 4.2.3\n", "4.2.3"),
    (DCGMI_V_3, "3.3.6"),  # the local build, not the host engine's
    (DCGMI_V_44, "4.4.1"),
    ("user@node:~$ dcgmi -v\nVersion : 3.3.5\nBuild ID : 14\n", "3.3.5"),
])
def test_dcgmi_version(text, expected):
    assert dcgm.parse_dcgmi_version(text) == expected


@pytest.mark.parametrize("text", [
    "", "dcgmi: command not found\n", "Build Platform : Linux 4.15.0-180-generic\n",
    "Error: unable to establish a connection to the specified host: localhost\n",
])
def test_dcgmi_version_bad(text):
    with pytest.raises(ParseError, match="dcgmi version"):
        dcgm.parse_dcgmi_version(text)


# --------------------------------------------------------------------------
# dcgmi health -c -j (jsoncpp tree: body -> group -> children -> id -> children
# -> Errors -> children -> system -> value + overflow pieces)

def _health(overall, gpus=None, group="GPU"):
    body = {"Overall Health": {"value": overall}}
    if gpus:
        children = {}
        for gpu, systems in gpus.items():
            errors = {name: {"value": sev, "overflow": pieces} for name, (sev, pieces) in systems.items()}
            worst = "Failure" if any(sev == "Failure" for sev, _ in systems.values()) else "Warning"
            children[str(gpu)] = {"value": worst, "children": {"Errors": {"children": errors}}}
        body[group] = {"children": children}
    return json.dumps({"body": body, "header": ["Health Monitor Report"]}, indent="\t")


HEALTH_WARNING = _health("Warning", {3: {"Memory system": (
    "Warning", ["A pending retired page has been detected in GPU 3."])}})
HEALTH_FAILURE = _health("Failure", {
    1: {"Memory system": ("Failure", ["Detected 2 volatile double-bit ECC error(s) in", "GPU 1."]),
        "PCIe system": ("Warning", ["Detected more than 8 PCIe replays per minute for", "GPU 1 : 12"])},
    6: {"NVLINK system": ("Failure", ["GPU 6's NvLink link 4 is currently down"])},
})


@pytest.mark.parametrize("text, overall, incidents", [
    (_health("Healthy"), "Healthy", ()),
    (HEALTH_WARNING, "Warning", ("GPU 3: Memory system: A pending retired page has been detected in GPU 3.",)),
    (HEALTH_FAILURE, "Failure", (
        "GPU 1: Memory system: Detected 2 volatile double-bit ECC error(s) in GPU 1.",
        "GPU 1: PCIe system: Detected more than 8 PCIe replays per minute for GPU 1 : 12",
        "GPU 6: NVLINK system: GPU 6's NvLink link 4 is currently down",
    )),
    (_health("Failure", {0: {"NvSwitch F": ("Failure", ["fatal error on link 12"])}}, group="Switch"),
     "Failure", ("Switch 0: NvSwitch F: fatal error on link 12",)),
    (json.dumps({"body": {"Overall Health": {"value": "failure"}}}), "Failure", ()),
])
def test_health(text, overall, incidents):
    health = dcgm.parse_health_json(text)
    assert health == DcgmHealth(overall=overall, incidents=incidents, watches_set=True)


def test_health_without_watches():
    text = "Error: Health watches not enabled. Please enable watches. \n"
    assert dcgm.parse_health_json(text) == DcgmHealth(overall="Unknown", incidents=(), watches_set=False)


@pytest.mark.parametrize("text", [
    "", "Error: Unable to check health watches. Return: Host engine connection invalid/disconnected\n",
    "[]", '{"body": {}}', '{"body": {"Overall Health": {"value": "Internal error"}}}',
    '{"body": {"Overall Health": "Healthy"}}', '{"header": ["Health Monitor Report"]}', "null",
])
def test_health_bad(text):
    with pytest.raises(ParseError, match="dcgmi health"):
        dcgm.parse_health_json(text)


# --------------------------------------------------------------------------
# dcgmi diag -r N -j

def _deployment(names=("Denylist", "NVML Library", "CUDA Main Library", "Permissions and OS Blocks",
                       "Persistence Mode", "Environment Variables", "Page Retirement/Row Remap",
                       "Graphics Processes", "Inforom")):
    return {"category": "Deployment", "tests": [{"name": n, "results": [{"status": "Pass"}]} for n in names]}


# DCGM 2.x: gpu_ids as a string, warnings as one string.
DIAG_2X = json.dumps({"DCGM GPU Diagnostic": {"test_categories": [
    _deployment(),
    {"category": "Hardware", "tests": [{"name": "GPU Memory", "results": [
        {"gpu_ids": "0", "status": "Pass"},
        {"gpu_ids": "1", "status": "Fail",
         "warnings": "Error using CUDA API cudaMalloc: an illegal memory access was encountered"},
    ]}]},
]}}, indent="\t")

# DCGM 3.x, level 3, one GPU with a DBE: isolate-class failure, exit 205.
DIAG_3X_205 = json.dumps({
    "version": "3.3.6", "Driver Version Detected": "535.161.08",
    "GPU Device IDs": ["2330", "2330"], "GPU Device Serials": {"0": "1650923012345", "1": "1650923012346"},
    "DCGM GPU Diagnostic": {"test_categories": [
        _deployment(),
        {"category": "Integration", "tests": [{"name": "PCIe", "results": [
            {"gpu_id": "0", "status": "Pass", "info": "GPU 0 GPU to Host bandwidth:\t\t24.9 GB/s"},
            {"gpu_id": "1", "status": "Pass"}]}]},
        {"category": "Hardware", "tests": [
            {"name": "GPU Memory", "results": [
                {"gpu_id": "0", "status": "Pass"},
                {"gpu_id": "1", "status": "Fail", "warnings": [
                    {"warning": "Detected 2 volatile double-bit ECC error(s) in GPU 1.",
                     "error_id": 4, "error_category": 2, "error_severity": 2}]}]},
            {"name": "Diagnostic", "results": [
                {"gpu_id": "0", "status": "Pass"}, {"gpu_id": "1", "status": "Skip"}]}]},
        {"category": "Stress", "tests": [{"name": "Targeted Stress", "results": [
            {"gpu_id": "0", "status": "Pass"}, {"gpu_id": "1", "status": "skip"}]}]},
    ]}}, indent="\t")

# DCGM 3.x level 1: a level-one warning keyed "warnings" (sic), a gpu_id int, null padding.
DIAG_3X_226 = json.dumps({"DCGM GPU Diagnostic": {"test_categories": [
    {"category": "Deployment", "tests": [
        {"name": "Denylist", "results": [{"status": "Pass"}]},
        {"name": "Persistence Mode", "results": [{"status": "Fail", "gpu_id": 2, "warnings": [
            None,
            {"warnings": "Persistence mode for GPU 2 is currently disabled. The DCGM diagnostic requires "
                         "peristence mode to be enabled.", "error_id": 29, "error_category": 5,
             "error_severity": 5}]}]},
        None,
    ]},
]}})

# DCGM 4.x: entity results, test_summary, entity_groups, metadata; exit 226.
DIAG_4X_226 = json.dumps({
    "DCGM Diagnostic": {"test_categories": [
        {"category": "Deployment", "tests": [{"name": "software", "results": [
            {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status": "Pass"},
            {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 1, "status": "Pass"}],
            "test_summary": {"status": "Pass"}}]},
        {"category": "Hardware", "tests": [
            {"name": "memory", "results": [
                {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status": "Pass"},
                {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 1, "status": "Fail",
                 "warnings": [{"warning": "Error using CUDA API cuMemAlloc: out of memory",
                               "error_id": 93, "error_category": 7, "error_severity": 3},
                              {"warning": "second warning", "error_id": 1, "error_category": 0,
                               "error_severity": 1}],
                 "info": ["Allocated 84918960128 bytes (98.9%)"]}],
             "test_summary": {"status": "Fail"}},
            {"name": "diagnostic", "test_summary": {"status": "Skip"}},
        ]},
        {"category": "Stress", "tests": [
            {"name": "targeted_power", "results": [
                {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status": "Pass"},
                {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 1, "status": "Pass"}],
             "test_summary": {"status": "Fail", "warnings": [
                 {"warning": "Targeted power plugin timed out", "error_id": 75,
                  "error_category": 0, "error_severity": 1}]}},
        ]},
        {"category": "Hardware", "tests": [{"name": "cpu_eud", "results": [
            {"entity_group": "CPU", "entity_group_id": 7, "entity_id": 0, "status": "Pass"}],
            "test_summary": {"status": "Pass"}}]},
    ]},
    "entity_groups": [
        {"entity_group": "GPU", "entity_group_id": 1, "entities": [
            {"entity_id": 0, "device_id": "2330", "serial_num": "1650923012345"},
            {"entity_id": 1, "device_id": "2330", "serial_num": "1650923012346"}]}],
    "metadata": {"version": "4.2.3", "Driver Version Detected": "570.133.20"},
}, indent=4)

DIAG_4X_PASS = json.dumps({
    "DCGM Diagnostic": {"test_categories": [{"category": "Deployment", "tests": [{"name": "software", "results": [
        {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status": "Pass"}],
        "test_summary": {"status": "Pass"}}]}]},
    "entity_groups": [{"entity_group": "GPU", "entity_group_id": 1,
                       "entities": [{"entity_id": 0, "device_id": "2330"}]}],
    "metadata": {"version": "4.7.0"},
})


def _table(diag):
    return [(r.test, r.status, r.gpu, r.error_id, r.severity, r.message) for r in diag.results]


def test_diag_2x():
    diag = dcgm.parse_diag_json(DIAG_2X, level=2, exit_code=226)
    assert (diag.level, diag.exit_code) == (2, 226)
    assert len(diag.results) == 11
    assert [(r.test, r.gpu, r.status) for r in diag.failures] == [("GPU Memory", 1, "Fail")]
    assert diag.failures[0].message.startswith("Error using CUDA API cudaMalloc")


def test_diag_3x_isolate():
    diag = dcgm.parse_diag_json(DIAG_3X_205, level=3, exit_code=205)
    assert _table(diag)[9:] == [
        ("PCIe", "Pass", 0, None, None, ""),
        ("PCIe", "Pass", 1, None, None, ""),
        ("GPU Memory", "Pass", 0, None, None, ""),
        ("GPU Memory", "Fail", 1, 4, 2, "Detected 2 volatile double-bit ECC error(s) in GPU 1."),
        ("Diagnostic", "Pass", 0, None, None, ""),
        ("Diagnostic", "Skip", 1, None, None, ""),
        ("Targeted Stress", "Pass", 0, None, None, ""),
        ("Targeted Stress", "Skip", 1, None, None, ""),
    ]


def test_diag_3x_level_one_warning():
    diag = dcgm.parse_diag_json(DIAG_3X_226, level=1, exit_code=226)
    assert [(r.test, r.status, r.gpu, r.error_id, r.severity) for r in diag.results] == [
        ("Denylist", "Pass", None, None, None), ("Persistence Mode", "Fail", 2, 29, 5)]
    assert diag.results[1].message.startswith("Persistence mode for GPU 2 is currently disabled")


def test_diag_4x():
    diag = dcgm.parse_diag_json(DIAG_4X_226, level=3, exit_code=226)
    assert _table(diag) == [
        ("software", "Pass", 0, None, None, ""),
        ("software", "Pass", 1, None, None, ""),
        ("memory", "Pass", 0, None, None, ""),
        ("memory", "Fail", 1, 93, 3, "Error using CUDA API cuMemAlloc: out of memory"),
        ("diagnostic", "Skip", None, None, None, ""),  # summary only: no entity ran it
        ("targeted_power", "Pass", 0, None, None, ""),
        ("targeted_power", "Pass", 1, None, None, ""),
        # a failure tied to no entity is kept from the test_summary
        ("targeted_power", "Fail", None, 75, 1, "Targeted power plugin timed out"),
        ("cpu_eud", "Pass", None, None, None, ""),  # a CPU entity is not a GPU index
    ]


def test_diag_4x_pass():
    diag = dcgm.parse_diag_json(DIAG_4X_PASS, level=1, exit_code=0)
    assert _table(diag) == [("software", "Pass", 0, None, None, "")]
    assert diag.failures == ()


def test_diag_failing_exit_code_is_never_all_pass():
    diag = dcgm.parse_diag_json(DIAG_4X_PASS, level=1, exit_code=226)
    assert [(r.test, r.status) for r in diag.failures] == [("dcgmi diag", "Fail")]


@pytest.mark.parametrize("status, expected", [
    ("Pass", "Pass"), ("PASS", "Pass"), ("fail", "Fail"), ("Skip", "Skip"), ("SKIP", "Skip"),
    ("Warn", "Warn"), ("warning", "Warn"), ("Skip - All", "Skip"), ("", "Skip"),
])
def test_diag_status_normalised(status, expected):
    text = json.dumps({"DCGM GPU Diagnostic": {"test_categories": [
        {"category": "Hardware", "tests": [{"name": "GPU Memory", "results": [{"gpu_id": "0", "status": status}]}]}]}})
    assert dcgm.parse_diag_json(text, 2, 0).results[0].status == expected


@pytest.mark.parametrize("text, message", [
    ("", "empty"),
    ("Error: Unable to connect to host engine. Host engine connection invalid/disconnected.\n", "expected JSON"),
    ("Successfully ran diagnostic for group.\n+-----+\n", "expected JSON"),
    ('{"DCGM Diagnostic": {"version": "4.2.3", "runtime_error": "Error: Unable to complete diagnostic for '
     'group 2147483647. Return: (-39) : The GPU is in use."}}', "did not run"),
    ('{"DCGM GPU Diagnostic": {"version": "3.3.6", "runtime_error": "Error: MIG is enabled on GPU 0."}}',
     "did not run"),
    ('{"DCGM Diagnostic": {}}', "test_categories"),
    ('{"Some Other Tool": {}}', "top key"),
    ('[1, 2, 3]', "top key"),
    ('{"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": '
     '[{"name": "memory", "results": [{"status": "Exploded"}]}]}]}}', "status"),
    ('{"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": '
     '[{"name": "memory", "results": [{"entity_id": 0}]}]}]}}', "status"),
    ('{"DCGM Diagnostic": {"test_categories": [{"tests": [{"results": []}]}]}}', "name"),
    ('{"DCGM Diagnostic": {"test_categories": [{"tests": [{"name": "x", "results": {}}]}]}}', "results"),
    ('{"DCGM Diagnostic": {"test_categories": [3]}}', "tests"),
    ("[" * 100000 + "]" * 100000, "expected JSON"),
])
def test_diag_bad(text, message):
    with pytest.raises(ParseError, match=message):
        dcgm.parse_diag_json(text, 1, 226)


# --------------------------------------------------------------------------
# kernel log

@pytest.mark.parametrize("line, expected", [
    ("NVRM: Xid (PCI:0000:38:00): 79, pid=1, name=python3, GPU has fallen off the bus.",
     XidEvent(79, "0000:38:00", "pid=1, name=python3, GPU has fallen off the bus.")),
    ("[ 1234.567890] NVRM: Xid (PCI:0000:B3:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable "
     "double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.",
     XidEvent(48, "0000:b3:00", "pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) "
              "has been detected on GPU in the framebuffer at partition 6, subpartition 0.")),
    ("kernel: NVRM: Xid (0000:3b:00): 13, Graphics Exception: ESR 0x50df30=0x107000e",
     XidEvent(13, "0000:3b:00", "Graphics Exception: ESR 0x50df30=0x107000e")),
    ("NVRM: Xid (PCI:af:00): 31, pid=4242, name=train, Ch 0000000a, intr 10000000. MMU Fault",
     XidEvent(31, "0000:af:00", "pid=4242, name=train, Ch 0000000a, intr 10000000. MMU Fault")),
    ("NVRM: Xid (PCI:0001:1A:00.0): 119, pid=812, name=nvidia-smi, Timeout after 6s of waiting for RPC",
     XidEvent(119, "0001:1a:00", "pid=812, name=nvidia-smi, Timeout after 6s of waiting for RPC")),
    ("NVRM: Xid (PCI:00000000:18:00): 94, pid=9, name=x, Contained: SM (0x1). RST: No, D-RST: No",
     XidEvent(94, "0000:18:00", "pid=9, name=x, Contained: SM (0x1). RST: No, D-RST: No")),
    ("NVRM: Xid (PCI:0000:9a:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
     XidEvent(154, "0000:9a:00", "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)")),
    ("NVRM: Xid (PCI:0000:9a:00): 45", XidEvent(45, "0000:9a:00", "")),
    ("NVRM: GPU at PCI:0000:38:00: GPU-8e2c1a55-1f2d-4b7e-9c3a-0d4e5f6a7b8c", None),
    ("nvidia-nvswitch2: SXid (PCI:0000:86:00.0): 12028, Non-fatal, Link 46 egress non-posted PRIV error", None),
    ("NVRM: Xid (PCI:0000:38:00): nope", None),
    ("", None),
])
def test_xid_message(line, expected):
    prefix, message = kernlog.kernel_message(line)  # what dmesg or the journal printed before it
    assert kernlog.parse_xid_message(message) == expected
    assert kernlog.parse_xid_message(line) == (expected if not prefix else None)  # a kernel message: anchored


KMSG = (
    "6,1041,5012345678,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.161.08  Thu Feb 22 ...\n"
    "4,1042,5123456789,-,caller=T812;NVRM: Xid (PCI:0000:38:00): 79, pid=2213, name=python, GPU has fallen off the bus.\n"
    " SUBSYSTEM=pci\n"
    " DEVICE=+pci:0000:38:00.0\n"
    "garbage that is not a record\n"
    "4,1043,5123456900,c;NVRM: Xid (PCI:0000:38:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)\n"
    "4,x,1,-;NVRM: Xid (PCI:0000:38:00): 13, malformed sequence number\n"
)


def test_kmsg():
    events = kernlog.parse_kmsg(KMSG, boot_time=1700000000.0)
    assert [(e.xid, e.seq, e.pci_bus_id) for e in events] == [(79, 1042, "0000:38:00"), (154, 1043, "0000:38:00")]
    assert events[0].timestamp == pytest.approx(1700000000.0 + 5123.456789)
    assert events[1].text.startswith("GPU recovery action changed")
    assert [e.timestamp for e in kernlog.parse_kmsg(KMSG, None)] == [None, None]


@pytest.mark.parametrize("text", ["", "hello\nworld\n", "{\"not\": \"kmsg\"}", ";;;,,,\n" * 10])
def test_kmsg_not_kmsg(text):
    assert kernlog.parse_kmsg(text, 1.0) == ()


DMESG = """\
kern  :info  : 2025-03-02T10:15:01,000100+00:00 NVRM: GPU at PCI:0000:38:00: GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0
kern  :warn  : 2025-03-02T10:15:02,500000+00:00 NVRM: Xid (PCI:0000:38:00): 13, pid=1234, name=python3, Graphics SM Warp Exception on (GPC 1, TPC 2, SM 0): Out Of Range Address
kern  :err   : 2025-03-02T12:15:02,250000+02:00 NVRM: Xid (PCI:0000:3b:00): 43, pid=1234, name=python3, Ch 00000010
[ 8123.123456] NVRM: Xid (PCI:0000:bd:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
Mar 02 10:15:03 gpu-node-17 kernel: NVRM: Xid (PCI:0000:be:00): 74, pid=77, name=nccl, NVLink: fatal error detected on link 3
2025-03-02T10:15:04+0000 gpu-node-17 kernel: NVRM: Xid (PCI:0000:bf:00): 64, pid=0, name=x, ECC row remapper failure
2025-13-40T10:15:04+0000 gpu-node-17 kernel: NVRM: Xid (PCI:0000:c0:00): 95, pid=0, name=x, Uncontained: FBHUB
"""


def test_dmesg():
    events = kernlog.parse_dmesg(DMESG)
    base = 1740910502.5  # 2025-03-02T10:15:02.5Z
    assert [(e.xid, e.pci_bus_id) for e in events] == [
        (13, "0000:38:00"), (43, "0000:3b:00"), (79, "0000:bd:00"), (74, "0000:be:00"), (64, "0000:bf:00"),
        (95, "0000:c0:00")]
    assert events[0].timestamp == pytest.approx(base)
    assert events[1].timestamp == pytest.approx(base - 0.25)  # +02:00 offset honoured
    assert [e.timestamp for e in events[2:4]] == [None, None]  # no ISO time: unknown
    assert events[4].timestamp == pytest.approx(base + 1.5)
    assert events[5].timestamp is None  # impossible date
    assert all(e.seq is None for e in events)


# --------------------------------------------------------------------------
# system: /proc/driver/nvidia/version, modinfo, dkms, lspci, dpkg, rpm, systemctl

@pytest.mark.parametrize("text, expected", [
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08  Thu Feb 22 01:32:18 UTC 2024\n"
     "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n", "535.161.08"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  "
     "(dvs-builder@U16-I3-B03-4-3)  Tue Jul 15 19:10:52 UTC 2025\nGCC version:  gcc version 13.3.0\n", "580.65.06"),
    ("NVRM version: NVIDIA UNIX aarch64 Kernel Module  550.54.15  Tue Mar  5 22:15:33 UTC 2024\n", "550.54.15"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  570.133.20  Release Build  "
     "(dvs-builder@U16-J09-12-1)  Wed Mar 12 2025\n", "570.133.20"),
])
def test_proc_driver_version(text, expected):
    assert system.parse_proc_driver_version(text) == expected


@pytest.mark.parametrize("text", ["", "cat: /proc/driver/nvidia/version: No such file or directory\n",
                                  "NVRM version: NVIDIA UNIX x86_64 Kernel Module\n"])
def test_proc_driver_version_bad(text):
    with pytest.raises(ParseError, match="/proc/driver/nvidia/version"):
        system.parse_proc_driver_version(text)


@pytest.mark.parametrize("text, expected", [("535.161.08\n", "535.161.08"), ("\n580.65.06  \n", "580.65.06")])
def test_modinfo(text, expected):
    assert system.parse_modinfo_version(text) == expected


@pytest.mark.parametrize("text", ["", "\n", "modinfo: ERROR: Module nvidia not found.\n", "535\n"])
def test_modinfo_bad(text):
    with pytest.raises(ParseError, match="modinfo"):
        system.parse_modinfo_version(text)


@pytest.mark.parametrize("text, expected", [
    ("", ()),
    ("nvidia, 535.161.08, 6.1.0-27-amd64, x86_64: installed\n",
     (DkmsEntry("nvidia", "535.161.08", "6.1.0-27-amd64", "x86_64", "installed"),)),
    ("nvidia/535.161.08, 6.1.0-27-amd64, x86_64: installed\n"
     "nvidia/535.161.08, 6.1.0-28-amd64, x86_64: built\n",
     (DkmsEntry("nvidia", "535.161.08", "6.1.0-27-amd64", "x86_64", "installed"),
      DkmsEntry("nvidia", "535.161.08", "6.1.0-28-amd64", "x86_64", "built"))),
    ("nvidia/535.161.08, 6.1.0-27-amd64, x86_64: installed (WARNING! Diff between built and installed module!)\n"
     "nvidia-fs/2.18.3, 5.15.0-105-generic, x86_64: installed (original_module exists)\n",
     (DkmsEntry("nvidia", "535.161.08", "6.1.0-27-amd64", "x86_64", "installed"),
      DkmsEntry("nvidia-fs", "2.18.3", "5.15.0-105-generic", "x86_64", "installed"))),
    ("nvidia/580.65.06: added\n", (DkmsEntry("nvidia", "580.65.06", "", "", "added"),)),
    ("nvidia, 470.256.02: added\n", (DkmsEntry("nvidia", "470.256.02", "", "", "added"),)),
    ("Warning: The pre_build script is not executable.\nnvidia/550.54.15, 6.8.0-45-generic, aarch64: installed\n",
     (DkmsEntry("nvidia", "550.54.15", "6.8.0-45-generic", "aarch64", "installed"),)),
])
def test_dkms(text, expected):
    assert system.parse_dkms_status(text) == expected


@pytest.mark.parametrize("text", ["bash: dkms: command not found\n", "Error! Could not locate dkms.conf file.\n"])
def test_dkms_bad(text):
    with pytest.raises(ParseError, match="dkms status"):
        system.parse_dkms_status(text)


LSPCI_HGX = "\n".join(
    ["%s:00.0 0302: 10de:2330 (rev a1)" % bus for bus in ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")]
    + ["0000:%s:00.0 0680: 10de:22a3 (rev a1)" % bus for bus in ("05", "06", "07", "08")]) + "\n"


@pytest.mark.parametrize("text, expected", [
    ("", (0, 0)),
    (LSPCI_HGX, (8, 4)),
    ("01:00.0 0300: 10de:2204 (rev a1)\n01:00.1 0403: 10de:1aef (rev a1)\n", (1, 0)),
    ("0000:c1:00.0 0302: 10de:20b5 (rev a1)\n0000:c2:00.0 0302: 10de:20b5\n", (2, 0)),
    ("00:1f.0 0601: 8086:a1c1 (rev 09)\n", (0, 0)),  # not NVIDIA
])
def test_lspci(text, expected):
    assert system.parse_lspci_nvidia(text) == expected


def test_lspci_bad():
    with pytest.raises(ParseError, match="lspci"):
        system.parse_lspci_nvidia("lspci: command not found\n")


DPKG = (
    "nvidia-driver-535-server\t535.161.08-0ubuntu0.22.04.1\thi \thold ok installed\n"
    "nvidia-container-toolkit\t1.17.8-1\tii \tinstall ok installed\n"
    "datacenter-gpu-manager-4-core\t1:4.2.3-1\tii \tinstall ok installed\n"
    "nvidia-fabricmanager-535\t535.161.08-1\tii \tinstall ok installed\n"
    "nvidia-driver-530\t530.30.02-0ubuntu1\trc \tdeinstall ok config-files\n"
    "libnvidia-compute-535\t\tun \tunknown ok not-installed\n"
    "cuda-keyring\t1.1\tii \tinstall ok installed\n"
)


def test_dpkg():
    packages = system.parse_dpkg_query(DPKG)
    assert sorted(packages) == ["cuda-keyring", "datacenter-gpu-manager-4-core", "nvidia-container-toolkit",
                                "nvidia-driver-535-server", "nvidia-fabricmanager-535"]
    assert packages["nvidia-driver-535-server"] == Package(
        "nvidia-driver-535-server", "535.161.08", True, "535.161.08-0ubuntu0.22.04.1")
    assert packages["nvidia-container-toolkit"] == Package("nvidia-container-toolkit", "1.17.8", False, "1.17.8-1")
    assert packages["datacenter-gpu-manager-4-core"].version == "4.2.3"
    assert packages["cuda-keyring"].version == "1.1"
    assert system.parse_dpkg_query("") == {}


@pytest.mark.parametrize("text", ["dpkg-query: no packages found matching nvidia-driver-999\n",
                                  "nvidia-driver-535\t535.161.08-1\n"])
def test_dpkg_bad(text):
    with pytest.raises(ParseError, match="dpkg-query"):
        system.parse_dpkg_query(text)


RPM = (
    "nvidia-driver\t550.54.15\t1.el9\n"
    "nvidia-fabric-manager\t550.54.15\t1\n"
    "package nvidia-container-toolkit is not installed\n"
    "datacenter-gpu-manager\t3.3.6\t1\n"
)


def test_rpm():
    packages = system.parse_rpm_query(RPM)
    assert packages == {
        "nvidia-driver": Package("nvidia-driver", "550.54.15", False, "550.54.15-1.el9"),
        "nvidia-fabric-manager": Package("nvidia-fabric-manager", "550.54.15", False, "550.54.15-1"),
        "datacenter-gpu-manager": Package("datacenter-gpu-manager", "3.3.6", False, "3.3.6-1"),
    }
    assert system.parse_rpm_query("package nvidia-driver is not installed\n") == {}


def test_rpm_bad():
    with pytest.raises(ParseError, match="rpm"):
        system.parse_rpm_query("error: rpmdb open failed\n")


@pytest.mark.parametrize("text", ["active\n", "inactive\n", "failed\n", "activating\n", "deactivating\n",
                                  "reloading\n", "unknown\n", "maintenance\n", "  active  \nignored\n"])
def test_systemctl(text):
    assert system.parse_systemctl_is_active(text) == text.split("\n")[0].strip()


@pytest.mark.parametrize("text", ["", "\n", "enabled\n", "Failed to connect to bus: No such file or directory\n"])
def test_systemctl_bad(text):
    with pytest.raises(ParseError, match="systemctl"):
        system.parse_systemctl_is_active(text)


# --------------------------------------------------------------------------
# The real captures (tests/fixtures, each with its .src.txt).

def _sample(name):
    path = os.path.join(SAMPLES, name)
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def test_samples_dcgm():
    assert dcgm.parse_dcgmi_version(_sample("dcgmi-version-dcgm4.7.0-DCGM-issue314.txt")) == "4.7.0"
    assert dcgm.parse_dcgmi_version(_sample("dcgmi-v-dcgm3.3.5-dcgm-exporter-issue319.txt")) == "3.3.5"
    health = dcgm.parse_health_json(_sample("dcgmi-health-c-j-healthy-virtualclient.json"))
    assert health == DcgmHealth("Healthy", (), True)
    r1 = dcgm.parse_diag_json(_sample("dcgmi-diag-r1-json-dcgm3-virtualclient.json"), 1, 0)
    assert len(r1.results) == 9 and r1.failures == ()
    r2 = dcgm.parse_diag_json(_sample("dcgmi-diag-r2-json-dcgm3-virtualclient.json"), 2, 0)
    assert [(r.test, r.gpu) for r in r2.results[-2:]] == [("PCIe", 0), ("GPU Memory", 0)]


def test_samples_dmesg():
    events = kernlog.parse_dmesg(_sample("dmesg-xid13-xid43-gpud.log"))
    assert [e.xid for e in events] == [13] * 16 + [43]
    assert {e.pci_bus_id for e in events} == {"0000:38:00"}
    assert events[-1].text == "pid=2924364, name=pt_main_thread, Ch 00000008"
    assert all(e.timestamp is not None for e in events)


# --------------------------------------------------------------------------
# Properties: any text gives a value or a ParseError, never another exception.

TEXT_PARSERS = [
    dcgm.parse_dcgmi_version, dcgm.parse_health_json,
    lambda t: dcgm.parse_diag_json(t, 3, 226),
    kernlog.parse_xid_message, lambda t: kernlog.parse_kmsg(t, 1.7e9), lambda t: kernlog.parse_kmsg(t, None),
    kernlog.parse_dmesg,
    system.parse_proc_driver_version, system.parse_modinfo_version, system.parse_dkms_status,
    system.parse_lspci_nvidia, system.parse_dpkg_query, system.parse_rpm_query, system.parse_systemctl_is_active,
]
JSON_PARSERS = [dcgm.parse_health_json, lambda t: dcgm.parse_diag_json(t, 2, 0)]

any_text = st.one_of(st.text(), st.binary().map(lambda b: b.decode("utf-8", errors="replace")))
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=30,
)
# JSON shaped like the real reports but with arbitrary values at every level,
# so the property reaches the deep code, not just the top-level type check.
_keys = st.sampled_from(["status", "warnings", "warning", "gpu_id", "gpu_ids", "entity_id", "entity_group",
                         "entity_group_id", "error_id", "error_severity", "info", "name", "results",
                         "test_summary", "tests", "category", "value", "children", "overflow", "Errors"])
shaped_values = st.recursive(
    json_values,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_keys, children, max_size=5),
    max_leaves=40,
)
shaped_docs = st.one_of(
    st.builds(lambda v: {"DCGM Diagnostic": {"test_categories": v}}, shaped_values),
    st.builds(lambda v: {"DCGM GPU Diagnostic": {"test_categories": [{"tests": v}]}}, shaped_values),
    st.builds(lambda v: {"DCGM Diagnostic": {"test_categories": [{"tests": [{"name": "memory", "results": v}]}]}},
              shaped_values),
    st.builds(lambda v: {"body": {"Overall Health": {"value": "Warning"}, "GPU": v}}, shaped_values),
    st.builds(lambda v: {"body": {"Overall Health": {"value": "Failure"},
                                  "GPU": {"children": {"0": {"children": {"Errors": v}}}}}}, shaped_values),
    st.builds(lambda v: {"body": {"Overall Health": v}}, shaped_values),
)


def _value_or_parse_error(parser, text):
    try:
        parser(text)
    except ParseError as err:
        assert str(err)  # a message an admin can read


@pytest.mark.parametrize("parser", TEXT_PARSERS)
@PROPS
@given(text=any_text)
def test_any_text_value_or_parse_error(parser, text):
    _value_or_parse_error(parser, text)


@pytest.mark.parametrize("parser", JSON_PARSERS)
@PROPS
@given(value=json_values)
def test_any_json_value_or_parse_error(parser, value):
    _value_or_parse_error(parser, json.dumps(value))


@pytest.mark.parametrize("parser", JSON_PARSERS)
@PROPS
@given(doc=shaped_docs)
def test_shaped_json_value_or_parse_error(parser, doc):
    _value_or_parse_error(parser, json.dumps(doc))


@pytest.mark.parametrize("text", [
    "9" * 5000, "[" * 50000, '{"a":' * 50000, "1e999999", "-" + "9" * 100000,
    '{"DCGM Diagnostic": {"test_categories": [{"tests": [{"name": "m", "results": [{"status": "Fail", '
    '"gpu_id": "%s", "warnings": [{"error_id": %s}]}]}]}]}}' % ("9" * 5000, "9" * 4000),
    "NVRM: Xid (PCI:0000:38:00): %s, huge" % ("9" * 5000),
    "%s,%s,%s,-;NVRM: Xid (PCI:0000:38:00): 79, huge" % ("9" * 30, "9" * 5000, "9" * 5000),
])
def test_extreme_inputs(text):
    for parser in TEXT_PARSERS:
        _value_or_parse_error(parser, text)


# Round trips: what we generate in the tools' own format comes back out.

hexbyte = st.integers(0, 255).map(lambda n: "%02x" % n)
noise = st.text(alphabet=st.characters(blacklist_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"),
                max_size=40).filter(lambda s: "NVRM: Xid" not in s)


@PROPS
@given(records=st.lists(st.tuples(st.integers(0, 2**40), st.integers(0, 2**50), st.integers(0, 999),
                                  st.integers(0, 0xffff), hexbyte, hexbyte, st.booleans(), noise), max_size=8),
       boot_time=st.one_of(st.none(), st.floats(0, 2e9)))
def test_kmsg_round_trip(records, boot_time):
    lines = []
    for seq, usec, xid, domain, bus, dev, upper, junk in records:
        bus_text = ("%04x:%s:%s" % (domain, bus, dev))
        lines.append("4,%d,%d,-;NVRM: Xid (PCI:%s): %d, pid=1, name=x, %s"
                     % (seq, usec, bus_text.upper() if upper else bus_text, xid, junk))
        lines.append(" SUBSYSTEM=pci")
        lines.append("6,%d,%d,-;%s" % (seq + 1, usec, junk))
    events = kernlog.parse_kmsg("\n".join(lines), boot_time)
    assert [(e.xid, e.seq, e.pci_bus_id) for e in events] == [
        (xid, seq, "%04x:%s:%s" % (domain, bus, dev)) for seq, _, xid, domain, bus, dev, _, _ in records]
    for event, (_, usec, *_rest) in zip(events, records):
        assert event.timestamp == (None if boot_time is None else boot_time + usec / 1e6)


@PROPS
@given(xid=st.integers(0, 999), bus=hexbyte, dev=hexbyte, legacy=st.booleans(), prefix=noise, text=noise)
def test_xid_line_round_trip(xid, bus, dev, legacy, prefix, text):
    bus_text = ("0000:%s:%s" if legacy else "PCI:0000:%s:%s") % (bus, dev)
    line = "NVRM: Xid (%s): %d, %s" % (bus_text, xid, text)
    assert kernlog.parse_xid_message(line) == XidEvent(xid, "0000:%s:%s" % (bus, dev), text.strip())
    # Anchored: the same text inside another message (issue 24) is not an Xid.
    assert kernlog.parse_xid_message("x" + prefix + line) is None


version_part = st.integers(0, 999).map(str)
versions = st.lists(version_part, min_size=2, max_size=4).map(".".join)
names = st.from_regex(r"[a-z0-9][a-z0-9.+-]{0,30}", fullmatch=True)


@PROPS
@given(packages=st.dictionaries(names, st.tuples(versions, st.booleans(), st.booleans(), st.booleans()), max_size=6))
def test_dpkg_round_trip(packages):
    lines = []
    for name, (version, epoch, revision, held) in packages.items():
        raw = ("1:" if epoch else "") + version + ("-0ubuntu1" if revision else "")
        lines.append("%s\t%s\t%s\t%s ok installed" % (name, raw, "hi " if held else "ii ",
                                                        "hold" if held else "install"))
    parsed = system.parse_dpkg_query("\n".join(lines) + "\n")
    assert {n: (p.version, p.held) for n, p in parsed.items()} == {
        n: (v, held) for n, (v, _, _, held) in packages.items()}


@PROPS
@given(gpus=st.integers(0, 16), switches=st.integers(0, 8), audio=st.integers(0, 4), domain=st.booleans())
def test_lspci_round_trip(gpus, switches, audio, domain):
    rows = [("0302", "2330")] * gpus + [("0680", "22a3")] * switches + [("0403", "1aef")] * audio
    prefix = "0000:" if domain else ""
    text = "".join("%s%02x:00.0 %s: 10de:%s (rev a1)\n" % (prefix, i, cls, dev) for i, (cls, dev) in enumerate(rows))
    assert system.parse_lspci_nvidia(text) == (gpus, switches)
