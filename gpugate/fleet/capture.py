"""Baseline capture and review.  Pure: facts and baselines in, text out.

``capture`` writes a baseline from one known-good node's facts (the runbook's
"populate the pins and the VBIOS from a known-good node"); ``diff`` says what
changes between two baselines and, from the latest audit, which nodes would
drift under the new one before it is pushed to the fleet.
"""

import json
import time
from dataclasses import asdict
from typing import Dict, List, Mapping, Optional, Tuple

from ..baseline import PIN_COMPONENTS, VERSION_RE
from ..errors import ConfigError

# ---------------------------------------------------------------------------
# TOML writing (by hand: the standard library only reads TOML).


def _toml_str(value: str) -> str:
    """A TOML basic string.  JSON's escapes (\\" \\\\ \\b \\f \\n \\r \\t \\uXXXX
    for the other control characters) are TOML's; DEL is the one character
    TOML also wants escaped.  Non-ASCII stays literal: JSON would write
    astral characters as surrogate pairs, which TOML forbids."""
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return _toml_str(str(value))


def _comment(text: str) -> str:
    """One comment line: TOML comments take no control characters."""
    clean = "".join(c if (c == "\t" or (ord(c) >= 32 and c != "\x7f")) else " " for c in str(text))
    return "# " + clean.strip()


# ---------------------------------------------------------------------------
# Reading the facts (the JSON form of NodeFacts).


def _error(value) -> Optional[str]:
    """Why a fact is unusable: an {"error": ...} record or a missing value."""
    if value is None:
        return "not collected"
    if isinstance(value, Mapping) and "error" in value:
        err = value["error"] if isinstance(value["error"], Mapping) else {}
        source, kind = err.get("source") or "probe", err.get("kind") or "error"
        if kind == "nvml":
            return "%s: NVML error %s" % (source, err.get("code"))
        return "%s %s" % (source, kind)
    return None


def _version_or_why(value) -> Tuple[Optional[str], Optional[str]]:
    why = _error(value)
    if why:
        return None, why
    if not isinstance(value, str):
        return None, "not a string (%r)" % (value,)
    if not VERSION_RE.match(value):
        return None, "%s is not a version string a baseline accepts" % json.dumps(value)[:80]
    return value, None


def _capture_pins(facts: Mapping) -> Tuple[Dict[str, str], Dict[str, str], Dict[str, str]]:
    """(pins, vbios per product, why each missing component is left out)."""
    pins: Dict[str, str] = {}
    skipped: Dict[str, str] = {}

    def take(component, value):
        version, why = _version_or_why(value)
        if version is None:
            skipped[component] = why
        else:
            pins[component] = version

    take("kernel", facts.get("kernel_release"))
    nvml = facts.get("nvml")
    nvml_why = _error(nvml)
    gpus: List[Mapping] = []
    if nvml_why or not isinstance(nvml, Mapping):
        for component in ("driver", "cuda_driver", "gsp_firmware", "vbios"):
            skipped[component] = nvml_why or "NVML unreadable"
    else:
        take("driver", nvml.get("driver_version"))
        take("cuda_driver", nvml.get("cuda_driver_version"))
        gpus = [g for g in nvml.get("gpus") or () if isinstance(g, Mapping)]
        _capture_gsp(gpus, pins, skipped)

    packages = facts.get("packages")
    packages_why = _error(packages)
    for role in ("fabricmanager", "container_toolkit"):
        if packages_why or not isinstance(packages, Mapping):
            skipped[role] = "packages: %s" % (packages_why or "unreadable")
            continue
        pkg = packages.get(role)
        if pkg is None:
            skipped[role] = "not installed"
        elif _error(pkg):
            skipped[role] = _error(pkg)
        else:
            take(role, pkg.get("version") if isinstance(pkg, Mapping) else None)
    take("dcgm", facts.get("dcgm_version"))
    image = facts.get("image")
    if _error(image):
        skipped["image"] = "/etc/cluster-image.json: %s" % _error(image) if image is None else _error(image)
    elif not isinstance(image, Mapping) or image.get("version") is None:
        skipped["image"] = "the image record has no version"
    else:
        take("image", image.get("version"))

    fm, driver = pins.get("fabricmanager"), pins.get("driver")
    if fm and driver and fm != driver:
        raise ConfigError("%s: fabricmanager %s differs from driver %s (Fabric Manager only runs with the "
                          "driver of the same version): not a good reference node"
                          % (facts.get("node") or "node", fm, driver))
    vbios = _capture_vbios(facts, gpus, skipped) if gpus else {}
    return pins, vbios, skipped


def _capture_gsp(gpus, pins, skipped) -> None:
    values = {}
    for gpu in gpus:
        value = gpu.get("gsp_firmware")
        if value is None:
            continue  # this GPU has no GSP
        if _error(value):
            skipped["gsp_firmware"] = "gpu%s: %s" % (gpu.get("index"), _error(value))
            return
        values.setdefault(str(value), []).append(gpu.get("index"))
    if len(values) > 1:
        raise ConfigError("GPUs disagree on the GSP firmware (%s): not a good reference node"
                          % "; ".join("gpu%s=%s" % (",".join(map(str, idx)), v) for v, idx in sorted(values.items())))
    if not values:
        skipped["gsp_firmware"] = "no GPU reports GSP firmware"
        return
    (gsp,) = values
    if gsp == pins.get("driver"):
        skipped["gsp_firmware"] = "equals the driver (the default)"
        return
    version, why = _version_or_why(gsp)
    if version is None:
        skipped["gsp_firmware"] = why
    else:
        pins["gsp_firmware"] = version


def _capture_vbios(facts, gpus, skipped) -> Dict[str, str]:
    per_product: Dict[str, Dict[str, List[int]]] = {}
    problems = []
    for gpu in gpus:
        name, vbios = gpu.get("name"), gpu.get("vbios")
        if not isinstance(name, str):
            problems.append("gpu%s: product %s" % (gpu.get("index"), _error(name) or "unreadable"))
            continue
        version, why = _version_or_why(vbios)
        if version is None:
            problems.append("gpu%s: %s" % (gpu.get("index"), why))
            continue
        per_product.setdefault(name, {}).setdefault(version, []).append(gpu.get("index"))
    disagree = {p: v for p, v in per_product.items() if len(v) > 1}
    if disagree:
        detail = "; ".join(
            "%s: %s" % (product, ", ".join("gpu%s=%s" % (",".join(map(str, idx)), ver)
                                           for ver, idx in sorted(versions.items())))
            for product, versions in sorted(disagree.items()))
        raise ConfigError("%s: GPUs of one product disagree on the VBIOS (%s): not a good reference node"
                          % (facts.get("node") or "node", detail))
    if problems:
        skipped["vbios"] = "; ".join(problems)
    return {product: next(iter(versions)) for product, versions in sorted(per_product.items())}


def _capture_shape(facts: Mapping) -> Tuple[Dict[str, object], Dict[str, str]]:
    """The [nodes."<node>"] section: what this node looks like."""
    shape: Dict[str, object] = {}
    skipped: Dict[str, str] = {}
    nvml = facts.get("nvml")
    if _error(nvml) or not isinstance(nvml, Mapping):
        for key in ("gpus", "product", "mig", "persistence"):
            skipped[key] = _error(nvml) or "NVML unreadable"
    else:
        gpus = [g for g in nvml.get("gpus") or () if isinstance(g, Mapping)]
        count = nvml.get("gpu_count")
        if isinstance(count, int) and not isinstance(count, bool) and 0 <= count <= 64:
            shape["gpus"] = count
        elif isinstance(count, int) and not isinstance(count, bool):
            skipped["gpus"] = "%d GPUs: a baseline allows 0 to 64" % count
        else:
            skipped["gpus"] = _error(count) or "no GPU count"
        names = {g.get("name") for g in gpus}
        if not gpus:
            skipped["product"] = "no GPUs"
        elif not all(isinstance(n, str) for n in names):
            skipped["product"] = "a GPU's product is unreadable"
        elif len(names) > 1:
            skipped["product"] = "mixed products: %s" % ", ".join(sorted(names))
        else:
            shape["product"] = next(iter(names))
        mig = [g.get("mig_enabled") for g in gpus]
        if any(m is True for m in mig):
            shape["mig"] = True
        elif mig and all(isinstance(m, bool) for m in mig):
            shape["mig"] = False
        else:
            skipped["mig"] = "unsupported or unreadable" if gpus else "no GPUs"
        persistence = [g.get("persistence_mode") for g in gpus]
        if persistence and all(isinstance(p, bool) for p in persistence):
            shape["persistence"] = all(persistence)
        else:
            skipped["persistence"] = "unreadable" if gpus else "no GPUs"
    switches = facts.get("pci_nvswitches")
    if isinstance(switches, int) and not isinstance(switches, bool):
        shape["nvswitch"] = switches > 0
    else:
        skipped["nvswitch"] = "lspci: %s" % (_error(switches) or "unreadable")
    order = ("gpus", "product", "nvswitch", "mig", "persistence")
    return {k: shape[k] for k in order if k in shape}, skipped


def _stamp(at) -> str:
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(at)))
    except (TypeError, ValueError, OverflowError, OSError):
        return "an unknown time"


def capture(node: str, facts: Mapping, name: str, now: Optional[float] = None) -> str:
    """TOML text of a baseline built from one known-good node's facts.

    Raises ConfigError when the node cannot be a reference (GPUs of one
    product on different VBIOS or GSP firmware, Fabric Manager on another
    version than the driver)."""
    pins, vbios, skipped = _capture_pins(facts)
    shape, shape_skipped = _capture_shape(facts)
    if "driver" not in pins:
        raise ConfigError("%s: no driver version to pin (%s): a baseline needs pin.driver"
                          % (node, skipped.get("driver", "not collected")))
    collected = facts.get("collected_at")
    lines = [
        "# gpugate baseline captured from node %s by `gpugate baseline capture`." % node,
        "# Facts collected %s (mode %s); written %s."
        % (_stamp(collected) if collected is not None else "at an unknown time", facts.get("mode") or "?",
           _stamp(time.time() if now is None else now)),
        "# Review it, keep it in git, and run `gpugate baseline diff OLD NEW` before pushing it.",
        "",
        "name = %s" % _toml_str(name),
        "",
        "[pin]",
    ]
    for component in PIN_COMPONENTS:
        if component in pins:
            lines.append("%s = %s" % (component, _toml_str(pins[component])))
        elif component in skipped:
            if component == "gsp_firmware" and skipped[component].startswith("equals the driver"):
                lines.append(_comment("gsp_firmware: not pinned (equals the driver, the default)"))
            else:
                lines.append(_comment("%s: not captured (%s)" % (component, skipped[component])))
        else:
            lines.append(_comment("%s: not captured" % component))
    lines += ["", "[pin.vbios]"]
    for product, version in vbios.items():
        lines.append("%s = %s" % (_toml_str(product), _toml_str(version)))
    if "vbios" in skipped:
        lines.append(_comment("vbios: not captured (%s)" % skipped["vbios"]))
    elif not vbios:
        lines.append(_comment("vbios: not captured (no GPUs)"))
    lines += ["", "[nodes.%s]" % _toml_str(node)]
    for key, value in shape.items():
        lines.append("%s = %s" % (key, _toml_value(value)))
    for key, why in shape_skipped.items():
        lines.append(_comment("%s: not captured (%s)" % (key, why)))
    lines += ["",
              "# No [health] section: the default health policy applies",
              "# (see slurm_conf/baseline.example.toml for every key).", ""]
    text = "\n".join(lines)
    _self_check(text, node)
    return text


def _self_check(text: str, node: str) -> None:
    """What we write must load: a capture that gpugate would refuse is an error here, not on the fleet."""
    from ..baseline import parse_baseline
    try:
        import tomllib as toml
    except ImportError:  # Python < 3.11
        import tomli as toml

    try:
        data = toml.loads(text)
    except ValueError as exc:
        raise ConfigError("captured baseline from %s is not valid TOML (%s): please report it" % (node, exc)) from None
    parse_baseline(data, "captured baseline from %s" % node)


# ---------------------------------------------------------------------------
# diff


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
    ov, nv = o.get("vbios") or {}, n.get("vbios") or {}
    for product in sorted(set(ov) | set(nv)):
        if ov.get(product) != nv.get(product):
            out.append({"component": "vbios[%s]" % product, "old": ov.get(product), "new": nv.get(product)})
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
    from .audit import DRIFT, fold, hostlist

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
        from .audit import hostlist

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
    from .audit import GPU_COMPONENTS, NODE_COMPONENTS

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
