"""Findings: what a judge says is wrong with a node, and what it calls for."""

from __future__ import annotations

from gpugate.core.record import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Optional

# Classes, most severe first.  The order decides which finding leads the
# reason and whether an existing gpugate reason may be replaced (never by a
# milder class: a node drained for hardware must not be "downgraded" to drift).
HEALTH = "health"  # hardware: Xid, ECC, remap, NVLink, PCIe, GPU count, DCGM fail
BROKEN = "broken"  # the stack itself fails: stale module, NVML mismatch, no module
DRIFT = "drift"  # a working stack on the wrong versions
PROBE = "probe"  # could not tell: timeout, tool missing
# Written by the sweep, never by a node-side check.
RMA = "rma"  # escalated: a human must look; never resumed automatically
ROLLOUT = "rollout"  # drained on purpose by a planned rollout
# Reported, never drained: a component still on the previous pin while a
# planned rollout is in progress.
PENDING = "pending"
# Reported, never drained, never a pass: a check that did not run, with why
# (the DCGM diagnostic DCGM refuses on MIG GPUs).  The node is verified on
# everything else, and says what it was not verified on.
NOT_RUN = "not_run"

CLASSES = (RMA, HEALTH, BROKEN, DRIFT, ROLLOUT, PROBE)
CHECK_CLASSES = (HEALTH, BROKEN, DRIFT, PROBE)
_RANK = {name: len(CLASSES) - i for i, name in enumerate(CLASSES)}

# Actions a finding calls for.
RECONVERGE = "reconverge"
RELOAD_OR_REBOOT = "reload_or_reboot"
RESET_GPU = "reset_gpu"
REBOOT = "reboot"
RMA_ACTION = "rma"
INVESTIGATE = "investigate"
ACTIONS = (RECONVERGE, RELOAD_OR_REBOOT, RESET_GPU, REBOOT, RMA_ACTION, INVESTIGATE)


def class_rank(name: str) -> int:
    """Higher is more severe; unknown classes rank lowest."""
    return _RANK.get(name, 0)


# Acute findings: intrinsic events of this node (a hardware fault, a stack
# that fails on its own), which drain at once.  Every other finding compares
# the node with what a file expects (versions, packages, services, the GPU
# count, product, MIG, persistence or other runtime setting a nodeset
# names), or says gpugate could not tell (probe): a wrong baseline or
# gpugate.toml could raise those on every node at once, so they drain only
# within the partition's drain budget (gpugate.budget.rules).  Keyed by (class,
# component): the component alone decides, so a reason read back from Slurm
# is classified the same way.  "clocks" (time spent slowed, judges.throttle)
# is budgeted although the GPU reports it: a power brake or a row's cooling
# slows every node of the room at once, and only the budget bounds that.
ACUTE = {
    HEALTH: frozenset({
        "xid", "sxid", "gpu", "nvml", "fallen_off_bus", "ecc", "ecc_aggregate", "retired_pages",
        "row_remap", "nvlink", "pcie_gen", "pcie_width", "recovery", "dcgm_health",
        "dcgm_diag", "ecc_during_job", "remap_during_job", "gpus_lost",
        "preflight",  # wrong values from the job's preflight all_reduce (gpugate.preflight.node); its busbw is budgeted
        "ib_port", "ib_errors",  # this node's own HCA history (judges.hca); hca_* and imex_* are budgeted
        "amdgpu_event",  # the amdgpu driver's own kernel-log events (gpugate.vendors.amd.judge_events)
        "ras", "ras_deferred", "bad_pages", "xgmi", "rvs"}),  # AMD GPUs' own faults (gpugate.vendors.amd.judge_gpus, judge)
    BROKEN: frozenset({"nvml", "module", "dkms", "nvml_gpus", "fabric", "processes",
                       "amdgpu_event",  # init_failed: amdgpu failed at probe
                       "bound_gpus"}),  # AMD functions on the bus that amdgpu does not drive
}


# Findings of one moment: a kernel-log event, a job's own counters, a
# preflight's answer.  The next check does not see them again, so a drain
# reason that names one keeps it while gpugate holds the node for the same
# class (gpugate.model.ownership): findings seen later add to it, never
# push out the Xid that drained the node.
EVENTS = frozenset({"xid", "sxid", "fallen_off_bus", "amdgpu_event", "ecc_during_job", "remap_during_job",
                    "preflight", "preflight_across"})


# Findings a job's user can cause: their applications' Xids (xid_repeat),
# their load on a shared link or node (the run across a job's nodes, a
# bandwidth under a floor, time spent slowed).  Never acute (a test holds
# ACUTE apart from them), and never a step towards rma on their own: the
# sweep's repeat-offender rule counts only the findings beside them
# (gpugate.sweep.history), so an rma needs hardware evidence.  The whole
# table, finding by finding: gpugate.model.influence, docs/explanation/reliability.md.
USER_CAUSED = frozenset({"xid_repeat", "amdgpu_repeat", "preflight_across", "preflight_busbw", "clocks",
                         "kernel_log"})


def is_acute(cls: str, component: str) -> bool:
    """Does a finding of this class and component drain at once, outside the
    drain budget?  Unknown pairs are budgeted: a file-caused finding must
    never escape the budget by a name this table does not know."""
    return component in ACUTE.get(cls, ())


@dataclass(frozen=True)
class Finding:
    """One thing wrong with a node: class, component, observed and expected."""

    cls: str
    component: str  # short name: "driver", "vbios", "xid", "ecc", ...
    observed: str
    expected: str
    action: str
    gpu: Optional[int] = None
    detail: str = ""

    @property
    def acute(self) -> bool:
        return is_acute(self.cls, self.component)

    def to_json(self) -> dict:
        return {"class": self.cls, "component": self.component, "gpu": self.gpu,
                "observed": self.observed, "expected": self.expected,
                "action": self.action, "detail": self.detail}

    @classmethod
    def from_json(cls, data: dict) -> "Finding":
        return cls(cls=data["class"], component=data["component"],
                   observed=data.get("observed", ""), expected=data.get("expected", ""),
                   action=data.get("action", INVESTIGATE), gpu=data.get("gpu"),
                   detail=data.get("detail", ""))


def severity(cls: str, acute: bool) -> tuple:
    """Acute before budgeted, then by class: what leads a reason, and what an
    existing gpugate reason may be replaced by (never by a milder one)."""
    return (bool(acute), class_rank(cls))


def sort_findings(findings):
    """Acute first, then the most severe class, then node-wide before
    per-GPU, then GPU index.  A reason therefore leads with its acute
    finding when it has one: Slurm's copy of the reason tells whether the
    drain counts against the drain budget (gpugate.model.reason.acute)."""
    return sorted(findings, key=lambda f: (not f.acute, -class_rank(f.cls), f.gpu is not None,
                                           f.gpu if f.gpu is not None else -1))
