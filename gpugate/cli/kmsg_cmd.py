"""`gpugate kmsg-follow`: the node's kernel-log follower (gpugate.node.kmsgfollow)."""

import click


@click.command("kmsg-follow")
@click.option("--config", "-c", type=click.Path(dir_okay=False), default=None, help="gpugate.toml.")
@click.option("--sim", type=click.Path(file_okay=False), default=None,
              help="Follow a simulated node of this fleet directory instead of this machine.")
@click.option("--node", "-n", default=None, help="Node name (default: $SLURMD_NODENAME or the hostname).")
@click.option("--seconds", type=click.FloatRange(0.1, None), default=None,
              help="Stop after this long (default: until SIGTERM).")
def kmsg_follow(config, sim, node, seconds):
    """Keep the GPU drivers' kernel-log records as they arrive (a node daemon).

    Reads the kernel log (/dev/kmsg, [kernel_log] path) record by record and
    keeps the NVIDIA/NVSwitch/amdgpu driver events in the node's state
    directory (kmsg/gpu-events.log, at most 512 KiB; the application's faults
    apart in kmsg/app-events.log, at most 128 KiB; root's alone), with a
    heartbeat (kmsg/follower.json).  The health check, prolog and epilog read
    them beside the ring, so an Xid a user's flood of kernel records pushed
    out of the ring is still found.  Records it could not read itself are
    counted (metric gpugate_kmsg_follower_lost_records).  Run it as root from
    slurm_conf/gpugate-kmsg-follow.service.

    \b
    Examples:
      gpugate kmsg-follow
      gpugate kmsg-follow --sim /tmp/fleet --node gpu01 --seconds 60
    """
    from gpugate.node.kmsgfollow import run
    from gpugate.cli.context import default_node, load_context

    node = node or default_node()
    settings = load_context(config, sim, None, node)
    raise SystemExit(run(settings, node, seconds=seconds, poll=0.05 if sim else 0.1))
