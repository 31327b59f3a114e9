"""What every command that looks at one node needs: its name, and the
settings with --sim/--baseline applied.  Apart from the group (cli/main.py)
so that the subcommand modules can use it without importing main back."""

import os
import socket

from gpugate.errors import ConfigError


def default_node() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def load_context(config, sim, baseline_path, node_required=None):
    """Settings (and a simulated fleet, when --sim is given) for a command."""
    from gpugate.model.config import load_settings

    from gpugate.model.config import CONFIG_ENV

    explicit = bool(config or os.environ.get(CONFIG_ENV))
    return in_context(load_settings(config, missing_ok=config is None), sim, baseline_path, node_required,
                      explicit)


def in_context(settings, sim=None, baseline_path=None, node_required=None, config_explicit=True):
    """Settings with --sim and --baseline applied, the simulated node checked.
    The baseline: --baseline, else that of a gpugate.toml named by --config
    or $GPUGATE_CONFIG, else the one the --sim fleet was created with, else
    gpugate.toml's (the default one's, or /etc/gpugate/baseline.toml)."""
    from gpugate.core.record import replace

    if sim:
        settings = replace(settings, sim_fleet=os.path.abspath(sim))
        from gpugate.sim.fleet import recorded_baseline

        recorded = recorded_baseline(settings.sim_fleet)
        if recorded and not config_explicit:
            settings = replace(settings, baseline=recorded)
    if node_required and settings.sim_fleet and not os.path.isdir(os.path.join(settings.sim_fleet, node_required)):
        raise ConfigError("%s: no simulated node %s there" % (settings.sim_fleet, node_required))
    if baseline_path:
        settings = replace(settings, baseline=os.path.abspath(baseline_path))
    return settings
