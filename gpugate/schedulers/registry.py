"""The scheduler a node agent, the keeper and the sweep act through
([scheduler] in gpugate.toml), one entry each in ADAPTERS: Slurm
(gpugate.slurm's backends), Kubernetes (gpugate.kube.nodes), or both at
once where slurmd runs in a pod (gpugate.kube.paired: Slurm decides, the
Node mirrors).  All offer gpugate.schedulers.interface.Scheduler, so the
ownership rules, the budget and the keeper are written once above it.  A new
scheduler is its adapter and one line here."""

from __future__ import annotations

import importlib

from gpugate.errors import ConfigError

# scheduler name -> "module:connect"; each connect(settings, timeout=, deadline=)
# returns a connected Scheduler.  Imported only when connected: the prolog's
# healthy path connects to nothing.
ADAPTERS = {
    "slurm": "gpugate.slurm:connect",
    "kubernetes": "gpugate.kube.nodes:connect",
    "slurm+kubernetes": "gpugate.kube.paired:connect",  # Slurm, each hold mirrored on the Node that runs it
}
# [sweep] transport -> "module:make" where a scheduler brings its own channel
# from the sweep to a node (Kubernetes: the node agent, on the Node object, no
# ssh); "ssh" and "local" are the sweep's own (gpugate.node.transport).
TRANSPORTS = {
    "kubernetes": "gpugate.kube.transport:make",
}
# The controller commands that drive Slurm itself (sbatch, reservations) and
# are not built for Kubernetes yet.
SLURM_DRIVEN = ("slurm", "slurm+kubernetes")


def require_slurm(settings, what: str) -> None:
    """The controller commands not built for Kubernetes yet refuse, saying
    so, rather than reach for a Slurm that is not there."""
    if getattr(settings, "scheduler", "slurm") not in SLURM_DRIVEN:
        raise ConfigError("%s acts on Slurm only so far; this gpugate.toml says scheduler = %r "
                          "(docs/explanation/kubernetes.md: what is built for Kubernetes: the node agent, "
                          "`gpugate budget`, `sweep` and `status`)" % (what, settings.scheduler))


def connect(settings, timeout=None, deadline=None):
    """The configured scheduler's adapter, connected (ConfigError for a name
    no adapter has: the schema refuses it first)."""
    name = getattr(settings, "scheduler", "slurm")
    try:
        module, _, function = ADAPTERS[name].partition(":")
    except KeyError:
        raise ConfigError("scheduler = %r: no such scheduler (one of %s)" % (name, ", ".join(sorted(ADAPTERS)))) from None
    return getattr(importlib.import_module(module), function)(settings, timeout=timeout, deadline=deadline)


def transport_maker(name: str):
    """The make(settings) of a scheduler's own transport ([sweep] transport), or None."""
    spec = TRANSPORTS.get(name)
    if spec is None:
        return None
    module, _, function = spec.partition(":")
    return getattr(importlib.import_module(module), function)
