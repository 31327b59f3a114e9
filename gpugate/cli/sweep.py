"""`gpugate sweep`: plan (default) or apply the return of drained nodes.
The work is in gpugate.sweep.run; this parses options and renders."""

import json
import os
import sys

import click



def _context(config, force=False):
    from gpugate.model.config import load_checked_baseline, load_settings
    from gpugate.schedulers.registry import connect

    settings = load_settings(config, missing_ok=config is None)
    if force and settings.scheduler == "kubernetes":
        raise click.UsageError("--force cancels Slurm jobs; on Kubernetes pods leave through the Eviction API and "
                               "a PodDisruptionBudget is never bypassed (a blocked node is deferred, held)")
    return settings, load_checked_baseline(settings), connect(settings)


@click.group(invoke_without_command=True)
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
@click.option("--rollout-if-in-progress", "rollout_if", is_flag=True,
              help="For the timer: repair as without it; then, only while the baseline says [rollout] "
                   "in_progress = true, roll the canary batch once per rollout and never more (the rest waits "
                   "for approval: `gpugate sweep --rollout --apply` by hand).")
@click.option("--preview", is_flag=True, help="Also run the configured preview command on the first batch.")
@click.pass_context
def sweep(ctx, config, apply_, as_json, partition, nodes, max_batch, force, rollout, rollout_if, preview):
    """Return the nodes gpugate drained to service: reconverge or reboot them
    in batches that keep every partition above its floor, verify each one
    (versions equal the pin, DCGM diagnostic passes) and only then RESUME it.
    What cannot be fixed, and a node drained again and again for the same
    component (repeat_limit times within repeat_window), is escalated with
    an `rma` reason.

    \b
    Examples:
      gpugate sweep                      # the plan: batches, commands, why each node is in or out
      gpugate sweep --apply              # do it
      gpugate sweep --apply -p gpu -w 'gpu[001-064]' --max-batch 4
      gpugate sweep --rollout --apply    # a planned rollout of a new pin
      gpugate sweep --apply --rollout-if-in-progress   # the timer: repairs, and a rollout's canary only
      gpugate sweep status               # what the journal says
      gpugate sweep forgive gpu017       # clear a repeat offender's record
      gpugate sweep repaired gpu017      # back from rma after its GPU was replaced, through the proofs
    """
    if ctx.invoked_subcommand is not None:
        return
    if rollout and rollout_if:
        raise click.UsageError("--rollout and --rollout-if-in-progress: give one (--rollout rolls every batch; "
                               "--rollout-if-in-progress, for the timer, the canary only)")
    from gpugate.sweep import run
    from gpugate.node.transport import make as make_transport
    from gpugate.cli.sweep_render import plan_json, plan_text, report_json, report_text

    settings, baseline, slurm = _context(config, force)
    options = run.options(settings, baseline, partition, nodes, max_batch)
    transport = make_transport(settings)
    held = run.lock(settings) if apply_ else None
    journal = None
    try:
        journal = run.open_journal(settings)
        if rollout:
            options = run.with_rollout(settings, baseline, slurm, transport, options)
        if not apply_:
            current, snap = run.current_plan(settings, slurm, journal, options)
            note = _canary(settings, baseline, slurm, transport, journal, options)[1] if rollout_if else None
            if as_json:
                click.echo(json.dumps(dict(plan_json(current, settings, snap), **({"rollout": note} if note else {})),
                                      sort_keys=True))
            else:
                click.echo(plan_text(current, settings, snap) + ("\n" + note if note else ""))
                if preview:
                    argv, output = run.preview(settings, current)
                    click.echo(("$ " + " ".join(argv) + "\n" if argv else "") + output)
            return
        say = (lambda text: None) if as_json else (lambda text: click.echo(text))
        report = run.apply(settings, baseline, slurm, transport, journal, options, sys.argv, force=force, say=say)
        note = None
        if rollout_if and not report.stopped:  # the repairs first; the canary only on a sweep not stopped
            from gpugate.sweep.timed_rollout import merged

            canary_options, note = _canary(settings, baseline, slurm, transport, journal, options)
            say(note)
            if canary_options is not None:
                report = merged(report, run.apply(settings, baseline, slurm, transport, journal, canary_options,
                                                  sys.argv, force=force, say=say))
        if as_json:
            click.echo(json.dumps(dict(report_json(report), **({"rollout": note} if note else {})), sort_keys=True))
        else:
            click.echo(report_text(report))
        if report.stopped:
            click.echo("gpugate sweep: %s" % report.stopped, err=True)
            sys.exit(1)
    finally:
        if journal is not None:
            journal.close()
        if held is not None:
            held.release()


def _canary(settings, baseline, slurm, transport, journal, options):
    from gpugate.sweep.timed_rollout import canary

    return canary(settings, baseline, slurm, transport, journal, options)


@sweep.command("status")
@click.option("--config", "-c", type=click.Path(dir_okay=False), default=None, help="gpugate.toml.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def sweep_status(ctx, config, as_json):
    """What the sweep journal says: nodes in flight, recent runs, each node's last step.

    \b
    Examples:
      gpugate sweep status
      gpugate sweep status --json
    """
    from gpugate.model.config import load_settings

    config = config or ctx.parent.params.get("config")  # `gpugate sweep -c X status` too
    from gpugate.sweep.journal import Journal
    from gpugate.cli.sweep_render import status_json, status_text

    settings = load_settings(config, missing_ok=config is None)
    if not os.path.exists(settings.sweep["journal"]):
        click.echo("no sweep has run yet (no journal at %s)" % settings.sweep["journal"])
        return
    journal = Journal(settings.sweep["journal"])
    try:
        stuck = _sweep_lock_stuck(settings)
        if as_json:
            click.echo(json.dumps(dict(status_json(journal), lock_stuck=stuck), sort_keys=True))
        else:
            click.echo(status_text(journal))
            if stuck:
                click.echo("\nSWEEP LOCK STUCK: pid %d has held %s for %ds, longer than one batch's time limits "
                           "(%ds): if that sweep is stuck, stop it (the next run continues from the journal)"
                           % (stuck["pid"], stuck["path"], stuck["seconds"], stuck["bound"]))
    finally:
        journal.close()


def _sweep_lock_stuck(settings):
    """{"lock", "pid", "seconds", "path", "bound"} when a sweeper holds the
    sweep's lock longer than one batch's time limits (sweep.run.batch_bound),
    else None.  Takes no lock."""
    import time

    from gpugate.safety.lock import lock_stuck
    from gpugate.sweep.run import batch_bound, lock_path

    path, bound = lock_path(settings), batch_bound(settings)
    stuck = lock_stuck(path, "sweep", bound, time.time())
    return dict(stuck, path=path, bound=round(bound)) if stuck else None


@sweep.command("forgive")
@click.option("--config", "-c", type=click.Path(dir_okay=False), default=None, help="gpugate.toml.")
@click.argument("nodes")
@click.pass_context
def sweep_forgive(ctx, config, nodes):
    """Clear the repeat-offender record of NODES (a hostlist): the sweep
    counts their returns to service from zero again.  The history stays in
    the journal, marked forgiven.  A node the sweep escalated as a repeat
    offender (`rma repeat=...`), or for the application's Xids on a GPU
    (`rma xid_repeat...`), is drained again with the reason it had, so the
    next `gpugate sweep --apply` repairs and verifies it (the node then
    clears its Xid history); any other reason is left alone.

    \b
    Examples:
      gpugate status                     # lists the repeat offenders
      gpugate sweep forgive gpu017       # after replacing its GPU
      gpugate sweep forgive 'gpu[017,101-102]'
    """
    from gpugate.model.config import load_settings
    from gpugate.core.names import parse_hostlist
    from gpugate.schedulers.registry import connect
    from gpugate.sweep import run

    config = config or ctx.parent.params.get("config")  # `gpugate sweep -c X forgive N` too
    names = sorted(parse_hostlist(nodes, "NODES"))
    settings = load_settings(config, missing_ok=config is None)
    journal = run.open_journal(settings)
    try:
        for line in run.forgive(settings, connect(settings), journal, names, who=os.environ.get("SUDO_USER", "")):
            click.echo(line)
    finally:
        journal.close()


@sweep.command("repaired")
@click.option("--config", "-c", type=click.Path(dir_okay=False), default=None, help="gpugate.toml.")
@click.argument("nodes")
@click.pass_context
def sweep_repaired(ctx, config, nodes):
    """Return NODES (a hostlist) from rma after a hardware repair (a GPU
    replaced), through the sweep's proof: never a bare RESUME.  For each
    node whose reason is gpugate's rma, the repeat-offender record is
    cleared (as `sweep forgive` does; the journal keeps the history and
    notes the repair) and the rma reason is replaced by the sweep's work
    reason `sweep=reboot after repair` (`reconverge` for a node drained
    for versions), so the next `gpugate sweep --apply` reboots it, verifies
    it (versions, DCGM diagnostic), runs the smoke job and only then
    RESUMEs it; a node that fails is escalated again.  A node whose reason
    is not gpugate's rma (an admin's, Slurm's, another gpugate class) is
    refused and left as it is.  Run it once the node is back up.

    \b
    Exit 0: every node was handed back to the sweep.
    Exit 1: a node was refused (the others were handed back).

    \b
    Examples:
      gpugate sweep repaired gpu017               # its GPU replaced
      gpugate sweep repaired 'gpu[017,101-102]'
      gpugate sweep repaired gpu017 && gpugate sweep --apply -w gpu017
    """
    from gpugate.model.config import load_settings
    from gpugate.core.names import parse_hostlist
    from gpugate.schedulers.registry import connect
    from gpugate.sweep import run
    from gpugate.sweep.repaired import repaired

    config = config or ctx.parent.params.get("config")  # `gpugate sweep -c X repaired N` too
    names = sorted(parse_hostlist(nodes, "NODES"))
    settings = load_settings(config, missing_ok=config is None)
    journal = run.open_journal(settings)
    try:
        done, refused = repaired(settings, connect(settings), journal, names, who=os.environ.get("SUDO_USER", ""))
    finally:
        journal.close()
    for line in done:
        click.echo(line)
    for line in refused:
        click.echo("gpugate sweep repaired: %s" % line, err=True)
    sys.exit(1 if refused else 0)
