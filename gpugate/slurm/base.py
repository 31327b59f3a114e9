"""What both Slurm backends share: the node state changes gpugate makes,
in terms of each backend's own ``update``."""


class NodeUpdates:
    def update(self, names: str, state: str, reason=None) -> None:
        raise NotImplementedError

    def drain(self, names: str, reason: str) -> None:
        self.update(names, "DRAIN", reason)

    def undrain(self, names: str) -> None:
        """Clears DRAIN only (the reason stays for Slurm to clear)."""
        self.update(names, "UNDRAIN")

    def resume(self, names: str) -> None:
        self.update(names, "RESUME")
