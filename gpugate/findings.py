"""Findings: what a judge says is wrong with a node, and what it calls for."""

from dataclasses import dataclass
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


@dataclass(frozen=True)
class Finding:
    cls: str
    component: str  # short name: "driver", "vbios", "xid", "ecc", ...
    observed: str
    expected: str
    action: str
    gpu: Optional[int] = None
    detail: str = ""

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


def sort_findings(findings):
    """Most severe class first, then node-wide before per-GPU, then GPU index."""
    return sorted(findings, key=lambda f: (-class_rank(f.cls), f.gpu is not None,
                                           f.gpu if f.gpu is not None else -1))
