"""`gpugate budget`: the drain-budget keeper (gpugate.keeper.run), on the controller."""

import json
import time

import click


def _render(status: dict) -> str:
    if not status.get("ok"):
        return "budget keeper: FAILED: %s (last good run: %s; %s failed run(s) in a row)\n" % (
            status.get("error"), _when(status.get("last_ok")), status.get("failed_runs", "?"))
    if status.get("why"):
        return "budget keeper: %s\n" % status["why"]
    if status.get("standby"):  # Kubernetes: another keeper holds the Lease
        return "budget keeper: standing by, draining nothing: %s\n" % status["standby"]
    lines = ["budget keeper: %d fleet read(s), %d single-node read(s) in %.2f s" % (
        status.get("fleet_reads", 0), status.get("single_reads", 0), status.get("took", 0.0))]
    for part, fig in sorted(status.get("partitions", {}).items()):
        lines.append("  partition %-12s drain budget %d/%d%s  held %d" % (
            part, fig["drained"], fig["allowance"], " SPENT" if fig["drained"] >= fig["allowance"] else "",
            fig["held"]))
    from gpugate.keeper.run import hostlist

    if status.get("drained"):
        lines.append("  drained now: %s" % hostlist(status["drained"]))
    if status.get("given_back"):
        lines.append("  given back (over the budget: another keeper drained at the same time): %s"
                     % hostlist(status["given_back"]))
    for node, why in sorted(status.get("held_nodes", {}).items()):
        lines.append("  held %s: %s" % (node, why))
    return "\n".join(lines) + "\n"


def _when(epoch) -> str:
    if not epoch:
        return "never"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(epoch)))


@click.command()
@click.option("--config", "-c", type=click.Path(dir_okay=False), default=None, help="gpugate.toml.")
@click.option("--watch", type=click.FloatRange(5, 3600), default=None, metavar="SECONDS",
              help="Run again every SECONDS, until stopped (sites without systemd; the timer runs it every 30 s).")
@click.option("--json", "as_json", is_flag=True, help="The run's figures as one JSON object.")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="With --watch: serve Prometheus metrics on this port (GET /metrics; default [kubernetes] "
                   "metrics_port; 0: none): the last good run, failed runs in a row, leader or standby.")
def budget(config, watch, as_json, metrics_port):
    """Drain published nodes within the drain budget (controller side).

    Nodes never read the fleet: one with a budgeted finding (a wrong pin,
    GPU count, service...) publishes it in its Slurm node Comment and keeps
    running jobs.  This command reads the fleet once, drains the published
    nodes of each partition, oldest first, up to the partition's budget
    (`[drain_budget] max_share`), and holds the rest.  Acute findings never
    wait for it.  Without it nothing budgeted is drained (the
    GpugateBudgetKeeperStale alert says so).  It drains only a finding its
    node signed with the drain budget key (`[drain_budget] key_file`); an
    unverified tag (pasted, copied, old) is held and named.  Exit 1 when
    Slurm failed or the key is missing or refused (nothing drained).

    With `scheduler = "kubernetes"` the same on Node objects: one paginated
    list, the pools by `[kubernetes] pool_label`, a drain is gpugate's
    taint and cordon; one keeper acts at a time (the Lease
    gpugate/gpugate-budget-keeper), the others stand by (exit 0).  A
    leader whose runs fail gives the Lease up after `[kubernetes]
    lease_give_up_runs` (3) of them in a row.  With --watch, `[kubernetes]
    metrics_port` (or --metrics-port) serves Prometheus metrics: the
    keeper's last good run (the Lease's word), leader or standby, failed
    runs in a row.

    \b
    Examples:
      gpugate budget
      gpugate budget --watch 30
      gpugate budget --json | jq '.drained, .standby'
      gpugate budget --watch 30 --metrics-port 9477
    """
    from gpugate.model.config import load_settings
    from gpugate.keeper.run import run

    settings = load_settings(config, missing_ok=config is None)
    latest = {}
    from gpugate.fleet.metrics_server import keeper_families, port_of, serve

    if metrics_port and watch is None:
        raise click.UsageError("--metrics-port serves a --watch loop's metrics: add --watch SECONDS")
    # [kubernetes] metrics_port: the keeper Deployment's loop; a run by hand serves nothing.
    port = port_of(settings, metrics_port) if watch is not None and settings.scheduler == "kubernetes" else 0
    if metrics_port and settings.scheduler != "kubernetes":
        raise click.UsageError("--metrics-port is the Kubernetes keeper's (its replicas lead through a Lease); on "
                               "Slurm `gpugate metrics -o FILE` exports the keeper's status for node_exporter")
    if port:
        from gpugate.core.promtext import render

        serve(settings, port, lambda: render(keeper_families(latest, time.time())))
    while True:
        began = time.monotonic()
        status = run(settings)
        latest = status
        click.echo(json.dumps(status, sort_keys=True) if as_json else _render(status), nl=as_json)
        if watch is None:
            raise SystemExit(0 if status.get("ok") else 1)
        time.sleep(max(0.0, watch - (time.monotonic() - began)))
