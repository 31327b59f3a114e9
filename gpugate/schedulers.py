"""The scheduler a node agent and the keeper act through ([scheduler] in
gpugate.toml): Slurm (gpugate.slurm's backends), Kubernetes
(gpugate.kube.nodes), or both at once where slurmd runs in a pod
(gpugate.kube.paired: Slurm decides, the Node mirrors).  All offer the
same interface: own_record, nodes, drain, undrain, resume, set_comment, report_verdict, lead, close; the
ownership rules, the budget and the keeper are written once above it."""

from .errors import ConfigError


def require_slurm(settings, what: str) -> None:
    """The controller commands not built for Kubernetes yet refuse, saying
    so, rather than reach for a Slurm that is not there."""
    if getattr(settings, "scheduler", "slurm") not in ("slurm", "slurm+kubernetes"):
        raise ConfigError("%s acts on Slurm only so far; this gpugate.toml says scheduler = %r "
                          "(docs/kubernetes.md: what is built for Kubernetes: the node agent, "
                          "`gpugate budget`, `sweep` and `status`)" % (what, settings.scheduler))


def connect(settings, timeout=None, deadline=None):
    scheduler = getattr(settings, "scheduler", "slurm")
    if scheduler == "kubernetes":
        from .kube.nodes import connect as kube_connect

        return kube_connect(settings, deadline=deadline, timeout=timeout)
    if scheduler == "slurm+kubernetes":  # Slurm, each hold mirrored on the Node that runs it
        from .kube.paired import connect as paired_connect

        return paired_connect(settings, timeout=timeout, deadline=deadline)
    from .slurm import connect as slurm_connect

    return slurm_connect(settings, timeout=timeout, deadline=deadline)
