"""amdgpu events in kernel messages (docs/explanation/amd-design.md section 4).

gpugate.parsers.kernlog.Scanner hands this module a kernel message (of
facility 0, without dmesg's or journalctl's prefix) only when it starts
``amdgpu `` / ``amdgpu:`` / ``[drm:amdgpu_`` / ``[drm] VRAM is lost``: the
module is imported, and its patterns compiled, on the first such record, so an
NVIDIA node's prolog pays nothing for it.

The driver prints through dev_*() on its PCI device, so its messages start
``amdgpu 0000:BB:DD.F: ``; kernels up to 6.x add the driver's dev_fmt
``amdgpu: `` (7.0 does not), RAS messages an event id ``{N}``, and some a DRM
prefix (``[drm] ``, ``[drm:FUNCTION [amdgpu]] *ERROR* ``, built in ``[drm:FUNCTION] *ERROR* ``).
That anchor, then exactly one of the bodies below, is matched from the start of
the message.  amdgpu prints a job's own text inside its records ("Process
information: process NAME pid ...", " Process NAME pid ..."): no body is
preceded by ``.*``, so the name of a job called "GPU reset(1) failed" never
starts an event.

Bodies, each a driver format string (the design's table cites the sources);
``where`` is the event name, then ":" and what it names; xid the count the
line reports, 1 when it reports none:

- ``ue:``/``ce:``/``de:BLOCK``, xid N: ``[socket: S, die: D[,] ]N [new ]``
  ``uncorrectable|correctable|deferred hardware errors detected in BLOCK
  block``.  The ``... detected in total in BLOCK block`` line after each
  ``new`` one repeats it as a running total: never counted.
- ``poison:BLOCK``, xid N: the RAS core's ``N new poison consumption detected
  in BLOCK block``; ``poison``: ``poison is consumed by client N, kick off gpu
  reset flow``.
- ``ue_event:SOURCE``: ``uncorrectable hardware error(ERREVENT_ATHUB_INTERRUPT)
  detected!`` (SOURCE "athub").
- ``aca``: ``[Hardware Error]: Accelerator Check Architecture events logged``
  (recorded); each bank's ``aca entry[NN].STATUS=0xS`` (first ACA code:
  ``[Hardware error] ACA[NN/NN].STATUS=0xS``) is ``ue:aca``, ``de:aca`` or
  ``ce:aca`` by the STATUS register's bits (aca_severity): a UC+PCC bank
  drains as a ``ue:`` line does, with or without one after it.
- ``bad_page_threshold``, xid N: ``Saved bad pages N reaches threshold value
  M``, older ``Saved bad pages(N) reaches threshold value(M).``
- ``gpu_reset``: ``GPU reset begin!`` (newer: ``GPU reset begin!. Source:  N``);
  ``reset_ok``: ``GPU reset(N) succeeded!``, ``GPU reset succeeded, trying to
  resume``; ``reset_failed``: ``GPU reset(N) failed``, ``GPU reset end with
  ret = R``, ``GPU Recovery Failed: R``.
- ``ring_timeout:RING``: ``ring RING timeout, signaled seq=A, emitted seq=B``;
  not ``ring RING timeout, but soft recovered`` (the driver recovered it).
  ``ring_reset_failed:RING``: ``Ring RING reset failure`` / ``... failed``.
- ``init_failed``: ``Fatal error during GPU init``; the driver core's
  ``amdgpu: probe of BDF failed with error -22`` (no anchor) and a newer
  driver core's ``probe with driver amdgpu failed with error -22``.
- ``vram_lost``: ``VRAM is lost due to GPU reset!`` (older: ``VRAM is lost!``).
- ``vm_fault:HUB``: a GPU VM page fault of a process (gmc_v9_0.c and later:
  ``[HUB] [retry |no-retry ]page fault (src_id:N ring:N vmid:V pasid:P``,
  then ``, for process ...)`` or the process on the next line; the
  ``VM_L2_PROTECTION_FAULT_STATUS`` lines after it are not events).  The
  application's fault, as NVIDIA's Xid 31: recorded per job and GPU
  (gpugate.judges.apprepeat), never drained on its own.  VM 0 is the
  driver's own (no process): not an application's, not read.

A built-in amdgpu (no module) prints ``[drm:FUNCTION]`` without `` [amdgpu]``:
both forms are read wherever either is.
Without the anchor, only the DRM_ERROR era's ``[drm:amdgpu_...]`` forms
(ring_timeout, reset_failed, vram_lost) and ``[drm] VRAM is lost ...`` count:
they name no device, so their event names the node (``pci_bus_id`` "").
"""

from __future__ import annotations

from gpugate.model.facts import XidEvent
from gpugate.core.lazyre import Lazy

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Optional

# What a message must start with to be handed here (gpugate.parsers.kernlog).
HEADS = ("amdgpu ", "amdgpu:", "[drm:amdgpu_", "[drm] VRAM is lost")
# The event names (the part of ``where`` before ":"); [health] amdgpu_events
# names the ones that drain (gpugate.model.baseline_keys.AMDGPU_EVENTS).
EVENTS = ("ue", "ce", "de", "poison", "ue_event", "aca", "bad_page_threshold", "gpu_reset", "reset_ok",
          "reset_failed", "ring_timeout", "ring_reset_failed", "init_failed", "vram_lost", "vm_fault")
_TEXT = 160  # of the driver's message kept in the event

_BDF = r"(?P<domain>[0-9a-fA-F]{4}):(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})\.[0-7]"
# "[drm:FUNCTION [amdgpu]] ": a built-in amdgpu (no module) prints "[drm:FUNCTION] " (%ps names no module).
_DRM = r"\[drm(?::amdgpu_\w{1,64}(?: \[amdgpu\])?)?\] (?:\*ERROR\* )?"
_ANCHOR = Lazy(r"amdgpu " + _BDF + r": (?:amdgpu: )?(?:" + _DRM + r")?(?:\{\d{1,20}\} ?)?")
_BARE = Lazy(r"\[drm:amdgpu_\w{1,64}(?: \[amdgpu\])?\] \*ERROR\* |\[drm\] (?=VRAM is lost)")
_PROBE = Lazy(r"amdgpu: probe of " + _BDF + r" failed with error (?P<errno>-?\d{1,9})")
_SOCKET = r"(?:socket: \d{1,9}, die: \d{1,9},? )?"
# One alternative per body; the first group that matched names the event.
_BODY = Lazy("|".join((
    _SOCKET + r"(?P<ras>\d{1,20}) (?:new )?(?P<sev>uncorrectable|correctable|deferred) hardware errors"
    r" detected in (?P<block>\w{1,32}) block",
    _SOCKET + r"(?P<consumed>\d{1,20}) new poison consumption detected in (?P<pblock>\w{1,32}) block",
    r"uncorrectable hardware error\((?P<ue_event>\w{1,64})\) detected!",
    r"(?P<aca>\[Hardware (?:Error\]:|error\]) Accelerator Check Architecture events logged)",
    r"\[Hardware (?:Error\]:|error\]) (?:aca entry\[\d{1,4}\]|ACA\[\d{1,4}/\d{1,4}\])"
    r"\.STATUS=0x(?P<aca_status>[0-9a-fA-F]{1,16})\b",
    r"(?P<poison>poison is consumed by client \d{1,9}, kick off gpu reset flow)",
    r"Saved bad pages(?: (?P<pages>\d{1,12})|\((?P<pages_old>\d{1,12})\)) reaches threshold value",
    r"(?P<gpu_reset>GPU reset begin!)",
    r"(?P<reset_ok>GPU reset\(\d{1,12}\) succeeded!|GPU reset succeeded, trying to resume)",
    r"(?P<reset_failed>GPU reset\(\d{1,12}\) failed|GPU reset end with ret = -?\d{1,9}"
    r"|GPU Recovery Failed: -?\d{1,9})",
    r"ring (?P<ring>[\w.-]{1,40}) timeout, signaled seq=\d{1,20}, emitted seq=\d{1,20}",
    r"Ring (?P<ring_reset>[\w.-]{1,40}) reset fail(?:ure|ed)",
    r"(?P<init_failed>Fatal error during GPU init|probe with driver amdgpu failed with error -?\d{1,9})",
    r"(?P<vram_lost>VRAM is lost(?: due to GPU reset)?!)",
    r"\[(?P<hub>[a-z]{1,16}hub[0-9_]{0,4})\] (?:(?:no-)?retry )?page fault \(src_id:\d{1,9} ring:\d{1,9}"
    r" vmid:(?P<vmid>\d{1,9}) pasid:\d{1,12}[,)]",
)))
_SEVERITY = {"uncorrectable": "ue", "correctable": "ce", "deferred": "de"}
_BARE_EVENTS = ("ring_timeout", "reset_failed", "vram_lost")  # the DRM_ERROR era's, without a device


def parse_message(message: str) -> Optional[XidEvent]:
    """The amdgpu event a kernel message reports, or None."""
    bus = ""
    anchor = _ANCHOR.match(message)
    if anchor is not None:
        bus = _bus(anchor)
    else:
        anchor = _BARE.match(message)
        if anchor is None:
            probe = _PROBE.match(message)
            if probe is None:
                return None
            return XidEvent(xid=1, pci_bus_id=_bus(probe), text=message[len("amdgpu: "):][:_TEXT],
                            kind="amdgpu", where="init_failed")
    body = _BODY.match(message, anchor.end())
    if body is None:
        return None
    if body.group("vmid") is not None and int(body.group("vmid")) == 0:
        return None  # the driver's own VM: no process's fault
    where, count = _event(body)
    if not bus and where.split(":")[0] not in _BARE_EVENTS:
        return None
    text = message[anchor.end():].split("\n", 1)[0].strip()  # dmesg's continuation lines are no part of it
    return XidEvent(xid=count, pci_bus_id=bus, text=text[:_TEXT], kind="amdgpu", where=where)


def event_name(where: str) -> str:
    """'ue:umc' -> 'ue'; 'ring_timeout:gfx_0.0.0' -> 'ring_timeout'."""
    return where.split(":", 1)[0]


def aca_severity(status: int) -> str:
    """An ACA bank's event from its STATUS register, as the driver decodes it
    (amdgpu_aca.h: ACA_REG__STATUS__VAL bit 63, UC 61, PCC 57, DEFERRED 44,
    POISON 43; ACA_BANK_ERR_IS_DEFFERED): "ue:aca" for an uncorrected error
    (UC; PCC: the processor context is corrupt), "de:aca" for a deferred or
    poisoned one (deferred even with UC, as ACA_BANK_ERR_UE_DE_DECODE), else
    "ce:aca"; a bank without Val holds no error: "aca", recorded only."""
    if not status >> 63 & 1:
        return "aca"
    if status >> 44 & 1 or status >> 43 & 1:
        return "de:aca"
    return "ue:aca" if status >> 61 & 1 else "ce:aca"


def _bus(match) -> str:
    # gpugate.probes.kernlog.bus_key's form: the GPU index map is keyed by it.
    return "%s:%s:%s" % (match.group("domain").lower(), match.group("bus").lower(), match.group("dev").lower())


def _event(body):
    group = body.group
    if group("ras") is not None:
        return "%s:%s" % (_SEVERITY[group("sev")], group("block").lower()), int(group("ras"))
    if group("consumed") is not None:
        return "poison:%s" % group("pblock").lower(), int(group("consumed"))
    if group("aca_status") is not None:
        return aca_severity(int(group("aca_status"), 16)), 1
    if group("ue_event") is not None:
        source = group("ue_event").upper()
        for affix in ("ERREVENT_", "_INTERRUPT"):
            source = source.replace(affix, "")
        return "ue_event:%s" % (source.lower() or "unknown"), 1
    if group("pages") is not None or group("pages_old") is not None:
        return "bad_page_threshold", int(group("pages") or group("pages_old"))
    if group("ring") is not None:
        return "ring_timeout:%s" % group("ring"), 1
    if group("ring_reset") is not None:
        return "ring_reset_failed:%s" % group("ring_reset"), 1
    if group("hub") is not None:
        return "vm_fault:%s" % group("hub"), 1
    for name in ("aca", "poison", "gpu_reset", "reset_ok", "reset_failed", "init_failed", "vram_lost"):
        if group(name) is not None:
            return name, 1
    raise AssertionError("a body alternative without an event: %r" % body.group(0))  # pragma: no cover
