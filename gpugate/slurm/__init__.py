"""The Slurm adapter: the only code that talks to Slurm.

Two backends with one interface: ``commands`` (scontrol, sinfo, sbatch,
scancel: every Slurm host has them, every release) and ``pyslurm``
(Slurm's C API, in a worker process: gpugate.slurm.pyslurm_backend), for
Slurm 25.11 and any release a site builds pyslurm for.  ``[slurm] backend``
picks one; ``auto`` takes pyslurm when it loads and was built for the Slurm
this host runs, else the commands, and says why (``backend.why``).

May import: the layers below the schedulers (core .. judges) and
gpugate.schedulers' neutral modules; never gpugate.kube, the node agent, the
keeper or the sweep."""

COMMANDS, PYSLURM, AUTO = "commands", "pyslurm", "auto"


def connect(settings, timeout=None, deadline=None):
    """The configured backend, ready to call.

    deadline (time.monotonic()): every call's timeout is cut to the time
    left, and no call starts once it has passed (node-side runs must end
    before slurmd kills them).  ``backend = "pyslurm"`` raises SlurmError
    (PyslurmMismatch) when pyslurm cannot be used: never half-used; ``auto``
    then takes the commands, and says why."""
    from gpugate.slurm.commands import CommandSlurm

    slurm = settings.slurm
    limit = float(slurm["timeout_seconds"])
    limit = min(limit, timeout) if timeout else limit
    args = (str(slurm["bin_dir"]), settings.slurm_env, limit)
    wanted = str(slurm.get("backend", COMMANDS))
    library = str(slurm.get("library", ""))
    if wanted == COMMANDS:
        backend = CommandSlurm(*args, deadline=deadline, library=library)
        backend.why = "configured"
        return backend
    from gpugate.errors import SlurmError
    from gpugate.slurm.pyslurm_backend import PyslurmSlurm

    backend = PyslurmSlurm(*args, deadline=deadline)
    try:
        backend.start()
    except SlurmError as exc:  # pyslurm cannot be used, or its worker did not start in time
        if wanted == PYSLURM:
            raise
        fallback = CommandSlurm(*args, deadline=deadline, library=library)
        fallback.why = "auto: %s" % exc
        return fallback
    backend.why = "configured" if wanted == PYSLURM else "auto: pyslurm %s matches this Slurm" % (
        backend.pyslurm_version)
    return backend
