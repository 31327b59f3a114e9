"""Every kernel-log form gpugate reads: MIG Xids, NVSwitch SXids, "fallen off
the bus" (one line, and split over records).  Lines are real captures, with
where they were published; properties check that no line of one form is
read as another."""

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gpugate.parsers import kernlog
from gpugate.probes.kernlog import fresh_xids

PROPS = settings(max_examples=150, deadline=None)


def scan(lines):
    """Plain dmesg/journal lines, read as parse_dmesg reads them (their prefix off)."""
    return list(kernlog.parse_dmesg("\n".join(lines)))


# (line, (kind, code, bus, where, text starts with)).
FORMS = [
    # NVIDIA's A100 memory-error guide / open-gpu-kernel-modules' comment: MIG attribution.
    ("NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9). RST: No, D-RST: No",
     ("xid", 94, "0000:01:00", "GPU-I:05", "pid=7194, Contained")),
    # open-gpu-kernel-modules' format "PCI:%04x:%02x:%02x GPU-I:%02u GPU-CI:%02u" (a compute instance too).
    ("[ 812.0] NVRM: Xid (PCI:0000:3B:00 GPU-I:01 GPU-CI:02): 13, pid=9, name=a, Graphics Exception",
     ("xid", 13, "0000:3b:00", "GPU-I:01 GPU-CI:02", "pid=9, name=a")),
    ("NVRM: Xid (PCI:0000:b7:00 GPU-I:03): 48, pid='<unknown>', name=<unknown>, An uncorrectable double bit error",
     ("xid", 48, "0000:b7:00", "GPU-I:03", "pid='<unknown>'")),
    # gpud's SXid README (captured on an HGX node), Fabric Manager guide's format.
    ("[6781753.400584] nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up",
     ("sxid", 20034, "0000:06:00", "nvidia-nvswitch1", "Fatal, Link 48")),
    ("nvidia-nvswitch2: SXid (PCI:0000:86:00.0): 12028, Non-fatal, Link 46 egress non-posted PRIV error",
     ("sxid", 12028, "0000:86:00", "nvidia-nvswitch2", "Non-fatal, Link 46")),
    ("kernel: nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 11012, Non-fatal, Link 32 MINION Link DLREQ interrupt",
     ("sxid", 11012, "0000:05:00", "nvidia-nvswitch0", "Non-fatal")),
    # gpud's SXid README: the one-line form, printed next to Xid 79.
    ("[6781741.548783] NVRM: GPU 0000:91:00.0: GPU has fallen off the bus.",
     ("fallen_off_bus", 79, "0000:91:00", "", "GPU has fallen off the bus")),
    ("NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.",
     ("fallen_off_bus", 79, "0000:29:00", "", "GPU has fallen off the bus")),
    # NVLink5 (GB200/B200) Xids with their sub-event severity (gpud's and NVSentinel's tests).
    ("NVRM: Xid (PCI:0019:01:00): 145, RLW_SRC_TRACK Nonfatal XC1 i0 Link 12 (0x040988e2 0x00000008 0x00000000)",
     ("xid", 145, "0019:01:00", "", "RLW_SRC_TRACK Nonfatal")),
    ("kernel: [16450076.435584] NVRM: Xid (PCI:0001:00:00): 145, RLW_REMAP Fatal XC1 i0 Link 10 (0x00000082)",
     ("xid", 145, "0001:00:00", "", "RLW_REMAP Fatal")),
]


@pytest.mark.parametrize("line,expected", FORMS)
def test_each_form_is_read_with_the_device_it_names(line, expected):
    (event,) = scan([line])
    assert (event.kind, event.xid, event.pci_bus_id, event.where) == expected[:4]
    assert event.text.startswith(expected[4])


# Lines that are not events, some very close to one.
NOT_EVENTS = [
    # The "Severity"/"Data" lines continue an SXid already reported (gpud's README capture).
    "nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Severity 1 Engine instance 60 Sub-engine instance 00",
    "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Data {0x10000000, 0x10000000, 0x00000000, 0x10000000}",
    "NVRM: GPU at PCI:0000:91:00: GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b",
    "NVRM: GPU 0000:91:00.0: GPU serial number is 1653723052734.",
    "NVRM: GPU Board Serial Number: 1653723052734",
    "nvidia-nvswitch3: open (minor number 3) failed",
    "NVRM: Xid (PCI:0000:38:00): nope",
]


@pytest.mark.parametrize("line", NOT_EVENTS)
def test_near_misses_are_not_events(line):
    assert scan([line]) == []


SPLIT = [  # nvidia.ko's three records for a GPU that stopped answering
    "NVRM: The NVIDIA GPU 0000:18:00.0",
    "NVRM: (PCI ID: 10de:20b0) installed in this system has",
    "NVRM: fallen off the bus and is not responding to commands.",
]


def test_split_records_are_joined_in_kmsg_and_dmesg():
    kmsg = "".join("4,%d,%d,-;%s\n" % (500 + i, 9000000 + i, line) for i, line in enumerate(SPLIT))
    (event,) = kernlog.parse_kmsg(kmsg, 1.7e9)
    assert (event.kind, event.pci_bus_id, event.seq) == ("fallen_off_bus", "0000:18:00", 502)
    (event,) = kernlog.parse_dmesg("".join("[  77.1] %s\n" % line for line in SPLIT))
    assert event.pci_bus_id == "0000:18:00"
    (event,) = scan([" ".join(line[len("NVRM: "):] for line in SPLIT).join(["NVRM: ", ""])])  # one journal line
    assert event.pci_bus_id == "0000:18:00"


def test_a_head_without_its_tail_is_nothing():
    # The same head also starts "... is not supported by the NVIDIA driver" messages.
    lines = ["NVRM: The NVIDIA GPU 0000:18:00.0 (PCI ID: 10de:20b0)",
             "NVRM: installed in this system is not supported by the", "NVRM: NVIDIA 580.65.06 driver release."]
    assert scan(lines) == []
    # ...and a tail long after an unrelated head is not joined to it.
    assert scan(SPLIT[:1] + ["NVRM: noise %d" % i for i in range(6)] + SPLIT[2:]) == []


def test_fresh_marks_events_after_the_cursor_and_the_window_drops_old_ones():
    now, boot = 1.8e9, 1.8e9 - 100000
    kmsg = ("4,10,%d,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 1\n"
            "4,11,%d,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 1\n"
            "4,12,%d,-;NVRM: Xid (PCI:0000:1b:00 GPU-I:02): 48, pid=1, name=x, DBE\n") % (
                10 * 10 ** 6, 99000 * 10 ** 6, 99500 * 10 ** 6)
    events = fresh_xids(kmsg, boot, 11, 3600.0, now, {"0000:1b:00": 3})
    assert [(e.seq, e.fresh, e.gpu) for e in events] == [(11, False, None), (12, True, 3)]


# --------------------------------------------------------------------------
# Properties

hexd = st.text("0123456789abcdef", min_size=2, max_size=2)
words = st.text(st.characters(min_codepoint=32, max_codepoint=126, blacklist_characters="\n"), max_size=40)


@st.composite
def mig_xid(draw):
    bus, dev = draw(hexd), draw(hexd)
    gi, ci = draw(st.integers(0, 99)), draw(st.one_of(st.none(), st.integers(0, 99)))
    inst = "GPU-I:%02d" % gi + ("" if ci is None else " GPU-CI:%02d" % ci)
    code = draw(st.integers(1, 200))
    return "NVRM: Xid (PCI:0000:%s:%s %s): %d, %s" % (bus, dev, inst, code, draw(words)), (bus, dev, inst, code)


@given(mig_xid())
@PROPS
def test_any_mig_xid_names_its_gpu_and_instance(case):
    line, (bus, dev, inst, code) = case
    (event,) = scan([line])
    assert (event.kind, event.xid, event.pci_bus_id, event.where) == ("xid", code, "0000:%s:%s" % (bus, dev), inst)


@st.composite
def sxid(draw):
    code = draw(st.integers(10000, 29999))
    severity = draw(st.sampled_from(["Fatal", "Non-fatal"]))
    return "nvidia-nvswitch%d: SXid (PCI:0000:%s:00.0): %05d, %s, %s" % (
        draw(st.integers(0, 11)), draw(hexd), code, severity, draw(words)), code


@given(sxid())
@PROPS
def test_an_sxid_is_never_read_as_an_xid(case):
    line, code = case
    assert kernlog.parse_xid_message(line) is None
    (event,) = scan([line])
    assert (event.kind, event.xid) == ("sxid", code)


@given(st.lists(words.filter(lambda s: "Xid" not in s and "fallen off" not in s and "SXid" not in s), max_size=20))
@PROPS
def test_other_kernel_lines_are_never_events(lines):
    assert scan(["NVRM: " + line for line in lines] + lines) == []


@given(mig_xid(), sxid())
@PROPS
def test_an_xid_line_is_never_an_sxid_or_fallen_off_bus(xid_case, sxid_case):
    assert kernlog.parse_sxid_message(xid_case[0]) is None
    kinds = [e.kind for e in scan([xid_case[0], sxid_case[0], SPLIT[0], xid_case[0]])]
    assert kinds == ["xid", "sxid", "xid"]  # the head's tail never came


def test_old_events_are_kept_only_for_rates_and_capped():
    from gpugate import xidcatalog
    from gpugate.probes import kernlog as probe
    assert probe.COUNTED_XIDS == xidcatalog.NVLINK_XIDS
    nonfatal = "NVRM: Xid (PCI:0000:04:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000004)"
    lines = ["NVRM: Xid (PCI:0000:04:00): 13, pid=1, name=x, Graphics Exception"] * 50 + [nonfatal] * 600 \
        + ["NVRM: Xid (PCI:0000:04:00): 13, pid=1, name=x, new"]
    kmsg = "".join("4,%d,1,-;%s\n" % (i, line) for i, line in enumerate(lines))
    events = fresh_xids(kmsg, None, len(lines) - 2, 0, 0.0, {})
    assert [e.xid for e in events] == [145] * probe.MAX_OLD_EVENTS + [13]
    assert events[-1].fresh and not any(e.fresh for e in events[:-1])
    assert events[0].seq == len(lines) - 1 - probe.MAX_OLD_EVENTS  # the newest old ones are kept


# --------------------------------------------------------------------------
# Issue 24: events come only from the kernel, read from the start of its message.

MESSAGES = [kernlog.kernel_message(line)[1] for line, _ in FORMS] + [
    " ".join(line[len("NVRM: "):] for line in SPLIT).join(["NVRM: ", ""])]  # the split form, one record


def _driver_start(text):
    return text.lower().startswith(("nvrm:", "nvidia-nvswitch"))


user_text = st.text(st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)), max_size=60)
subsystem = st.from_regex(r"[a-z][a-z0-9_.-]{0,15}", fullmatch=True).filter(
    lambda name: name != "kernel" and not _driver_start(name))
line_text = st.text(st.characters(min_codepoint=32, max_codepoint=0x7e), max_size=60)  # dmesg escapes the rest


@given(st.sampled_from(MESSAGES), user_text.filter(bool), st.integers(0, 7), st.integers(0, 2 ** 32))
@PROPS
def test_a_driver_message_inside_another_kernel_message_is_no_event(message, prefix, level, seq):
    """Any text before it (a refused mount option, an exec'd path, ...): not the driver's record."""
    assume(not _driver_start(prefix + message))
    assert kernlog.parse_kmsg("%d,%d,1,-;%s%s\n" % (level, seq, prefix, message), 1.7e9) == ()


@given(st.sampled_from(MESSAGES), subsystem, line_text, st.sampled_from(
    ["", "[ 8123.123456] ", "kernel: ", "Mar 02 10:15:03 gpu01 kernel: ", "2025-01-21T04:41:44,283302+00:00 ",
     "kern  :err   : [   12.5] ", "<3>[    1.000000] "]))
@PROPS
def test_a_driver_message_inside_another_subsystems_line_is_no_event(message, name, text, tool):
    assert kernlog.parse_dmesg("%s%s: %s%s" % (tool, name, text, message)) == ()


@given(st.sampled_from(MESSAGES), st.integers(1, 2 ** 28), st.integers(0, 7))
@PROPS
def test_a_record_of_another_facility_is_no_event(message, facility, level):
    pri = facility << 3 | level
    assert kernlog.parse_kmsg("%d,7,1,-;%s\n" % (pri, message), 1.7e9) == ()
    assert kernlog.parse_dmesg("<%d>[    1.000000] %s" % (pri, message)) == ()


@given(st.sampled_from(list(zip(MESSAGES, [f[1] for f in FORMS] + [("fallen_off_bus", 79, "0000:18:00")]))),
       st.integers(0, 7))
@PROPS
def test_every_real_form_at_kernel_facility_is_still_an_event(case, level):
    message, expected = case
    (event,) = kernlog.parse_kmsg("%d,7,1,-;%s\n" % (level, message), 1.7e9)
    assert (event.kind, event.xid, event.pci_bus_id) == expected[:3]
