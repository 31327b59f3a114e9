"""`gpugate audit` and `gpugate metrics`: the fleet's versions, and a
Prometheus summary for the controller."""

import json
import os
import sys
import time

import click



def _settings(config):
    from gpugate.model.config import load_settings

    return load_settings(config, missing_ok=config is None)


def audit_path(settings) -> str:
    """The latest audit's facts, next to the sweep journal (`baseline diff` reads it)."""
    return os.path.join(os.path.dirname(os.path.abspath(settings.sweep["journal"])), "audit.json")


def _select_nodes(settings, nodes, partitions):
    """The nodes to audit (a hostlist, or Slurm's nodes, optionally of
    partitions) and node -> partitions of every Slurm node, which `baseline
    check` needs for the drain budget; None when Slurm did not answer and
    a hostlist was given (the audit goes on without them)."""
    from gpugate.errors import SlurmError
    from gpugate.core.names import parse_hostlist
    from gpugate.schedulers.registry import require_slurm
    from gpugate.slurm import connect

    wanted = set(parse_hostlist(nodes)) if nodes else None
    if wanted is None or partitions:
        require_slurm(settings, "gpugate audit without -w, or with -p,")
    if getattr(settings, "scheduler", "slurm") != "slurm":  # -w alone: the nodes named, no partitions
        click.echo("gpugate audit: no partitions recorded (scheduler = %r)" % settings.scheduler, err=True)
        return sorted(wanted), None
    try:
        states = connect(settings).nodes()
    except SlurmError as exc:
        if wanted is None or partitions:
            raise
        click.echo("gpugate audit: no partitions recorded (Slurm did not answer: %s); `baseline check` "
                   "needs them: run the audit where Slurm answers" % exc, err=True)
        return sorted(wanted), None
    member_of = {n: list(st.partitions) for n, st in states.items()}
    if wanted is not None and not partitions:
        return sorted(wanted), member_of
    chosen = [n for n, st in states.items() if not partitions or set(st.partitions) & set(partitions)]
    if wanted is not None:
        chosen = [n for n in chosen if n in wanted]
    return sorted(chosen), member_of


@click.command()
@click.option("--config", "-c", type=click.Path(dir_okay=False), default=None, help="gpugate.toml.")
@click.option("--nodes", "-w", default=None, help="Only these nodes (hostlist); default: every Slurm node.")
@click.option("--partition", "-p", multiple=True, help="Only nodes of this partition (repeatable).")
@click.option("--baseline", "-b", "baseline_path", type=click.Path(dir_okay=False), default=None,
              help="Compare with this baseline (default: the configured one).")
@click.option("--max-age", type=click.FloatRange(0, 7 * 86400), default=900, show_default=True,
              help="Use a node's last health-check facts when younger than this (seconds).")
@click.option("--json", "as_json", is_flag=True, help="The same content as JSON.")
def audit(config, nodes, partition, baseline_path, max_age, as_json):
    """Every component's distinct values across the fleet, folded into
    hostlists, with the pinned value and the drift.  Exit 1 when any node
    drifts, no [nodes] section covers it, its gpugate.toml/baseline does
    not load there (it gates with its last good copy; for cron jobs and pipelines),
    or Slurm's PrologEpilogTimeout is under the prolog's worst case (`gpugate slurm-conf`);
    unreachable and uncovered nodes are listed.  The facts and Slurm's
    partitions are kept for `gpugate baseline diff` and `baseline check`.

    \b
    Examples:
      gpugate audit
      gpugate audit -p gpu --json
      gpugate audit -w 'gpu[001-064]' -b new-baseline.toml
    """
    from gpugate.core.record import replace

    from gpugate.model.baseline import load_baseline
    from gpugate.fleet.audit import fold, to_json, to_text
    from gpugate.safety.state import write_json
    from gpugate.node.transport import make as make_transport

    settings = _settings(config)
    if baseline_path:
        settings = replace(settings, baseline=os.path.abspath(baseline_path))
    baseline = load_baseline(settings.baseline)
    names, member_of = _select_nodes(settings, nodes, partition)
    answers = make_transport(settings).facts(names, max_age, float(settings.sweep["verify_timeout"]))
    fleet = {n: (a["facts"] if isinstance(a, dict) and isinstance(a.get("facts"), dict) else str(a))
             for n, a in answers.items()}
    errors = {n: a["config_error"] for n, a in answers.items() if isinstance(a, dict) and a.get("config_error")}
    # Nodes whose health check lock is held past a check's budget (gpugate.safety.lock): `gpugate status` says so.
    stuck = {n: a["lock_stuck"] for n, a in answers.items()
             if isinstance(a, dict) and isinstance(a.get("lock_stuck"), dict)}
    # Each node's job preflight counts (gpugate.preflight.memory): `gpugate status` sums them.
    preflight = {n: a["preflight"] for n, a in answers.items()
                 if isinstance(a, dict) and isinstance(a.get("preflight"), dict)}
    result = fold(fleet, baseline, errors)
    try:
        write_json(audit_path(settings), {"at": time.time(), "baseline": settings.baseline, "facts": fleet,
                                          "partitions": member_of, "config_errors": errors, "locks_stuck": stuck,
                                          "preflight": preflight})
    except OSError as exc:
        click.echo("gpugate audit: could not keep the audit for `baseline diff`: %s" % exc, err=True)
    timeout = _prolog_timeout(settings)
    if as_json:
        click.echo(json.dumps(dict(to_json(result), nodes=len(names), prolog_timeout=timeout), sort_keys=True))
    else:
        click.echo("audit of %d nodes against %s (%s)" % (len(names), baseline.name, settings.baseline))
        click.echo(to_text(result))
        if timeout.get("short"):
            click.echo("PROLOG TIMEOUT: %s (%s)" % (timeout["short"], timeout["sum"]))
    sys.exit(1 if result.drift or result.uncovered or result.config_errors or timeout.get("short") else 0)


def _prolog_timeout(settings) -> dict:
    """Slurm's PrologEpilogTimeout against the prolog's worst case
    (gpugate.slurm.prologtimeout); {} where no Slurm runs the prolog."""
    if "slurm" not in str(getattr(settings, "scheduler", "slurm")):
        return {}
    from gpugate.slurm.prologtimeout import check_slurm

    return check_slurm(settings)


@click.command()
@click.option("--config", "-c", type=click.Path(dir_okay=False), default=None, help="gpugate.toml.")
@click.option("--output", "-o", type=click.Path(dir_okay=False), default=None,
              help="Write the exposition atomically to this file (node_exporter's textfile collector).")
def metrics(config, output):
    """Fleet summary in Prometheus text format (controller side): nodes per
    gpugate class, nodes drained by others, drift per component from the
    latest audit, and the sweep's progress from its journal.

    \b
    Examples:
      gpugate metrics
      gpugate metrics -o /var/lib/node_exporter/textfile/gpugate_fleet.prom
    """
    from gpugate.budget.rules import fleet_usage
    from gpugate.fleet.metrics import fleet_families
    from gpugate.core.promtext import render
    from gpugate.safety.state import read_json
    from gpugate.safety.safeio import AUDIT_CAP
    from gpugate.slurm import connect
    from gpugate.sweep.snapshot import take

    from gpugate.model.baseline import load_baseline

    settings = _settings(config)
    # A baseline that does not load is an error, not "nothing is pinned":
    # exit 2 before anything is read or written.
    baseline = load_baseline(settings.baseline)
    states = connect(settings).nodes()
    snap = take(states, settings.reason_tag, time.time())
    journal_nodes, last_run, evidence = {}, None, {}
    if os.path.exists(settings.sweep["journal"]):
        from gpugate.sweep.journal import Journal

        journal = Journal(settings.sweep["journal"])
        try:
            journal_nodes = journal.nodes()
            last_run = (journal.runs(1) or [None])[0]
            evidence = {n: journal.evidence_id(n) for n, r in journal_nodes.items() if r.step == "escalate"}
        finally:
            journal.close()
    last_audit = read_json(audit_path(settings), AUDIT_CAP)
    usage = fleet_usage(settings, states)
    families = fleet_families(snap, journal_nodes, last_audit, baseline, usage, last_run, evidence=evidence)
    if usage is not None:  # the budget is on: its keeper must run (gpugate.keeper.run)
        from gpugate.budget.rules import published
        from gpugate.fleet.metrics import keeper_families
        from gpugate.keeper.run import read_status

        held = {p: 0 for p in usage}
        for state in states.values():
            if not state.drain and published(state, settings.reason_tag) is not None:
                for part in state.partitions:
                    held[part] = held.get(part, 0) + 1
        families += keeper_families(read_status(settings), time.time(), held)
    text = render(families)
    if output:
        from gpugate.safety.safeio import write_in_checked_dir

        # node_exporter's textfile directory: root's alone, or refused (ConfigError naming the fix).
        write_in_checked_dir(os.path.abspath(output), text.encode(), "the metrics textfile directory")
    else:
        click.echo(text, nl=False)
