"""The `gpugate` command.  Thin: parse options, call the library, print.
Library errors become messages and exit codes in one place (``Cli.invoke``)."""

import json
import os
import sys

import click

from gpugate import __version__
from gpugate.errors import ConfigError, GpugateError
from gpugate.cli import baseline_cmd
from gpugate.cli import demo as demo_cmd
from gpugate.cli import fleet as fleet_cmd
from gpugate.cli import sim as sim_cmd
from gpugate.cli import smoke as smoke_cmd
from gpugate.cli import status_cmd
from gpugate.cli import agent_cmd
from gpugate.cli import budget_cmd
from gpugate.cli import kmsg_cmd
from gpugate.cli import kube_preflight_cmd
from gpugate.cli import repair_cmd
from gpugate.cli import sweep as sweep_cmd
from gpugate.cli.context import default_node, in_context, load_context

EXIT_CODES = """\b
Exit codes:
  0  fit / success
  1  unfit (check), drift or uncovered nodes (audit), over the drain budget
     or audited nodes uncovered (baseline check), sweep stopped by its
     circuit breaker, a node refused (sweep repaired)
  2  usage or configuration error: nothing was changed
  3  Slurm did not answer or refused"""


class Cli(click.Group):
    def invoke(self, ctx):
        # As the node entry points: what gpugate creates (the sweep's lock,
        # journal, audit) is root's alone unless it says otherwise.  Given
        # back after the command: a program (or a test) that calls the CLI in
        # process keeps its own.
        umask = os.umask(0o077)
        try:
            return super().invoke(ctx)
        except GpugateError as exc:
            click.echo("gpugate: error: %s" % exc, err=True)
            sys.exit(exc.exit_code)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, SystemExit):
            raise
        except Exception as exc:  # a bug: say so plainly, the traceback on request
            if os.environ.get("GPUGATE_DEBUG"):
                raise
            click.echo("gpugate: internal error: %s: %s\n(run again with GPUGATE_DEBUG=1 for the traceback, "
                       "and report it)" % (type(exc).__name__, exc), err=True)
            sys.exit(2)
        finally:
            os.umask(umask)


@click.group(cls=Cli, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
             epilog=EXIT_CODES)
@click.version_option(__version__, "-V", "--version", prog_name="gpugate")
def main():
    """gpugate: keep a Slurm GPU fleet on its pinned baseline, drain unfit nodes
    with a precise reason, and return them to service only once verified.

    \b
    Examples:
      gpugate demo                                  # a local 8-node cluster, narrated
      gpugate check --mode healthcheck              # this node against the baseline
      gpugate check --sim fleet --node gpu03 --json # a simulated node
      gpugate explain --sim fleet --node gpu03      # what to do about it
      gpugate slurm-conf                            # the slurm.conf lines for this install
    """


_config_opt = click.option("--config", "-c", type=click.Path(dir_okay=False), default=None,
                           help="gpugate.toml (default: $GPUGATE_CONFIG or /etc/gpugate/gpugate.toml).")
_baseline_opt = click.option("--baseline", "-b", "baseline_path", type=click.Path(dir_okay=False), default=None,
                             help="baseline.toml to judge against (default: the one gpugate.toml names; with --sim "
                                  "and no --config, the one the fleet was created with).")
_sim_opt = click.option("--sim", type=click.Path(file_okay=False), default=None,
                        help="Check a simulated node of this fleet directory instead of this machine.")
_node_opt = click.option("--node", "-n", default=None, help="Node name (default: $SLURMD_NODENAME or the hostname).")


def _node_options(command):
    """--config, --baseline, --sim, --node: every command that looks at one node."""
    for option in (_node_opt, _sim_opt, _baseline_opt, _config_opt):
        command = option(command)
    return command


@main.command()
@_node_options
@click.option("--mode", "-m", type=click.Choice(["healthcheck", "prolog", "epilog", "verify"]),
              default="healthcheck", show_default=True, help="What to collect and the time budget.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object (keys: node, mode, fit, reason, findings, facts, durations).")
@click.option("--pin", type=click.Choice(["current", "previous"]), default="current", show_default=True,
              help="Judge against the baseline's [pin] or its [previous] block (what a rollback verifies).")
@click.option("--gpu", "gpus", type=click.IntRange(0, 99), multiple=True,
              help="These GPUs only (repeat): their facts and diagnostic (the sweep's repair of one held GPU).")
def check(config, baseline_path, sim, node, mode, as_json, pin, gpus):
    """Check one node against the baseline.  Never touches Slurm.

    \b
    Examples:
      gpugate check
      gpugate check --mode verify --json
      gpugate check --sim /tmp/fleet --node gpu02 --baseline new-baseline.toml
    """
    from gpugate.model.config import load_checked_baseline
    from gpugate.node.check import result_json, run_check

    node = node or default_node()
    settings = load_context(config, sim, baseline_path, node)
    baseline = load_checked_baseline(settings)
    if pin == "previous":
        baseline = baseline.as_previous()
    xid_after = -1
    if mode == "verify":
        from gpugate.node import xidhistory
        from gpugate.node.gpureset import verify_cursor

        xid_after = verify_cursor(settings, node)  # after the sweep's GPU reset: only Xids since
        baseline = xidhistory.deepen(settings, node, baseline)  # application Xids: the deep diagnostic
    result = run_check(settings, baseline, node, mode, xid_after=xid_after, gpus=sorted(set(gpus)) or None)
    # A pass of the deep diagnostic proves the GPUs: their application Xid history goes.
    cleared = xidhistory.after_verify(settings, node, baseline, result) if mode == "verify" else ""
    if as_json:
        answer = result_json(result, baseline, settings.baseline)
        if cleared:
            answer["xid_history"] = cleared
        click.echo(json.dumps(answer, sort_keys=True))
    else:
        from gpugate.cli.render import verdict_text

        click.echo(verdict_text(result) + ("\n" + cleared if cleared else ""))
    sys.exit(result.verdict.exit_code)


@main.command()
@_node_options
@click.option("--mode", "-m", type=click.Choice(["healthcheck", "prolog", "epilog", "verify"]), default="healthcheck")
def explain(config, baseline_path, sim, node, mode):
    """Check a node and show, for each finding, the runbook step it calls for.

    \b
    Examples:
      gpugate explain
      gpugate explain --sim /tmp/fleet --node gpu003
    """
    from gpugate.model.config import load_checked_baseline
    from gpugate.node.check import run_check
    from gpugate.cli.render import explain_text

    node = node or default_node()
    settings = load_context(config, sim, baseline_path, node)
    result = run_check(settings, load_checked_baseline(settings), node, mode)
    click.echo(explain_text(result))
    sys.exit(result.verdict.exit_code)


@main.command()
@_node_options
@click.option("--max-age", type=click.FloatRange(0, 86400 * 7), default=0, show_default=True,
              help="Print the last health check's facts when younger than this (seconds); else probe now.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object: node, at, source, facts, config_error (null, or why the node judges with "
                   "its last good gpugate.toml/baseline).")
def facts(config, baseline_path, sim, node, max_age, as_json):
    """Print this node's facts (what `gpugate audit` folds across the fleet).

    \b
    Examples:
      gpugate facts --json
      gpugate facts --json --max-age 900     # the last health check's, when fresh
    """
    import time

    from gpugate.model.config import config_path
    from gpugate.node.check import run_check
    from gpugate.node.lastgood import for_admin
    from gpugate.probes.reuse import last_state

    from gpugate.fleet.capture import probe_baseline

    node = node or default_node()
    record = {}  # config_error: the files did not load; the node's last good copies did
    baseline_error = None  # no baseline (yet): every fact is still read and printed, none judged
    if sim or baseline_path:
        from gpugate.model.config import load_checked_baseline

        settings = load_context(config, sim, baseline_path, node)
        try:
            baseline = load_checked_baseline(settings)
        except ConfigError as exc:
            baseline, baseline_error = probe_baseline(None, node, settings.node_root(node)), str(exc)
    else:
        from gpugate.model.config import load_settings

        try:
            settings, baseline = for_admin(lambda: load_settings(config, missing_ok=config is None),
                                           config_path(config), node, record)
        except ConfigError as exc:
            # gpugate.toml is needed (where to read, which tools); the baseline is not.
            settings = _settings_alone(config, node, record)
            baseline, baseline_error = probe_baseline(None, node, settings.node_root(node)), str(exc)
        settings = in_context(settings, node_required=node)
    last = last_state(settings, node) if max_age else None
    if last and last.get("facts") and time.time() - float(last.get("at", 0)) <= max_age:
        out = {"node": node, "at": last["at"], "source": "last health check", "facts": last["facts"],
               "config_error": last.get("config_error") or record.get("config_error")}
    else:
        from gpugate.model.facts import to_jsonable

        result = run_check(settings, baseline, node, "healthcheck")
        out = {"node": node, "at": time.time(), "source": "probed", "facts": to_jsonable(result.facts),
               "config_error": record.get("config_error")}
    # null, or why no baseline loaded: the facts are printed, none judged (those
    # only a baseline asks for, e.g. an IMEX member's nvidia-imex-ctl, are not read).
    out["baseline_error"] = baseline_error
    from gpugate.node.locks import healthcheck_stuck

    # null, or the health check lock held past a check's whole budget: no check runs on the node.
    out["lock_stuck"] = healthcheck_stuck(settings, node, time.time())
    from gpugate.preflight.memory import stats

    out["preflight"] = stats(settings, node)  # null before a first job preflight; `gpugate status` sums them
    click.echo(json.dumps(out, sort_keys=True) if as_json else json.dumps(out, indent=1, sort_keys=True))


def _settings_alone(config, node, record):
    """gpugate.toml (or its last good copy) when the baseline is what failed."""
    from gpugate.model.config import config_path, load_settings
    from gpugate.node import lastgood

    try:
        return load_settings(config, missing_ok=config is None)
    except ConfigError:
        return lastgood.load_settings(config_path(config), node, record)


@main.command("slurm-conf")
@_config_opt
@click.option("--release", default="22.05", show_default=True, help="Slurm release the fragment is for.")
def slurm_conf(config, release):
    """Print the slurm.conf lines that point slurmd at this installation.
    List-valued parameters (PrologFlags, SchedulerParameters, SlurmctldParameters)
    come as comments: add their value to the list your slurm.conf already has.
    PrologEpilogTimeout is the prolog's worst case from gpugate.toml's
    [preflight] and [budgets] (gpugate.slurm.prologtimeout).

    \b
    Examples:
      gpugate slurm-conf
      gpugate slurm-conf --release 24.11
    """
    from gpugate.slurm.fragment import fragment

    click.echo(fragment(config, release), nl=False)


# The subcommand modules define their commands; the group gathers them here
# (they do not import this module, so there is no cycle).
for _command in (sim_cmd.sim, demo_cmd.demo, sweep_cmd.sweep, fleet_cmd.audit, fleet_cmd.metrics, smoke_cmd.smoke,
                 status_cmd.status, baseline_cmd.baseline, budget_cmd.budget, repair_cmd.evidence,
                 repair_cmd.reset_gpus, kmsg_cmd.kmsg_follow, agent_cmd.agent, kube_preflight_cmd.kube_preflight):
    main.add_command(_command)
