"""What slurmd gives the health check, read without asking the controller.

How long it may run: slurmd kills it at a hard-coded 60 s up to 25.11, and at
HealthCheckTimeout (slurm.conf, default 60) from 26.05; read from the node's
own slurm.conf.  Whether slurmctld holds the node in service:
SLURM_NODE_IS_HEALTHY, from 26.05.2 with SlurmctldParameters=health_check_report
(always from 26.11)."""

import os
import re
from typing import Iterable, Optional

DEFAULT_KILL = 60.0
# Writing the state, the log line and interpreter exit after the budget.
MARGIN = 10.0
# Where slurmd's configuration is on a node: the usual path, then the cache
# a configless slurmd keeps.
CANDIDATES = ("/etc/slurm/slurm.conf", "/run/slurm/conf/slurm.conf", "/var/spool/slurmd/conf-cache/slurm.conf")
_KEY = re.compile(r"(?i)(?:^|\s)HealthCheckTimeout\s*=\s*(\S+)")
_INTERVAL = re.compile(r"(?i)(?:^|\s)HealthCheckInterval\s*=\s*(\S+)")
_MAX_BYTES = 1 << 20


def parse_health_check_timeout(text: str, key: "re.Pattern" = _KEY) -> Optional[int]:
    """HealthCheckTimeout (or another HealthCheck* key) from slurm.conf text
    (the last one wins, as in Slurm), or None when absent or unreadable (0
    and junk: Slurm resets them to its default)."""
    found = None
    for line in text.splitlines():
        line = line.split("#", 1)[0]
        for match in key.finditer(line):
            value = match.group(1)
            found = int(value) if value.isdigit() and 0 < int(value) <= 65535 else None
    return found


def health_check_timeout(paths: Iterable[str], key: "re.Pattern" = _KEY) -> Optional[int]:
    for path in paths:
        if not path:
            continue
        try:
            with open(path, "r", errors="replace") as handle:
                return parse_health_check_timeout(handle.read(_MAX_BYTES), key)
        except OSError:
            continue
    return None


def health_check_interval(paths: Iterable[str]) -> Optional[int]:
    """HealthCheckInterval: how often slurmd runs the health check."""
    return health_check_timeout(paths, _INTERVAL)


def conf_paths(settings) -> list:
    return [str(settings.slurm.get("slurm_conf") or ""), os.environ.get("SLURM_CONF", "")] + list(CANDIDATES)


def healthcheck_budget(configured: float, timeout: Optional[int]) -> float:
    """The configured budget, cut to leave MARGIN before slurmd's kill (at
    least half of the kill time, so a tiny timeout still gets a check)."""
    kill = float(timeout) if timeout else DEFAULT_KILL
    return max(min(configured, kill - MARGIN), min(configured, kill / 2))


def slurm_node_is_healthy(environ) -> Optional[bool]:
    """SLURM_NODE_IS_HEALTHY: True ("yes") when slurmctld holds the node in
    service (not drained, draining, down, failing or in a MAINT reservation),
    False ("no") when it does not, None when slurmd did not say (older Slurm,
    the option off, or the run before slurmd registers)."""
    value = environ.get("SLURM_NODE_IS_HEALTHY")
    return {"yes": True, "no": False}.get(value.strip().lower()) if isinstance(value, str) else None
