"""Find NVIDIA Xid events in kernel log text (/dev/kmsg records, dmesg, journal).

The kernel log is long and noisy: a line we cannot read is skipped, never fatal,
so one odd record cannot hide the Xid after it.
"""

from __future__ import annotations

import re

from gpugate.facts import XidEvent
from gpugate.lazyre import Lazy

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Optional, Tuple

# "NVRM: Xid (PCI:0000:38:00): 79, pid=..., name=..., text"; older drivers omit
# "PCI:" and sometimes the domain; a few print the function (".0").
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?:(?P<domain>[0-9a-f]{1,8}):)?(?P<bus>[0-9a-f]{2}):(?P<dev>[0-9a-f]{2})"
    r"(?:\.[0-9a-f])?\):[ \t]*(?P<xid>[0-9]{1,9})\b(?P<rest>[^\n]*)",
    re.I,
)
# /dev/kmsg record: "PRI,SEQ,TS_USEC,FLAGS[,more];MESSAGE".
_KMSG = re.compile(r"^([0-9]{1,10}),([0-9]{1,20}),([0-9]{1,20}),[^;]*;(.*)$")
# dmesg --time-format=iso "2025-01-21T04:41:44,283302+00:00"; journal short-iso "...+0000".
_ISO = Lazy(
    r"\b(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?(Z|[+-]\d{2}:?\d{2})(?=\s|$)",
    re.ASCII,
)


def parse_xid_message(message: str) -> Optional[XidEvent]:
    """The Xid in one log line, or None when the line is not an Xid report."""
    match = _XID.search(message)
    if not match:
        return None
    domain = int(match.group("domain") or "0", 16)
    bus_id = "%04x:%s:%s" % (domain, match.group("bus").lower(), match.group("dev").lower())
    text = re.sub(r"^[ \t]*,", "", match.group("rest")).strip()  # drop the ", " after the number
    return XidEvent(xid=int(match.group("xid")), pci_bus_id=bus_id, text=text)


def parse_kmsg(text: str, boot_time: Optional[float]) -> Tuple[XidEvent, ...]:
    """Xids in /dev/kmsg records; timestamp = boot_time + TS_USEC when boot_time is known."""
    events = []
    for line in text.splitlines():
        match = _KMSG.match(line)  # continuation lines (" KEY=value") do not match
        event = parse_xid_message(match.group(4)) if match else None
        if event is None:
            continue
        timestamp = None if boot_time is None else boot_time + int(match.group(3)) / 1e6
        events.append(XidEvent(xid=event.xid, pci_bus_id=event.pci_bus_id, text=event.text,
                               seq=int(match.group(2)), timestamp=timestamp))
    return tuple(events)


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


def parse_dmesg(text: str) -> Tuple[XidEvent, ...]:
    """Xids in plain dmesg/journal lines; timestamp only from an ISO time with a zone."""
    events = []
    for line in text.splitlines():
        event = parse_xid_message(line)
        if event is not None:
            events.append(XidEvent(xid=event.xid, pci_bus_id=event.pci_bus_id, text=event.text,
                                   timestamp=_iso_epoch(line)))
    return tuple(events)
