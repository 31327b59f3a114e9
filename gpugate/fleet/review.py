"""Baseline review: what changes between two baselines and, from the latest
audit, which nodes would drift under the new one before it is pushed."""

import json
from typing import Dict, List, Mapping, Optional, Tuple

from gpugate.model.baseline_keys import PIN_COMPONENTS

AMD_PIN_COMPONENTS = ("amdgpu", "rocm", "amd_smi")  # gpugate.vendors.amd.baseline's (not imported: it loads the schema)
from gpugate.core.record import asdict


def _pin_changes(old, new) -> List[Dict[str, object]]:
    """old/new: Pins or None.  Components, then vbios per product, then
    require_hold, each only when it differs."""
    out = []
    o = asdict(old) if old is not None else {}
    n = asdict(new) if new is not None else {}
    for component in PIN_COMPONENTS:
        if o.get(component) != n.get(component):
            change = {"component": component, "old": o.get(component), "new": n.get(component)}
            if (component == "gsp_firmware" and o.get(component) == o.get("driver")
                    and n.get(component) == n.get("driver")):
                change["note"] = "follows the driver"
            out.append(change)
    for component in AMD_PIN_COMPONENTS:  # only where a side pins it: an NVIDIA baseline's review is as before
        if o.get(component) != n.get(component):
            out.append({"component": component, "old": o.get(component), "new": n.get(component)})
    for table in ("vbios", "ifwi", "amdgpu_firmware"):  # per product
        ov, nv = o.get(table) or {}, n.get(table) or {}
        for product in sorted(set(ov) | set(nv)):
            if ov.get(product) != nv.get(product):
                out.append({"component": "%s[%s]" % (table, product), "old": ov.get(product), "new": nv.get(product)})
    if bool(o.get("require_hold")) != bool(n.get("require_hold")) and (old is not None or new is not None):
        out.append({"component": "require_hold", "old": o.get("require_hold", None),
                    "new": n.get("require_hold", None)})
    return out


def _nodeset_changes(old, new) -> List[Dict[str, object]]:
    def table(baseline):
        return {expr: {k: v for k, v in values.items() if v is not None} for expr, values in baseline.nodesets}

    o, n = table(old), table(new)
    out = []
    for expr in [e for e, _ in old.nodesets] + [e for e, _ in new.nodesets if e not in o]:
        if expr not in n:
            out.append({"nodes": expr, "change": "removed", "old": o[expr], "new": None})
        elif expr not in o:
            out.append({"nodes": expr, "change": "added", "old": None, "new": n[expr]})
        elif o[expr] != n[expr]:
            out.append({"nodes": expr, "change": "changed", "old": o[expr], "new": n[expr]})
    return out


def _flat(policy) -> Dict[str, object]:
    out: Dict[str, object] = {}
    for key, value in asdict(policy).items():
        if isinstance(value, Mapping):
            for sub, v in value.items():
                out["%s.%s" % (key, sub)] = v
        else:
            out[key] = list(value) if isinstance(value, tuple) else value
    return out


def _health_changes(old, new) -> List[Dict[str, object]]:
    o, n = _flat(old.health), _flat(new.health)
    keys = list(o) + sorted(k for k in n if k not in o)
    return [{"key": k, "old": o.get(k), "new": n.get(k)} for k in keys if o.get(k) != n.get(k)]


def _drift(audit_fleet, baseline) -> Tuple[Dict[str, Dict[str, object]], Dict[str, object]]:
    """Per component: the nodes the audit marks DRIFT under this baseline;
    and the union over components."""
    from gpugate.fleet.audit import DRIFT, fold, hostlist

    audit = fold(audit_fleet, baseline)
    per: Dict[str, set] = {}
    for row in audit.rows:
        if row.status == DRIFT:
            per.setdefault(row.component, set()).update(row.nodes)
    every = set().union(*per.values()) if per else set()
    return ({c: {"count": len(nodes), "nodes": hostlist(nodes)} for c, nodes in per.items()},
            {"count": len(every), "nodes": hostlist(every)})


def diff(old, new, audit_fleet: Optional[Mapping[str, object]]) -> dict:
    """What changes from baseline ``old`` to ``new`` and, given the latest
    audit's facts (node -> facts JSON, or a string for an unreachable node),
    which nodes would drift under each.  Without an audit the predictions
    are None."""
    out = {
        "pin": _pin_changes(old.pin, new.pin),
        "previous": _pin_changes(old.previous, new.previous),
        "rollout": {"old": bool(old.rollout_in_progress), "new": bool(new.rollout_in_progress)},
        "nodesets": _nodeset_changes(old, new),
        "health": _health_changes(old, new),
        "would_drift": None, "would_drift_total": None,
        "would_drift_now": None, "would_drift_now_total": None,
        "unreachable": None,
    }
    if audit_fleet is not None:
        from gpugate.fleet.audit import hostlist

        out["would_drift"], out["would_drift_total"] = _drift(audit_fleet, new)
        out["would_drift_now"], out["would_drift_now_total"] = _drift(audit_fleet, old)
        out["unreachable"] = hostlist([n for n, f in audit_fleet.items() if not isinstance(f, Mapping)])
    return out


def _show(value) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _shape_text(values) -> str:
    if values is None:
        return "(none)"
    return " ".join("%s=%s" % (k, _show(v)) for k, v in values.items()) or "(empty)"


def _drift_lines(per: Mapping[str, Mapping[str, object]]) -> List[str]:
    from gpugate.fleet.audit import GPU_COMPONENTS, NODE_COMPONENTS

    order = {c: i for i, c in enumerate(NODE_COMPONENTS + GPU_COMPONENTS)}
    width = max([len(c) for c in per] + [8])
    return ["  %-*s %6d  %s" % (width, c, per[c]["count"], per[c]["nodes"])
            for c in sorted(per, key=lambda c: (order.get(c, 99), c))]


def diff_text(d: Mapping) -> str:
    """The diff for a terminal."""
    rows: List[Tuple[str, str]] = []
    for block in ("pin", "previous"):
        for ch in d.get(block) or ():
            note = "  (%s)" % ch["note"] if ch.get("note") else ""
            rows.append(("%s.%s" % (block, ch["component"]), "%s -> %s%s" % (_show(ch["old"]), _show(ch["new"]), note)))
    rollout = d.get("rollout") or {}
    if rollout.get("old") != rollout.get("new"):
        rows.append(("rollout.in_progress", "%s -> %s" % (_show(rollout.get("old")), _show(rollout.get("new")))))
    for ch in d.get("nodesets") or ():
        label = "nodes.%s" % json.dumps(ch["nodes"])
        if ch["change"] == "added":
            rows.append((label, "added: %s" % _shape_text(ch["new"])))
        elif ch["change"] == "removed":
            rows.append((label, "removed (was: %s)" % _shape_text(ch["old"])))
        else:
            rows.append((label, "%s -> %s" % (_shape_text(ch["old"]), _shape_text(ch["new"]))))
    for ch in d.get("health") or ():
        rows.append(("health.%s" % ch["key"], "%s -> %s" % (_show(ch["old"]), _show(ch["new"]))))
    lines = []
    if rows:
        width = max(len(label) for label, _ in rows)
        lines += ["%-*s  %s" % (width, label, text) for label, text in rows]
    else:
        lines.append("The two baselines are the same.")
    if d.get("would_drift") is None:
        return "\n".join(lines)
    lines.append("")
    total, now = d.get("would_drift_total") or {}, d.get("would_drift_now_total") or {}
    if d["would_drift"]:
        lines.append("Under the new baseline %d node%s would drift:" % (total.get("count", 0),
                                                                        "" if total.get("count") == 1 else "s"))
        lines += _drift_lines(d["would_drift"])
    else:
        lines.append("Under the new baseline no node would drift.")
    if d.get("would_drift_now"):
        count = now.get("count", 0)
        lines.append("(now: %d node%s drift%s under the old baseline)" % (count, "" if count == 1 else "s",
                                                                         "s" if count == 1 else ""))
        lines += ["  " + line for line in _drift_lines(d["would_drift_now"])]
    else:
        lines.append("(now: 0 nodes drift)")
    if d.get("unreachable") and d["unreachable"] != "-":
        lines.append("Unreachable in the latest audit (not predicted): %s" % d["unreachable"])
    return "\n".join(lines)
