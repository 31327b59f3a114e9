"""`gpugate agent`: the node agent as a Kubernetes DaemonSet runs it."""

import os

import click


@click.command("agent")
@click.option("--config", "-c", type=click.Path(dir_okay=False), default=None,
              help="gpugate.toml (default: $GPUGATE_CONFIG or /etc/gpugate/gpugate.toml).")
@click.option("--node", "-n", default=None, help="The Node's name (default: $GPUGATE_NODE_NAME, the DaemonSet's "
                                                 "spec.nodeName, else the hostname).")
@click.option("--interval", type=click.FloatRange(10, 86400), default=300, show_default=True,
              help="Seconds between health checks.")
@click.option("--poll", type=click.FloatRange(0.1, 600), default=5, show_default=True,
              help="Seconds between reads of the Node while gpugate holds it (the sweep's requests).")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Serve Prometheus metrics on this port (GET /metrics; default [kubernetes] metrics_port; 0: none).")
@click.option("--mirror-from", "mirror_from", type=click.Path(dir_okay=False), default=None,
              help="Slurm on Kubernetes: run as the slurmd pod's sidecar, writing the Node from this mirror file "
                   "(slurmd's gpugate writes it: [kubernetes] mirror_file) and doing nothing else.")
def agent(config, node, interval, poll, metrics_port, mirror_from):
    """Run the node agent on a Kubernetes node: gpugate-healthcheck every
    --interval, and, while gpugate holds the Node, the sweep's requests
    ([sweep] transport = "kubernetes": check, facts, reset-gpus; nothing
    else) read from the Node every --poll seconds and answered on it.

    \b
    Examples:
      gpugate agent --config /etc/gpugate/gpugate.toml
      GPUGATE_NODE_NAME=gpu07 gpugate agent --interval 300 --poll 5
      gpugate agent --metrics-port 9477
      gpugate agent --mirror-from /run/gpugate-mirror/gpu07.json --poll 2

    With [preflight] kubernetes = true it also serves the preflight init
    container of opted-in GPU Pods on [preflight] kube_port: this node's
    own proof and the proof across the Pod's gang (gpugate.node.kube_preflight).

    With --mirror-from FILE (scheduler = "slurm+kubernetes"): the slurmd
    pod's sidecar, the only container with a token; it writes on its Node
    what slurmd's gpugate wrote into FILE (gpugate's hold and the
    GpugateHealthy condition), read every --poll seconds when it changed.
    """
    import shutil
    import socket
    import sysconfig

    from gpugate.model.config import config_path, load_settings
    from gpugate.node.kube_agent import Agent
    from gpugate.core.names import check_node_name

    node = node or os.environ.get("GPUGATE_NODE_NAME") or socket.gethostname().split(".")[0]
    check_node_name(node, "--node")
    path = config_path(config)
    settings = load_settings(path)
    if mirror_from:
        from gpugate.node.kube_mirror_agent import MirrorAgent

        if settings.scheduler != "slurm+kubernetes":
            raise click.UsageError("--mirror-from is the slurmd pod's sidecar (Slurm on Kubernetes); %s says "
                                   "scheduler = %r" % (path, settings.scheduler))
        MirrorAgent(settings, node, os.path.abspath(mirror_from), poll=poll).run()
        return
    if settings.scheduler != "kubernetes":
        raise click.UsageError("gpugate agent serves Kubernetes nodes; %s says scheduler = %r (on Slurm, slurmd "
                               "runs gpugate-healthcheck itself)" % (path, settings.scheduler))
    # The one installed beside this interpreter (pip), else the PATH's (a distribution package).
    healthcheck = os.path.join(sysconfig.get_path("scripts"), "gpugate-healthcheck")
    if not os.access(healthcheck, os.X_OK):
        healthcheck = shutil.which("gpugate-healthcheck") or healthcheck
    runner = Agent(settings, node, path, [healthcheck, "--config", path], interval=interval, poll=poll)
    from gpugate.fleet.metrics_server import AgentWatch, port_of, serve

    port = port_of(settings, metrics_port)
    if port:  # when its last check ended, from a thread beside the loop (GpugateHealthCheckStale)
        serve(settings, port, AgentWatch(runner).text)
    if settings.preflight["kubernetes"]:  # the preflight init containers' requests, from threads beside it
        from gpugate.kube.client import connect
        from gpugate.node.kube_preflight import serve

        serve(settings, node, lambda deadline: connect(dict(settings.kubernetes), deadline))
    runner.run()
