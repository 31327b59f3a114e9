"""InfiniBand/RoCE HCAs: pure judges of /sys/class/infiniband facts.

Two kinds, as for GPUs (judges.lost): what the nodeset's [hca] table says
(count, rate, link layer) and the [pin] firmware come from a file, so a
mismatch is budgeted; what this very node showed before and lost (a port it
had ACTIVE, an error counter growing faster than [health] ib_counter_max
allows between two health checks) is an intrinsic event and acute.  The
node's own history is kept in the health-check record (``next_state``)."""

from __future__ import annotations

from gpugate.model.facts import failed
from gpugate.model.findings import DRIFT, HEALTH, INVESTIGATE, PENDING, RECONVERGE, REBOOT, Finding
from gpugate.judges.common import probe_finding

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Dict, List, Optional

UP = ("ACTIVE", "LinkUp")


def port_id(hca, port) -> str:
    return "%s/%d" % (hca.name, port.port)


def _ports(hcas):
    for hca in hcas:
        for port in hca.ports:
            if not failed(port):
                yield hca, port


def _is_up(port) -> bool:
    return (port.state, port.phys_state) == UP


def _show(port) -> str:
    return "%s/%s" % tuple(v.kind if failed(v) else v for v in (port.state, port.phys_state))


def _fmt(value) -> str:
    return "%g" % value if isinstance(value, float) else str(value)


def judge(baseline, expect, facts) -> List[Finding]:
    """What the baseline says: firmware per HCA type, and the nodeset's fabric."""
    hcas = facts.hcas
    if hcas is None:
        return []  # not read in this mode
    if failed(hcas):
        return [probe_finding("hca", hcas)]
    out: List[Finding] = []
    for hca in hcas:
        for value in (hca.hca_type, hca.fw_ver):
            if failed(value):
                out.append(probe_finding("hca", value))
        for port in hca.ports:
            if failed(port):
                out.append(probe_finding("hca", port))
            else:
                out += [probe_finding("hca", v) for v in (port.state, port.phys_state) if failed(v)]
    out += _firmware(baseline, hcas)
    want = expect.hca or {}
    if not want:
        return out
    types = want.get("types")
    fabric = [h for h in hcas if not types or h.hca_type in types]
    count = want.get("count")
    if count is not None and len(fabric) != count:
        out.append(Finding(HEALTH, "hca_count", str(len(fabric)), str(count), INVESTIGATE,
                           detail="HCAs%s: %s" % (" of type " + ",".join(types) if types else "",
                                                   " ".join(h.name for h in fabric) or "none")))
    for hca, port in _ports(fabric):
        if failed(port.state) or failed(port.phys_state):
            continue
        where = port_id(hca, port)
        if not _is_up(port):
            out.append(Finding(HEALTH, "hca_port", "%s %s" % (where, _show(port)), "ACTIVE/LinkUp", INVESTIGATE))
            continue
        rate, layer = want.get("rate"), want.get("link_layer")
        # What the nodeset pins must be read: an unreadable value is a probe finding, never a match.
        out += [probe_finding("hca", v) for pinned, v in ((rate, port.rate), (layer, port.link_layer))
                if pinned is not None and failed(v)]
        if rate is not None and not failed(port.rate) and port.rate != rate:
            out.append(Finding(HEALTH, "hca_rate", "%s %sGb/s" % (where, _fmt(port.rate)),
                               "%sGb/s" % _fmt(float(rate)), INVESTIGATE))
        if layer is not None and not failed(port.link_layer) and port.link_layer != layer:
            out.append(Finding(HEALTH, "hca_link_layer", "%s %s" % (where, port.link_layer), layer, INVESTIGATE))
    return out


def _firmware(baseline, hcas) -> List[Finding]:
    """One finding per HCA type and firmware off the pin (a fleet's flash
    moves every HCA of a type), the HCAs named in the detail."""
    groups: Dict[tuple, list] = {}
    for hca in hcas:
        want = baseline.pin.hca_firmware.get(hca.hca_type) if isinstance(hca.hca_type, str) else None
        if want is not None and not failed(hca.fw_ver) and hca.fw_ver != want:
            groups.setdefault((hca.hca_type, hca.fw_ver, want), []).append(hca.name)
    prev = baseline.previous
    out = []
    for (kind, fw, want), names in sorted(groups.items()):
        pending = baseline.rollout_in_progress and prev is not None and prev.hca_firmware.get(kind) == fw
        out.append(Finding(PENDING if pending else DRIFT, "hca_firmware", "%s %s" % (kind, fw), want, RECONVERGE,
                           detail="HCAs %s" % ",".join(names)))
    return out


def judge_history(last: Optional[dict], facts, counter_max: Dict[str, int]) -> List[Finding]:
    """Acute: ports this node had ACTIVE (since its boot) that are now down
    or gone, and error counters that grew more than allowed since the last
    health check.  No history (first run, new boot) judges nothing."""
    hcas = facts.hcas
    if not isinstance(last, dict) or hcas is None or failed(hcas) or last.get("boot_id") != facts.boot_id:
        return []
    now = {port_id(h, p): p for h, p in _ports(hcas)}
    out: List[Finding] = []
    for where in sorted(last.get("active") or ()):
        port = now.get(where)
        if port is None:
            out.append(Finding(HEALTH, "ib_port", "%s gone" % where, "ACTIVE/LinkUp as before", REBOOT))
        elif not failed(port.state) and not failed(port.phys_state) and not _is_up(port):
            out.append(Finding(HEALTH, "ib_port", "%s %s" % (where, _show(port)), "ACTIVE/LinkUp as before", REBOOT))
    before = last.get("counters") or {}
    for where, port in sorted(now.items()):
        grown = counter_deltas(before.get(where), port.counters)
        over = [(name, d) for name, d in sorted(grown.items()) if name in counter_max and d > counter_max[name]]
        if over:
            name, delta = max(over, key=lambda x: x[1] - counter_max[x[0]])
            out.append(Finding(HEALTH, "ib_errors", "%s %s +%d" % (where, name, delta),
                               "<= %d per check" % counter_max[name], INVESTIGATE,
                               detail=", ".join("%s +%d" % x for x in over)))
    return out


def counter_deltas(before, now) -> Dict[str, int]:
    """How much each counter grew.  A counter that went backwards (reset,
    driver reload) or that either sample lacks gives no delta: it restarts."""
    if not isinstance(before, dict) or not isinstance(now, dict):
        return {}
    out = {}
    for name, value in now.items():
        old = before.get(name)
        if isinstance(value, int) and isinstance(old, int) and value >= old:
            out[name] = value - old
    return out


def next_state(last: Optional[dict], facts) -> Optional[dict]:
    """What to keep for the next run: the ports seen ACTIVE since boot (a
    port stays there while it is down, so the drain does not lift on the
    next run) and this run's counters."""
    hcas = facts.hcas
    if hcas is None or failed(hcas):
        return last if isinstance(last, dict) and last.get("boot_id") == facts.boot_id else None
    same_boot = isinstance(last, dict) and last.get("boot_id") == facts.boot_id
    active = {port_id(h, p) for h, p in _ports(hcas) if _is_up(p)}
    if same_boot:
        active |= set(last.get("active") or ())
    counters = {port_id(h, p): {k: v for k, v in (p.counters or {}).items() if isinstance(v, int)}
                for h, p in _ports(hcas)}
    return {"boot_id": facts.boot_id if isinstance(facts.boot_id, str) else None,
            "active": sorted(active), "counters": counters}


def supersede(findings: List[Finding]) -> List[Finding]:
    """A port the node lost (acute ib_port) is not reported again as the
    nodeset's (budgeted hca_port)."""
    lost = {f.observed for f in findings if f.component == "ib_port"}
    return [f for f in findings if not (f.component == "hca_port" and f.observed in lost)]


__all__ = ["judge", "judge_history", "next_state", "counter_deltas", "supersede"]
