"""Every kernel-log form gpugate reads: MIG Xids, NVSwitch SXids, "fallen off
the bus" (one line, and split over records).  Lines are real captures, with
where they were published; properties check that no line of one form is
read as another."""

import calendar
import os

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
    from gpugate.vendors.nvidia import xidcatalog
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


# ------------------------------------------------ dmesg's continuation lines (issue 34)
# A kernel record may hold newlines: nvidia.ko's "fallen off the bus" is one
# record of three lines, and a user's text (a mount option, an exec'd path, a
# process name) can hold them too.  dmesg and journalctl print the further
# lines indented under the first, to the width of the prefix they printed.
NVSENTINEL = os.path.join(os.path.dirname(__file__), "fixtures", "dmesg-fallenoffbus-continuation-nvsentinel.txt")
FALLEN = "NVRM: The NVIDIA GPU 0000:b3:00.0\nNVRM: (PCI ID: 10de:26b5) installed in this system has\n" \
         "NVRM: fallen off the bus and is not responding to commands."
_ISO_TIME = calendar.timegm((2026, 11, 27, 13, 37, 36))
# Every dmesg/journalctl prefix parse_dmesg reads, and the time it gives (an ISO time with a zone only).
PREFIXES = [
    ("[ 1843.308145] ", None),  # dmesg
    ("[Fri Nov 27 13:37:36 2026] ", None),  # dmesg -T
    ("[Nov27 13:37] ", None),  # dmesg --reltime
    ("[  +0.000045] ", None),  # dmesg -d
    ("kern  :err   : [ 1843.308145] ", None),  # dmesg --decode
    ("<3>[ 1843.308145] ", None),  # dmesg --raw
    ("2026-11-27T13:37:36,283302+00:00 ", _ISO_TIME + 0.283302),  # dmesg --time-format=iso
    ("Nov 27 13:37:36 gpu01 kernel: ", None),  # journalctl -k (short), syslog
    ("Nov 27 13:37:36.283302 gpu01 kernel: ", None),  # -o short-precise
    ("2026-11-27T13:37:36+0000 gpu01 kernel: ", _ISO_TIME),  # -o short-iso
    ("Fri 2026-11-27 13:37:36 UTC gpu01 kernel: ", None),  # -o short-full
    ("[ 1843.308145] gpu01 kernel: ", None),  # -o short-monotonic
    ("1795786656.283302 gpu01 kernel: ", None),  # -o short-unix
    ("Nov 27 13:37:36 gpu01 kernel: [ 1843.308145] ", None),  # syslog's copy of the kernel's time
]


def printed(prefix, message, indent=None):
    """A record as dmesg and journalctl print it: its further lines indented
    to the prefix's width (or by ``indent``)."""
    first, *more = message.split("\n")
    pad = " " * len(prefix) if indent is None else indent
    return prefix + first + "".join("\n" + pad + line for line in more)


def test_nvsentinels_fallen_off_the_bus_record_is_one_event():
    with open(NVSENTINEL) as handle:
        (event,) = kernlog.parse_dmesg(handle.read())
    assert (event.kind, event.xid, event.pci_bus_id) == ("fallen_off_bus", 79, "0000:b3:00")


@pytest.mark.parametrize("prefix,timestamp", PREFIXES)
def test_the_record_with_continuation_lines_in_every_prefix_style(prefix, timestamp):
    text = "\n".join([printed(prefix, "NVRM: GPU at PCI:0000:b3:00: GPU-b6c3"), printed(prefix, FALLEN),
                      printed(prefix, "tmpfs: Unknown parameter 'x")])
    (event,) = kernlog.parse_dmesg(text)
    assert (event.kind, event.pci_bus_id) == ("fallen_off_bus", "0000:b3:00")
    assert event.timestamp == (pytest.approx(timestamp) if timestamp else None)
    # /dev/kmsg prints the same record's newlines as "\x0a": one record, one event.
    (event,) = kernlog.parse_kmsg("4,9,1,-;%s\n" % FALLEN.replace("\n", "\\x0a"), None)
    assert event.pci_bus_id == "0000:b3:00"


def test_the_follower_keeps_the_record_and_a_built_in_amdgpus():
    from gpugate.probes import gpujournal

    assert gpujournal.classify("4,9,1,-;%s" % FALLEN.replace("\n", "\\x0a")) == gpujournal.GPU
    assert gpujournal.classify("3,10,1,-;[drm:amdgpu_job_timedout] *ERROR* GPU Recovery Failed: -22") == \
        gpujournal.GPU
    assert gpujournal.classify("3,11,1,-;[drm:amdgpu_job_timedout] *ERROR* Process information: process "
                               "x pid 1 thread x pid 1") is None


# Lines that are records of their own only at a line's start: a user's text
# cut there by a separator other than "\n" (dmesg prints it raw) must not be.
@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\r"])
def test_a_users_line_separator_other_than_newline_ends_no_record(separator):
    line = "[ 8123.1] tmpfs: Unknown parameter 'x%sNVRM: Xid (PCI:0000:01:00): 79, pid=1, GPU has fallen off the " \
           "bus.'" % separator
    assert kernlog.parse_dmesg(line) == ()


AMD_MESSAGES = ["amdgpu 0000:1b:00.0: amdgpu: GPU reset(2) failed",
                "[drm:amdgpu_job_timedout] *ERROR* GPU Recovery Failed: -22",
                "amdgpu 0000:4e:00.0: {1}[Hardware Error]: aca entry[00].STATUS=0xfaa00000000d080b"]
EVENT_MESSAGES = MESSAGES + SPLIT + AMD_MESSAGES
indent = st.text(st.sampled_from(" \t"), min_size=1, max_size=40)
separator = st.sampled_from(["\n", "\r\n", "\u2028", "\x0b", "\x0c", "\x85"])
user_lines = st.lists(st.one_of(st.sampled_from(EVENT_MESSAGES), line_text), min_size=1, max_size=4)
# What a user's text goes into: another subsystem's record (no event), or the driver's own
# records that name a process (their one event, whatever the name says).
USER_RECORDS = [
    ("tmpfs: Unknown parameter '%s'", []),
    ("process 'sh' launched '%s' with NULL argv: empty string added", []),
    ("EXT4-fs (sda1): %s", []),
    ("[drm:amdgpu_job_timedout] *ERROR* Process information: process %s pid 1 thread x pid 2", []),
    ("NVRM: Xid (PCI:0000:01:00): 13, pid=7, name=%s, Graphics Exception: ESR 0x50", [("xid", 13, "0000:01:00")]),
    ("amdgpu 0000:1b:00.0: amdgpu: [gfxhub0] retry page fault (src_id:0 ring:24 vmid:3 pasid:32770, for process "
     "%s pid 7 thread x pid 7)", [("amdgpu", 1, "0000:1b:00")]),
]


@given(st.sampled_from(PREFIXES), st.sampled_from(EVENT_MESSAGES + ["tmpfs: Unknown parameter 'x"]),
       st.lists(st.sampled_from(EVENT_MESSAGES), min_size=1, max_size=3), indent)
@PROPS
def test_property_an_indented_continuation_line_never_starts_an_event(prefix, first, more, pad):
    alone = kernlog.parse_dmesg(prefix[0] + first)
    if first == SPLIT[0]:
        assume(not any(line.startswith(("NVRM: fallen", "NVRM: The")) or "fallen off the bus" in line
                       for line in more))  # the driver's own head: its continuation is its tail
    assert kernlog.parse_dmesg(printed(prefix[0], "\n".join([first] + more), pad)) == alone


@given(st.sampled_from(PREFIXES), st.sampled_from(USER_RECORDS), user_lines, separator)
@PROPS
def test_property_a_users_text_with_embedded_newlines_never_yields_an_event(prefix, record, lines, sep):
    wrapper, expected = record
    message = wrapper % sep.join(lines)
    found = kernlog.parse_dmesg(printed(prefix[0], message))
    assert [(e.kind, e.xid, e.pci_bus_id) for e in found] == expected, message
