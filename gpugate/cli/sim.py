"""`gpugate sim`: create and change simulated nodes."""

import json
import os

import click

from gpugate.errors import ConfigError


def _nodeset(expr: str):
    from gpugate.core.names import parse_hostlist

    ns = parse_hostlist(expr, "node list")
    if not len(ns):
        raise ConfigError("empty node list %r" % expr)
    return ns


@click.group()
def sim():
    """Simulated GPU nodes: NVML, the file-system root and the tools are
    simulated; everything above them runs the production code.

    \b
    Examples:
      gpugate sim init /tmp/fleet --nodes 'gpu[01-08]' --baseline slurm_conf/baseline.example.toml
      gpugate sim set /tmp/fleet 'gpu[02-03]' driver=550.54.15
      gpugate sim set /tmp/fleet gpu05 gpu.3.xid=79
      gpugate sim replay /tmp/fleet gpu06 --stdout-file diag.json --exit-code 226 -- dcgmi diag -r 2 -j
      gpugate check --sim /tmp/fleet --node gpu02
    """


@sim.command("init")
@click.argument("fleet", type=click.Path(file_okay=False))
@click.option("--nodes", required=True, help="Hostlist of node names, e.g. 'gpu[01-08]'.")
@click.option("--baseline", "-b", "baseline_path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--vendor", type=click.Choice(["nvidia", "amd"]), default=None,
              help="GPU vendor of these nodes (default: each node's nodeset vendor in the baseline).")
def sim_init(fleet, nodes, baseline_path, vendor):
    """Create one healthy simulated node per name, matching the baseline.
    The fleet remembers the baseline (FLEET/fleet.json): `gpugate check
    --sim FLEET` and `explain --sim FLEET` judge against it by default.
    An AMD Instinct node (its nodeset says vendor = "amd", or --vendor amd)
    has amdgpu's sysfs, amd-smi and rvs instead of NVML and NVIDIA's tools.

    \b
    Examples:
      gpugate sim init /tmp/fleet --nodes 'gpu[001-004]' --baseline slurm_conf/baseline.example.toml
      gpugate sim init /tmp/fleet --nodes 'mi[01-04]' --baseline slurm_conf/baseline.mixed.example.toml
      gpugate sim init /tmp/fleet --nodes 'mi05' --vendor amd --baseline baseline.toml
    """
    from gpugate.model.baseline import load_baseline
    from gpugate.sim import fleet as simfleet

    baseline = load_baseline(baseline_path)
    names = _nodeset(nodes)
    for name in names:
        simfleet.save(fleet, name, simfleet.new_model(name, baseline, vendor=vendor))
    simfleet.record_baseline(fleet, baseline_path)  # check/explain/facts --sim default to it
    click.echo("created %d simulated nodes in %s: %s" % (len(names), fleet, names))


@sim.command("set")
@click.argument("fleet", type=click.Path(file_okay=False, exists=True))
@click.argument("nodes")
@click.argument("assignments", nargs=-1, required=True)
def sim_set(fleet, nodes, assignments):
    """Change facts of simulated nodes: KEY=VALUE ... (unknown keys are errors).

    \b
    Examples:
      gpugate sim set /tmp/fleet 'gpu[002-003]' driver=550.54.15
      gpugate sim set /tmp/fleet gpu003 gpu.3.xid=79 gpu.3.ecc.uncorrected.volatile=2
      gpugate sim set /tmp/fleet gpu004 sxid=20034 sxid=12028:nonfatal@2
      gpugate sim set /tmp/fleet gpu004 'kmsg=NVRM: GPU 0000:1b:00.0: GPU has fallen off the bus.'
      gpugate sim set /tmp/fleet gpu002 compute_mode=prohibited gpu.1.power_limit=500 gpu.2.ecc.pending=0
      gpugate sim set /tmp/fleet gpu004 ib.mlx5_4.state=DOWN imex.domain=DEGRADED
      gpugate sim set /tmp/fleet gpu004 smoke=pcie-degraded   # the sweep's smoke job finds NVLink off
      gpugate sim set /tmp/fleet gpu004 smoke=pair-slow       # only its 2-node pair job is slow
      gpugate sim set /tmp/fleet mi02 amd.gpu3.ras.umc.ue=+2 amd.gpu3.log=ue:umc:2   # an AMD GPU's RAS error
      gpugate sim set /tmp/fleet mi03 amd.gpu1.bad_pages=pending:1 amd.gpu5.xgmi_down=1

    \b
    Keys: driver gsp cuda kernel image_version fabricmanager container_toolkit dcgm
      dcgm.health dcgm.diag_fail=GPU[:msg] gpus pci.gpus nvml.init_error nvml.hang
      module.resident module.on_disk dkms converge_fails reboot=1 service.<unit>=STATE
      sxid=CODE[:nonfatal][@SWITCH] kmsg=RAW-KERNEL-LOG-MESSAGE kmsg.user=MESSAGE (user space's)
      kmsg.flood=N (N records overwrite the oldest of the ring's 1000)
      kmsg.ring=N (the ring holds N records, 100-100000)
      compute_mode power_limit (every GPU; watts)
      throttle.{sw_power_cap,sync_boost,sw_thermal,hw_thermal,power_brake}=S|+S (NVML's
      counters of time slowed, every GPU; gpu.N.throttle.REASON for one) clock.advance=S
      (NVML's clock S seconds on: the next health check's interval) nvml.binding=12.535
      (an nvidia-ml-py that names no clock-event counter)
      smoke=healthy|pcie-degraded|hang|nccl-abort|pair-slow|pair-abort (what all_reduce_perf
      replays; pair-*: only the 2-node pair job, whose first node plays the worse of the two)
      bug_report=1 (nvidia-bug-report.sh installed; absent by default) reset_delay=S (how long
      nvidia-smi -r takes: a window for a kill -9 during the sweep's GPU reset)
      gpu.N.{vbios,gsp,name,xid,remapped_rows.pending,remapped_rows.failure,
      ecc.uncorrected.volatile,ecc.uncorrected.aggregate,retired_pages_pending,pcie.width,
      pcie.gen,recovery_action,fabric_state,nvlink.down,clocks,processes,persistence,mig,
      mig.pending,ecc,ecc.pending,compute_mode,power_limit,lost,hang,nvml_error.<nvmlFunction>}
      lost,hang,nvml_error.<nvmlFunction>}
      ib.<dev>.{state=ACTIVE|DOWN|POLLING|INIT,rate,link_layer,fw,gone=1,counter.<name>=N|+N}
      (nodesets with an [hca] table) imex.{service,domain,installed,peer.<address>} (imex = true)
      AMD nodes: amd.{initstate,amdgpu,rocm,gpus,smi,amd_smi,xgmi_status,rvs,rvs.fail.LEVEL}
      amd.gpuN.{ras.BLOCK.ue|ce|de,ras,bad_pages,compute_partition,memory_partition,pcie_gen,
      pcie_width,pcie_replays,bound,processes,product,serial,vbios,power_cap_w,firmware.ID,
      file.PATH,ifwi,xgmi_down,threshold_exceeded,reset_fails,log=EVENT[:COUNT]}
    """
    from gpugate.sim import fleet as simfleet
    from gpugate.sim import keys

    pairs = keys.parse_assignments(list(assignments))
    names = list(_nodeset(nodes))
    models = {name: simfleet.load(fleet, name) for name in names}  # all or nothing
    for name, model in models.items():
        for key, value in pairs:
            keys.apply(model, key, value)
    for name, model in models.items():
        simfleet.save(fleet, name, model)
    click.echo("%s: %s" % (nodes, " ".join(assignments)))


@sim.command("replay")
@click.argument("fleet", type=click.Path(file_okay=False, exists=True))
@click.argument("nodes")
@click.option("--stdout-file", type=click.Path(exists=True, dir_okay=False), help="What the tool prints.")
@click.option("--stderr-file", type=click.Path(exists=True, dir_okay=False))
@click.option("--exit-code", type=int, default=0, show_default=True)
@click.option("--hang", is_flag=True, help="The tool never answers.")
@click.option("--delay", type=click.FloatRange(0, 3600), default=0.0, help="Seconds the tool takes to answer.")
@click.option("--clear", is_flag=True, help="Remove the recording for this argv.")
@click.argument("argv", nargs=-1, required=True)
def sim_replay(fleet, nodes, stdout_file, stderr_file, exit_code, hang, delay, clear, argv):
    """Make a simulated tool replay a recorded output for this exact argv
    (after --), e.g. `-- dcgmi diag -r 1 -j`.  ARGV may end in '*' to match
    any further arguments.

    \b
    Examples:
      gpugate sim replay /tmp/fleet gpu006 --stdout-file diag.json --exit-code 226 -- dcgmi diag -r 2 -j
      gpugate sim replay /tmp/fleet gpu006 --hang -- dcgmi health '*'
      gpugate sim replay /tmp/fleet gpu006 --clear -- dcgmi diag -r 2 -j
    """
    from gpugate.sim import fleet as simfleet

    tool = os.path.basename(argv[0])
    if tool not in simfleet.EXECUTABLES:
        raise ConfigError("%s is not a simulated tool (%s)" % (tool, ", ".join(simfleet.EXECUTABLES)))
    key = " ".join((tool,) + tuple(argv[1:]))
    entry = {"stdout": _read(stdout_file), "stderr": _read(stderr_file), "rc": exit_code, "hang": hang,
             "sleep": delay}
    for name in _nodeset(nodes):
        model = simfleet.load(fleet, name)
        if not stdout_file and not clear:  # keep what the tool prints now, change only timing/exit
            current = simfleet.replay_entry(fleet, name, key)
            entry = dict(current, **{k: v for k, v in entry.items() if k in ("hang", "sleep")})
            if exit_code:
                entry["rc"] = exit_code
        if clear:
            model["replays"].pop(key, None)
        else:
            model["replays"][key] = entry
        simfleet.save(fleet, name, model)
    click.echo("%s: %s -> %s" % (nodes, key, "cleared" if clear else "hang" if hang else "exit %d" % exit_code))


@sim.command("show")
@click.argument("fleet", type=click.Path(file_okay=False, exists=True))
@click.argument("node")
def sim_show(fleet, node):
    """Print a simulated node's model (JSON).

    \b
    Examples:
      gpugate sim show /tmp/fleet gpu002
    """
    from gpugate.sim import fleet as simfleet

    click.echo(json.dumps(simfleet.load(fleet, node), indent=1, sort_keys=True))


def _read(path):
    if not path:
        return ""
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


@sim.command("converge")
@click.argument("fleet", type=click.Path(file_okay=False, exists=True))
@click.argument("nodes")
@click.option("--baseline", "-b", "baseline_path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--previous", is_flag=True, help="Converge to the baseline's [previous] block (a rollback).")
def sim_converge(fleet, nodes, baseline_path, previous):
    """The reconverge command for simulated fleets: rewrite each node to the
    pinned versions (hardware faults stay).  A node set with converge=noop
    "succeeds" and changes nothing; converge=error fails (exit 1).

    \b
    In gpugate.toml:  [sweep] converge = ["gpugate", "sim", "converge", "FLEET", "{nodes}", "-b", "BASELINE"]

    \b
    Examples:
      gpugate sim converge /tmp/fleet 'gpu[001-004]' -b new-baseline.toml
      gpugate sim converge /tmp/fleet gpu002 -b /etc/gpugate/baseline.toml --previous
    """
    from gpugate.model.baseline import load_baseline
    from gpugate.sim import fleet as simfleet

    baseline = load_baseline(baseline_path)
    failed = []
    for name in _nodeset(nodes):
        model = simfleet.load(fleet, name)
        mode = model.get("converge", "ok")
        if mode == "error":
            failed.append(name)
            continue
        if mode == "ok":
            simfleet.converge(model, baseline, previous=previous)
            simfleet.save(fleet, name, model)
    if failed:
        click.echo("converge failed on %s" % ",".join(failed), err=True)
        raise SystemExit(1)
    click.echo("converged %s to %s" % (nodes, "the previous baseline" if previous else baseline.name))
