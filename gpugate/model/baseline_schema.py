"""baseline.toml's schema: every table, key, type and default.  Loaded
only where TOML is validated (the health check, the controller's tools):
the prolog reuses the resolved view (gpugate.probes.reuse) and never needs it."""

from __future__ import annotations

from gpugate.vendors.amd import baseline as amd
from gpugate.model.baseline_keys import CLOCK_REASONS, PIN_COMPONENTS, _version
from gpugate.core.hostlists import _hostlist
from gpugate.model.iblimits import HEALTH_KEYS as IB_HEALTH_KEYS
from gpugate.model.schema import REQUIRED, AnyOf, Bool, Choice, Int, Invalid, ListOf, MapOf, Number, Str, Table

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only
    from typing import Optional


def _pins_spec() -> Table:
    ver = Str("580.65.06", _version)
    fields = {name: (ver, None) for name in PIN_COMPONENTS}
    fields["vbios"] = (MapOf(Str("96.00.99.00.01", _version)), dict)
    fields["hca_firmware"] = (MapOf(Str("28.41.1000", _version)), dict)  # per HCA type, e.g. MT4129
    fields["require_hold"] = (Bool(), False)
    fields.update(amd.pin_fields(ver))  # amdgpu, rocm, amd_smi, ifwi, amdgpu_firmware
    # pin.driver is required where a nodeset is NVIDIA's (gpugate.vendors.amd.baseline.check_vendors)
    return Table(fields)



def _catalog(name: str):
    # The [health] Xid defaults come from NVIDIA's Xid catalog with gpugate's
    # deviations (gpugate.vendors.nvidia.xidcatalog); loaded only when a TOML is validated.
    def default():
        from gpugate.vendors.nvidia import xidcatalog

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


class _AppJobs(Int):
    """[health] xid_app_jobs_max: 0 (off) or 2 to 50 (gpugate.judges.apprepeat)."""

    def __init__(self):
        super().__init__(0, 50)

    def check(self, value, path):
        if super().check(value, path) == 1:
            raise Invalid(path, "expected 0 (off) or 2 at the least, got 1: one job is one user's, and one "
                                "user's Xids are their application's, not the GPU's; a single job would drain "
                                "the node (gpugate.judges.apprepeat)")
        return value


_HEALTH = Table({
    "drain_xids": (ListOf(Int(1, 100000)), _catalog("default_drain_xids")),
    "xid_actions": (MapOf(Choice(*XID_ACTIONS),
                          lambda k: None if k.isdigit() else "Xid keys are numbers in quotes, e.g. \"79\""),
                    _catalog("default_xid_actions")),
    "xid_window_seconds": (Number(0), 86400.0),
    # Non-fatal NVLink Xid (144-150) sub-events / non-fatal SXids per device in the window.
    "xid_nonfatal_max": (Int(1, 500), 10),  # 500: gpugate.probes.kernlog.MAX_OLD_EVENTS
    # The application's Xids (13, 31, 43, 94) on one GPU in this many jobs within the window drain (0: off).
    "xid_app_jobs_max": (_AppJobs(), 3), "xid_app_window_seconds": (Number(60.0, 30 * 86400.0), 86400.0),
    # The deep diagnostic that proves such a GPU (dcgmi diag -r 3; 4 adds EUD where the site runs it).
    "xid_repeat_diag": (Int(3, 4), 3),
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
    **IB_HEALTH_KEYS,  # ib_counter_max, ib_error_rate_max, ib_flap_window_seconds (gpugate.model.iblimits)
    **amd.HEALTH_KEYS,  # ras_*, bad_pages_*, xgmi_links_down_max, amdgpu_events, rvs (gpugate.vendors.amd.baseline)
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
    **amd.NODESET_FIELDS,  # vendor, device_id, compute_partition, memory_partition
})

_IMAGE_PIN = Str("v0.17.1", lambda v: None if v == "" or v.startswith("sha256:") or all(
    c.isalnum() or c in "._-" for c in v) else "expected an image tag (\"v0.17.1\", \"4.2.3-4.1.3\") or \"sha256:...\"")
_OPERATOR = Table({
    "labels": (Bool(), False),
    "mig_strategy": (Choice("", "none", "single", "mixed"), ""),
    "driver_image": (Bool(), False),
    "container_toolkit": (_IMAGE_PIN, ""), "device_plugin": (_IMAGE_PIN, ""), "dcgm_exporter": (_IMAGE_PIN, ""),
    "amd_device_plugin": (_IMAGE_PIN, ""), "amd_metrics_exporter": (_IMAGE_PIN, ""),
})

BASELINE = Table({
    "name": (Str("h100-r580-2026.11"), "unnamed"),
    "pin": (_pins_spec(), REQUIRED),
    "previous": (_pins_spec(), None),
    "rollout": (Table({"in_progress": (Bool(), False)}), lambda: {"in_progress": False}),
    "nodes": (MapOf(_NODESET, _hostlist), dict),
    "health": (_HEALTH, lambda: _HEALTH.check({}, "health")),
    # The sweep's smoke job passes at or above this average bus bandwidth, per GPU product.
    # min_pair_busbw_gbps: the 2-node pair run's (inter-node line rate, not NVLink).
    # What a Kubernetes GPU operator publishes on each Node (gpugate.judges.operator): its labels
    # must be there (labels = true), and the MIG strategy it runs ("": not judged).  Its driver and
    # CUDA labels are always held to [pin] where they are present.  The images its pods run on the
    # node (gpugate.judges.operator_images): each pinned one ("": not judged; "sha256:...": by
    # digest), and the driver container to [pin] driver where driver_image = true.
    "operator": (_OPERATOR, lambda: _OPERATOR.check({}, "operator")),
    "smoke": (Table({"min_busbw_gbps": (MapOf(Number(0, 100000)), dict),
                     "min_pair_busbw_gbps": (MapOf(Number(0, 100000)), dict)}),
              lambda: {"min_busbw_gbps": {}, "min_pair_busbw_gbps": {}}),
})
