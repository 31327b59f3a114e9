"""The Slurm adapter: the only code that talks to Slurm."""


def connect(settings, timeout=None, deadline=None):
    """The command backend (scontrol/sinfo: every Slurm host has them, every
    release).  A pyslurm backend is not part of this release: pyslurm must
    match Slurm's major.minor and PyPI only has 25.11 builds, so it could not
    be proven here against a real cluster; the configuration refuses it.

    deadline (time.monotonic()): every call's timeout is cut to the time
    left, and no call starts once it has passed (node-side runs must end
    before slurmd kills them)."""
    from .commands import CommandSlurm

    slurm = settings.slurm
    limit = float(slurm["timeout_seconds"])
    return CommandSlurm(str(slurm["bin_dir"]), settings.slurm_env, min(limit, timeout) if timeout else limit,
                        deadline=deadline)
