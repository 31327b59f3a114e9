"""The slurm.conf fragment for this installation (`gpugate slurm-conf`)."""

import os
import sysconfig
from typing import Optional

from gpugate.safety import trust
from gpugate.model.config import DEFAULT_CONFIG
from gpugate.errors import ConfigError

REBOOT_PROGRAM = "/usr/sbin/reboot"

# HealthCheckNodeState values each Slurm release accepts.
NODE_STATES = {
    (22, 5): "ANY,ALLOC,MIXED,IDLE,CYCLE",
    (23, 2): "ANY,ALLOC,MIXED,IDLE,NONDRAINED_IDLE,CYCLE",
    (25, 11): "ANY,ALLOC,MIXED,IDLE,NONDRAINED_IDLE,START_ONLY,CYCLE",
    (26, 5): "ANY,ALLOC,MIXED,IDLE,NONDRAINED_IDLE,START_ONLY,REBOOT_ONLY,CYCLE",
}


def _release(text: str):
    try:
        major, minor = text.split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        from gpugate.errors import ConfigError

        raise ConfigError("--release: expected MAJOR.MINOR such as 22.05, got %r" % text) from None


def allowed_states(release) -> str:
    best = (22, 5)
    for known in sorted(NODE_STATES):
        if release >= known:
            best = known
    return NODE_STATES[best]


def vouch(programs) -> str:
    """slurmd runs every program this fragment names as root, and gpugate
    never does (so runner's check cannot cover them): refuse to point slurmd
    at one root could not vouch for.  One missing here (slurm-conf run off
    the node) is a comment in the fragment, not an error."""
    notes = []
    for key, path in programs:
        try:
            os.close(trust.open_executable(path, key))
        except FileNotFoundError:
            notes.append("# NOTE: %s=%s does not exist on this machine: install it on the nodes\n" % (key, path))
        except OSError as exc:
            raise ConfigError("%s: %s: cannot check it (%s)" % (path, key, exc.strerror or exc)) from None
    return "".join(notes)


def fragment(config: Optional[str], release_text: str = "22.05", settings=None) -> str:
    """settings: gpugate.toml's (its [preflight] and [budgets] size the
    prolog's timeout: gpugate.slurm.prologtimeout); None: the defaults."""
    from gpugate.slurm.prologtimeout import DEFAULT, prolog_timeout, worst_case

    release = _release(release_text)
    if settings is None:
        from gpugate.model.config import load_settings

        settings = load_settings(None, missing_ok=True) if config is None else load_settings(config)
    prolog_seconds = prolog_timeout(settings.preflight, settings.budgets)
    scripts = sysconfig.get_path("scripts")
    entry = {m: os.path.join(scripts, "gpugate-" + m) for m in ("healthcheck", "prolog", "epilog")}
    missing = vouch([("HealthCheckProgram", entry["healthcheck"]), ("Prolog", entry["prolog"]),
                     ("Epilog", entry["epilog"]), ("RebootProgram", REBOOT_PROGRAM)])
    from gpugate.probes.install_trust import vouch_install, vouch_shebangs

    vouch_install()  # the code those entry points import, and its interpreter
    vouch_shebangs([entry[m] for m in ("healthcheck", "prolog", "epilog")])  # and -I on their #! lines
    note = ""
    if config and os.path.abspath(config) != DEFAULT_CONFIG:
        note = ("# gpugate reads %s by default; slurmd passes no arguments, so install\n"
                "# gpugate.toml there (or point small wrapper scripts at --config %s).\n"
                % (DEFAULT_CONFIG, os.path.abspath(config)))
    timeout = ""
    if release >= (26, 5):
        timeout = "HealthCheckTimeout=50          # 26.05+: keep above gpugate's budgets.healthcheck\n"
    if (26, 5) <= release < (26, 11):
        # A second SlurmctldParameters line would replace the site's own list.
        timeout += ("# 26.05.2+: with health_check_report slurmd tells the health check whether\n"
                    "# slurmctld holds the node in service (SLURM_NODE_IS_HEALTHY; always on from\n"
                    "# 26.11), which spares a fit node's check a controller read. Add it to your\n"
                    "# SlurmctldParameters list:\n"
                    "#SlurmctldParameters=health_check_report\n")
    return """# --- gpugate (Slurm {rel}) ---
{note}{missing}{devices}# Health check: slurmd runs it on every HealthCheckInterval while slurmctld
# pings; it gets no PATH and is killed at {kill}; gpugate keeps
# its own budget (budgets.healthcheck, default 40 s) and locks against overlap.
# LBNL NHC: set [nhc] command in gpugate.toml and gpugate runs it within that
# budget (docs/how-to/nhc.md); not a second HealthCheckProgram line.
HealthCheckProgram={hc}
HealthCheckInterval=300
# Accepted here: {states}
HealthCheckNodeState=ANY
{timeout}# Prolog: the fast gate before every job; drains and fails (the job is
# requeued) when the node went bad since the last health check.
Prolog={pro}
Epilog={epi}
# PrologFlags is a list: add Alloc to yours (a second line would replace it).
# Alloc runs the prolog when the job is allocated, before anything starts.
# With a [preflight] (docs/how-to/preflight.md): Alloc,DeferBatch (and
# ForceRequeueOnFail on 23.02+).
#PrologFlags=Alloc
# Unlimited by default: bound the prolog and epilog. The prolog's worst case
# from gpugate.toml's [preflight] and [budgets] (any job may ask for a
# preflight with the job word; never under {default} s; `gpugate audit` holds
# Slurm to it):
#   {worst}
# The epilog's budget is 50 s; its DCGM diagnostic, when enabled, needs more.
PrologEpilogTimeout={prolog_seconds}
# SchedulerParameters is a list (backfill tuning, ...): add nohold_on_prolog_fail
# to yours, so that a job whose prolog failed is requeued without a hold.
#SchedulerParameters=nohold_on_prolog_fail
# The sweep reboots through `scontrol reboot`: your site's reboot command.
RebootProgram={reboot}
# --- end gpugate ---
""".format(rel="%d.%02d" % release, note=note, kill="60 s" if release < (26, 5) else "HealthCheckTimeout",
           hc=entry["healthcheck"], states=allowed_states(release), timeout=timeout,
           pro=entry["prolog"], epi=entry["epilog"], missing=missing, reboot=REBOOT_PROGRAM, devices=devices_hint("/"),
           worst=worst_case(settings.preflight, settings.budgets)[1], default=DEFAULT,
           prolog_seconds=prolog_seconds)


def devices_hint(root: str) -> str:
    """cgroup.conf's ConstrainDevices, said once here (and in the audit's
    job_devices row), never in an epilog: without it a job's process may
    use another job's GPU, which the epilog leaves alone while that job
    runs (gpugate.probes.owners)."""
    from gpugate.model.jobfacts import CONSTRAINED
    from gpugate.probes.owners import job_devices

    state = job_devices(root)
    text = ("# cgroup.conf (not slurm.conf), with TaskPlugin=task/cgroup: ConstrainDevices=yes\n"
            "# confines each job to its own GPUs.  Without it a job may use another's GPU;\n"
            "# the epilog then drains only for a process no running job owns\n"
            "# (docs/explanation/what-drains-when.md).  ProctrackType other than proctrack/cgroup:\n"
            "# a job's process is the job of the slurmstepd above it; one reparented to init is a leftover.\n")
    if isinstance(state, str) and state != CONSTRAINED and ("no cgroup.conf" not in state or "ProctrackType" in state):
        text += "# NOTE: on this machine %s\n" % state
    return text
