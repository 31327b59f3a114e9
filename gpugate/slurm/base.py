"""What both Slurm backends share: the node state changes gpugate makes,
in terms of each backend's own ``update``."""


class NodeUpdates:
    reports_verdict = False  # Slurm carries no verdict but a drain's reason (Kubernetes: a condition)

    def update(self, names: str, state: str, reason=None) -> None:
        raise NotImplementedError

    def drain(self, names: str, reason: str) -> None:
        self.update(names, "DRAIN", reason)

    def undrain(self, names: str) -> None:
        """Clears DRAIN only (the reason stays for Slurm to clear)."""
        self.update(names, "UNDRAIN")

    def resume(self, names: str) -> None:
        self.update(names, "RESUME")

    def report_verdict(self, name: str, verdict, state) -> None:
        """Slurm has nothing but the reason to carry a verdict (Kubernetes:
        the GpugateHealthy condition, gpugate.kube.nodes)."""

    def lead(self, who: str) -> str:
        """Why this keeper must not act now ("": it may).  On Slurm two
        keepers may both act: each run's re-read gives back what exceeds
        the budget (gpugate.keeper.run); Kubernetes elects one through a Lease."""
        return ""
