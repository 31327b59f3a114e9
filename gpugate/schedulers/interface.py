"""What every scheduler adapter offers the node agent, the keeper and the
sweep (gpugate.slurm's backends, gpugate.kube.nodes, gpugate.kube.paired).
Documentation and a test's checklist: the adapters do not inherit from it
(Slurm's NodeUpdates gives the shared defaults)."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Optional

# The methods every adapter has (tests/test_scheduler_seam.py checks each adapter).
METHODS = ("own_record", "nodes", "drain", "undrain", "resume", "set_comment", "report_verdict", "lead", "close")


class Scheduler:
    """One connection to the scheduler, for one run."""

    reports_verdict = False  # whether the scheduler carries a verdict beside a hold (Kubernetes: a condition)

    def own_record(self, name: str):
        """This node's record as the scheduler holds it (state, reason, comment)."""

    def nodes(self, names: Optional[str] = None) -> Dict[str, object]:
        """name -> NodeState, for the fleet or a hostlist."""

    def drain(self, names: str, reason: str) -> None:
        """Hold the nodes with gpugate's reason (Slurm: DRAIN; Kubernetes: taint, cordon, annotation)."""

    def undrain(self, names: str) -> None:
        """Lift the hold only (the reason stays for the scheduler to clear)."""

    def resume(self, names: str) -> None:
        """Return the nodes to service."""

    def set_comment(self, name: str, comment: str) -> None:
        """Publish a budgeted finding on the node's own record."""

    def report_verdict(self, name: str, verdict, state) -> None:
        """Say the verdict where the scheduler shows it (no-op on Slurm)."""

    def lead(self, who: str) -> str:
        """Why this keeper must not act now ("": it may)."""

    def close(self) -> None:
        """Release the connection."""
