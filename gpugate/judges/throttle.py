"""Clock events judged by time, not by a sample.

One NVML sample of the clock-event reasons says what a GPU does this very
millisecond: a power brake the facility asserts for two seconds, or a
burst of heat at a job's start, looks the same as a GPU that has been slow
for an hour.  NVML also keeps, per reason, the time the GPU spent slowed
since the driver loaded (field values NVML_FI_DEV_CLOCKS_EVENT_REASON_*,
ns; `nvidia-smi -q`, "Clocks Event Reasons Counters": a real H200 on 580
answers sw_power_cap, sync_boost, sw_thermal, hw_thermal and power_brake).
The health check keeps the last counters in its record and judges the
share of the interval each GPU spent slowed for each reason of
``[health] clock_event_reasons``:

- an interval shorter than ``clock_event_min_seconds`` is not judged: the
  older reference is kept until the interval is long enough (one sample
  never drains), and the last judged interval's verdict stands meanwhile;
- a share above ``clock_event_share_max`` is a ``health clocks`` finding
  naming the reason, the share and the interval;
- a counter that went backwards (reboot, driver reload, GPU reset), a clock
  stepped back, or a GPU not seen before restarts the interval, no alarm.

NVML has no counter for "HW slowdown" itself: it counts its two causes
(HW thermal slowdown and the external power brake), so ``hw_slowdown`` is
judged on their sum (reported only when neither cause is judged over on
its own, so a power brake is named as such).

Budgeted, not acute (gpugate.model.findings.ACUTE): a power brake or a row's
cooling trouble slows every node of the row at once, and an acute finding
would drain them all.  A single node cannot tell "only me" from "the whole
row" without reading the fleet, which the healthy path never does; the
drain budget drains the first few and holds the rest, and the node metric
gpugate_clock_event_over, counted across nodes, tells on-call it is the
room (GpugateClockEventsRoomWide)."""

from __future__ import annotations

from gpugate.model.facts import failed, unchecked
from gpugate.model.findings import HEALTH, INVESTIGATE, Finding
from gpugate.judges.common import probe_finding

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Dict, List, Optional, Tuple

# The counters each judged reason is the time of.
COUNTERS = {"hw_slowdown": ("hw_thermal", "power_brake"), "hw_thermal": ("hw_thermal",),
            "power_brake": ("power_brake",), "sw_thermal": ("sw_thermal",), "sw_power_cap": ("sw_power_cap",)}
MAX_GPUS = 64  # GPUs kept in the record: only those seen this run, so never more than a node has


def _key(gpu) -> str:
    return gpu.uuid if isinstance(gpu.uuid, str) else "index-%d" % gpu.index


def _shares(before: dict, now: dict, reasons, seconds: float) -> Dict[str, float]:
    out = {}
    for reason in reasons:
        names = COUNTERS.get(reason, ())
        if names and all(isinstance(now.get(n), int) and isinstance(before.get(n), int) for n in names):
            slowed = sum(now[n] - before[n] for n in names) / 1e9
            out[reason] = min(max(slowed / seconds, 0.0), 1.0)
    return out


def _over(shares: Dict[str, float], limit: float) -> Dict[str, float]:
    over = {r: s for r, s in shares.items() if s > limit}
    if "hw_slowdown" in over and any(c in over for c in COUNTERS["hw_slowdown"]):
        del over["hw_slowdown"]  # its cause is named on its own
    return over


def _restarted(before: dict, now: dict) -> bool:
    """A counter went backwards (driver reload, reboot, reset) or NVML's
    clock did: the next interval starts from ``now``."""
    if not isinstance(before, dict) or not isinstance(before.get("t"), int) or now["t"] <= before["t"]:
        return True
    return any(isinstance(before.get(n), int) and isinstance(v, int) and v < before[n]
               for n, v in now.items())


def step(last: Optional[dict], facts, policy) -> Tuple[List[Finding], Optional[dict]]:
    """(findings, the record to keep for the next health check)."""
    nvml = facts.nvml
    reasons = tuple(policy.clock_event_reasons)
    if nvml is None or failed(nvml):
        return [], last if isinstance(last, dict) else None
    kept = (last or {}).get("gpus") if isinstance(last, dict) else None
    kept = kept if isinstance(kept, dict) else {}
    out: List[Finding] = []
    state: Dict[str, dict] = {}
    for gpu in nvml.gpus[:MAX_GPUS]:
        now, key = gpu.clock_event_ns, _key(gpu)
        prev = kept.get(key) if isinstance(kept.get(key), dict) else None
        if failed(now):
            if reasons and not unchecked(now):  # unchecked: listed as such (facts.unchecked_facts)
                out.append(probe_finding("clock_event_ns", now, gpu.index))
            if prev is not None:
                state[key] = prev  # the reference stays for when NVML answers again
            continue
        if not isinstance(now, dict) or not isinstance(now.get("t"), int):
            continue  # this GPU or NVML counts none: nothing to judge by time
        counters = {n: v for n, v in now.items() if isinstance(v, int)}
        ref = prev.get("ref") if prev else None
        if ref is None or _restarted(ref, counters):
            state[key] = {"ref": counters, "over": {}, "seconds": 0}
            continue
        seconds = (counters["t"] - ref["t"]) / 1e6
        if seconds < policy.clock_event_min_seconds:
            state[key] = dict(prev)  # too short to judge: the last verdict stands
        else:
            over = _over(_shares(ref, counters, reasons, seconds), policy.clock_event_share_max)
            state[key] = {"ref": counters, "over": {r: round(s, 4) for r, s in over.items()},
                          "seconds": round(seconds)}
        out += _findings(gpu.index, state[key], reasons, policy.clock_event_share_max)
    return out, {"gpus": state}


def _findings(index: int, entry: dict, reasons, limit: float) -> List[Finding]:
    over = {r: s for r, s in (entry.get("over") or {}).items() if r in reasons and isinstance(s, (int, float))}
    if not over:
        return []
    seconds = entry.get("seconds") or 0
    ranked = sorted(over.items(), key=lambda x: (-x[1], x[0]))
    return [Finding(HEALTH, "clocks", "+".join(_share_text(r, s, limit) for r, s in ranked),
                    "<= %g%%" % round(limit * 100, 2), INVESTIGATE, gpu=index,
                    detail="NVML clock-event counters: " + ", ".join(
                        "%s %.0fs slowed in %ds (%d%%)" % (r, s * seconds, seconds, round(s * 100))
                        for r, s in ranked))]


def _share_text(reason: str, share: float, limit: float) -> str:
    """The share in steps of 10 points ("power_brake>=30%"), the exact one in
    the detail: the reason and the published comment change only when the
    finding does, not at every check (each change is a write to slurmctld)."""
    step = int(share * 10) * 10
    if step > limit * 100:
        return "%s>=%d%%" % (reason, step)
    return "%s>%g%%" % (reason, round(limit * 100, 2))


def shares_over(record: Optional[dict]) -> Dict[str, float]:
    """The highest share per reason over this node's GPUs in the last judged
    intervals, for the node metrics (reasons over the limit only)."""
    out: Dict[str, float] = {}
    for entry in ((record or {}).get("gpus") or {}).values():
        for reason, share in ((entry or {}).get("over") or {}).items():
            if reason in COUNTERS and isinstance(share, (int, float)):
                out[reason] = max(out.get(reason, 0.0), float(share))
    return out


__all__ = ["step", "shares_over", "COUNTERS"]
