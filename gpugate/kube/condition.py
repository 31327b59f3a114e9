"""The GpugateHealthy condition on a Node, as node-problem-detector writes
its own: a status (True: fit; False: unfit; Unknown: gpugate could not
tell), a CamelCase reason a `kubectl describe node` reader and an alert
rule can match (``XidFallenOffBus``, ``DriverDrift``, ``AwaitingRepair``),
the message gpugate's precise reason text, and lastHeartbeatTime refreshed
on every health check, so a dead agent shows as a stale heartbeat, never
as a fit node for ever.  Pure functions."""

from __future__ import annotations

import re

from gpugate.model import reason as reasons
from gpugate.model.findings import PROBE, RMA, ROLLOUT

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Optional, Tuple

CONDITION = "GpugateHealthy"
REASON_MAX = 128  # the API server's own limit on a condition's reason is 1024; NPD's readers expect short words
REASON_RE = re.compile(r"[A-Z][A-Za-z0-9]*\Z")

FIT = "Fit"
FIT_HELD = "FitHeld"  # fit now, held by gpugate until the sweep proves it
AWAITING_REPAIR = "AwaitingRepair"  # the sweep escalated it (rma): a human must look
SWEEP = "SweepInProgress"  # the sweep's work reason (sweep=reset, sweep=reboot, ...)
ROLLOUT_REASON = "RolloutInProgress"

# The Xids an operator knows by name (NVIDIA's Xid catalog); any other reads XidError.
_XIDS = {48: "XidDoubleBitEcc", 63: "XidRowRemapPending", 64: "XidRowRemapFailure", 74: "XidNvlinkError",
         79: "XidFallenOffBus", 92: "XidHighSbeRate", 94: "XidContainedEcc", 95: "XidUncontainedEcc",
         119: "XidGspTimeout", 154: "XidRecoveryAction"}
# Components whose CamelCase word alone would read badly.
_WORDS = {"fallen_off_bus": "GpuFallenOffBus", "sxid": "NvswitchXid", "ecc": "Ecc", "nvml": "Nvml",
          "gpus_lost": "GpusLost", "dcgm_health": "DcgmHealth", "dcgm_diag": "DcgmDiag"}
# What follows the component's word, by class ("driver" + "Drift").
# (No rma or rollout entry: those reasons read AwaitingRepair and RolloutInProgress before this.)
_SUFFIX = {"health": "Fault", "broken": "Broken", "drift": "Drift", PROBE: "Unknown"}


def _camel(text: str) -> str:
    words = [w for w in re.split(r"[^A-Za-z0-9]+", str(text)) if w]
    out = "".join(w[:1].upper() + w[1:] for w in words)
    out = out.lstrip("0123456789")  # a reason starts with a letter
    return out[:1].upper() + out[1:]


def _xid(observed: str) -> str:
    digits = re.match(r"\s*([0-9]{1,6})", observed or "")
    return _XIDS.get(int(digits.group(1)), "XidError") if digits else "XidError"


def reason_word(fit: bool, parsed, cls: str = "") -> str:
    """The condition's reason: CamelCase, at most REASON_MAX characters.
    ``parsed``: the verdict's reason (unfit) or the hold's (fit but held),
    read back with gpugate.model.reason.parse (None: not gpugate's, or none)."""
    if parsed is not None and (parsed.cls == RMA or any(f.component == "rma" for f in parsed.findings)):
        return AWAITING_REPAIR
    if parsed is not None and parsed.findings and parsed.findings[0].component == "sweep":
        return SWEEP
    if parsed is not None and parsed.cls == ROLLOUT:
        return ROLLOUT_REASON
    if fit:
        return FIT_HELD if parsed is not None else FIT
    cls = parsed.cls if parsed is not None else cls
    first = parsed.first if parsed is not None else None
    if first is None:
        word = ""
    elif first.component == "xid":
        return _xid(first.observed)
    else:
        word = _WORDS.get(first.component) or _camel(first.component)
    word = (word + _SUFFIX.get(cls, "Unknown")) if word else (_camel(cls) or "Unfit")
    return word[:REASON_MAX]


def wanted(fit: bool, cls: str, reason: str, tag: str, held: str = "", pending: str = "") -> Tuple[str, str, str]:
    """(status, reason, message): the message gpugate's reason text (when
    fit but still held, what holds it; when fit, what is pending: still on
    [previous] during a rollout).  "Could not tell" (the probe class) is
    Unknown, never False."""
    if fit:
        message = ("fit now; held by gpugate until the sweep proves it: " + held) if held else "fit"
        if pending:
            message += "; pending, rollout in progress: " + pending
        return "True", reason_word(True, reasons.parse(held, tag) if held else None), message
    status = "Unknown" if cls == PROBE else "False"
    return status, reason_word(False, reasons.parse(reason, tag), cls), reason


def not_run(why: str) -> Tuple[str, str, str]:
    """The health check did not run (or did not end): gpugate cannot tell."""
    return "Unknown", "HealthCheckNotRun", ("gpugate's health check did not run: " + why)[:1024]


def current(node: Dict[str, Any]) -> Dict[str, Any]:
    """The Node's GpugateHealthy condition as read, or {}."""
    for cond in (node.get("status") or {}).get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == CONDITION:
            return cond
    return {}


def patch(node: Optional[Dict[str, Any]], want: Tuple[str, str, str], now_iso: str) -> Dict[str, Any]:
    """The strategic-merge status patch that sets GpugateHealthy, written
    on every run (its heartbeat).  ``node``: the Node as read, for the
    transition time; None when it was not read (the fit run's one write):
    then the patch names no lastTransitionTime and the server keeps the
    one there (the caller adds it when the Node had none)."""
    status, reason, message = want
    cond = {"type": CONDITION, "status": status, "reason": reason, "message": message[:1024],
            "lastHeartbeatTime": now_iso}
    if node is not None:
        old = current(node)
        moved = old.get("status") != status or not old.get("lastTransitionTime")
        cond["lastTransitionTime"] = now_iso if moved else old["lastTransitionTime"]
    return {"status": {"conditions": [cond]}}
