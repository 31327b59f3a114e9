"""The Slurm adapter: the only code that talks to Slurm."""


def connect(settings):
    """The backend gpugate.toml chooses; the command backend without pyslurm."""
    slurm = settings.slurm
    if slurm["backend"] == "pyslurm":
        try:
            from .pyslurm_backend import PyslurmSlurm

            return PyslurmSlurm(settings)
        except ImportError:
            pass  # pyslurm must match Slurm's major.minor; fall back rather than fail
    from .commands import CommandSlurm

    return CommandSlurm(str(slurm["bin_dir"]), settings.slurm_env, float(slurm["timeout_seconds"]))
