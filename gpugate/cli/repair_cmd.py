"""The node-side commands the sweep runs through its transport before and
for a repair: `gpugate evidence` (what the node knows, before it is lost)
and `gpugate reset-gpus` (the reset rung).  An admin can run them by hand."""

import json
import sys

import click

from gpugate.cli.context import default_node, load_context

_config = click.option("--config", "-c", type=click.Path(dir_okay=False), default=None,
                       help="gpugate.toml (default: $GPUGATE_CONFIG or /etc/gpugate/gpugate.toml).")
_sim = click.option("--sim", type=click.Path(file_okay=False), default=None,
                    help="A simulated node of this fleet directory instead of this machine.")
_node = click.option("--node", "-n", default=None, help="Node name (default: $SLURMD_NODENAME or the hostname).")
_json = click.option("--json", "as_json", is_flag=True, help="One JSON object.")


@click.command()
@_config
@_sim
@_node
@_json
@click.option("--max-bytes", type=click.IntRange(1 << 16, 1 << 34), default=64 << 20, show_default=True,
              help="The most raw data the bundle carries.")
@click.option("--bug-report-timeout", type=click.FloatRange(1, 86400), default=300, show_default=True,
              help="nvidia-bug-report.sh's own time limit (seconds).")
def evidence(config, sim, node, as_json, max_bytes, bug_report_timeout):
    """Collect what this node knows about its fault (kernel log since boot,
    nvidia-smi -q, nvidia-bug-report.sh where installed, gpugate's last facts
    and verdict).  Changes nothing.  The sweep runs it before a GPU reset or
    a reboot and keeps the bundle on the controller.

    \b
    Examples:
      gpugate evidence --json > /root/gpu07-evidence.json
    """
    from gpugate.node.evidence import collect

    node = node or default_node()
    settings = load_context(config, sim, None, node)
    out = collect(settings, node, max_bytes, bug_report_timeout)
    if as_json:
        click.echo(json.dumps(out, sort_keys=True))
    else:
        for part in out["parts"]:
            click.echo("%-28s %s" % (part["name"], part.get("error") or "%d bytes%s" % (
                part["bytes"], " (truncated)" if part.get("truncated") else "")))


@click.command("reset-gpus")
@_config
@_sim
@_node
@_json
@click.option("--gpu", "-i", "gpus", type=click.IntRange(0, 1023), multiple=True,
              help="A GPU to reset (repeat); default all.  On an NVSwitch node all GPUs are reset together.")
@click.option("--timeout", type=click.FloatRange(1, 86400), default=300, show_default=True,
              help="The most each command may take (seconds).")
def reset_gpus(config, sim, node, as_json, gpus, timeout):
    """Reset this drained, idle node's GPUs: refuse while a process holds one,
    stop what holds them (nvidia-persistenced, DCGM, Fabric Manager), reset
    (nvidia-smi -r), start them again.  On an AMD node (its nodeset says
    vendor = "amd"): refuse while a process holds /dev/kfd, then reset every
    GPU of the node as one unit (amd-smi reset -G -g all: an XGMI hive resets
    together).  Exit 0 when the reset was done; the sweep then verifies the
    node exactly as after a reboot.

    \b
    Examples:
      gpugate reset-gpus --gpu 3
      gpugate reset-gpus --json
    """
    from gpugate.vendors.seam import reset

    node = node or default_node()
    settings = load_context(config, sim, None, node)
    out = reset(settings, node, list(gpus), timeout)
    if as_json:
        click.echo(json.dumps(out, sort_keys=True))
    else:
        for step in out["steps"]:
            click.echo("%-10s %s" % (step["step"], step["detail"]))
        click.echo("reset %s" % ("done" if out["ok"] else "FAILED: " + out["error"]))
    sys.exit(0 if out["ok"] else 1)
