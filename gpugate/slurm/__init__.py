"""The Slurm adapter: the only code that talks to Slurm."""


def connect(settings, timeout=None):
    """The backend gpugate.toml chooses; the command backend without pyslurm."""
    slurm = settings.slurm
    if slurm["backend"] == "pyslurm":
        try:
            from .pyslurm_backend import PyslurmSlurm

            return PyslurmSlurm(settings)
        except ImportError:
            pass  # pyslurm must match Slurm's major.minor; fall back rather than fail
    from .commands import CommandSlurm

    limit = float(slurm["timeout_seconds"])
    return CommandSlurm(str(slurm["bin_dir"]), settings.slurm_env, min(limit, timeout) if timeout else limit)
