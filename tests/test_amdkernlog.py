"""amdgpu kernel-log events (issue 29, docs/explanation/amd-design.md section 4): the real
captures in tests/fixtures/amd/ (each with its source), the driver's other
forms constructed from its format strings (each cited), /dev/kmsg records of
the kernel's facility and of user space, the injection cases, and the judge
(gpugate.vendors.amd.judge_events) with its exact findings."""

import glob
import os
import subprocess
import sys
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpugate.model import runbook
from gpugate.model.baseline import load_baseline
from gpugate.model.facts import NodeFacts, XidEvent
from gpugate.model.findings import BROKEN, HEALTH, REBOOT, RESET_GPU, RMA_ACTION, Finding
from gpugate.vendors.amd import judge_events
from gpugate.judges import xids
from gpugate.vendors.amd import parse_kernlog
from gpugate.parsers import kernlog
from gpugate.probes.kernlog import bus_key, fresh_xids
from gpugate.model.reason import render
from gpugate.core.record import replace

from conftest import DEMO_BASELINE, ROOT

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "amd")
POLICY = load_baseline(DEMO_BASELINE).health
PROPS = settings(max_examples=150, deadline=None)
MI300X = ["0000:1b:00.0", "0000:3d:00.0", "0000:4e:00.0", "0000:5f:00.0",
          "0000:9d:00.0", "0000:bd:00.0", "0000:cd:00.0", "0000:dd:00.0"]  # the rocm4021/4454 nodes' BDFs
MI300X_GPUS = {bus_key(bdf): i for i, bdf in enumerate(MI300X)}


def fixture(name):
    with open(os.path.join(FIXTURES, name)) as handle:
        return handle.read()


def events(text):
    return [(e.where, e.xid, e.pci_bus_id) for e in kernlog.parse_dmesg(text)]


# ------------------------------------------------------------------ captures
CAPTURES = {
    "dmesg-athub-aca-xgmiwafl-mode1reset-MI300X-rocm6.2.3-rocm4021.txt":
        # Each ACA bank: its header, recorded, then its STATUS by the bits (UC+PCC on 1b:00; 9d:00's corrected)
        [("ue_event:athub", 1, "0000:dd:00"), ("aca", 1, "0000:1b:00"), ("ue:aca", 1, "0000:1b:00")]
        + [("aca", 1, "0000:9d:00"), ("ce:aca", 1, "0000:9d:00")] * 12
        + [("ce:xgmi_wafl", 1533, "0000:9d:00"),  # the "in total" line after it: not again
           ("gpu_reset", 1, "0000:dd:00"), ("reset_ok", 1, "0000:dd:00"), ("vram_lost", 1, "")],
    "dmesg-initfail-ipdiscovery-fwload-8xMI300X-rocm6.3.3-rocm4454.txt":
        # "Fatal error during GPU init", then the driver core's "probe of ... failed with error -22"
        [("init_failed", 1, bus_key(bdf)) for bdf in MI300X for _ in (1, 2)],
    # The process's VM fault (issue 33, item 1): one event; "for process python3.12 ..." on the next line, and
    # the VM_L2_PROTECTION_FAULT_STATUS lines, are not events.
    "dmesg-pagefault-mmhub-MI300X-rocm6.2.3-rocm4021c.FRAGMENT.txt": [("vm_fault:mmhub0", 1, "0000:3d:00")],
    "dmesg-ringtimeout-gpureset-RX5700XT-kernel7.0-cosmic3764.FRAGMENT.txt":
        [("ring_timeout:gfx_0.0.0", 1, "0000:28:00"), ("ring_reset_failed:gfx_0.0.0", 1, "0000:28:00"),
         ("gpu_reset", 1, "0000:28:00"), ("reset_ok", 1, "0000:28:00"), ("vram_lost", 1, "0000:28:00")],
    "dmesg-ringtimeout-ringresetfailed-gpureset-unknownGPU-rocm6273.FRAGMENT.txt":
        [("ring_timeout:gfx_0.0.0", 1, "0000:c5:00"), ("ring_reset_failed:gfx_0.0.0", 1, "0000:c5:00"),
         ("gpu_reset", 1, "0000:c5:00"), ("reset_ok", 1, "0000:c5:00")],
    "dmesg-ringtimeout-ringresetfailed-source-RX9060XT-unknown-amdgpu202.FRAGMENT.txt":
        [("ring_timeout:gfx_0.0.0", 1, "0000:45:00"), ("ring_reset_failed:gfx_0.0.0", 1, "0000:45:00"),
         ("gpu_reset", 1, "0000:45:00")],
    "dmesg-ringtimeout-ringresetok-RDNA4-unknown-rocm6127.FRAGMENT.txt":
        # "Ring comp_1.1.0 reset succeeded": the driver's success; its page fault in VM 0 is the driver's own
        [("ring_timeout:comp_1.1.0", 1, "0000:03:00")],
    "dmesg-softrecovered-pagefault-gfx1201-unknown-therock2591.FRAGMENT.txt":  # "but soft recovered": none
        [("vm_fault:gfxhub", 1, "0000:83:00")] * 2,
    "dmesg-ueevent-athub-gpureset-MI50-unknown-rocm1886.FRAGMENT.txt":
        [("ue_event:athub", 1, "0000:e3:00"), ("gpu_reset", 1, "0000:e3:00")],
    "dmesg-journal-ringtimeout-vce-gpureset-oldformat-domain000d-unknownGPU-appstream97.FRAGMENT.txt":
        [("reset_ok", 1, "000d:31:00"), ("ring_timeout:vce0", 1, ""),  # DRM_ERROR era: no device
         ("gpu_reset", 1, "000d:31:00"), ("reset_ok", 1, "000d:31:00"), ("vram_lost", 1, "")],
    "dmesg-journal-recoveryfailed-drmerror-unknownGPU-qubes7648.FRAGMENT.txt":
        [("ring_timeout:gfx", 1, ""), ("reset_failed", 1, ""), ("ring_timeout:gfx", 1, "")],
    # Two ACA banks with UC+PCC and no ue: line after them (issue 34): uncorrected by their bits.
    "dmesg-athub-aca-ucpcc-MI300X-rocm6.2.3-rocm4021b.FRAGMENT.txt":
        [("ue_event:athub", 1, "0000:dd:00")] + [("aca", 1, "0000:4e:00"), ("ue:aca", 1, "0000:4e:00")] * 2,
    # amdgpu built into the kernel: "[drm:amdgpu_job_timedout]" without " [amdgpu]" (issue 34).
    "dmesg-journal-builtin-ringtimeout-RX6400-kernel6.1.2-kbz216899.FRAGMENT.txt":
        [("ring_timeout:gfx_0.0.0", 1, ""), ("gpu_reset", 1, "0000:75:00")],
}


def test_every_capture_in_the_fixtures_is_tested_and_has_its_source():
    captures = sorted(os.path.basename(p) for p in glob.glob(os.path.join(FIXTURES, "dmesg-*.txt"))
                      if not p.endswith(".src.txt"))
    assert captures == sorted(CAPTURES)
    for name in captures:
        source = fixture(name + ".src.txt")
        assert source.startswith("URL: https://") and "Retrieved via:" in source, name


@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_each_capture_is_read_with_exactly_its_events(name):
    assert events(fixture(name)) == CAPTURES[name]
    assert all(e.kind == "amdgpu" and e.text for e in kernlog.parse_dmesg(fixture(name)))


def kmsg(text, pri=6, first_seq=100):
    """A capture's dmesg/journal lines as /dev/kmsg records of priority ``pri``
    (6: facility 0, the kernel's; 14: facility 1, LOG_USER), their prefix off."""
    records = []
    for n, line in enumerate(text.splitlines()):
        parts = kernlog.kernel_message(line)
        if parts is not None and parts[1]:
            records.append("%d,%d,%d,-;%s" % (pri, first_seq + n, 1000000 * (n + 1), parts[1]))
    return "\n".join(records) + "\n"


@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_each_capture_as_kmsg_records_of_the_kernel_and_of_user_space(name):
    found = kernlog.parse_kmsg(kmsg(fixture(name)), boot_time=1.7e9)
    assert [(e.where, e.xid, e.pci_bus_id) for e in found] == CAPTURES[name]
    assert all(e.seq is not None and e.timestamp > 1.7e9 for e in found)
    assert kernlog.parse_kmsg(kmsg(fixture(name), pri=14), boot_time=1.7e9) == ()  # LOG_USER
    assert kernlog.parse_kmsg(kmsg(fixture(name), pri=30), boot_time=1.7e9) == ()  # LOG_DAEMON


# ----------------------------------------------- forms constructed, each cited
# No capture of these was found (searched: ROCm/ROCm, ROCm/amdgpu, TheRock,
# vllm, pytorch issues; web pages).  Each line is CONSTRUCTED from the
# driver's format string, cited ("id N": the code index's find_string id).
CONSTRUCTED = [
    # amdgpu_ras.c before socket/die: "%ld uncorrectable hardware errors detected in %s block\n" (id 9560030010,
    # the MI200-era form) and its "%ld correctable ..." twin.
    ("amdgpu 0000:29:00.0: amdgpu: 2 uncorrectable hardware errors detected in umc block", "ue:umc", 2),
    ("amdgpu 0000:29:00.0: amdgpu: 13 correctable hardware errors detected in umc block", "ce:umc", 13),
    # The interim form without a comma after the die: "socket: %d, die: %d %lld uncorrectable ..." (id 9560030010).
    ("amdgpu 0000:29:00.0: amdgpu: socket: 0, die: 1 4 uncorrectable hardware errors detected in umc block",
     "ue:umc", 4),
    # RAS_EVENT_LOG: "{%llu}" + "socket: %d, die: %d, %lld new uncorrectable ... in %s block\n" (id 6409838451).
    ("amdgpu 0000:1b:00.0: {7}socket: 0, die: 0, 1 new uncorrectable hardware errors detected in umc block",
     "ue:umc", 1),
    # ... and its CE twin with ", no user action is needed" (id 9560030010).
    ("amdgpu 0000:1b:00.0: amdgpu: socket: 0, die: 0, 3 new correctable hardware errors detected in gfx block, "
     "no user action is needed", "ce:gfx", 3),
    # The RAS core's "{%llu} socket: %d, die: %d, %u new %s detected in %s block\n" with "deferred hardware
    # errors" (UMC) or "poison consumption" (other blocks) (drivers/gpu/drm/amd/ras/rascore, id 2006048729).
    ("amdgpu 0000:1b:00.0: {8} socket: 0, die: 2, 3 new deferred hardware errors detected in umc block", "de:umc", 3),
    ("amdgpu 0000:1b:00.0: {9} socket: 1, die: 0, 1 new poison consumption detected in gfx block", "poison:gfx", 1),
    ("amdgpu 0000:1b:00.0: {10} socket: 1, die: 0, 6 new uncorrectable hardware errors detected in xgmi_wafl block",
     "ue:xgmi_wafl", 6),
    # kfd_int_process_v9.c: dev_warn "poison is consumed by client %d, kick off gpu reset flow\n" (id 6418513030),
    # later through RAS_EVENT_LOG with "{%llu}" (id 13398897969).
    ("amdgpu 0000:1b:00.0: amdgpu: poison is consumed by client 5, kick off gpu reset flow", "poison", 1),
    ("amdgpu 0000:1b:00.0: {2}poison is consumed by client 12, kick off gpu reset flow", "poison", 1),
    # amdgpu_ras_eeprom.c: dev_warn "Saved bad pages %d reaches threshold value %d\n" (id 204902549; the printk
    # index shows it with the "amdgpu: " dev_fmt, id 43554722138) and the older
    # "Saved bad pages(%d) reaches threshold value(%d).\n" (id 34095805653).
    ("amdgpu 0000:1b:00.0: amdgpu: Saved bad pages 130 reaches threshold value 128", "bad_page_threshold", 130),
    ("amdgpu 0000:1b:00.0: amdgpu: Saved bad pages(12) reaches threshold value(12).", "bad_page_threshold", 12),
    # amdgpu_device.c: "GPU reset(%d) failed\n" (ids 42018402852, 1326219188), "GPU reset(%d) failed with error
    # %d \n" (id 29851826332), "GPU reset end with ret = %d\n" (id 7212147980); amdgpu_job.c's dev_err
    # "GPU Recovery Failed: %d\n" (the DRM_ERROR form of it is captured: qubes7648).
    ("amdgpu 0000:1b:00.0: amdgpu: GPU reset(2) failed", "reset_failed", 1),
    ("amdgpu 0000:1b:00.0: amdgpu: GPU reset(2) failed with error -110 ", "reset_failed", 1),
    ("amdgpu 0000:1b:00.0: amdgpu: GPU reset end with ret = -110", "reset_failed", 1),
    ("amdgpu 0000:1b:00.0: GPU Recovery Failed: -110", "reset_failed", 1),
    ("amdgpu 0000:1b:00.0: amdgpu: GPU reset(4) succeeded!", "reset_ok", 1),
    # amdgpu_job.c before the rename to "reset failed": "Ring %s reset failure\n" (id 7232959363).
    ("amdgpu 0000:1b:00.0: amdgpu: Ring sdma0 reset failure", "ring_reset_failed:sdma0", 1),
    # The RAS core's "{%llu}" RAS_HW_ERR "Accelerator Check Architecture events logged\n" (id 2006048729)
    # and the first ACA code's "[Hardware error] " (docs/explanation/amd-design.md section 4).
    ("amdgpu 0000:1b:00.0: {5}[Hardware Error]: Accelerator Check Architecture events logged", "aca", 1),
    ("amdgpu 0000:1b:00.0: amdgpu: [Hardware error] Accelerator Check Architecture events logged", "aca", 1),
    # drivers/base/dd.c, newer driver cores: dev_err "probe with driver %s failed with error %d\n" on the device (id
    # 15139129499; the older pr_warn "%s: probe of %s failed with error %d\n" is captured: rocm4454).
    ("amdgpu 0000:1b:00.0: probe with driver amdgpu failed with error -22", "init_failed", 1),
    # amdgpu_device.c's dev_info "VRAM is lost due to GPU reset!\n" with the 6.x prefix (7.0's is captured).
    ("amdgpu 0000:1b:00.0: amdgpu: VRAM is lost due to GPU reset!", "vram_lost", 1),
    # gmc_v9_0.c before 6.x: dev_err "[%s] %s page fault (src_id:%u ring:%u vmid:%u pasid:%u, for process %s pid
    # %d thread %s pid %d)\n" with "retry"/"no-retry" (6.x's form and gmc_v10+'s without it are captured).
    ("amdgpu 0000:1b:00.0: amdgpu: [gfxhub0] no-retry page fault (src_id:0 ring:24 vmid:3 pasid:32770, for "
     "process python3 pid 1234 thread python3 pid 1234)", "vm_fault:gfxhub0", 1),
    ("amdgpu 0000:1b:00.0: amdgpu: [mmhub1] retry page fault (src_id:0 ring:0 vmid:8 pasid:32769, for process "
     "pt_main_thread pid 77 thread pt_main_thread pid 78)", "vm_fault:mmhub1", 1),
]


@pytest.mark.parametrize("line,where,count", CONSTRUCTED)
def test_each_constructed_form_from_the_drivers_format_strings(line, where, count):
    (event,) = kernlog.parse_kmsg("4,7,1,-;%s\n" % line, None)
    assert (event.kind, event.where, event.xid, event.pci_bus_id) == ("amdgpu", where, count, bus_key(line[7:19]))


def test_the_in_total_lines_are_not_counted_again():
    """The driver follows each "N new ..." line with the running total "M ...
    detected in total in BLOCK block" (id 2006048729): counting both would
    double every error."""
    lines = ["amdgpu 0000:1b:00.0: {3} socket: 0, die: 1, 2 new uncorrectable hardware errors detected in umc block",
             "amdgpu 0000:1b:00.0: {3} socket: 0, die: 1, 5 uncorrectable hardware errors detected in total in umc "
             "block",
             "amdgpu 0000:1b:00.0: {4} socket: 0, die: 1, 7 correctable hardware errors detected in total in gfx block",
             "amdgpu 0000:1b:00.0: {4} socket: 0, die: 1, 1 deferred hardware errors detected in total in umc block",
             "amdgpu 0000:1b:00.0: {4} socket: 0, die: 1, 1 poison consumption detected in total in gfx block"]
    found = kernlog.parse_kmsg("".join("6,%d,1,-;%s\n" % (n, line) for n, line in enumerate(lines)), None)
    assert [(e.where, e.xid) for e in found] == [("ue:umc", 2)]


@pytest.mark.parametrize("message", [
    # LINUX amdgpu_job.c: dev_err "ring %s timeout, but soft recovered\n" (the DRM_ERROR form is captured above)
    "amdgpu 0000:03:00.0: amdgpu: ring gfx_0.0.0 timeout, but soft recovered",
    "amdgpu 0000:03:00.0: ring comp_1.0.0 timeout, but soft recovered",
    "[drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring sdma0 timeout, but soft recovered",
    "amdgpu 0000:03:00.0: amdgpu: Ring gfx_0.0.0 reset succeeded",
    "amdgpu 0000:03:00.0: amdgpu: Starting gfx_0.0.0 ring reset",
    "amdgpu 0000:03:00.0: amdgpu: MODE1 reset",
    "amdgpu 0000:03:00.0: amdgpu: RAS: optional ras ta ucode is not available",
    "amdgpu 0000:03:00.0: [drm:amdgpu_ring_test_helper [amdgpu]] *ERROR* ring kiq_2.1.0 test failed (-110)",
    "amdgpu: Failed to restore process queues",
    "[drm] PCIE GART of 512M enabled.",
    "[drm:amdgpu_dm_commit_planes [amdgpu]] *ERROR* Waiting for fences timed out!",
    "[drm:amdgpu_device_ip_suspend_phase2 [amdgpu]] *ERROR* GPU reset begin!",  # a reset names its device
])
def test_the_drivers_other_records_are_not_events(message):
    assert kernlog.parse_amdgpu_message(message) is None


# ------------------------------------------------------------- injections
USER = "GPU reset(1) failed"  # a job's name, or any text a user chooses


@pytest.mark.parametrize("record", [
    # amdgpu prints a job's comm inside its own records (LINUX amdgpu_job.c, captures above).
    "3,10,1,-;[drm:amdgpu_job_timedout [amdgpu]] *ERROR* Process information: process %s pid 7 thread %s pid 7"
    % (USER, USER),
    "3,11,1,-;amdgpu 0000:1b:00.0: amdgpu:  Process %s pid 7 thread %s:cs0 pid 8" % (USER, USER),
    "3,12,1,-;amdgpu 0000:1b:00.0:  Process %s pid 7 thread x pid 8" % USER,
    "3,13,1,-;amdgpu 0000:1b:00.0: amdgpu: Process information: process %s pid 7 thread x pid 8" % USER,
    "3,15,1,-;amdgpu 0000:1b:00.0: amdgpu:  for process %s pid 6071 thread python3.12 pid 6071)" % USER,
    # Other subsystems log a user's text at kernel facility (issue 24's reproduction).
    "3,16,1,-;tmpfs: Unknown parameter 'amdgpu 0000:1b:00.0: %s!'" % USER,
    "4,17,1,-;process 'sh' launched '/tmp/amdgpu 0000:1b:00.0: amdgpu: %s' with NULL argv: empty string added"
    % USER,
    # User space's records reach /dev/kmsg at a user facility.
    "14,18,1,-;amdgpu 0000:1b:00.0: %s" % USER,
    "12,19,1,-;amdgpu 0000:1b:00.0: amdgpu: GPU reset begin!",
    "30,20,1,-;amdgpu 0000:1b:00.0: {1}uncorrectable hardware error(ERREVENT_ATHUB_INTERRUPT) detected!",
])
def test_user_text_never_starts_an_event(record):
    assert kernlog.parse_kmsg(record + "\n", None) == ()


def test_a_page_fault_naming_a_users_process_is_the_fault_and_nothing_else():
    """The driver's VM fault record names the process (a user's text): it is
    one vm_fault event of that GPU (issue 33, item 1), never what the text says."""
    record = ("3,14,1,-;amdgpu 0000:1b:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:3 pasid:32769, for "
              "process %s pid 7 thread %s pid 7)" % (USER, USER))
    assert [(e.where, e.pci_bus_id) for e in kernlog.parse_kmsg(record + "\n", None)] == [("vm_fault:gfxhub",
                                                                                          "0000:1b:00")]


def test_the_same_text_is_an_event_only_as_the_drivers_own_record():
    (event,) = kernlog.parse_kmsg("6,21,1,-;amdgpu 0000:1b:00.0: %s\n" % USER, None)
    assert (event.where, event.pci_bus_id, event.seq) == ("reset_failed", "0000:1b:00", 21)


@pytest.mark.parametrize("line", [
    "[ 8123.123456] tmpfs: Unknown parameter 'amdgpu 0000:1b:00.0: %s!'" % USER,
    "Mar 02 10:15:03 mi01 kernel: process 'sh' launched '/tmp/amdgpu 0000:1b:00.0: %s' with NULL argv" % USER,
    "Mar 02 10:15:03 mi01 myjob[4242]: amdgpu 0000:1b:00.0: %s" % USER,  # another identifier: user space's
    "user  :warn  : [ 8123.123456] amdgpu 0000:1b:00.0: %s" % USER,  # dmesg --decode: a user-space facility
    "<14>[ 8123.123456] amdgpu 0000:1b:00.0: amdgpu: GPU reset begin!",  # dmesg --raw: LOG_USER
    "[ 8123.1] [drm:amdgpu_job_timedout [amdgpu]] *ERROR* Process information: process %s pid 1 thread x pid 1"
    % USER,
])
def test_dmesg_and_journal_lines_of_users_are_not_events(line):
    assert kernlog.parse_dmesg(line) == ()


# Other subsystems' messages and amdgpu's own records that carry a user's text.
_WRAPPERS = ["tmpfs: Unknown parameter '%s'", "process 'sh' launched '%s' with NULL argv: empty string added",
             "audit: type=1400 audit(1.2:3): apparmor=\"DENIED\" comm=\"%s\"", "EXT4-fs (sda1): %s",
             "[drm:amdgpu_job_timedout [amdgpu]] *ERROR* Process information: process %s pid 1 thread %s pid 2",
             "amdgpu 0000:1b:00.0: amdgpu:  Process %s pid 1 thread %s pid 2",
             "amdgpu 0000:1b:00.0:  Process %s pid 1 thread %s pid 2",
             "amdgpu 0000:1b:00.0: amdgpu: [mmhub0] retry page fault (src_id:0 ring:0 vmid:3 pasid:32790)"
             " for process %s pid 6071 thread %s pid 6071)",
             "amdgpu 0000:1b:00.0: amdgpu:  for process %s pid 6071 thread %s pid 6071)"]
_REAL = [line for line, _, _ in CONSTRUCTED] + ["amdgpu 0000:28:00.0: ring gfx_0.0.0 timeout, signaled seq=1, "
                                                 "emitted seq=3", "Fatal error during GPU init", "GPU reset begin!"]


@PROPS
@given(wrapper=st.sampled_from(_WRAPPERS), real=st.sampled_from(_REAL), noise=st.text(max_size=40),
       pri=st.sampled_from([3, 4, 6]))
def test_property_user_text_inside_other_records_never_yields_an_event(wrapper, real, noise, pri):
    text = (noise + real + noise).replace("\n", " ")
    message = wrapper.replace("%s", text)
    found = [e.where for e in kernlog.parse_kmsg("%d,5,1,-;%s\n" % (pri, message), None)]
    # The driver's own page fault record is its one event (issue 33, item 1), whatever it names.
    assert found == (["vm_fault:mmhub0"] if "retry page fault" in wrapper else []), (wrapper, found)


FORMS = [  # (body template, where, count): each body of the design's table, placeholders filled at random
    ("{n} uncorrectable hardware errors detected in {block} block", "ue:{block}", "{n}"),
    ("socket: {s}, die: {d}, {n} new correctable hardware errors detected in {block} block", "ce:{block}", "{n}"),
    ("socket: {s}, die: {d}, {n} new deferred hardware errors detected in {block} block", "de:{block}", "{n}"),
    ("socket: {s}, die: {d}, {n} new poison consumption detected in {block} block", "poison:{block}", "{n}"),
    ("uncorrectable hardware error(ERREVENT_ATHUB_INTERRUPT) detected!", "ue_event:athub", "1"),
    ("[Hardware Error]: Accelerator Check Architecture events logged", "aca", "1"),
    ("poison is consumed by client {s}, kick off gpu reset flow", "poison", "1"),
    ("Saved bad pages {n} reaches threshold value {s}", "bad_page_threshold", "{n}"),
    ("Saved bad pages({n}) reaches threshold value({s}).", "bad_page_threshold", "{n}"),
    ("GPU reset begin!", "gpu_reset", "1"),
    ("GPU reset begin!. Source:  {s}", "gpu_reset", "1"),
    ("GPU reset({s}) succeeded!", "reset_ok", "1"),
    ("GPU reset succeeded, trying to resume", "reset_ok", "1"),
    ("GPU reset({s}) failed", "reset_failed", "1"),
    ("GPU reset end with ret = -{s}", "reset_failed", "1"),
    ("GPU Recovery Failed: -{s}", "reset_failed", "1"),
    ("ring {ring} timeout, signaled seq={n}, emitted seq={s}", "ring_timeout:{ring}", "1"),
    ("Ring {ring} reset failure", "ring_reset_failed:{ring}", "1"),
    ("Ring {ring} reset failed", "ring_reset_failed:{ring}", "1"),
    ("Fatal error during GPU init", "init_failed", "1"),
    ("probe with driver amdgpu failed with error -{s}", "init_failed", "1"),
    ("VRAM is lost due to GPU reset!", "vram_lost", "1"),
]
_HEX = "0123456789abcdef"


@PROPS
@given(form=st.sampled_from(FORMS), domain=st.text(_HEX, min_size=4, max_size=4),
       bus=st.text(_HEX, min_size=2, max_size=2), dev=st.text(_HEX, min_size=2, max_size=2),
       fn=st.integers(0, 7), prefix=st.sampled_from(["", "amdgpu: "]),
       event_id=st.one_of(st.none(), st.integers(0, 2 ** 63)), n=st.integers(1, 10 ** 11),
       s=st.integers(0, 99999), d=st.integers(0, 7),
       block=st.sampled_from(["umc", "gfx", "sdma", "mmhub", "xgmi_wafl", "hdp", "pcie_bif", "athub"]),
       ring=st.sampled_from(["gfx", "gfx_0.0.0", "comp_1.2.1", "sdma0", "vcn_unified_0", "mes_kiq_3.1.0"]))
def test_property_every_form_matches_with_any_device_and_count(form, domain, bus, dev, fn, prefix, event_id, n,
                                                                 s, d, block, ring):
    template, where, count = form
    values = dict(n=n, s=s, d=d, block=block, ring=ring)
    ras = where.startswith(("ue", "ce", "de", "poison", "aca"))  # RAS_EVENT_LOG's "{N}", the RAS core's "{N} "
    rid = "" if event_id is None or not ras else "{%d}%s" % (event_id, " " * (event_id % 2))
    bdf = "%s:%s:%s.%d" % (domain, bus, dev, fn)
    message = "amdgpu %s: %s%s%s" % (bdf, prefix, rid, template.format(**values))
    (event,) = kernlog.parse_kmsg("3,1,1,-;%s\n" % message, None)
    assert (event.kind, event.where, event.xid) == ("amdgpu", where.format(**values), int(count.format(**values)))
    assert event.pci_bus_id == bus_key(bdf) == "%s:%s:%s" % (domain, bus, dev)


# ----------------------------------------------------------------- the scan
def test_the_prolog_loads_no_amd_pattern_for_an_nvidia_log():
    """The prolog parses the kernel log on every job: an NVIDIA node's log
    (an Xid, the BMC's ast DRM driver) must not load the AMD module."""
    code = ("import sys; from gpugate.parsers import kernlog; "
            "t = '4,1,1,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1\\n6,2,2,-;[drm] Initialized ast 0.1.0 for "
            "0000:02:00.0 on minor 0\\n6,3,3,-;ast 0000:02:00.0: [drm] fb0: astdrmfb frame buffer device\\n'; "
            "assert len(kernlog.parse_kmsg(t, None)) == 1; print('gpugate.vendors.amd.parse_kernlog' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                         check=True)
    assert out.stdout.strip() == "False"


def test_the_gate_and_the_module_agree_on_what_starts_an_amdgpu_record():
    assert kernlog._AMD_HEADS == parse_kernlog.HEADS
    assert set(POLICY.amdgpu_events) <= set(parse_kernlog.EVENTS)
    assert {parse_kernlog.event_name(w) for _, w, _ in CONSTRUCTED} <= set(parse_kernlog.EVENTS)


def test_fresh_events_take_the_amd_gpu_index_and_old_ring_timeouts_count():
    lines = ["6,10,1000000,-;amdgpu 0000:dd:00.0: amdgpu: ring gfx_0.0.0 timeout, signaled seq=1, emitted seq=3",
             "6,11,2000000,-;amdgpu 0000:dd:00.0: amdgpu: GPU reset begin!",
             "6,12,3000000,-;amdgpu 0000:dd:00.0: {1}uncorrectable hardware error(ERREVENT_ATHUB_INTERRUPT) detected!",
             "6,13,4000000,-;amdgpu 0000:dd:00.0: amdgpu: ring comp_1.0.0 timeout, signaled seq=1, emitted seq=3",
             "6,14,5000000,-;NVRM: Xid (PCI:0000:dd:00): 79, pid=1"]
    text = "\n".join(lines) + "\n"
    found = fresh_xids(text, 1.7e9, after_seq=12, window=86400, now=1.7e9 + 10, bus_to_gpu={},
                       amd_bus_to_gpu=MI300X_GPUS)
    # Before the cursor: the ring timeout and the reset stay (rates), the UE goes.
    assert [(e.where, e.gpu, e.fresh) for e in found] == [
        ("ring_timeout:gfx_0.0.0", 7, False), ("gpu_reset", 7, False), ("ring_timeout:comp_1.0.0", 7, True),
        ("", None, True)]
    # One map for the node's GPUs, as before (the caller builds it from AmdGpu.bdf on an AMD node).
    same = fresh_xids(text, 1.7e9, after_seq=12, window=86400, now=1.7e9 + 10, bus_to_gpu=MI300X_GPUS)
    assert [(e.where, e.gpu) for e in same] == [(e.where, e.gpu) for e in found[:3]] + [("", 7)]
    # Out of the window: gone.
    assert fresh_xids(text, 1.7e9, 12, window=60, now=1.7e9 + 3600, bus_to_gpu=MI300X_GPUS) == ()


# ----------------------------------------------------------------- the judge
def judge(lines, fresh_from=0, policy=POLICY, gpus=MI300X_GPUS):
    """Kernel-log lines -> findings, as a check reads them (seq from 1)."""
    text = "".join("6,%d,%d,-;%s\n" % (n, n, line) for n, line in enumerate(lines, 1))
    found = fresh_xids(text, None, fresh_from, 0, 0.0, gpus)
    return judge_events.judge(policy, NodeFacts(node="n", mode="healthcheck", collected_at=0.0, xids=found))


def capture_findings(name, gpus=MI300X_GPUS):
    found = kernlog.parse_kmsg(kmsg(fixture(name)), None)
    found = tuple(replace(e, gpu=gpus.get(bus_key(e.pci_bus_id))) for e in found)
    return judge_events.judge(POLICY, NodeFacts(node="n", mode="healthcheck", collected_at=0.0, xids=found))


def test_the_mi300x_hang_drains_for_its_uncorrectable_error_and_its_reset():
    assert capture_findings("dmesg-athub-aca-xgmiwafl-mode1reset-MI300X-rocm6.2.3-rocm4021.txt") == [
        # 1b:00's ACA bank has UC (bit 61) and PCC (bit 57) set: uncorrected, with no ue: line after it
        Finding(HEALTH, "amdgpu_event", "ue aca", "none", RESET_GPU, gpu=0,
                detail="0000:1b:00: [Hardware Error]: aca entry[00].STATUS=0xbaa000000000080b"),
        Finding(HEALTH, "amdgpu_event", "ue_event athub", "none", RESET_GPU, gpu=7,
                detail="0000:dd:00: uncorrectable hardware error(ERREVENT_ATHUB_INTERRUPT) detected!"),
        Finding(HEALTH, "amdgpu_repeat", "gpu_reset", "none in 86400s", REBOOT, gpu=7,
                detail="1 in the window: 0000:dd:00: GPU reset begin!"),
    ]  # the xgmi_wafl CEs, 9d:00's corrected ACA banks, the reset's success and VRAM lost: recorded only


def test_gpus_that_failed_at_probe_are_broken_once_each():
    name = "dmesg-initfail-ipdiscovery-fwload-8xMI300X-rocm6.3.3-rocm4454.txt"
    unbound = capture_findings(name, gpus={})  # no GPU bound: no index to name
    assert unbound[0] == Finding(BROKEN, "amdgpu_event", "init_failed 0000:1b:00", "none", REBOOT,
                                 detail="0000:1b:00: probe of 0000:1b:00.0 failed with error -22")
    assert [f.observed for f in unbound] == ["init_failed %s" % bus_key(bdf) for bdf in MI300X]
    assert all(f.acute for f in unbound)
    assert [(f.gpu, f.observed) for f in capture_findings(name)] == [(i, "init_failed") for i in range(8)]


def test_a_ring_timeout_whose_ring_reset_failed_reboots():
    gpus = {"0000:28:00": 0}
    assert capture_findings("dmesg-ringtimeout-gpureset-RX5700XT-kernel7.0-cosmic3764.FRAGMENT.txt", gpus) == [
        Finding(HEALTH, "amdgpu_event", "ring_reset_failed gfx_0.0.0", "none", REBOOT, gpu=0,
                detail="0000:28:00: Ring gfx_0.0.0 reset failed"),
        Finding(HEALTH, "amdgpu_repeat", "gpu_reset", "none in 86400s", REBOOT, gpu=0,
                detail="1 in the window: 0000:28:00: GPU reset begin!. Source:  1"),
    ]  # one ring timeout: under ring_timeout_max (3)
    assert capture_findings("dmesg-ringtimeout-ringresetok-RDNA4-unknown-rocm6127.FRAGMENT.txt", gpus) == []
    assert capture_findings("dmesg-softrecovered-pagefault-gfx1201-unknown-therock2591.FRAGMENT.txt", gpus) == []


UE = "amdgpu 0000:5f:00.0: {%d}socket: 0, die: 1, 1 new uncorrectable hardware errors detected in umc block"
TIMEOUT = "amdgpu 0000:5f:00.0: amdgpu: ring %s timeout, signaled seq=1, emitted seq=3"


def test_uncorrectable_errors_reset_the_gpu_with_their_count_in_the_detail():
    findings = judge([UE % 1, UE % 2, UE.replace("umc", "gfx") % 3])
    assert findings == [
        Finding(HEALTH, "amdgpu_event", "ue umc", "none", RESET_GPU, gpu=3,
                detail="2 errors: 0000:5f:00: socket: 0, die: 1, 1 new uncorrectable hardware errors detected in "
                       "umc block"),
        Finding(HEALTH, "amdgpu_event", "ue gfx", "none", RESET_GPU, gpu=3,
                detail="0000:5f:00: socket: 0, die: 1, 1 new uncorrectable hardware errors detected in gfx block")]
    assert render("gpugate:", HEALTH, findings[:1]) == "gpugate: health amdgpu_event:gpu3=ue umc (want none)"
    assert judge([UE % 1, UE % 2], fresh_from=2) == []  # before the cursor: no longer drains


def test_each_event_drains_with_its_action():
    cases = [
        ("amdgpu 0000:5f:00.0: {8} socket: 0, die: 2, 3 new deferred hardware errors detected in umc block",
         (HEALTH, "de umc", RESET_GPU)),
        ("amdgpu 0000:5f:00.0: amdgpu: poison is consumed by client 5, kick off gpu reset flow",
         (HEALTH, "poison", RESET_GPU)),
        ("amdgpu 0000:5f:00.0: amdgpu: GPU reset(2) failed", (HEALTH, "reset_failed", REBOOT)),
        ("amdgpu 0000:5f:00.0: amdgpu: Ring sdma0 reset failure", (HEALTH, "ring_reset_failed sdma0", REBOOT)),
        ("amdgpu 0000:5f:00.0: amdgpu: Fatal error during GPU init", (BROKEN, "init_failed", REBOOT)),
        ("amdgpu 0000:5f:00.0: amdgpu: Saved bad pages 130 reaches threshold value 128",
         (HEALTH, "bad_page_threshold", RMA_ACTION)),
        ("amdgpu 0000:5f:00.0: {1}socket: 6, die: 1, 1533 new correctable hardware errors detected in xgmi_wafl "
         "block", None),
        ("amdgpu 0000:5f:00.0: {1}[Hardware Error]: Accelerator Check Architecture events logged", None),
        ("amdgpu 0000:5f:00.0: amdgpu: GPU reset succeeded, trying to resume", None),
        ("amdgpu 0000:5f:00.0: amdgpu: VRAM is lost due to GPU reset!", None),
    ]
    for line, expected in cases:
        found = [(f.cls, f.observed, f.action, f.gpu) for f in judge([line])]
        assert found == ([] if expected is None else [expected + (3,)]), line


def test_ring_timeouts_drain_at_ring_timeout_max_on_one_gpu_within_the_window():
    three = [TIMEOUT % "gfx_0.0.0", TIMEOUT % "comp_1.0.0", TIMEOUT % "gfx_0.0.0"]
    (finding,) = judge(three, fresh_from=2)  # two older ones in the window count, the third is fresh
    assert finding == Finding(HEALTH, "amdgpu_repeat", "ring_timeout >=3", "< 3 in 86400s", RESET_GPU, gpu=3,
                              detail="3 in the window: 0000:5f:00: ring gfx_0.0.0 timeout, signaled seq=1, "
                                     "emitted seq=3")
    assert judge(three[:2]) == []  # under the maximum
    assert judge(three, fresh_from=3) == []  # none fresh: an admin's resume sticks
    other = three[:2] + [(TIMEOUT % "gfx_0.0.0").replace("5f:00", "9d:00")]
    assert judge(other) == []  # two GPUs, under the maximum on each
    assert judge(three, policy=replace(POLICY, ring_timeout_max=4)) == []
    (old_form,) = judge(["[drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring gfx timeout, signaled seq=1, "
                         "emitted seq=3"] * 3)  # no device: the node's
    assert (old_form.gpu, old_form.observed) == (None, "ring_timeout >=3")


def test_gpu_resets_drain_at_gpu_reset_events_max():
    reset = "amdgpu 0000:5f:00.0: amdgpu: GPU reset begin!"
    assert [f.observed for f in judge([reset])] == ["gpu_reset"]
    lenient = replace(POLICY, gpu_reset_events_max=2)
    assert judge([reset], policy=lenient) == []
    (finding,) = judge([reset, reset], policy=lenient)
    assert (finding.observed, finding.expected, finding.action) == ("gpu_reset >=2", "< 2 in 86400s", REBOOT)


def test_an_event_the_policy_does_not_name_is_recorded_only():
    policy = replace(POLICY, amdgpu_events=tuple(e for e in POLICY.amdgpu_events if e != "ue"))
    assert judge([UE % 1], policy=policy) == []
    assert judge([UE % 1, "amdgpu 0000:5f:00.0: amdgpu: GPU reset(2) failed"], policy=policy)[0].observed == \
        "reset_failed"


def test_the_nvidia_judge_ignores_amdgpu_events():
    """An amdgpu line reporting 79 errors is not Xid 79."""
    line = "amdgpu 0000:5f:00.0: {1}socket: 0, die: 1, 79 new uncorrectable hardware errors detected in umc block"
    found = kernlog.parse_kmsg("6,1,1,-;%s\n" % line, None)
    assert found[0].xid == 79
    facts = NodeFacts(node="n", mode="healthcheck", collected_at=0.0, xids=found)
    assert xids.judge(POLICY, facts) == []
    nvidia = found + (XidEvent(xid=79, pci_bus_id="0000:18:00", text="", gpu=2),)
    assert [(f.component, f.observed, f.gpu) for f in xids.judge(POLICY, replace(facts, xids=nvidia))] == \
        [("xid", "79", 2)]
    assert judge_events.judge(POLICY, replace(facts, xids=nvidia[1:])) == []


def test_explain_gives_the_amd_steps():
    finding = judge([UE % 1])[0]
    assert finding.acute
    steps = " ".join(runbook.steps(finding))
    for text in ("amd-smi reset -G", "amd-smi bad-pages", "RMA", "reboot", "rvs -r 2"):
        assert text in steps, text
    from gpugate.cli.render import explain_text

    verdict = types.SimpleNamespace(fit=False, not_verified=(), cls=HEALTH, findings=[finding],
                                    reason=render("gpugate:", HEALTH, [finding]))
    text = explain_text(types.SimpleNamespace(verdict=verdict, facts=NodeFacts(node="mi01", mode="healthcheck",
                                                                                collected_at=0.0)))
    assert "reason: gpugate: health amdgpu_event:gpu3=ue umc (want none)" in text
    assert "amd-smi reset -G -g N" in text


# ---------------------------------------------- ACA banks by their bits (issue 34)
# amdgpu_aca.h's STATUS layout: Val 63, Overflow 62, UC 61, En 60, MiscV 59,
# AddrV 58, PCC 57, ..., Deferred 44, Poison 43.
ACA_BANKS = [
    (0xfaa00000000d080b, "ue:aca"),  # Val Over UC En MiscV PCC: the rocm4021b capture
    (0xbaa000000000080b, "ue:aca"),  # Val UC En MiscV PCC: rocm4021's bank on 1b:00
    (0xb000000000000000, "ue:aca"),  # UC without PCC: still not corrected
    (0xd820000000060150, "ce:aca"),  # Val Over En MiscV: rocm4021's xgmi banks, a "correctable" line after them
    (0x9000100000000000, "de:aca"),  # Deferred
    (0x9000080000000000, "de:aca"),  # Poison: deferred, as ACA_BANK_ERR_IS_DEFFERED decodes it
    (0xb000100000000000, "de:aca"),  # UC and Deferred: the driver's UE_DE decode says deferred
    (0x7aa000000000080b, "aca"),  # no Val: the bank holds no error (recorded)
]


@pytest.mark.parametrize("status,where", ACA_BANKS)
def test_an_aca_banks_severity_is_read_from_its_status_bits(status, where):
    assert parse_kernlog.aca_severity(status) == where
    for form in ("amdgpu 0000:4e:00.0: {1}[Hardware Error]: aca entry[03].STATUS=0x%016x",
                 "amdgpu 0000:4e:00.0: amdgpu: [Hardware error] ACA[03/04].STATUS=0x%016x"):
        (event,) = kernlog.parse_kmsg("3,9,1,-;%s\n" % (form % status), None)
        assert (event.where, event.pci_bus_id) == (where, "0000:4e:00")


@pytest.mark.parametrize("register", ["ADDR", "MISC0", "IPID", "SYND"])
def test_an_aca_banks_other_registers_are_not_events(register):
    line = "amdgpu 0000:4e:00.0: {1}[Hardware Error]: aca entry[00].%s=0xfaa00000000d080b" % register
    assert kernlog.parse_amdgpu_message(line) is None


def test_uncorrected_aca_banks_drain_their_gpu_with_no_ue_line_after_them():
    """rocm4021b: UC+PCC banks on 4e:00 and no "uncorrectable hardware errors"
    line: before issue 34 an ``aca`` record only, and no finding for 4e:00."""
    found = capture_findings("dmesg-athub-aca-ucpcc-MI300X-rocm6.2.3-rocm4021b.FRAGMENT.txt")
    assert [(f.gpu, f.observed.split(" x")[0], f.action, f.acute) for f in found] == [
        (2, "ue aca", RESET_GPU, True), (7, "ue_event athub", RESET_GPU, True)]
    # A corrected bank alone is recorded, never a finding.
    assert judge(["amdgpu 0000:4e:00.0: {1}[Hardware Error]: aca entry[00].STATUS=0xd820000000060150"]) == []


# ------------------------------------- amdgpu built into the kernel (issue 34)
def _built_in(line):
    return line.replace(" [amdgpu]]", "]")  # %ps of a built-in function names no module


_TAGGED = sorted({line for name in CAPTURES for line in fixture(name).splitlines() if " [amdgpu]]" in line}
                 | {wrapper for wrapper in _WRAPPERS if " [amdgpu]]" in wrapper})


@pytest.mark.parametrize("line", _TAGGED)
def test_every_tagged_line_reads_the_same_from_a_built_in_amdgpu(line):
    """Each DRM line of the captures (and each carrying a user's text), with
    the module tag and without it: the same events, in dmesg and in /dev/kmsg."""
    assert events(_built_in(line)) == events(line)
    assert kernlog.parse_kmsg(kmsg(_built_in(line)), None) == kernlog.parse_kmsg(kmsg(line), None)


def test_the_tagged_lines_hold_events():
    assert sum(bool(events(line)) for line in _TAGGED) >= 5  # the test above is no vacuous "() == ()"


@pytest.mark.parametrize("line,where,bus", [
    # Quoted in issue 34 from a real MI210 log on kernel 6.14 with amdgpu built in.
    ("[drm:amdgpu_job_timedout] *ERROR* ring gfx timeout, signaled seq=1, emitted seq=3", "ring_timeout:gfx", ""),
    ("[drm:amdgpu_job_timedout] *ERROR* GPU Recovery Failed: -22", "reset_failed", ""),
    # Its device-prefixed form (DRM_DEV_ERROR): the anchor, then the same bodies.
    ("amdgpu 0000:05:00.0: [drm:amdgpu_job_timedout] *ERROR* ring gfx timeout, signaled seq=1, emitted seq=3",
     "ring_timeout:gfx", "0000:05:00"),
    ("amdgpu 0000:05:00.0: [drm:amdgpu_job_timedout] *ERROR* GPU Recovery Failed: -22", "reset_failed",
     "0000:05:00"),
])
def test_the_built_in_forms_quoted_in_issue_34(line, where, bus):
    for text in (line, "[ 8123.1] " + line, "Mar 02 10:15:03 mi210 kernel: " + line):
        assert events(text) == [(where, 1, bus)]
    (event,) = kernlog.parse_kmsg("3,9,1,-;%s\n" % line, None)
    assert (event.where, event.pci_bus_id) == (where, bus)


@pytest.mark.parametrize("line", [
    "amdgpu 0000:05:00.0: [drm:amdgpu_ring_test_helper] *ERROR* ring kiq_2.1.0 test failed (-110)",
    "[drm:amdgpu_dm_commit_planes] *ERROR* Waiting for fences timed out!",
    "[drm:amdgpu_job_timedout] *ERROR* ring sdma0 timeout, but soft recovered",
    "[drm:amdgpu_job_timedout] *ERROR* Process information: process %s pid 1 thread %s pid 2" % (USER, USER),
])
def test_a_built_in_amdgpus_other_records_are_not_events(line):
    assert events(line) == [] and kernlog.parse_kmsg("3,9,1,-;%s\n" % line, None) == ()
