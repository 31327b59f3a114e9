"""`gpugate demo`: a real local Slurm cluster of simulated GPU nodes, and
gpugate doing its job on it, narrated."""

import os
import sys
import tempfile
import time

import click


DEMO_INTERVAL = 6
KEEPER_EVERY = 30  # slurm_conf/gpugate-budget.timer


def _baseline_text() -> str:
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "demo-baseline.toml")
    with open(path) as handle:
        return handle.read()


def _say(text: str) -> None:
    click.echo(click.style("\n== " + text, bold=True))


def _show(cluster, argv, title=None) -> None:
    shown = " ".join(os.path.basename(argv[0]) if i == 0 else a for i, a in enumerate(argv))
    click.echo(click.style("$ " + (title or shown), fg="cyan"))
    click.echo(cluster.run(argv, check=False).stdout.rstrip())


@click.group(invoke_without_command=True)
@click.option("--nodes", default=8, show_default=True, type=click.IntRange(4, 32))
@click.option("--keep", is_flag=True, help="Leave the cluster running at the end (stop it with `gpugate demo down`).")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None,
              help="Where the cluster lives (default: a new temporary directory).")
@click.pass_context
def demo(ctx, nodes, keep, directory):
    """Boot a local Slurm cluster of simulated GPU nodes and watch gpugate work.

    Needs root and Debian's slurm-wlm, slurmctld, slurmd and munge packages
    (the README's set-up command installs them).

    \b
    Examples:
      gpugate demo                       # the narrated walk-through (about 2 minutes)
      gpugate demo --keep                # ... and leave the cluster running afterwards
      gpugate demo up --dir /tmp/gg      # a healthy cluster, left running
      gpugate sim set /tmp/gg/fleet gpu03 driver=550.54.15
      SLURM_CONF=/tmp/gg/slurm.conf sinfo -R
      gpugate demo down --dir /tmp/gg
    """
    if ctx.invoked_subcommand is not None:
        return
    from gpugate.testbed import Cluster, smoke_command

    directory = directory or tempfile.mkdtemp(prefix="gpugate-demo-")
    # The sweep's smoke job runs under slurmd; all_reduce_perf replays a recorded run.
    cluster = Cluster(directory, nodes=nodes, health_interval=DEMO_INTERVAL,
                      sweep={"smoke": smoke_command(directory), "smoke_deadline": 60})
    done = False
    try:
        _walkthrough(cluster)
        done = True
    finally:
        cluster.stop_keeper()
        if keep:
            if done:  # left running, it runs what a site runs: the keeper at the timer's pace
                cluster.start_keeper(KEEPER_EVERY)
            click.echo("\nThe cluster keeps running%s: SLURM_CONF=%s sinfo -R ; gpugate demo down --dir %s"
                       % (", with its drain-budget keeper every %d s" % KEEPER_EVERY if done else "",
                          cluster.conf, cluster.dir))
        else:
            cluster.stop()
            cluster.remove()


def _walkthrough(cluster) -> None:
    env = "SLURM_CONF=%s" % cluster.conf
    _say("1. Boot munge, slurmctld and %d slurmd (one per simulated GPU node) in %s"
         % (len(cluster.nodes), cluster.dir))
    # Two of the eight may be out for drift at once (default 10%: one).
    cluster.write(_baseline_text(), "[drain_budget]\nmax_share = 0.25\n")
    started = time.monotonic()
    cluster.start()
    click.echo("up in %.1fs. slurm.conf points HealthCheckProgram, Prolog and Epilog at gpugate;"
               " HealthCheckInterval=%ds." % (time.monotonic() - started, DEMO_INTERVAL))
    # The controller's drain-budget keeper (a real one: gpugate-budget.timer, every 30 s).
    cluster.start_keeper(5)
    click.echo("the controller runs the drain-budget keeper every 5 s (`gpugate budget --watch 5`; "
               "a real one: gpugate-budget.timer, every 30 s)")
    _show(cluster, ["/usr/bin/sinfo", "-N", "-o", "%N %T %E"], "%s sinfo -N" % env)

    _say("2. Break four nodes the way fleets break")
    faults = [("gpu02", ["driver=550.54.15"], "drifted: an old driver install"),
              ("gpu03", ["image_version=gpu-2026.09.2", "container_toolkit=1.16.2"], "drifted: old golden image"),
              ("gpu05", ["gpu.3.xid=79", "gpus=7"], "a GPU fell off the bus (Xid 79) and stays off"),
              ("gpu07", ["module.resident=570.133.20", "nvml.init_error=18"],
               "driver upgraded, old kernel module still loaded")]
    for node, assignments, what in faults:
        cluster.sim("set", "FLEET", node, *assignments)
        click.echo("  %-6s %-55s (gpugate sim set ... %s)" % (node, what, " ".join(assignments)))
    # Invisible to every node-side check: only the sweep's smoke job finds it.
    cluster.sim("set", "FLEET", "gpu03", "smoke=pcie-degraded")
    click.echo("  %-6s %-55s (gpugate sim set ... smoke=pcie-degraded)" % ("gpu03", "and NCCL falls back to PCIe"))

    _say("3. slurmd's own health checks run gpugate and drain them, each with a precise reason")
    bad = [n for n, _, _ in faults]
    cluster.wait_for(lambda: all("drain" in cluster.state(n) for n in bad), 4 * DEMO_INTERVAL + 30,
                     "the four nodes to drain")
    _show(cluster, ["/usr/bin/sinfo", "-R"], "%s sinfo -R   (20 characters: owner and class)" % env)
    _show(cluster, ["/usr/bin/sinfo", "-R", "-o", "%50E %N"], "%s sinfo -R -o '%%50E %%N'" % env)
    for node in bad:
        click.echo("  %s: %s" % (node, cluster.reason(node)))

    _say("4. A node goes bad after its last health check; a job is sent to it")
    target, spare = "gpu01", "gpu04"
    _wait_fresh_healthcheck(cluster, target)
    cluster.sim("set", "FLEET", target, "gpu.6.ecc.uncorrected.volatile=4")
    click.echo("  %s: GPU 6 now has 4 uncorrected ECC errors; the health check has not seen it yet" % target)
    others = ",".join(n for n in cluster.nodes if n not in (target, spare))
    job = cluster.run(["/usr/bin/sbatch", "--parsable", "-x", others, "-o", cluster.path("log", "demo-%j.out"),
                       "--wrap", "hostname"]).stdout.strip()
    click.echo("  submitted job %s (it may run on %s or %s; the scheduler picks %s first)" % (job, target, spare, target))
    cluster.wait_for(lambda: _job(cluster, job).get("JobState") == "COMPLETED", 120, "job %s to complete" % job)
    info = _job(cluster, job)
    prolog = [r for r in cluster.log_records(target) if r.get("mode") == "prolog" and r.get("job") == job]
    if prolog:
        click.echo("  the prolog on %s: %s -> %s, exit 1 (%.2fs)" % (target, prolog[-1]["verdict"],
                                                                   prolog[-1].get("action"), prolog[-1]["duration"]))
    click.echo("  job %s: requeued %s time(s), completed on %s" % (job, info.get("Restarts"), info.get("NodeList")))
    _show(cluster, ["/usr/bin/sinfo", "-R", "-o", "%60E %N"], "%s sinfo -R -o '%%60E %%N'" % env)

    _say("5. What an admin does next")
    click.echo("  gpugate explain --config %s --node gpu07   (the runbook for a stale module):" % cluster.gpugate_conf)
    result = cluster.run([sys.executable, "-m", "gpugate", "explain", "--config", cluster.gpugate_conf,
                          "--node", "gpu07"], check=False)
    click.echo("\n".join("    " + line for line in result.stdout.rstrip().splitlines()))
    _sweep_step(cluster)
    cluster.stop_keeper()  # step 8 runs it by hand, to show what happens before and after
    _budget_step(cluster)
    click.echo("\nDone. Every node-side run left one JSON line in %s/state/<node>/gpugate.log." % cluster.dir)


def _budget_step(cluster) -> None:
    """A bad baseline push: the drain budget keeps the fleet in service."""
    _say("8. A wrong driver pin pushed to every node: the drain budget (25% here, default 10%)")
    with open(cluster.baseline) as handle:
        good = handle.read()
    bad = good.replace('driver = "580.65.06"', 'driver = "580.95.05"', 1).replace(
        'fabricmanager = "580.65.06"', 'fabricmanager = "580.95.05"', 1)
    _replace_file(cluster.baseline, bad)
    click.echo("  baseline.toml now pins driver 580.95.05, which no node runs")
    healthy = [n for n in cluster.nodes if cluster.state(n) == "idle"]

    def published():
        return all(any(r.get("action") == "held" for r in cluster.log_records(n)[-2:]) for n in healthy)
    cluster.wait_for(published, 4 * DEMO_INTERVAL + 30, "every node to publish its finding")
    click.echo("  no node read the fleet: each published its finding on its own Slurm record (Comment)")
    click.echo("  and keeps running jobs; nothing is drained until the budget keeper runs")
    _show(cluster, ["/usr/bin/sinfo", "-N", "-O", "NodeList:7,StateCompact:8,Comment:0"],
          "SLURM_CONF=%s sinfo -N -O NodeList,StateCompact,Comment" % cluster.conf)
    _show(cluster, [sys.executable, "-m", "gpugate", "budget", "--config", cluster.gpugate_conf],
          "gpugate budget   (the keeper, on the controller: gpugate-budget.timer runs it every 30 s)")
    _show(cluster, [sys.executable, "-m", "gpugate", "status", "--config", cluster.gpugate_conf],
          "gpugate status   (two drained for drift; the held nodes keep running jobs; the keeper's last run)")
    held = [n for n in healthy if cluster.state(n) == "idle"]
    record = [r for r in cluster.log_records(held[0]) if r.get("action") == "held"][-1]
    click.echo("  %s's log line: action=held, why=%s" % (held[0], record.get("why")))
    _replace_file(cluster.baseline, good)
    click.echo("  the pin is put back; the two drained nodes wait for `gpugate sweep --apply` to verify them")


def _replace_file(path: str, text: str) -> None:
    tmp = path + ".new"
    with open(tmp, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


def _sweep_step(cluster) -> None:
    """The sweep returns what it can fix to service, verified, and escalates the rest."""
    argv = [sys.executable, "-m", "gpugate", "sweep", "--config", cluster.gpugate_conf]
    _say("6. gpugate sweep: the plan (nothing changes without --apply)")
    click.echo(cluster.run(argv, check=False).stdout.rstrip())
    _say("7. gpugate sweep --apply: reconverge / reboot, verify (dcgmi diag -r 1, then -r 3), a smoke job "
         "through Slurm in the batch's reservation, and only then RESUME")
    result = cluster.run(argv + ["--apply"], check=False, timeout=900)
    click.echo(result.stdout.rstrip())
    if result.returncode:
        click.echo(result.stderr.rstrip())
    _show(cluster, argv + ["status"], "gpugate sweep status   (each node's proofs, in order)")
    _show(cluster, ["/usr/bin/sinfo", "-R", "-o", "%60E %N"],
          "SLURM_CONF=%s sinfo -R -o '%%60E %%N'   (what is left: escalated for a human)" % cluster.conf)


def _wait_fresh_healthcheck(cluster, node: str) -> None:
    """Start right after a health check, so the prolog sees the fault first."""
    count = len([r for r in cluster.log_records(node) if r.get("mode") == "healthcheck"])
    cluster.wait_for(lambda: len([r for r in cluster.log_records(node) if r.get("mode") == "healthcheck"]) > count,
                     3 * DEMO_INTERVAL + 10, "a health check on " + node)


def _job(cluster, job: str) -> dict:
    out = cluster.scontrol("show", "job", job, check=False)
    return dict(token.split("=", 1) for token in out.split() if "=" in token)


@demo.command("up")
@click.option("--dir", "directory", required=True, type=click.Path(file_okay=False))
@click.option("--nodes", default=8, show_default=True, type=click.IntRange(1, 64))
@click.option("--interval", default=DEMO_INTERVAL, show_default=True, help="HealthCheckInterval (seconds).")
@click.option("--no-keeper", is_flag=True,
              help="Leave out the drain-budget keeper (then nothing budgeted is ever drained).")
def demo_up(directory, nodes, interval, no_keeper):
    """Boot a healthy cluster in DIR and leave it running, with the
    controller's drain-budget keeper (`gpugate budget --watch 30`, as
    gpugate-budget.timer runs it on a site) unless --no-keeper.

    \b
    Examples:
      gpugate demo up --dir /tmp/gg --nodes 4
      gpugate status --config /tmp/gg/gpugate.toml
      gpugate demo down --dir /tmp/gg
    """
    from gpugate.testbed import Cluster

    cluster = Cluster(directory, nodes=nodes, health_interval=interval)
    cluster.write(_baseline_text())
    cluster.start()
    if no_keeper:
        keeper = "no drain-budget keeper (--no-keeper): budgeted findings are published, never drained"
    else:
        cluster.start_keeper(KEEPER_EVERY)
        keeper = ("the controller runs the drain-budget keeper every %d s (gpugate budget --watch %d, as "
                  "gpugate-budget.timer does); its runs: gpugate status --config %s"
                  % (KEEPER_EVERY, KEEPER_EVERY, cluster.gpugate_conf))
    click.echo("cluster up: %d nodes %s\n  %s\n  SLURM_CONF=%s sinfo -R\n  gpugate sim set %s NODES KEY=VALUE\n"
               "  gpugate demo down --dir %s" % (nodes, cluster.nodeset(), keeper, cluster.conf, cluster.fleet,
                                                 directory))


@demo.command("down")
@click.option("--dir", "directory", required=True, type=click.Path(file_okay=False, exists=True))
def demo_down(directory):
    """Stop the cluster in DIR (by the pids it recorded).

    \b
    Examples:
      gpugate demo down --dir /tmp/gg
    """
    from gpugate.testbed import Cluster, node_names_from_conf

    cluster = Cluster(directory, nodes=0)
    cluster.nodes = node_names_from_conf(cluster.conf)
    cluster.stop()
    click.echo("stopped %s" % directory)


from gpugate.cli.demo_kube import demo_kubernetes  # noqa: E402  (a subcommand of the group above)

demo.add_command(demo_kubernetes)
