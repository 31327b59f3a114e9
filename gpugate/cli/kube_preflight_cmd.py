"""`gpugate kube-preflight`: the preflight init container of a GPU Pod on
Kubernetes (gpugate.node.kube_preflight_call), and the container itself
for a site's own Pod template (--print-init-container)."""

import click

DEFAULT_AGENT = "gpugate-preflight.gpugate.svc:9412"


@click.command("kube-preflight")
@click.option("--print-init-container", "print_container", is_flag=True,
              help="Print the init container (for a Pod template) instead of running it.")
@click.option("--image", default=None,
              help="With --print-init-container: gpugate's image (default: the chart's, this version).")
@click.option("--agent", default=DEFAULT_AGENT, show_default=True,
              help="With --print-init-container: the node agent's preflight address, HOST:PORT.")
@click.option("--seconds", type=click.IntRange(1, None), default=900, show_default=True,
              help="With --print-init-container: the whole wait for a verdict.")
@click.option("--format", "fmt", type=click.Choice(["yaml", "json"]), default="yaml", show_default=True,
              help="With --print-init-container: how it is printed.")
def kube_preflight(print_container, image, agent, seconds, fmt):
    """Wait for the node agent's preflight verdict on this Pod (an init container).

    Run as the first init container of a GPU Pod (the chart's
    MutatingAdmissionPolicy injects it; docs/how-to/kubernetes-preflight.md).
    Everything comes from the environment: GPUGATE_POD_NAME,
    GPUGATE_POD_NAMESPACE, GPUGATE_POD_UID, GPUGATE_NODE_NAME (downward API),
    GPUGATE_PREFLIGHT_AGENT (HOST:PORT of the node-local agent) and
    GPUGATE_PREFLIGHT_SECONDS (the whole wait, default 900).  It asks the
    agent over TCP, prints the agent's progress, and ends with one JSON line,
    also written to /dev/termination-log.  Exit 0: passed, or undecided (the
    agent not reachable within a minute, no verdict in time, a garbled
    answer): a preflight that cannot decide never keeps a Pod from running.
    Exit 1: failed, this node is its gang's culprit and the agent holds it;
    the Pod fails and its controller makes it anew elsewhere.

    \b
    Examples:
      gpugate kube-preflight
      gpugate kube-preflight --print-init-container --image registry.example.com/gpugate:1.0
      gpugate kube-preflight --print-init-container --format json
    """
    if print_container:
        import json

        import yaml

        import gpugate
        from gpugate.node.kube_preflight_call import init_container

        image = image or "registry.example.com/gpugate:%s" % gpugate.__version__
        container = init_container(image, agent, seconds)
        if fmt == "json":
            click.echo(json.dumps(container, indent=1))
        else:
            click.echo(yaml.safe_dump([container], sort_keys=False), nl=False)
        return
    from gpugate.node.kube_preflight_call import run

    raise SystemExit(run(say=lambda text: click.echo(text)))
