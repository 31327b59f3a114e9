"""`gpugate demo kubernetes`: the same gate on Kubernetes GPU nodes, on a
real kube-apiserver and etcd (scripts/kube-build) with simulated GPUs."""

import json
import os
import shutil
import tempfile

import click

NODES_DEFAULT = 6


def _refusal(log_line: str) -> str:
    """What the API server said when it refused a node agent's write (its
    run's log record: slurm_error, condition_error), or "" when nothing was
    refused.  Pure: the demo stops on it rather than show a row of "?"."""
    try:
        record = json.loads(log_line)
    except ValueError:
        return "its log line is not a record: %r" % log_line[:200]
    if not isinstance(record, dict):
        return "its log line is not a record: %r" % log_line[:200]
    return str(record.get("slurm_error") or record.get("condition_error") or "")


def _agents(fleet, config, names) -> None:
    """Each node's agent run (gpugate-healthcheck as the DaemonSet runs it);
    a write the API server refused stops the demo with its words."""
    from gpugate.node.logline import LOG_FILE

    for name in names:
        out = fleet.healthcheck(config, name)
        try:
            with open(os.path.join(fleet.dir, "state", name, LOG_FILE), encoding="utf-8") as handle:
                last = handle.read().splitlines()[-1]
        except (OSError, IndexError):
            last = ""
        why = _refusal(last) if last else "it wrote no log record (exit %d): %s" % (out.returncode,
                                                                                   out.stderr.strip()[-400:])
        if why:
            raise click.ClickException("the API server refused the node agent on %s: %s" % (name, why))


def _table(fleet, keeper_note="") -> None:
    from gpugate.kube import nodeview as nv
    from gpugate.kube.client import node_path

    click.echo(click.style("$ kubectl get nodes  (taints, cordon, GpugateHealthy)", fg="cyan"))
    click.echo("%-7s %-10s %-36s %-9s %-8s %s" % ("NODE", "CORDONED", "GPUGATE TAINT", "HEALTHY", "REASON",
                                                   "PUBLISHED FOR THE KEEPER"))
    for name in fleet.names:
        node = fleet.admin.get(node_path(name))
        taints = ",".join("%s=%s:%s" % (t["key"], t["value"], t["effect"]) for t in nv.our_taints(node)) or "-"
        cond = next((c for c in node["status"].get("conditions") or [] if c["type"] == nv.CONDITION), {})
        pending = "yes" if (node["metadata"].get("annotations") or {}).get(nv.PENDING) else "-"
        click.echo("%-7s %-10s %-36s %-9s %-8s %s" % (name, "yes" if node["spec"].get("unschedulable") else "-",
                                                       taints, cond.get("status", "?"), cond.get("reason", "?"),
                                                       pending))


def _sweep(fleet):
    """One `gpugate sweep --apply` with the sweep's ServiceAccount; the nodes it returned."""
    from gpugate.testbed.kubelet import Kubelets

    lines, kube = fleet.sweep_settings()
    config = fleet.config("sweep", 0.34, extra=kube, sweep=lines)
    kubelets = Kubelets(fleet.api, fleet.names)  # what the absent kubelets do: end pods, run the smoke Pod
    kubelets.start()
    try:
        out, report = fleet.sweep(config)
    finally:
        kubelets.stop()
    if report is None:
        raise click.ClickException("gpugate sweep printed no report (exit %d): %s"
                                   % (out.returncode, out.stderr.strip()[-600:]))
    for name, outcome in sorted(report.get("outcomes", {}).items()):
        click.echo("  %s: %s (%s) %s" % (name, outcome.get("result"), outcome.get("remedy"),
                                         (outcome.get("detail") or "")[:100]))
    click.echo("  smoke Pods run: %s" % (", ".join("%s on %s exit %d" % r for r in kubelets.ran) or "none"))
    return sorted(n for n, o in report.get("outcomes", {}).items() if o.get("result") == "resumed")


def _say(text: str) -> None:
    click.echo(click.style("\n== " + text, bold=True))


@click.command("kubernetes")
@click.option("--nodes", default=NODES_DEFAULT, show_default=True, type=click.IntRange(3, 32))
@click.option("--keep", is_flag=True, help="Leave the API server running at the end (its directory is printed).")
@click.option("--dir", "directory", type=click.Path(file_okay=False), default=None,
              help="Where it lives (default: a new temporary directory).")
@click.option("--manifests", "manifest_file", type=click.Path(dir_okay=False), default=None,
              help="Apply these instead of the ones gpugate ships: `helm template deploy/helm/gpugate` output "
                   "(YAML: needs PyYAML) or a JSON v1 List.")
def demo_kubernetes(nodes, keep, directory, manifest_file):
    """Kubernetes GPU nodes under the same gate: a real kube-apiserver and
    etcd, gpugate's manifests applied (RBAC: the node agent's and the
    keeper's ServiceAccounts have only what they grant), simulated GPU nodes.
    The manifests are the Helm chart's defaults, shipped inside gpugate; a
    write the API server refuses stops the demo with its words.

    Needs a kube-apiserver built on this machine (`scripts/kube-build`, Go
    from the module proxy, about 9 minutes once); `scripts/demo kubernetes`
    builds it first.

    \b
    Examples:
      gpugate demo kubernetes              # about 30 seconds once built
      gpugate demo kubernetes --nodes 9 --keep
    """
    from gpugate.testbed import manifests
    from gpugate.testbed.kube import KubeAPI, KubeFleet, built_versions, cache_dir

    docs = manifests.load_file(manifest_file) if manifest_file else manifests.packaged()
    if not built_versions():
        raise click.ClickException("no kube-apiserver built in %s: run scripts/kube-build (or scripts/demo "
                                   "kubernetes, which builds it)" % cache_dir())
    directory = directory or tempfile.mkdtemp(prefix="gpugate-demo-kube-")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    baseline = os.path.join(here, "data", "demo-baseline.toml")
    api = KubeAPI(os.path.join(directory, "api"))
    try:
        _say("1. A real kube-apiserver %s and etcd, gpugate's manifests applied (%s)"
             % (api.version, manifest_file or "the Helm chart's defaults, as gpugate ships them"))
        api.start()
        for kind, name in api.apply(docs):  # the policies waited for until enforced
            click.echo("  %s/%s" % (kind, name))
        names = ["gpu%02d" % (i + 1) for i in range(nodes)]
        fleet = KubeFleet(api, directory, names, baseline,
                          labels={"nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
        share = 0.34
        agent = fleet.config("agent", share)
        keeper = fleet.config("keeper", share, 'node_selector = "nvidia.com/gpu.present=true"')
        click.echo("  %d Node objects (no kubelet; Ready written as one would), one pool "
                   "(nvidia.com/gpu.product), drain budget %d%% of it" % (nodes, share * 100))
        _agents(fleet, agent, names)
        _table(fleet)

        _say("2. A wrong driver pin pushed to all but the last node: each node agent publishes, none drains itself")
        fleet.sim(",".join(names[:-1]), "driver=550.54.15")
        _agents(fleet, agent, names)
        _table(fleet)

        _say("3. The budget keeper (gpugate budget; one leads, through the Lease) taints within the budget, "
             "oldest first")
        figures = fleet.keeper(keeper)
        if figures.get("error"):  # a refused read or write: the API server's words, not a quiet "none"
            raise click.ClickException("the keeper's run failed: %s" % figures["error"])
        click.echo("  drained %s; %d held in service; requests: one paginated list, one read and one "
                   "patch per node drained" % (",".join(figures.get("drained") or []) or "none",
                                              figures.get("held", 0)))
        _table(fleet)

        _say("4. An Xid 79 (fallen off the bus) on the last node: acute, its agent taints it at once, "
             "outside the budget")
        held = [n for n in names if n not in (figures.get("drained") or [])]
        fleet.sim(held[-1], "gpu.2.xid=79")
        _agents(fleet, agent, held[-1:])
        _table(fleet)

        _say("5. gpugate sweep --apply (its own ServiceAccount): evict through the Eviction API, reconverge, "
             "reboot, prove (DCGM, a smoke Pod on the node), and only then lift gpugate's hold")
        returned = _sweep(fleet)
        _agents(fleet, agent, returned)  # each node agent's next run: its condition says Fit again
        _table(fleet)
        click.echo("  returned: %s. The drifted nodes still in service stay published: the keeper's next run "
                   "takes the next ones within the budget, and the sweep repairs them in turn."
                   % (",".join(returned) or "none"))
    finally:
        if keep:
            click.echo("\nThe API server keeps running: %s (admin token %s; stop: kill the pids in %s/*.pid)"
                       % (api.server, api.token_file("admin"), api.dir))
            api.write_pids()
        else:
            api.stop()
            shutil.rmtree(directory, ignore_errors=True)
