"""The pinned baseline (baseline.toml, kept in git): what every node must run,
what each nodeset must look like, and the health policy."""

from __future__ import annotations

from .errors import ConfigError
from .lazyre import Lazy
from .record import asdict, dataclass, field, replace
from .iblimits import DEFAULT_IB_COUNTER_MAX, DEFAULT_IB_RATE_MAX, IB_COUNTERS, HEALTH_KEYS as IB_HEALTH_KEYS
from .schema import (REQUIRED, AnyOf, Bool, Choice, Int, ListOf, MapOf, Number, Str, Table,
                     load_toml, validate)

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Dict, Mapping, Optional, Tuple

VERSION_RE = Lazy(r"^[A-Za-z0-9][A-Za-z0-9.+_~:-]{0,63}$")


def _version(value: str) -> Optional[str]:
    if not VERSION_RE.match(value):
        return ("expected a version string of letters, digits and . + _ ~ : - (at most 64), got %r"
                % value[:80])
    return None


# Node names are letters, digits, '.', '_' and '-'; brackets, ',' and the
# ClusterShell operators ! & ^ build sets of them.  '@' (a group) and '*' (all
# nodes) are refused: ClusterShell resolves them by running the commands of its
# groups.conf through a shell, on every node, on every check.
_HOSTLIST_RE = Lazy(r"^[A-Za-z0-9._\-\[\],/!&^]+$")
_RANGE_RE = Lazy(r"^([0-9]+)(?:-([0-9]+))?(?:/([0-9]+))?$")
_HOSTLIST_SPLIT = Lazy(r"[,!&^](?![^\[]*\])")
_HOSTLIST_GROUP = Lazy(r"\[([^\[\]]*)\]")
MAX_NODESET = 100000  # names one expression may expand to (expanding is linear in them)


def _hostlist_size(value: str) -> float:
    """An upper bound of the names ``value`` expands to, found without
    expanding it (NodeSet builds every name: "gpu[0-99999999]" would take
    minutes and gigabytes).  Unreadable ranges count 0: NodeSet reports them."""
    total = 0.0
    for element in _HOSTLIST_SPLIT.split(value):
        size = 1.0
        for group in _HOSTLIST_GROUP.findall(element):
            count = 0.0
            for item in group.split(","):
                match = _RANGE_RE.match(item)
                if not match:
                    continue
                low, high, step = match.groups()
                if max(len(low), len(high or "")) > 18:
                    return float("inf")
                span = int(high) - int(low) if high else 0
                count += max(span, 0) // max(int(step or 1), 1) + 1
            size *= count
        total += size
    return total


def _hostlist(value: str) -> Optional[str]:
    from ClusterShell.NodeSet import NodeSet, NodeSetException  # only when loading

    if not value:
        return "empty hostlist expression ''"
    if not _HOSTLIST_RE.match(value):
        bad = sorted({c for c in value if not _HOSTLIST_RE.match(c)})
        return ("not a hostlist expression: %s not allowed (node names are ASCII letters, digits, "
                "'.', '_' and '-'; groups '@' and '*' are not supported)" % ", ".join(repr(c) for c in bad[:5]))
    if _hostlist_size(value) > MAX_NODESET:
        return "hostlist expression names more than %d nodes: %r" % (MAX_NODESET, value[:80])
    try:
        if len(NodeSet(value)) == 0:
            return "empty hostlist expression %r" % value
    except (NodeSetException, ValueError, TypeError, OverflowError, RecursionError) as exc:
        return "not a hostlist expression (%s)" % exc
    return None


# Component names as they appear in findings, reasons, the audit and sim keys.
PIN_COMPONENTS = ("kernel", "driver", "gsp_firmware", "cuda_driver", "fabricmanager",
                  "container_toolkit", "dcgm", "image")


def _pins_spec(required: bool) -> Table:
    ver = Str("580.65.06", _version)
    fields = {name: (ver, None) for name in PIN_COMPONENTS}
    fields["vbios"] = (MapOf(Str("96.00.99.00.01", _version)), dict)
    fields["hca_firmware"] = (MapOf(Str("28.41.1000", _version)), dict)  # per HCA type, e.g. MT4129
    fields["require_hold"] = (Bool(), False)
    if required:
        fields["driver"] = (ver, REQUIRED)
    return Table(fields)


CLOCK_REASONS = {"hw_slowdown": 0x8, "hw_thermal": 0x40, "power_brake": 0x80,
                 "sw_thermal": 0x20, "sw_power_cap": 0x4}


def _catalog(name: str):
    # The [health] Xid defaults come from NVIDIA's Xid catalog with gpugate's
    # deviations (gpugate.xidcatalog); loaded only when a TOML is validated.
    def default():
        from . import xidcatalog

        return getattr(xidcatalog, name)()
    return default


XID_ACTIONS = ("reset_gpu", "reboot", "rma", "investigate")
MODES = ("healthcheck", "prolog", "epilog", "verify")

def _diag_mig(value: str) -> Optional[str]:
    if value == "skip":
        return None
    if value == "disable":
        return ('"disable" (take MIG down for the diagnostic) is not built: gpugate cannot yet restore a '
                "nodeset's MIG instances afterwards; use \"skip\"")
    return 'expected "skip", got %r' % value[:40]


_HEALTH = Table({
    "drain_xids": (ListOf(Int(1, 100000)), _catalog("default_drain_xids")),
    "xid_actions": (MapOf(Choice(*XID_ACTIONS),
                          lambda k: None if k.isdigit() else "Xid keys are numbers in quotes, e.g. \"79\""),
                    _catalog("default_xid_actions")),
    "xid_window_seconds": (Number(0), 86400.0),
    # Non-fatal NVLink Xid (144-150) sub-events / non-fatal SXids per device in the window.
    "xid_nonfatal_max": (Int(1, 500), 10),  # 500: gpugate.probes.kernlog.MAX_OLD_EVENTS
    # The application's Xids (13, 31, 43, 94) on one GPU in this many jobs within the window drain (0: off).
    "xid_app_jobs_max": (Int(0, 50), 3), "xid_app_window_seconds": (Number(60.0, 30 * 86400.0), 86400.0),
    "ecc_uncorrected_volatile_max": (Int(0), 0),
    "ecc_uncorrected_aggregate_max": (AnyOf(Int(0), Choice("ignore")), "ignore"),
    "retired_pages_pending": (Bool(), True),
    "row_remap_pending": (Bool(), True),
    "row_remap_failure": (Bool(), True),
    # Off by default: idle GPUs lower their link generation to save power.
    "pcie_min_gen": (AnyOf(Int(0, 10), Choice("max")), 0),
    "pcie_min_width": (AnyOf(Int(0, 32), Choice("max")), "max"),
    "clock_event_reasons": (ListOf(Choice(*sorted(CLOCK_REASONS))), ("hw_slowdown", "hw_thermal", "power_brake")),
    # Judged by time (gpugate.judges.throttle): the share of at least min_seconds a GPU spent slowed.
    "clock_event_share_max": (Number(0.0, 1.0), 0.10),
    "clock_event_min_seconds": (Number(1.0, 86400.0), 300.0),
    "nvlink_down_max": (AnyOf(Int(0), Choice("ignore")), 0),
    "fabric_completed": (Bool(), True),
    "recovery_action": (Bool(), True),
    "dcgm_health_warning": (Choice("drain", "ignore"), "ignore"),
    "dcgm_health_failure": (Choice("drain", "ignore"), "drain"),
    "leftover_processes": (Choice("drain", "ignore"), "drain"),
    # The diagnostic needs idle GPUs: only where the node is the sweep's (verify).
    # verify: the levels in order, cheapest first, stopping at the first that fails (an int n means [n]).
    "dcgm_diag": (Table(dict({m: (Int(0, 4), 0) for m in MODES},
                             verify=(AnyOf(Int(0, 4), ListOf(Int(1, 4))), (1, 3)))),
                  lambda: {"healthcheck": 0, "prolog": 0, "epilog": 0, "verify": (1, 3)}),
    # DCGM refuses its diagnostic on MIG GPUs: "skip" reports it not run (never a pass).
    "dcgm_diag_mig": (Str("skip", _diag_mig), "skip"),
    **IB_HEALTH_KEYS,  # ib_counter_max, ib_error_rate_max, ib_flap_window_seconds (gpugate.iblimits)
})
# [nodes."..".hca]: the nodeset's fabric HCAs (types: the hca_type values that
# count, e.g. ["MT4129"]; all when left out), each port ACTIVE/LinkUp at rate.
_HCA = Table({"count": (Int(0, 64), None), "types": (ListOf(Str("MT4129")), None),
              "rate": (Number(0), None), "link_layer": (Choice("InfiniBand", "Ethernet"), None)})

COMPUTE_MODES = ("default", "exclusive_process", "prohibited")  # nvidia-smi -c; EXCLUSIVE_THREAD is gone

_NODESET = Table({
    "gpus": (Int(0, 64), None),
    "product": (Str("NVIDIA H100 80GB HBM3"), None),
    "nvswitch": (Bool(), None),
    "mig": (Bool(), None),
    "persistence": (Bool(), None),
    # Runtime settings a reset loses (gpugate.judges.settings).
    "compute_mode": (Choice(*COMPUTE_MODES), None),
    "power_limit_watts": (Int(1, 5000), None),
    "ecc": (Bool(), None),
    "hca": (_HCA, None),
    "imex": (Bool(), None),  # a member of an NVLink (IMEX) domain: check nvidia-imex-ctl
})

_BASELINE = Table({
    "name": (Str("h100-r580-2026.11"), "unnamed"),
    "pin": (_pins_spec(required=True), REQUIRED),
    "previous": (_pins_spec(required=False), None),
    "rollout": (Table({"in_progress": (Bool(), False)}), lambda: {"in_progress": False}),
    "nodes": (MapOf(_NODESET, _hostlist), dict),
    "health": (_HEALTH, lambda: _HEALTH.check({}, "health")),
    # The sweep's smoke job passes at or above this average bus bandwidth, per GPU product.
    # min_pair_busbw_gbps: the 2-node pair run's (inter-node line rate, not NVLink).
    "smoke": (Table({"min_busbw_gbps": (MapOf(Number(0, 100000)), dict),
                     "min_pair_busbw_gbps": (MapOf(Number(0, 100000)), dict)}),
              lambda: {"min_busbw_gbps": {}, "min_pair_busbw_gbps": {}}),
})


@dataclass(frozen=True)
class Pins:
    """The pinned versions ([pin] or [previous])."""

    kernel: Optional[str] = None
    driver: Optional[str] = None
    gsp_firmware: Optional[str] = None
    cuda_driver: Optional[str] = None
    fabricmanager: Optional[str] = None
    container_toolkit: Optional[str] = None
    dcgm: Optional[str] = None
    image: Optional[str] = None
    vbios: Mapping[str, str] = field(default_factory=dict)
    hca_firmware: Mapping[str, str] = field(default_factory=dict)
    require_hold: bool = False

    def get(self, component: str) -> Optional[str]:
        return getattr(self, component)


@dataclass(frozen=True)
class NodeExpect:
    """What the [nodes] sections naming a node say it looks like."""

    gpus: Optional[int] = None
    product: Optional[str] = None
    nvswitch: Optional[bool] = None
    mig: Optional[bool] = None
    persistence: Optional[bool] = None
    compute_mode: Optional[str] = None
    power_limit_watts: Optional[int] = None
    ecc: Optional[bool] = None
    hca: Optional[Mapping[str, object]] = None  # count, types, rate, link_layer
    imex: Optional[bool] = None


@dataclass(frozen=True)
class HealthPolicy:
    """The [health] policy."""

    drain_xids: Tuple[int, ...]
    xid_actions: Mapping[str, str]
    xid_window_seconds: float
    ecc_uncorrected_volatile_max: int
    ecc_uncorrected_aggregate_max: object  # int or "ignore"
    retired_pages_pending: bool
    row_remap_pending: bool
    row_remap_failure: bool
    pcie_min_gen: object  # int or "max"
    pcie_min_width: object
    clock_event_reasons: Tuple[str, ...]
    nvlink_down_max: object
    fabric_completed: bool
    recovery_action: bool
    dcgm_health_warning: str
    dcgm_health_failure: str
    leftover_processes: str
    dcgm_diag: Mapping[str, int]
    dcgm_diag_mig: str = "skip"
    xid_nonfatal_max: int = 10
    xid_app_jobs_max: int = 3
    xid_app_window_seconds: float = 86400.0
    ib_counter_max: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_IB_COUNTER_MAX))
    ib_error_rate_max: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_IB_RATE_MAX))
    ib_flap_window_seconds: float = 3600.0
    clock_event_share_max: float = 0.10
    clock_event_min_seconds: float = 300.0

    @property
    def clock_mask(self) -> int:
        mask = 0
        for name in self.clock_event_reasons:
            mask |= CLOCK_REASONS[name]
        return mask

    def xid_action(self, xid: int) -> str:
        return self.xid_actions.get(str(xid), "reset_gpu")


@dataclass(frozen=True)
class Baseline:
    """baseline.toml, validated (or a node's resolved view of it)."""

    name: str
    pin: Pins
    previous: Optional[Pins]
    rollout_in_progress: bool
    nodesets: Tuple[Tuple[str, Mapping[str, object]], ...]
    health: HealthPolicy
    source: str = ""
    resolved_expect: Optional[NodeExpect] = None  # set when loaded from a node's cache
    resolved_covered: Optional[bool] = None  # likewise
    smoke_min_busbw: Mapping[str, float] = field(default_factory=dict)  # [smoke] min_busbw_gbps
    smoke_min_pair_busbw: Mapping[str, float] = field(default_factory=dict)  # [smoke] min_pair_busbw_gbps

    def _sections_for(self, node: str):
        if not self.nodesets:
            return []
        from ClusterShell.NodeSet import NodeSet

        return [values for pattern, values in self.nodesets if node in NodeSet(pattern)]

    def expect_for(self, node: str) -> NodeExpect:
        """Merge every [nodes."..."] section that names this node; later wins."""
        if self.resolved_expect is not None:
            return self.resolved_expect
        merged: Dict[str, object] = {}
        for values in self._sections_for(node):
            merged.update({k: v for k, v in values.items() if v is not None})
        return NodeExpect(**merged)

    def covers(self, node: str) -> bool:
        """Does a [nodes."..."] section name this node?  One that none names
        has no expected shape: the judges report it (uncovered) rather than
        judge it against nothing."""
        if self.resolved_covered is not None:
            return self.resolved_covered
        return bool(self._sections_for(node))

    def with_pin(self, pin: Pins) -> "Baseline":
        return replace(self, pin=pin)

    def as_previous(self) -> "Baseline":
        """The baseline with [previous] pinned (what a rollback must verify
        against): previous values win, components it leaves out keep the pin."""
        if self.previous is None:
            raise ConfigError("%s: no [previous] block to verify against" % (self.source or "baseline"))
        merged = asdict(self.pin)
        for key, value in asdict(self.previous).items():
            if key in ("vbios", "hca_firmware"):
                merged[key] = dict(getattr(self.pin, key), **value)
            elif value:
                merged[key] = value
        return replace(self, pin=Pins(**merged), previous=None, rollout_in_progress=False)

    def resolved_for(self, node: str) -> Dict[str, object]:
        """This node's view of the baseline as JSON: the prolog reuses it
        without parsing TOML or expanding hostlists on every job."""
        return {"name": self.name, "pin": asdict(self.pin),
                "previous": asdict(self.previous) if self.previous else None,
                "rollout": self.rollout_in_progress, "expect": asdict(self.expect_for(node)),
                "covered": self.covers(node), "health": asdict(self.health), "source": self.source}


def from_resolved(data: Mapping[str, object]) -> Baseline:
    """The inverse of ``Baseline.resolved_for`` (raises KeyError/TypeError on a
    cache from another version: the caller then loads the TOML)."""
    health = dict(data["health"])
    health["drain_xids"] = tuple(health["drain_xids"])
    health["clock_event_reasons"] = tuple(health["clock_event_reasons"])
    return Baseline(name=data["name"], pin=Pins(**data["pin"]),
                    previous=Pins(**data["previous"]) if data["previous"] else None,
                    rollout_in_progress=bool(data["rollout"]), nodesets=(),
                    health=HealthPolicy(**health), source=str(data.get("source", "")),
                    resolved_expect=NodeExpect(**data["expect"]), resolved_covered=bool(data["covered"]))


def _pins(raw: Mapping[str, object], driver_default: Optional[str] = None) -> Pins:
    values = dict(raw)
    if not values.get("gsp_firmware"):
        values["gsp_firmware"] = values.get("driver") or driver_default
    return Pins(**values)


def _cross_check(pins: Pins, where: str, source: str) -> None:
    # Fabric Manager refuses to start against another driver version.
    if pins.fabricmanager and pins.driver and pins.fabricmanager != pins.driver:
        raise ConfigError("%s: %s.fabricmanager: must equal %s.driver (%s), got %s: Fabric Manager "
                          "only runs with the driver of the same version"
                          % (source, where, where, pins.driver, pins.fabricmanager))


def parse_baseline(data: object, source: str) -> Baseline:
    raw = validate(data, _BASELINE, source)
    pin = _pins(raw["pin"])
    _cross_check(pin, "pin", source)
    previous = None
    if raw["previous"] is not None:
        previous = _pins(raw["previous"])
        _cross_check(previous, "previous", source)
    if raw["rollout"]["in_progress"] and previous is None:
        raise ConfigError("%s: rollout.in_progress: a rollout needs a [previous] block naming the "
                          "baseline the fleet is leaving" % source)
    health = dict(raw["health"])
    health["xid_actions"] = dict(health["xid_actions"])
    health["ib_counter_max"] = dict(DEFAULT_IB_COUNTER_MAX, **health["ib_counter_max"])  # a key overrides its default
    health["ib_error_rate_max"] = dict(DEFAULT_IB_RATE_MAX, **health["ib_error_rate_max"])
    verify = health["dcgm_diag"]["verify"]
    health["dcgm_diag"] = dict(health["dcgm_diag"], verify=tuple(verify) if isinstance(verify, (list, tuple))
                               else ((verify,) if verify else ()))
    return Baseline(name=raw["name"], pin=pin, previous=previous,
                    rollout_in_progress=raw["rollout"]["in_progress"],
                    nodesets=tuple(raw["nodes"].items()), health=HealthPolicy(**health),
                    source=source, smoke_min_busbw=dict(raw["smoke"]["min_busbw_gbps"]),
                    smoke_min_pair_busbw=dict(raw["smoke"]["min_pair_busbw_gbps"]))


def load_baseline(path: str) -> Baseline:
    return parse_baseline(load_toml(path, "baseline"), path)
