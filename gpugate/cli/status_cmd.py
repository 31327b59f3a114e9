"""`gpugate status`: gpugate's drains by class, the sweep's word on them, and
the nodes out for other reasons (listed, never touched).  Read-only."""

import json
import os
import sqlite3
import time

import click

from gpugate.errors import GpugateError


def _hostlist(expr):
    from gpugate.core.names import parse_hostlist

    return set(parse_hostlist(expr))


def _journal(path):
    """The journal's node records and history; ({}, {}) when no sweep has run.
    An unreadable journal is reported and skipped: the Slurm view is still
    worth showing."""
    if not os.path.exists(path):
        return {}, {}
    from gpugate.sweep.journal import Journal

    try:
        journal = Journal(path)
    except (GpugateError, sqlite3.Error, OSError) as exc:
        click.echo("gpugate status: sweep journal %s not read: %s" % (path, exc), err=True)
        return {}, {}
    try:
        return journal.nodes(), journal.history()
    except sqlite3.Error as exc:
        click.echo("gpugate status: sweep journal %s not read: %s" % (path, exc), err=True)
        return {}, {}
    finally:
        journal.close()


@click.command("status")
@click.option("--config", "-c", type=click.Path(dir_okay=False), default=None, help="gpugate.toml.")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object: gpugate (nodes by class), others, counts, partitions.")
@click.option("--partition", "-p", multiple=True, help="Only nodes of this partition (repeatable).")
@click.option("--nodes", "-w", default=None, help="Only these nodes (hostlist).")
def status(config, as_json, partition, nodes):
    """One screen for the on-call admin: the nodes gpugate drained, by class,
    oldest first, with how long each has been out and what the sweep journal
    says about it; then the nodes out of service for other reasons (an
    admin's drain, DOWN, not responding), which gpugate lists and never
    touches; then the repeat offenders (nodes the sweep returned to service
    again and again for the same component; `gpugate sweep forgive NODE`
    clears one).  Reads Slurm and the journal; changes nothing.

    \b
    Examples:
      gpugate status
      gpugate status -p gpu -w 'gpu[001-064]'
      gpugate status --json | jq '.gpugate.drift[].node'
      gpugate status --json | jq '.repeat_offenders'
    """
    from gpugate.budget.rules import fleet_usage
    from gpugate.model.config import load_settings
    from gpugate.fleet.status import config_errors, locks_stuck, render_text, repeat_offenders, summarize
    from gpugate.schedulers.registry import connect
    from gpugate.sweep.snapshot import take

    settings = load_settings(config, missing_ok=config is None)
    wanted = _hostlist(nodes) if nodes else None
    slurm = connect(settings)
    try:
        states = slurm.nodes()
        on_lease = _keeper_on_lease(settings, slurm)
    finally:
        slurm.close()
    now = time.time()
    budget = fleet_usage(settings, states)  # over whole partitions, before -p/-w
    states = {n: st for n, st in states.items()
              if (wanted is None or n in wanted) and (not partition or set(st.partitions) & set(partition))}
    journal_nodes, history = _journal(str(settings.sweep["journal"]))
    summary = summarize(take(states, settings.reason_tag, now), journal_nodes, now, states=states, budget=budget)
    if partition:
        summary["partitions"] = {p: f for p, f in summary["partitions"].items() if p in partition}
    last_audit = _last_audit(settings)
    summary["config_errors"] = config_errors(last_audit, now)
    summary["locks_stuck"] = locks_stuck(last_audit, now)
    from gpugate.fleet.audit import kernel_log_watch

    summary["kernel_log"] = kernel_log_watch(last_audit)  # followers not running, records lost unread
    from gpugate.fleet.preflight_status import figures

    summary["preflight"] = figures(last_audit, summary["gpugate"], settings.reason_tag, now)
    summary["repeat_offenders"] = repeat_offenders(
        {n: e for n, e in history.items() if n in states}, now, int(settings.sweep["repeat_limit"]),
        float(settings.sweep["repeat_window"]))
    summary["slurm_backend"] = {"name": slurm.name, "why": slurm.why}
    if budget is not None:  # the budget is on: published nodes and its keeper (gpugate.keeper.run)
        from gpugate.fleet.status import budget_held
        from gpugate.keeper.run import read_status

        summary["held"] = budget_held(states, settings.reason_tag)
        # Kubernetes: the keeper's Lease says it (a replica's emptyDir is no one's to read).
        summary["budget_keeper"] = on_lease if on_lease is not None else (read_status(settings) or {})
    if as_json:
        click.echo(json.dumps(summary, sort_keys=True))
    else:
        click.echo(render_text(summary))


def _keeper_on_lease(settings, backend):
    """The keeper's latest run as its Lease tells it (gpugate.kube.lease.STATUS),
    or None where the keeper keeps no Lease (Slurm)."""
    if not getattr(backend, "memory_on_lease", False):
        return None
    from gpugate.kube.lease import read_status

    try:
        return read_status(backend.client, str(settings.kubernetes.get("namespace") or "gpugate"))
    except GpugateError as exc:  # said, and the rest of the screen still shown
        return {"ok": False, "error": "the keeper's Lease cannot be read: %s" % exc}


def _last_audit(settings):
    """The latest audit (audit.json next to the sweep journal), or None."""
    from gpugate.safety.state import read_json
    from gpugate.safety.safeio import AUDIT_CAP
    from gpugate.cli.fleet import audit_path

    return read_json(audit_path(settings), AUDIT_CAP)
