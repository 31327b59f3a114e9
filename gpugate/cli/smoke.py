"""`gpugate smoke -w NODES`: the sweep's smoke job by hand.  The work is in
gpugate.sweep.smoke (the same submission, wait and judgement); this parses
options, holds a reservation of its own for the run and renders."""

import json
import os
import sys

import click


@click.command("smoke")
@click.option("--config", "-c", type=click.Path(dir_okay=False), default=None, help="gpugate.toml.")
@click.option("--nodes", "-w", required=True, help="The nodes to smoke (hostlist).")
@click.option("--json", "as_json", is_flag=True, help="Print the verdicts as JSON.")
def smoke(config, nodes, as_json):
    """Run the sweep's smoke job on each node, through Slurm, and print the
    verdict per node.  Changes no node state: it runs in a maintenance
    reservation of its own (gpugate_smoke_PID, deleted afterwards), on nodes
    that are in service (a drained node takes no job; the sweep lifts its
    own drain inside its reservation).  The command, sbatch options and
    deadline are gpugate.toml's [sweep] smoke, smoke_sbatch, smoke_deadline;
    the minimum bus bandwidth per GPU product is the baseline's
    [smoke.min_busbw_gbps].  Exit 0 when every node passed, 1 otherwise.

    \b
    Examples:
      gpugate smoke -w gpu017                 # one repaired node
      gpugate smoke -w 'gpu[001-064]' --json  # a batch, machine-readable
    """
    from ClusterShell.NodeSet import NodeSet

    from ..config import load_checked_baseline, load_settings
    from ..errors import SlurmError
    from ..slurm import connect
    from ..sweep.smoke import run_smoke

    settings = load_settings(config, missing_ok=config is None)
    baseline = load_checked_baseline(settings)
    slurm = connect(settings)
    if not settings.sweep["smoke"]:
        raise click.ClickException("no smoke job configured ([sweep] smoke = [])")
    wanted = sorted(NodeSet(nodes))
    states = slurm.nodes(nodes)
    verdicts = {}
    ready = []
    for name in wanted:
        st = states.get(name)
        if st is None:
            verdicts[name] = (False, "not a Slurm node")
        elif st.drain or st.down or not st.responding:
            verdicts[name] = (False, "not in service (%s): a drained node takes no job" % (st.reason or "down"))
        else:
            ready.append(name)
    reservation = "gpugate_smoke_%d" % os.getpid()
    if ready:
        from ..sweep.steps import hostlist

        slurm.reserve(reservation, hostlist(ready))
        try:
            results = run_smoke(slurm, settings.sweep, baseline, ready, reservation)
            verdicts.update({n: (r.passed, "job %s in %.0fs%s" % (r.job, r.seconds, "" if r.passed else ": " + r.problem))
                             for n, r in results.items()})
        except SlurmError as exc:
            verdicts.update({n: (False, "not run: %s" % exc) for n in ready})
        finally:
            slurm.unreserve(reservation)
    if as_json:
        click.echo(json.dumps({n: {"passed": p, "detail": d} for n, (p, d) in verdicts.items()}, sort_keys=True))
    else:
        for name in wanted:
            passed, detail = verdicts[name]
            click.echo("%s %s %s" % (name, "pass" if passed else "FAIL", detail))
    sys.exit(0 if all(p for p, _ in verdicts.values()) else 1)
