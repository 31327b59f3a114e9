"""InfiniBand links judged over time: flaps and error rates (the health
check, between two of its runs; the record keeps what this needs).

- **Flap.** A port whose ``link_downed`` counter rose (it went down and
  came back between two checks), or that came back up after this node had
  it up before, flapped.  The port stays suspect, a ``health ib_flap``
  finding, until ``[health] ib_flap_window_seconds`` after its last flap
  (as gpud's sticky flap windows; a new boot forgets it: device names may
  change, and the sweep's reboot is the repair).  A port that is down now
  is judges.hca's ``ib_port``, not a flap.  Budgeted: a leaf switch's
  reboot or a subnet manager's sweep flaps every node behind it at once.
- **Rate.** Each error counter of ``ib_error_rate_max`` is judged per hour
  (NVSentinel: symbol_error above 120/hour) over an interval of at least
  an hour, kept from the first sample: more errors than the limit allows
  for max(the interval, one hour) is a ``health ib_errors`` finding (acute,
  as judges.hca's per-check limit: the node's own counters).  Before the
  hour is over only a count that already spent a whole hour's allowance is
  judged, so a short interval never makes a rate out of two errors.  The
  verdict stands until the next interval is judged.
- **Resets and wraps.** A counter lower than its reference (reboot, driver
  reload, ``perfquery -R``, or a counter that wrapped) restarts that port's
  interval, no alarm; sysfs PortCounters saturate at their width, which
  only stops the count."""

from __future__ import annotations

from gpugate.model.facts import failed
from gpugate.model.findings import HEALTH, INVESTIGATE, Finding
from gpugate.judges.hca import UP, port_id

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Dict, List, Optional, Tuple

HOUR = 3600.0
MAX_PORTS = 64  # ports kept in the record: those seen this run (a node has a handful)


def _ints(counters) -> Dict[str, int]:
    return {k: v for k, v in (counters or {}).items() if isinstance(v, int) and not isinstance(v, bool)}


def _flap(prev: dict, up: bool, counters: Dict[str, int]) -> str:
    """Why this port flapped since the last check, or ""."""
    ref = prev.get("last") or {}
    old, new = ref.get("link_downed"), counters.get("link_downed")
    if up and isinstance(old, int) and isinstance(new, int) and new > old:
        return "link_downed +%d" % (new - old)
    if up and prev.get("seen_up") and prev.get("up") is False:
        return "came back up"
    return ""


def _rates(prev: Optional[dict], counters: Dict[str, int], now: float, limits) -> dict:
    """The port's rate record: reference, and the counters over their limit."""
    ref = (prev or {}).get("ref")
    at = (prev or {}).get("ref_at")
    if (not isinstance(ref, dict) or not isinstance(at, (int, float)) or now < at
            or any(isinstance(ref.get(k), int) and v < ref[k] for k, v in counters.items())):
        return {"ref": counters, "ref_at": now, "over": {}}  # first sample, reset, wrap or clock back
    seconds = now - at
    over = {}
    for name, limit in limits.items():
        if isinstance(counters.get(name), int) and isinstance(ref.get(name), int):
            grown = counters[name] - ref[name]
            if grown > limit * max(seconds, HOUR) / HOUR:
                over[name] = [grown, round(seconds)]
    if seconds >= HOUR:  # the interval is judged: the next starts here
        return {"ref": counters, "ref_at": now, "over": over}
    kept = dict((prev or {}).get("over") or {})
    kept.update(over)  # the last judged interval's verdict stands until this one is judged
    return {"ref": ref, "ref_at": at, "over": kept}


def step(last: Optional[dict], facts, policy, now: float) -> Tuple[List[Finding], Optional[dict]]:
    """(findings, the record to keep).  No HCAs read: the record stays."""
    hcas = facts.hcas
    if hcas is None or failed(hcas):
        return [], last if isinstance(last, dict) else None
    same_boot = isinstance(last, dict) and last.get("boot_id") == facts.boot_id
    ports_before = (last.get("ports") or {}) if same_boot else {}
    flaps = dict((last.get("flaps") or {}) if same_boot else {})
    ports: Dict[str, dict] = {}
    for hca in hcas:
        for port in hca.ports:
            if failed(port) or len(ports) >= MAX_PORTS:
                continue
            where = port_id(hca, port)
            up = (port.state, port.phys_state) == UP
            counters = _ints(port.counters)
            prev = ports_before.get(where) if isinstance(ports_before.get(where), dict) else None
            why = _flap(prev, up, counters) if prev else ""
            if why:
                old = flaps.get(where) or {}
                flaps[where] = {"first": old.get("first", now), "last": now, "count": int(old.get("count", 0)) + 1,
                                "why": why}
            entry = _rates(prev, counters, now, policy.ib_error_rate_max)
            entry.update(last=counters, up=up, seen_up=up or bool(prev and prev.get("seen_up")))
            ports[where] = entry
    window = policy.ib_flap_window_seconds
    flaps = {w: f for w, f in flaps.items() if isinstance(f, dict) and 0 <= now - f.get("last", 0) < window}
    out = [_flap_finding(where, f, window) for where, f in sorted(flaps.items())]
    for where, entry in sorted(ports.items()):
        out += _rate_finding(where, entry["over"], policy.ib_error_rate_max)
    return out, {"boot_id": facts.boot_id if isinstance(facts.boot_id, str) else None, "ports": ports,
                 "flaps": dict(sorted(flaps.items())[:MAX_PORTS])}


def _flap_finding(where: str, flap: dict, window: float) -> Finding:
    count = int(flap.get("count", 1))
    return Finding(HEALTH, "ib_flap", "%s %d flap%s" % (where, count, "" if count == 1 else "s"),
                   "none within %ds" % window, INVESTIGATE,
                   detail="last: %s; a flap keeps the port suspect for ib_flap_window_seconds after it" % flap.get("why"))


def _span(seconds: int) -> str:
    return "within 1h" if seconds < HOUR else "in %.1fh" % (seconds / HOUR)


def _rate_finding(where: str, over: dict, limits) -> List[Finding]:
    rows = [(name, v[0], v[1]) for name, v in sorted(over.items()) if name in limits and isinstance(v, list)]
    if not rows:
        return []
    name = max(rows, key=lambda r: r[1] / max(limits[r[0]], 1e-9))[0]
    # The counts go to the detail: a reason that changed at every check would
    # be written to slurmctld at every check.
    return [Finding(HEALTH, "ib_errors", "%s %s over its rate" % (where, name),
                    "<= %g per hour" % limits[name], INVESTIGATE,
                    detail=", ".join("%s +%d %s" % (n, g, _span(s)) for n, g, s in rows))]


__all__ = ["step"]
