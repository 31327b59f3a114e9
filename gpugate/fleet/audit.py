"""The audit: every component's distinct values across the fleet, folded
into hostlists and compared with the pin.  Pure: facts in, table out."""

from typing import Dict, List, Mapping, Optional, Tuple

from gpugate.core.record import dataclass, field

# Node-wide components: how to read each from a node's facts (JSON form).
# The daemons: "active", "inactive", "not running" (no process, no systemd), "(unchecked)" where gpugate.toml
# says [services] ROLE = "none".  Not versions: never pinned (the check judges them).
SERVICE_COMPONENTS = ("service:persistenced", "service:fabricmanager")
NODE_COMPONENTS = ("kernel", "driver", "cuda_driver", "module", "fabricmanager", "container_toolkit", "dcgm",
                   "image") + SERVICE_COMPONENTS + ("install",)
# AMD nodes' stack (gpugate.vendors.amd.facts): rows only where a node has them, so an NVIDIA fleet's audit is as before.
AMD_NODE_COMPONENTS = ("amdgpu", "rocm", "amd_smi")
NODE_COMPONENTS += AMD_NODE_COMPONENTS
# Whether Slurm confines each job to its GPUs (cgroup.conf ConstrainDevices; gpugate.probes.owners):
# "constrained", or "not constrained: why", said here once rather than in every epilog.
NODE_COMPONENTS += ("job_devices",)
# The kernel-log follower (gpugate kmsg-follow, issue 33): "following" is what it
# must be; "down"/"absent", or records the ring lost that it did not read
# either, mean an Xid a flood pushed out of the ring may be missed there.
NODE_COMPONENTS += ("kmsg_follower",)
# Whether NVML counts the time each GPU spent slowed (gpugate.judges.throttle):
# "counted", or "(unchecked)" where an older nvidia-ml-py or the GPU has no counter.
NODE_COMPONENTS += ("clock_events",)
# The code gpugate runs as root (gpugate.probes.install_trust): "trusted" is what it
# must be, never a pin; one others could change reads "(unreadable: untrusted)".
TRUSTED_INSTALL = "trusted"
GPU_COMPONENTS = ("vbios", "gsp_firmware", "hca_firmware", "ifwi")  # hca_firmware: per HCA type, like VBIOS
PINNED, DRIFT, PENDING, UNPINNED, UNREADABLE = "pinned", "DRIFT", "pending", "unpinned", "unreadable"
UNCHECKED = "unchecked"  # configured not to be read (packages.manager = "none")
STATUSES = (PINNED, DRIFT, PENDING, UNPINNED, UNREADABLE, UNCHECKED)
# One state per node and component (a per-GPU component has a row per GPU
# value): the worst wins, and "could not tell" is worse than any good state.
_WORST_FIRST = (DRIFT, UNREADABLE, PENDING, UNCHECKED, UNPINNED, PINNED)


@dataclass(frozen=True)
class Row:
    component: str
    product: Optional[str]  # per-GPU components are grouped per GPU product
    value: str
    nodes: Tuple[str, ...]
    status: str  # one of STATUSES

    @property
    def count(self) -> int:
        return len(self.nodes)


@dataclass(frozen=True)
class Audit:
    rows: Tuple[Row, ...]
    unreachable: Mapping[str, str] = field(default_factory=dict)  # node -> why
    uncovered: Tuple[str, ...] = ()  # nodes no [nodes] section of the baseline names
    baseline_source: str = ""
    # node -> why it judges with its last good gpugate.toml/baseline (node.lastgood)
    config_errors: Mapping[str, str] = field(default_factory=dict)

    @property
    def drift(self) -> bool:
        return any(r.status == DRIFT for r in self.rows)


def _value(x) -> Optional[str]:
    """A fact's value as text; errors and absent facts as a marked value."""
    if x is None:
        return None
    if isinstance(x, dict) and "error" in x:
        error = x["error"] if isinstance(x["error"], dict) else {}
        kind = str(error.get("kind", "error"))
        return "(unchecked)" if kind == "unchecked" else "(unreadable: %s)" % kind
    return str(x)


def node_values(facts: Mapping) -> Dict[str, Optional[str]]:
    nvml = facts.get("nvml") or {}
    nvml_ok = isinstance(nvml, dict) and "error" not in nvml
    packages = facts.get("packages") or {}
    if isinstance(packages, dict) and "error" in packages:  # the whole probe failed
        packages = {role: packages for role in ("fabricmanager", "container_toolkit")}
    image = facts.get("image")
    out = {
        "kernel": _value(facts.get("kernel_release")),
        "driver": _value(nvml.get("driver_version")) if nvml_ok else _value(nvml),
        "cuda_driver": _value(nvml.get("cuda_driver_version")) if nvml_ok else _value(nvml),
        "module": _value(facts.get("module_resident")),
        "fabricmanager": _package(packages.get("fabricmanager")),
        "container_toolkit": _package(packages.get("container_toolkit")),
        "dcgm": _value(facts.get("dcgm_version")),
        "image": _value(image.get("version")) if isinstance(image, dict) and "error" not in image else _value(image),
        "install": _value(facts.get("install")),
        "job_devices": _value(facts.get("job_devices")),
        "kmsg_follower": follower_value(facts.get("kernel_log_follower")),
        "clock_events": clock_events_value(nvml) if nvml_ok else None,
    }
    amd = facts.get("amd")
    if isinstance(amd, dict):  # an AMD node
        whole = "error" in amd
        for component, key in zip(AMD_NODE_COMPONENTS, ("amdgpu_version", "rocm_version", "amd_smi_version")):
            out[component] = _value(amd) if whole else _value(amd.get(key))
    services = facts.get("services")
    for component in SERVICE_COMPONENTS:
        role = component[len("service:"):]
        out[component] = _value(services if not isinstance(services, dict) or "error" in services
                                else services.get(role))
    return out


def clock_events_value(nvml: Mapping) -> Optional[str]:
    """"counted" where every GPU's clock-event counters were read; a GPU's
    failure (unchecked: gpugate.model.facts.clock_events_unchecked) otherwise;
    None without GPUs or from before the counters (no row)."""
    values = [g.get("clock_event_ns") for g in nvml.get("gpus") or () if isinstance(g, Mapping)]
    if not values or any(v is None for v in values):
        return None
    failed = [_value(v) for v in values if isinstance(v, Mapping) and "error" in v]
    return next((f for f in failed if f.startswith("(unreadable")), failed[0]) if failed else "counted"


def follower_value(cover) -> Optional[str]:
    """The audit's kmsg_follower value (gpugate.probes.kernlog.coverage): None
    for facts from before the follower (no row)."""
    if not isinstance(cover, Mapping):
        return None
    state = str(cover.get("follower"))
    return state + ", records lost unread" if cover.get("covered") is False else state


def kernel_log_watch(last_audit) -> Optional[dict]:
    """From the latest audit, for `gpugate status`: {"not_following": nodes
    whose follower is down or absent, "lost_unread": nodes whose ring lost
    records it did not read either (Xids there may be missed)}."""
    facts = last_audit.get("facts") if isinstance(last_audit, Mapping) else None
    if not isinstance(facts, Mapping):
        return None
    values = {n: follower_value(f.get("kernel_log_follower")) for n, f in facts.items() if isinstance(f, Mapping)}
    return {"not_following": sorted(n for n, v in values.items() if v and not v.startswith("following")),
            "lost_unread": sorted(n for n, v in values.items() if v and v.endswith("records lost unread"))}


def _package(pkg) -> Optional[str]:
    if pkg is None:
        return None
    if isinstance(pkg, dict) and "error" in pkg:
        return _value(pkg)
    return str(pkg.get("version")) if isinstance(pkg, dict) else None


def gpu_values(facts: Mapping) -> List[Tuple[str, str, Optional[str]]]:
    """(component, product, value) for every GPU."""
    if isinstance(facts.get("amd"), dict):
        return _amd_gpu_values(facts["amd"])
    nvml = facts.get("nvml") or {}
    if not isinstance(nvml, dict) or "error" in nvml:
        # No GPU could be read: say so, rather than leave the node out of the rows.
        value = _value(nvml) if isinstance(nvml, dict) else "(unreadable: nvml)"
        return [(c, None, value) for c in ("vbios", "gsp_firmware")]
    out = []
    for gpu in nvml.get("gpus") or ():
        name = gpu.get("name")
        product = name if isinstance(name, str) else "(unknown product)"
        # Without the product there is no telling which VBIOS pin applies.
        vbios = _value(gpu.get("vbios")) if isinstance(name, str) else (_value(name) or "(unreadable: name)")
        out.append(("vbios", product, vbios))
        out.append(("gsp_firmware", product, _value(gpu.get("gsp_firmware"))))
    return out


def _amd_gpu_values(amd: Mapping) -> List[Tuple[str, str, Optional[str]]]:
    """An AMD node's GPUs: VBIOS (sysfs part number) and IFWI per product."""
    if "error" in amd:
        return [(c, None, _value(amd)) for c in ("vbios", "ifwi")]
    out = []
    for gpu in amd.get("gpus") or ():
        if not gpu.get("bound"):
            continue
        name = gpu.get("product")
        product = name if isinstance(name, str) else "(unknown product)"
        out.append(("vbios", product, _value(gpu.get("vbios")) if isinstance(name, str) else "(unreadable: product)"))
        out.append(("ifwi", product, _value(gpu.get("ifwi")) if isinstance(name, str) else "(unreadable: product)"))
    return out


def hca_values(facts: Mapping) -> List[Tuple[str, Optional[str], Optional[str]]]:
    """("hca_firmware", HCA type, firmware) for every HCA; none on a node without."""
    hcas = facts.get("hcas")
    if isinstance(hcas, dict):  # the probe failed
        return [("hca_firmware", None, _value(hcas))]
    out = []
    for hca in hcas or ():
        kind = hca.get("hca_type")
        out.append(("hca_firmware", kind if isinstance(kind, str) else "(unknown type)", _value(hca.get("fw_ver"))))
    return out


def _status(component: str, product: Optional[str], value: str, baseline) -> str:
    if value.startswith("(unreadable"):
        return UNREADABLE  # the node answered, this fact did not: not drift, not fine
    if value == "(unchecked)":
        return UNCHECKED
    if component == "install":
        return PINNED if value == TRUSTED_INSTALL else UNREADABLE
    if component == "job_devices":  # not a pin: shown, never drift (docs/explanation/what-drains-when.md)
        return PINNED if value == "constrained" else UNPINNED
    if component == "kmsg_follower":  # never drift, never a drain: whether an Xid can go unseen
        return PINNED if value == "following" else UNREADABLE
    if component == "clock_events":  # never a pin: whether time spent slowed is judged
        return PINNED
    if baseline is None or component in SERVICE_COMPONENTS:
        return UNPINNED
    pin, prev = baseline.pin, baseline.previous
    if component in ("vbios", "hca_firmware", "ifwi"):
        want = getattr(pin, component).get(product)
        before = getattr(prev, component).get(product) if prev else None
    elif component == "module":
        want, before = pin.driver, prev.driver if prev else None
    else:
        want = pin.get(component)
        before = prev.get(component) if prev else None
    if want is None:
        return UNPINNED
    if value == want:
        return PINNED
    if baseline.rollout_in_progress and before is not None and value == before:
        return PENDING
    return DRIFT


def fold(fleet: Mapping[str, object], baseline=None, config_errors: Optional[Mapping[str, str]] = None) -> Audit:
    """fleet: node -> facts (the JSON form of NodeFacts), or a string saying
    why the node could not be read (it is listed as unreachable).
    config_errors: node -> why its files did not load (it judges with the
    last good copies)."""
    groups: Dict[Tuple[str, Optional[str], str], set] = {}
    unreachable = {}
    for node, facts in fleet.items():
        if not isinstance(facts, Mapping):
            unreachable[node] = str(facts)
            continue
        try:  # root on the node wrote these: a shape the readers do not know is that node's alone (issue 33)
            values = [(c, None, v) for c, v in node_values(facts).items()] + gpu_values(facts) + hca_values(facts)
        except (AttributeError, TypeError, KeyError, ValueError) as exc:
            unreachable[node] = "malformed facts in its answer (%s: %s)" % (type(exc).__name__, str(exc)[:100])
            continue
        for component, product, value in values:
            if value is not None:
                groups.setdefault((component, product, value), set()).add(node)
    order = {c: i for i, c in enumerate(NODE_COMPONENTS + GPU_COMPONENTS)}
    rows = [Row(c, p, v, tuple(sorted(nodes)), _status(c, p, v, baseline))
            for (c, p, v), nodes in groups.items()]
    rows.sort(key=lambda r: (order.get(r.component, 99), r.product or "", r.status != PINNED, -r.count, r.value))
    uncovered = tuple(sorted(n for n in fleet if not baseline.covers(n))) if baseline is not None else ()
    errors = {n: str(e) for n, e in (config_errors or {}).items() if e}
    return Audit(tuple(rows), unreachable, uncovered, baseline.source if baseline is not None else "", errors)


def node_states(audit: Audit) -> Dict[str, Dict[str, str]]:
    """component -> node -> its one state (the worst of its rows)."""
    rank = {s: i for i, s in enumerate(_WORST_FIRST)}
    out: Dict[str, Dict[str, str]] = {c: {} for c in NODE_COMPONENTS + GPU_COMPONENTS}
    for row in audit.rows:
        states = out.setdefault(row.component, {})
        for node in row.nodes:
            if node not in states or rank[row.status] < rank[states[node]]:
                states[node] = row.status
    return out


def hostlist(nodes) -> str:
    from ClusterShell.NodeSet import NodeSet

    return str(NodeSet.fromlist(sorted(nodes))) if nodes else "-"


def to_json(audit: Audit) -> dict:
    return {"drift": audit.drift,
            "rows": [{"component": r.component, "product": r.product, "value": r.value, "count": r.count,
                      "nodes": hostlist(r.nodes), "status": r.status} for r in audit.rows],
            "unreachable": {"nodes": hostlist(audit.unreachable), "why": dict(audit.unreachable)},
            "uncovered": {"count": len(audit.uncovered), "nodes": hostlist(audit.uncovered),
                          "baseline": audit.baseline_source},
            "config_error": {"count": len(audit.config_errors), "nodes": hostlist(audit.config_errors),
                             "why": dict(audit.config_errors)}}


def to_text(audit: Audit) -> str:
    lines = []
    width = max([len(r.value) for r in audit.rows] + [8])
    last = None
    for r in audit.rows:
        name = r.component + (" [%s]" % r.product if r.product else "")
        label = name if name != last else ""
        last = name
        lines.append("%-40s %-*s %6d  %-28s %s" % (label, width, r.value, r.count, hostlist(r.nodes), r.status))
    if audit.unreachable:
        lines.append("%-40s %-*s %6d  %s" % ("UNREACHABLE", width, "", len(audit.unreachable),
                                             hostlist(audit.unreachable)))
        for node, why in sorted(audit.unreachable.items())[:20]:
            lines.append("    %s: %s" % (node, why[:100]))
    if audit.uncovered:
        # Judged against no nodeset: `gpugate check` reports them (probe uncovered).
        lines.append("%-40s %-*s %6d  %-28s no [nodes] section in %s" % (
            "UNCOVERED", width, "", len(audit.uncovered), hostlist(audit.uncovered), audit.baseline_source))
    if audit.config_errors:
        # These nodes gate with their last good copies: the pushed file is broken there.
        lines.append("%-40s %-*s %6d  %s" % ("CONFIG ERROR (last good copy in use)", width, "",
                                             len(audit.config_errors), hostlist(audit.config_errors)))
        for node, why in sorted(audit.config_errors.items())[:20]:
            lines.append("    %s: %s" % (node, why[:160]))
    if not lines:
        lines.append("(no nodes)")
    return "\n".join(lines)
