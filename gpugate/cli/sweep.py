"""`gpugate sweep`: plan (default) or apply the return of drained nodes."""

import json
import os
import sys
import time

import click

from ..errors import ConfigError, GpugateError
from .main import main


class SweepBusy(GpugateError):
    pass


def _options(settings, baseline, partition, nodes, max_batch):
    from ..names import parse_hostlist
    from ..sweep.plan import Options

    policy = baseline.health
    actions = {int(k): v for k, v in policy.xid_actions.items()}
    escalate = frozenset(x for x, a in actions.items() if a in ("rma", "investigate"))
    cfg = settings.sweep
    return Options(
        max_batch=int(max_batch or cfg["max_batch"]), floor=float(cfg["floor"]),
        floors={k: float(v) for k, v in cfg["floors"].items()},
        nodes=frozenset(parse_hostlist(nodes)) if nodes else None,
        partitions=frozenset(partition) if partition else None,
        canary=int(cfg["canary"]), escalate_xids=escalate)


def _context(config):
    from ..config import load_checked_baseline, load_settings
    from ..slurm import connect

    settings = load_settings(config, missing_ok=config is None)
    return settings, load_checked_baseline(settings), connect(settings)


@main.group(invoke_without_command=True)
@click.option("--config", "-c", type=click.Path(dir_okay=False), default=None, help="gpugate.toml.")
@click.option("--apply", "apply_", is_flag=True, help="Execute the plan (default: only print it).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan (or the summary) as JSON.")
@click.option("--partition", "-p", multiple=True, help="Only nodes in this partition (repeatable).")
@click.option("--nodes", "-w", default=None, help="Only these nodes (hostlist).")
@click.option("--max-batch", type=click.IntRange(1, 100000), default=None, help="Nodes per batch at most.")
@click.option("--force", is_flag=True, help="Cancel the jobs still running on a batch's nodes instead of "
              "waiting for them to finish.")
@click.option("--rollout", is_flag=True, help="Roll the fleet from [previous] to [pin]: drain, converge, "
              "verify and resume the nodes still on [previous], canary batch first.")
@click.option("--preview", is_flag=True, help="Also run the configured preview command on the first batch.")
@click.pass_context
def sweep(ctx, config, apply_, as_json, partition, nodes, max_batch, force, rollout, preview):
    """Return the nodes gpugate drained to service: reconverge or reboot them
    in batches that keep every partition above its floor, verify each one
    (versions equal the pin, DCGM diagnostic passes) and only then RESUME it.
    What cannot be fixed is escalated with an `rma` reason.

    \b
    Examples:
      gpugate sweep                      # the plan: batches, commands, why each node is in or out
      gpugate sweep --apply              # do it
      gpugate sweep --apply -p gpu -w 'gpu[001-064]' --max-batch 4
      gpugate sweep --rollout --apply    # a planned rollout of a new pin
      gpugate sweep status               # what the journal says
    """
    if ctx.invoked_subcommand is not None:
        return
    from ..config import check_state
    from ..sweep.engine import Sweeper
    from ..sweep.journal import Journal
    from ..sweep.plan import plan as make_plan
    from ..sweep.snapshot import take
    from ..sweep.transport import make as make_transport
    from .sweep_render import plan_json, plan_text, report_json, report_text

    settings, baseline, slurm = _context(config)
    options = _options(settings, baseline, partition, nodes, max_batch)
    transport = make_transport(settings)
    journal_path = str(settings.sweep["journal"])
    check_state(os.path.dirname(os.path.abspath(journal_path)), files=(journal_path,))
    lock = _lock(settings) if apply_ else None
    journal = Journal(journal_path)
    try:
        from dataclasses import replace

        rollout_nodes = None
        if rollout:
            if baseline.previous is None:
                raise ConfigError("%s: --rollout needs a [previous] block in the baseline" % settings.baseline)
            rollout_nodes = _nodes_on_previous(slurm, transport, settings, options)
            options = replace(options, rollout=rollout_nodes)
        if not apply_:
            snap = take(slurm.nodes(), settings.reason_tag, time.time())
            current = make_plan(snap, replace(options, in_flight=frozenset(journal.in_flight())))
            if as_json:
                click.echo(json.dumps(plan_json(current, settings, snap), sort_keys=True))
            else:
                click.echo(plan_text(current, settings, snap))
                if preview:
                    _run_preview(settings, current)
            return
        say = (lambda text: None) if as_json else (lambda text: click.echo(text))
        journal.start_run(sys.argv)
        sweeper = Sweeper(settings, baseline, slurm, transport, journal, options, force=force, say=say)
        report = sweeper.run()
        journal.end_run("stopped" if report.stopped else "ok")
        click.echo(json.dumps(report_json(report), sort_keys=True) if as_json else report_text(report))
        if report.stopped:
            click.echo("gpugate sweep: %s" % report.stopped, err=True)
            sys.exit(1)
    finally:
        journal.close()
        if lock is not None:
            lock.release()


@sweep.command("status")
@click.option("--config", "-c", type=click.Path(dir_okay=False), default=None, help="gpugate.toml.")
@click.option("--json", "as_json", is_flag=True)
def sweep_status(config, as_json):
    """What the sweep journal says: nodes in flight, recent runs, each node's last step."""
    from ..config import load_settings
    from ..sweep.journal import Journal
    from .sweep_render import status_json, status_text

    settings = load_settings(config, missing_ok=config is None)
    if not os.path.exists(settings.sweep["journal"]):
        click.echo("no sweep has run yet (no journal at %s)" % settings.sweep["journal"])
        return
    journal = Journal(settings.sweep["journal"])
    try:
        click.echo(json.dumps(status_json(journal), sort_keys=True) if as_json else status_text(journal))
    finally:
        journal.close()


def _lock(settings):
    from ..node.lock import RunLock

    path = os.path.join(os.path.dirname(os.path.abspath(settings.sweep["journal"])), "sweep.lock")
    lock = RunLock(path)
    if not lock.acquire():
        try:
            with open(path) as handle:
                holder = handle.read().strip()
        except OSError:
            holder = "?"
        raise SweepBusy("another gpugate sweep (pid %s) holds %s; it must finish first" % (holder, path))
    return lock


def _nodes_on_previous(slurm, transport, settings, options):
    """In-service nodes whose check reports components pending the rollout."""
    from ..sweep.snapshot import take

    snap = take(slurm.nodes(), settings.reason_tag, time.time())
    scope = [n for n, v in snap.nodes.items() if v.in_service and (options.nodes is None or n in options.nodes)
             and (options.partitions is None or set(v.partitions) & options.partitions)]
    answers = transport.check(sorted(scope), ["--mode", "healthcheck"], float(settings.sweep["verify_timeout"]))
    return frozenset(n for n, a in answers.items() if isinstance(a, dict) and a.get("pending"))


def _run_preview(settings, current):
    from ..errors import CommandError
    from ..runner import run
    from ..sweep.transport import expand

    template = settings.sweep["preview"]
    batches = [b for b in current.batches if b.remedy != "escalate"]
    if not template or not batches:
        click.echo("(no preview command configured, or nothing to converge)")
        return
    argv = expand(template, list(batches[0].nodes))
    click.echo("$ " + " ".join(argv))
    try:
        click.echo(run(argv, float(settings.sweep["converge_timeout"]), ok_codes=range(256)).stdout)
    except CommandError as exc:
        click.echo("preview failed: %s" % exc)
