"""The pinned baseline (baseline.toml, kept in git): what every node must run,
what each nodeset must look like, and the health policy."""

from __future__ import annotations

from gpugate.errors import ConfigError
from gpugate.model.iblimits import DEFAULT_IB_COUNTER_MAX, DEFAULT_IB_RATE_MAX
from gpugate.core.record import asdict, dataclass, field, replace
from gpugate.model.schema import load_toml, validate

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Dict, Mapping, Optional, Tuple


@dataclass(frozen=True)
class AmdExpect:
    """A node's vendor and the nodeset keys only AMD nodes have (kept apart
    from NodeExpect, whose shape NVIDIA's tools and caches know)."""

    vendor: str = "nvidia"
    device_id: Optional[str] = None  # PCI device id, "0x74a1"
    compute_partition: Optional[str] = None
    memory_partition: Optional[str] = None


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
    amdgpu: Optional[str] = None
    rocm: Optional[str] = None
    amd_smi: Optional[str] = None
    ifwi: Mapping[str, str] = field(default_factory=dict)
    amdgpu_firmware: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

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
    xid_repeat_diag: int = 3  # the DCGM level that proves a GPU xid_repeat named (gpugate.node.xidhistory)
    ib_counter_max: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_IB_COUNTER_MAX))
    ib_error_rate_max: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_IB_RATE_MAX))
    ib_flap_window_seconds: float = 3600.0
    clock_event_share_max: float = 0.10
    clock_event_min_seconds: float = 300.0
    ras_uncorrected_blocks: Tuple[str, ...] = ("umc", "xgmi_wafl", "gfx", "sdma", "mmhub", "hdp", "pcie_bif", "athub")
    ras_deferred_max: int = 0
    bad_pages_pending: bool = True
    bad_pages_unreservable: bool = True
    bad_pages_retired_max: object = "threshold"  # or an int
    xgmi_links_down_max: object = 0  # or "ignore"
    amdgpu_events: Tuple[str, ...] = field(default_factory=lambda: _keys().AMDGPU_EVENTS)
    ring_timeout_max: int = 3
    gpu_reset_events_max: int = 1
    rvs: Mapping[str, object] = field(default_factory=lambda: {"healthcheck": 0, "prolog": 0, "epilog": 0,
                                                                "verify": (1, 2)})

    @property
    def clock_mask(self) -> int:
        mask = 0
        for name in self.clock_event_reasons:
            mask |= _keys().CLOCK_REASONS[name]
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
    resolved_amd: Optional[AmdExpect] = None  # set when loaded from a node's cache
    operator: Mapping[str, object] = field(default_factory=dict)  # [operator] (gpugate.judges.operator)

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
            merged.update({k: v for k, v in values.items() if v is not None and k not in _keys().AMD_NODESET_KEYS})
        return NodeExpect(**merged)

    def amd_expect_for(self, node: str) -> AmdExpect:
        """The node's vendor and AMD-only keys (device_id, partitions), merged
        like expect_for; vendor "nvidia" when no section names one."""
        if self.resolved_amd is not None:
            return self.resolved_amd
        merged: Dict[str, object] = {}
        for values in self._sections_for(node):
            merged.update({k: v for k, v in values.items() if v is not None and k in _keys().AMD_NODESET_KEYS})
        return AmdExpect(**merged)

    def vendor_for(self, node: str) -> str:
        return self.amd_expect_for(node).vendor

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
            if key in ("vbios", "hca_firmware", "ifwi", "amdgpu_firmware"):
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
                "covered": self.covers(node), "health": asdict(self.health), "source": self.source,
                "amd": asdict(self.amd_expect_for(node)),
                # The preflight's floors (gpugate.preflight): the prolog holds a proof to them.
                "smoke": {"min_busbw": dict(self.smoke_min_busbw), "min_pair_busbw": dict(self.smoke_min_pair_busbw)},
                "operator": dict(self.operator)}


def from_resolved(data: Mapping[str, object]) -> Baseline:
    """The inverse of ``Baseline.resolved_for`` (raises KeyError/TypeError on a
    cache from another version: the caller then loads the TOML)."""
    health = dict(data["health"])
    health["drain_xids"] = tuple(health["drain_xids"])
    health["clock_event_reasons"] = tuple(health["clock_event_reasons"])
    for key in ("ras_uncorrected_blocks", "amdgpu_events"):
        if key in health:  # a cache written before AMD keys: the defaults apply
            health[key] = tuple(health[key])
    if "rvs" in health:
        health["rvs"] = dict(health["rvs"], verify=tuple(health["rvs"]["verify"]))
    smoke = data.get("smoke")
    if not isinstance(smoke, dict):
        raise KeyError("smoke")  # a cache written before the preflight's floors: load the TOML
    return Baseline(name=data["name"], pin=Pins(**data["pin"]),
                    previous=Pins(**data["previous"]) if data["previous"] else None,
                    rollout_in_progress=bool(data["rollout"]), nodesets=(),
                    health=HealthPolicy(**health), source=str(data.get("source", "")),
                    resolved_expect=NodeExpect(**data["expect"]), resolved_covered=bool(data["covered"]),
                    resolved_amd=AmdExpect(**data.get("amd") or {}),
                    smoke_min_busbw=_floors(smoke["min_busbw"]), smoke_min_pair_busbw=_floors(smoke["min_pair_busbw"]),
                    operator=dict(data["operator"]))  # KeyError: a cache from before [operator]


def _floors(table) -> Dict[str, float]:
    if not isinstance(table, dict):
        raise TypeError("a floor table")
    return {str(k): float(v) for k, v in table.items()}


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
    from gpugate.vendors.amd import baseline as amd
    from gpugate.model.baseline_schema import BASELINE

    raw = validate(data, BASELINE, source)
    amd.check_vendors(raw, source)
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
    amd.normalize_health(health)
    verify = health["dcgm_diag"]["verify"]
    health["dcgm_diag"] = dict(health["dcgm_diag"], verify=tuple(verify) if isinstance(verify, (list, tuple))
                               else ((verify,) if verify else ()))
    return Baseline(name=raw["name"], pin=pin, previous=previous,
                    rollout_in_progress=raw["rollout"]["in_progress"],
                    nodesets=tuple(raw["nodes"].items()), health=HealthPolicy(**health),
                    source=source, smoke_min_busbw=dict(raw["smoke"]["min_busbw_gbps"]),
                    smoke_min_pair_busbw=dict(raw["smoke"]["min_pair_busbw_gbps"]), operator=dict(raw["operator"]))


def load_baseline(path: str) -> Baseline:
    return parse_baseline(load_toml(path, "baseline"), path)


def _keys():
    # The key names (a leaf module): not loaded by the prolog's reuse of a kept view.
    from gpugate.model import baseline_keys

    return baseline_keys
