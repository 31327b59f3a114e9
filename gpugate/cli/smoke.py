"""`gpugate smoke -w NODES`: the sweep's smoke job by hand.  The work is in
gpugate.sweep.byhand (its own reservation, the sweep's submission, wait,
judgement and pairing); this parses options and renders."""

import json
import sys

import click


@click.command("smoke")
@click.option("--config", "-c", type=click.Path(dir_okay=False), default=None, help="gpugate.toml.")
@click.option("--nodes", "-w", required=True, help="The nodes to smoke (hostlist).")
@click.option("--pairs", is_flag=True, help="Then pair the nodes that passed for 2-node jobs ([sweep] smoke_pair), "
              "as the sweep does with pairs = true, and print each pair's verdict too.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdicts as JSON.")
def smoke(config, nodes, pairs, as_json):
    """Run the sweep's smoke job on each node, through Slurm, and print the
    verdict per node.  Changes no node state: it runs in a maintenance
    reservation of its own (gpugate_smoke_PID, deleted afterwards), on nodes
    that are in service (a drained node takes no job; the sweep lifts its
    own drain inside its reservation).  The command, sbatch options and
    deadline are gpugate.toml's [sweep] smoke, smoke_sbatch, smoke_deadline;
    the minimum bus bandwidth per GPU product is the baseline's
    [smoke.min_busbw_gbps].  With --pairs, the nodes that passed then run
    2-node jobs in pairs (sorted names; a failed pair's nodes each try once
    more with another partner; the pair minimum is the baseline's
    [smoke.min_pair_busbw_gbps]).  Exit 0 when every node passed, 1 otherwise.

    \b
    Examples:
      gpugate smoke -w gpu017                 # one repaired node
      gpugate smoke -w 'gpu[001-064]' --json  # a batch, machine-readable
      gpugate smoke -w 'gpu[001-004]' --pairs # and the links: gpu001+gpu002, gpu003+gpu004
    """
    from ClusterShell.NodeSet import NodeSet

    from gpugate.model.config import load_checked_baseline, load_settings
    from gpugate.schedulers.registry import require_slurm
    from gpugate.slurm import connect
    from gpugate.sweep.byhand import smoke_by_hand
    from gpugate.sweep.pairs import UNPAIRED

    settings = load_settings(config, missing_ok=config is None)
    require_slurm(settings, "gpugate smoke")
    baseline = load_checked_baseline(settings)
    if not settings.sweep["smoke"]:
        raise click.ClickException("no smoke job configured ([sweep] smoke = [])")
    if pairs and not settings.sweep["smoke_pair"]:
        raise click.ClickException("no pair job configured ([sweep] smoke_pair = [])")
    wanted = sorted(NodeSet(nodes))
    result = smoke_by_hand(connect(settings), settings, baseline, wanted, pairs)
    if as_json:
        out = {n: {"passed": p, "detail": d} for n, (p, d) in result.verdicts.items()}
        for name, verdict in result.pair_verdicts.items():
            out[name]["pair"] = {"verdict": verdict.verdict, "partner": verdict.partner, "problem": verdict.problem,
                                 "runs": [{"nodes": list(r.nodes), "round": r.round, "passed": r.passed,
                                           "detail": r.detail} for r in result.runs if name in r.nodes]}
        click.echo(json.dumps(out, sort_keys=True))
    else:
        for name in wanted:
            passed, detail = result.verdicts[name]
            click.echo("%s %s %s" % (name, "pass" if passed else "FAIL", detail))
        for run in result.runs:
            click.echo("%s pair round %d %s %s" % ("+".join(run.nodes), run.round, "pass" if run.passed else "FAIL",
                                                   run.detail))
        for name, verdict in result.pair_verdicts.items():
            if verdict.verdict == UNPAIRED:
                click.echo("%s %s" % (name, verdict.problem))
    sys.exit(0 if result.passed else 1)
