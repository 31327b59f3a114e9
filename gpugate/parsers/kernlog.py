"""Find GPU events in kernel log text (/dev/kmsg records, dmesg, journal):
NVIDIA's Xids (MIG-attributed ones too), NVSwitch SXids, and "GPU has fallen
off the bus" in its one-line and its split form; AMD's amdgpu events
(gpugate.vendors.amd.parse_kernlog, loaded on the first amdgpu record) as
XidEvent(kind="amdgpu").

The kernel log is long and noisy: a line we cannot read is skipped, never fatal,
so one odd record cannot hide the event after it.

Only the kernel's own records are events, read as the drivers print them: a
/dev/kmsg record of facility 0 (the kernel gives every record written to
/dev/kmsg from user space a user-space facility, LOG_USER when none is named:
devkmsg_write), whose message *starts* with "NVRM: ", "nvidia-nvswitchN: " or
amdgpu's "amdgpu 0000:BB:DD.F: ".
Other subsystems log text a job's user chooses at kernel facility ("tmpfs:
Unknown parameter 'NVRM: Xid (...): 79'", "process '/tmp/NVRM: Xid ...'
launched ... with NULL argv"): matched anywhere in the message, that drained
healthy nodes (issue 24).  Plain dmesg/journal lines lose only the prefixes
those tools print (time, "host kernel: ", dmesg -x's facility) before the same
anchored match; a line they name a user-space facility or identifier for is
not the kernel's.
"""

from __future__ import annotations

from gpugate.model.facts import XidEvent
from gpugate.core.lazyre import ASCII, IGNORECASE, Lazy
from gpugate.core.record import replace

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Optional, Tuple

_BUS = r"(?:PCI:)?(?:(?P<domain>[0-9a-f]{1,8}):)?(?P<bus>[0-9a-f]{2}):(?P<dev>[0-9a-f]{2})(?:\.[0-9a-f])?"
# "NVRM: Xid (PCI:0000:38:00): 79, pid=..., name=..., text"; older drivers omit
# "PCI:" and sometimes the domain; a few print the function (".0").  On a MIG
# GPU the driver adds the instances: "(PCI:0000:01:00 GPU-I:05 GPU-CI:01)"
# (open-gpu-kernel-modules' Xid format; NVIDIA's A100 memory-error guide).
_XID = Lazy(
    r"NVRM: Xid \(" + _BUS + r"(?P<mig>(?:[ \t]+GPU-C?I:[0-9]{1,4}){1,2})?"
    r"\):[ \t]*(?P<xid>[0-9]{1,9})\b(?P<rest>[^\n]*)",
    IGNORECASE,
)
# "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up"; the
# driver follows it with "..., Severity 1 Engine instance ..." and "..., Data {...}"
# lines for the same event (Fabric Manager user guide; gpud's captured lines).
_SXID = Lazy(
    r"(?P<switch>nvidia-nvswitch[0-9]{1,4}): SXid \(" + _BUS + r"\):[ \t]*(?P<xid>[0-9]{1,9})\b(?P<rest>[^\n]*)",
    IGNORECASE,
)
_SXID_MORE = Lazy(r"^(?:Severity [0-9]|Data \{)", IGNORECASE)
# "NVRM: GPU 0000:29:00.0: GPU has fallen off the bus."
_OFF_BUS = Lazy(r"NVRM: GPU " + _BUS + r": GPU has fallen off the bus", IGNORECASE)
# Split over records: "NVRM: The NVIDIA GPU 0000:18:00.0" / "NVRM: (PCI ID: 10de:20b0)
# installed in this system has" / "NVRM: fallen off the bus and is not responding to commands."
_OFF_BUS_HEAD = Lazy(r"NVRM: The NVIDIA GPU " + _BUS + r"(?P<rest>[^\n]*)", IGNORECASE)
_OFF_BUS_TAIL = "fallen off the bus and is not responding"
_SPLIT_RECORDS = 4  # the tail comes within this many records of the head
# /dev/kmsg record: "PRI,SEQ,TS_USEC,FLAGS[,more];MESSAGE" (read by
# kmsg_record, without a regular expression: it runs on every record).
_DIGITS = frozenset("0123456789")
# dmesg --time-format=iso "2025-01-21T04:41:44,283302+00:00"; journal short-iso "...+0000".
_ISO = Lazy(
    r"\b(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?(Z|[+-]\d{2}:?\d{2})(?=\s|$)",
    ASCII,
)
_LEADING_COMMA = Lazy(r"^[ \t]*,")
# What dmesg and journalctl print before a kernel message (parse_dmesg): the
# message after it is matched from its start, as a /dev/kmsg message is.
_PLAIN_PREFIX = Lazy(
    r"(?:<(?P<pri>[0-9]{1,10})>)?"  # dmesg --raw: "<4>"
    r"(?:(?P<facility>[a-z][a-z0-9]{1,8}) *:[a-z]{1,8} *: )?"  # dmesg --decode: "kern  :warn  : "
    r"(?:(?P<time>\[(?!drm[:\]])[^\]\n]{0,64}\]"  # dmesg "[  123.456789]", -T, --reltime, -d; journal short-monotonic
    # (a DRM message's own "[drm] ", "[drm:FUNCTION] " of a built-in driver, is never a time)
    r"|[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.,]{8,20}(?:Z|[+-][0-9]{2}:?[0-9]{2})?"  # dmesg iso, journal short-iso
    r"|(?:[A-Z][a-z]{2} )?[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9:.]{8,20}(?: [A-Za-z0-9+-]{1,8})?"  # journal short-full
    r"|[A-Z][a-z]{2} [ 0-9][0-9] [0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?"  # journal short(-precise), syslog
    r"|[0-9]{1,12}\.[0-9]{1,9}"  # journal short-unix
    r") {1,2})?"
    r"(?:(?:[^\s]{1,253} )?kernel: )?"  # journal and syslog: "HOST kernel: " (another identifier is user space)
    r"(?:\[[ 0-9.]{1,32}\] )?",  # syslog's copy of the kernel's time: "kernel: [  123.456] "
)


def _bus_id(match) -> str:
    domain = int(match.group("domain") or "0", 16)
    return "%04x:%s:%s" % (domain, match.group("bus").lower(), match.group("dev").lower())


def _rest(match) -> str:
    return _LEADING_COMMA.sub("", match.group("rest")).strip()  # drop the ", " after the number


def _nvrm(message: str) -> bool:
    return message[:5].lower() == "nvrm:"  # most messages: no pattern to run (or compile)


# amdgpu's records start with one of these (gpugate.vendors.amd.parse_kernlog.HEADS,
# kept equal by a test): the AMD patterns load only once one is seen.
_AMD_HEADS = ("amdgpu ", "amdgpu:", "[drm:amdgpu_", "[drm] VRAM is lost")


def parse_amdgpu_message(message: str) -> Optional[XidEvent]:
    """The amdgpu event (kind "amdgpu") a kernel message starts with, or None."""
    if not message.startswith(_AMD_HEADS):
        return None
    from gpugate.vendors.amd.parse_kernlog import parse_message  # an AMD node's: NVIDIA's prolog never loads it

    return parse_message(message)


def parse_xid_message(message: str) -> Optional[XidEvent]:
    """The Xid a kernel message (a /dev/kmsg record's, or kernel_message's) starts
    with, or None when it is not an Xid report."""
    if not _nvrm(message):
        return None
    match = _XID.match(message)
    if not match:
        return None
    mig = " ".join((match.group("mig") or "").split())
    return XidEvent(xid=int(match.group("xid")), pci_bus_id=_bus_id(match), text=_rest(match), where=mig)


def parse_sxid_message(message: str) -> Optional[XidEvent]:
    """The NVSwitch SXid a kernel message starts with; None for other messages and
    for the "Severity"/"Data" lines that continue an SXid already reported."""
    if "SXid" not in message:
        return None
    match = _SXID.match(message)
    if not match or _SXID_MORE.search(_rest(match)):
        return None
    return XidEvent(xid=int(match.group("xid")), pci_bus_id=_bus_id(match), text=_rest(match), kind="sxid",
                    where=match.group("switch").lower())


class Scanner:
    """Reads kernel messages in log order (of facility 0 only, without a tool's
    prefix: kernel_message); joins the split "fallen off the bus" records."""

    def __init__(self) -> None:
        self._head = None  # (bus id, records since)

    def feed(self, message: str) -> Optional[XidEvent]:
        event = parse_xid_message(message) or parse_sxid_message(message)
        if event is not None:
            return event
        if not _nvrm(message):
            return parse_amdgpu_message(message)
        match = _OFF_BUS.match(message)
        if match:
            return XidEvent(xid=79, pci_bus_id=_bus_id(match), text="GPU has fallen off the bus.",
                            kind="fallen_off_bus")
        match = _OFF_BUS_HEAD.match(message)
        if match:
            self._head = (_bus_id(match), 0)
            # One record: its three lines in one message (dmesg's continuation lines joined, or
            # /dev/kmsg's "\x0a"), or printed as one line by some tools.
            tail = _OFF_BUS_TAIL in message[match.start("rest"):]
        else:
            tail = message[6:].startswith(_OFF_BUS_TAIL)  # a record of its own: "NVRM: fallen off ..."
        if self._head is None:
            return None
        bus, since = self._head
        if tail:
            self._head = None
            return XidEvent(xid=79, pci_bus_id=bus, text="fallen off the bus and is not responding to commands.",
                            kind="fallen_off_bus")
        self._head = (bus, since + 1) if since + 1 < _SPLIT_RECORDS else None
        return None


def parse_kmsg(text: str, boot_time: Optional[float]) -> Tuple[XidEvent, ...]:
    """Events in /dev/kmsg records of the kernel's facility; timestamp =
    boot_time + TS_USEC when boot_time is known."""
    events, scanner = [], Scanner()
    for line in text.split("\n"):  # records end at "\n" only: not at a user's U+2028 in a file's text
        record = kmsg_record(line)  # continuation lines (" KEY=value") are none
        event = scanner.feed(record[3]) if record and kernel_facility(record[0]) else None
        if event is None:
            continue
        timestamp = None if boot_time is None else boot_time + int(record[2]) / 1e6
        events.append(replace(event, seq=int(record[1]), timestamp=timestamp))
    return tuple(events)


def kmsg_record(line: str) -> Optional[Tuple[str, str, str, str]]:
    """(PRI, SEQ, TS_USEC, MESSAGE) of a /dev/kmsg record line, or None: what
    ^([0-9]{1,10}),([0-9]{1,20}),([0-9]{1,20}),[^;]*;(.*)$ matches."""
    head, semicolon, message = line.partition(";")
    if message.endswith("\n"):
        message = message[:-1]  # "$" matches before a final newline
    if not semicolon or "\n" in message:
        return None
    fields = head.split(",", 3)
    if len(fields) < 4:
        return None
    pri, seq, usec = fields[0], fields[1], fields[2]
    for value, most in ((pri, 10), (seq, 20), (usec, 20)):
        if not 0 < len(value) <= most or not _DIGITS.issuperset(value):
            return None
    return pri, seq, usec, message


def kernel_facility(pri: str) -> bool:
    """Is a record's PRI (facility << 3 | level) the kernel's, facility 0?"""
    return int(pri) >> 3 == 0


def kernel_message(line: str) -> Optional[Tuple[str, str]]:
    """(the prefix dmesg or journalctl printed, the kernel's message) of a plain
    text line, or None when the prefix names a user-space facility or identifier."""
    match = _PLAIN_PREFIX.match(line)
    if match.group("pri") is not None and not kernel_facility(match.group("pri")):
        return None
    if match.group("facility") not in (None, "kern"):
        return None
    return line[:match.end()], line[match.end():]


def _iso_epoch(line: str) -> Optional[float]:
    # Without a zone we cannot place the time; an impossible date is "unknown" too.
    match = _ISO.search(line)
    if not match:
        return None
    from datetime import datetime, timedelta, timezone  # dmesg and journal text only, not /dev/kmsg
    year, month, day, hour, minute, second, frac, zone = match.groups()
    try:
        if zone == "Z":
            tz = timezone.utc
        else:
            sign = -1 if zone[0] == "-" else 1
            hours, minutes = int(zone[1:3]), int(zone[-2:])
            tz = timezone(sign * timedelta(hours=hours, minutes=minutes))
        moment = datetime(int(year), int(month), int(day), int(hour), int(minute), int(second), tzinfo=tz)
        seconds = moment.timestamp()
    except (ValueError, OverflowError):
        return None
    return seconds + (int(frac) / 10 ** len(frac) if frac else 0.0)


def _amd_line(line: str) -> bool:
    return "amdgpu" in line or "VRAM is lost" in line


def parse_dmesg(text: str) -> Tuple[XidEvent, ...]:
    """Events in plain dmesg/journal lines; timestamp only from an ISO time with a zone.

    A kernel record's message may hold newlines (NVIDIA's "fallen off the bus"
    is one record of three lines; a user's text can hold them too): dmesg and
    journalctl print its further lines indented under the first, so an
    indented line is read as part of the record above it, never as a record
    of its own.  Lines end at "\n" only, as records do (a user's U+2028 or
    form feed, printed raw, ends no line)."""
    events, scanner = [], Scanner()
    for line, more in _records(text):
        if not ("NVRM" in line.upper() or "SXid" in line or _amd_line(line)):
            continue  # a continuation never makes its record the driver's: the match runs from its start
        parts = kernel_message(line)
        event = scanner.feed(parts[1] + "".join("\n" + part for part in more)) if parts else None
        if event is not None:
            events.append(replace(event, timestamp=_iso_epoch(parts[0])))
    return tuple(events)


def _records(text: str):
    """(first line, its continuation lines stripped) for each record of dmesg's
    or journalctl's text; an indented line before any record is dropped."""
    first, more = None, []
    for line in text.split("\n"):
        line = line[:-1] if line.endswith("\r") else line
        if line[:1] in (" ", "\t"):
            more.append(line.strip())
            continue
        if first is not None:
            yield first, more
        first, more = line, []
    if first is not None:
        yield first, more
