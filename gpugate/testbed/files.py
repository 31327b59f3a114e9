"""The rig's files: its slurm.conf, gpugate.toml (with the sweep of a
simulated fleet), the shims slurmd runs, and the RebootProgram."""

import os
import stat
import sys
from typing import Dict, List

from gpugate.testbed.procs import BIN, ENTRY_POINTS, installed_entry_point, slurm_version


def node_names(count: int) -> List[str]:
    return ["gpu%02d" % i for i in range(1, count + 1)]


def rig_slurm_conf(cluster, ports: List[int]) -> str:
    """The rig's slurm.conf (not the fragment `gpugate slurm-conf` prints for
    a real one): slurmctld on ports[0], a slurmd on each of the others."""
    d = cluster.dir
    lines = [
        "# Local gpugate test cluster: one slurmctld, %d slurmd on loopback." % len(cluster.nodes),
        "ClusterName=gpugate",
        "SlurmctldHost=localhost",
        "SlurmctldPort=%d" % ports[0],
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # cred_expire also delays a requeued job's restart (default 120 s).
        "AuthInfo=socket=%s/munge/munge.sock,cred_expire=10" % d,
        "SlurmUser=root",
        "SlurmdUser=root",
        "StateSaveLocation=%s/spool/ctld" % d,
        "SlurmdSpoolDir=%s/spool/%%n" % d,
        "SlurmctldPidFile=%s/run/slurmctld.pid" % d,
        "SlurmdPidFile=%s/run/slurmd-%%n.pid" % d,
        "SlurmctldLogFile=%s/log/slurmctld.log" % d,
        "SlurmdLogFile=%s/log/slurmd-%%n.log" % d,
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "SlurmdTimeout=30",
        "SlurmctldTimeout=30",
        "MessageTimeout=5",
        "KillWait=2",
        "MinJobAge=30",
        "ResumeTimeout=60",
        "RebootProgram=%s/bin/reboot" % d,
        "HealthCheckProgram=%s/bin/healthcheck" % d,
        "HealthCheckInterval=%d" % cluster.health_interval,
        "HealthCheckNodeState=ANY",
        "Prolog=%s/bin/prolog" % d,
        "Epilog=%s/bin/epilog" % d,
        "PrologFlags=Alloc",
        "SchedulerParameters=nohold_on_prolog_fail",
    ]
    if slurm_version() >= (26, 5):
        # 26.05.2+: slurmd tells the health check whether slurmctld holds
        # the node in service (SLURM_NODE_IS_HEALTHY); default from 26.11.
        lines.append("SlurmctldParameters=health_check_report")
    gres = ""
    if getattr(cluster, "gpus", 0):
        lines.append("GresTypes=gpu")
        gres = " Gres=gpu:%d" % cluster.gpus
    for name, port in zip(cluster.nodes, ports[1:]):
        lines.append("NodeName=%s NodeHostname=localhost NodeAddr=127.0.0.1 Port=%d CPUs=%d "
                     "RealMemory=100%s State=UNKNOWN" % (name, port, getattr(cluster, "cpus", 1), gres))
    partitions = cluster.partitions or {"gpu": cluster.nodeset()}
    for i, (part, members) in enumerate(partitions.items()):
        lines.append("PartitionName=%s Nodes=%s Default=%s MaxTime=INFINITE State=UP"
                     % (part, members, "YES" if i == 0 else "NO"))
    return "\n".join(lines) + "\n"


class NoDeviceNodes(OSError):
    """This machine refuses mknod: a rig with GPU GRES cannot be made."""


def write_gres(cluster) -> None:
    """gres.conf for the rig's GPU GRES: slurmd wants a character device per
    GPU (it reads the major and minor for the job's device cgroup); these are
    nvidia's numbers (195, N) made in the rig's directory, never opened."""
    dev = cluster.path("dev")
    os.makedirs(dev, mode=0o755, exist_ok=True)
    for i in range(cluster.gpus):
        path = os.path.join(dev, "nvidia%d" % i)
        if not os.path.exists(path):
            try:
                os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(195, i))
            except PermissionError as exc:  # no CAP_MKNOD (some containers): no GRES rig here
                raise NoDeviceNodes("cannot make the rig's GPU device files (%s): %s" % (path, exc)) from None
    write_file(cluster.path("gres.conf"), "Name=gpu File=%s/nvidia[0-%d]\n" % (dev, cluster.gpus - 1))


def rig_backend() -> str:
    """The Slurm backend the rig's gpugate uses: $GPUGATE_TEST_SLURM_BACKEND
    (scripts/test --release 25.11 runs the Slurm tests once with each)."""
    return os.environ.get("GPUGATE_TEST_SLURM_BACKEND", "commands")


def _with_key(cluster, extra: str) -> str:
    """The rig's drain budget key (one for its nodes and its keeper, root's
    0600: gpugate.safety.budgetkey), named in ``extra``'s [drain_budget] or a new one;
    an extra that names its own key_file keeps it."""
    if "key_file" in extra:
        return extra
    key = cluster.path("drain-budget.key")
    if not os.path.exists(key):
        write_file(key, os.urandom(32).hex() + "\n", 0o600)
    line = 'key_file = "%s"\n' % key
    if "[drain_budget]\n" in extra:
        return extra.replace("[drain_budget]\n", "[drain_budget]\n" + line, 1)
    return extra + "\n[drain_budget]\n" + line


def write_gpugate_toml(cluster, extra: str) -> None:
    """gpugate.toml of the rig (what its shims name)."""
    extra = _with_key(cluster, extra)
    text = """# gpugate.toml of a local test cluster (gpugate demo / tests)
baseline = "{dir}/baseline.toml"
state_dir = "{dir}/state/{{node}}"
log = "file"

[healthcheck]
boot_grace_seconds = 0

[slurm]
backend = "{backend}"
slurm_conf = "{dir}/slurm.conf"
# Logging shims in front of scontrol/sinfo: tests count gpugate's Slurm calls.
bin_dir = "{dir}/slurm-bin"
# The shims' directory has no lib/ beside it: the real Slurm's library, as a
# site names it whose commands are wrappers.
library = "{library}"

[sim]
fleet = "{dir}/fleet"

[sweep]
{sweep}
{extra}
""".format(dir=cluster.dir, extra=extra, sweep=_sweep_toml(cluster), backend=rig_backend(),
           library=real_library())
    write_file(cluster.gpugate_conf, text)


def _sweep_toml(cluster) -> str:
    """The sweep of a simulated fleet: local transport, `gpugate sim
    converge` as the reconverge command, short timeouts."""
    gpugate = [sys.executable, "-m", "gpugate"]
    converge = gpugate + ["sim", "converge", cluster.fleet, "{nodes}", "--baseline", cluster.baseline]
    values: Dict[str, object] = {
        "journal": cluster.path("state", "sweep.db"), "transport": "local", "gpugate": gpugate,
        "converge": converge, "rollback": converge + ["--previous"],
        "poll_seconds": 0.5, "drain_timeout": 60, "reboot_timeout": 90, "verify_timeout": 120,
        # No smoke job unless a test asks (smoke_command()); the rig has no gres.
        "smoke": [], "smoke_sbatch": [], "smoke_output_dir": cluster.path("smoke"), "smoke_pair_sbatch": [],
    }
    values.update(cluster.sweep_overrides)
    return "\n".join("%s = %s" % (k, _toml_value(v)) for k, v in values.items())


def real_library() -> str:
    """The installed Slurm's libslurm, where gpugate looks for it beside
    BIN (gpugate.slurm.libslurm.candidates); "" when there is none."""
    from gpugate.slurm.libslurm import candidates

    return next((path for path in candidates(BIN) if os.path.isfile(path)), "")


def write_shims(cluster) -> None:
    """What slurmd runs (it passes no arguments), and logging shims in front
    of scontrol/sinfo/scancel/sbatch so that tests count gpugate's calls."""
    for mode in ENTRY_POINTS:
        target = installed_entry_point(mode)
        # The pyslurm backend's calls go to the same log as the shims' below.
        write_file(cluster.path("bin", mode), "#!/bin/sh\n# slurmd passes no arguments: name this cluster's "
                   "configuration.\nexport GPUGATE_SLURM_TRACE=%s\nexec %s --config %s\n"
                   % (cluster.path("log", "slurm-calls.log"), target, cluster.gpugate_conf), 0o755)
    for tool in ("scontrol", "sinfo", "scancel", "sbatch"):
        write_file(cluster.path("slurm-bin", tool), '#!/bin/sh\necho "$SLURMD_NODENAME %s $*" >> %s\nexec %s/%s "$@"\n'
                   % (tool, cluster.path("log", "slurm-calls.log"), BIN, tool), 0o755)
    write_file(cluster.path("bin", "reboot"), REBOOT_PROGRAM.format(python=sys.executable, dir=cluster.dir), 0o755)


# RebootProgram: slurmd runs it as root when `scontrol reboot` reaches the
# node.  A simulated node "reboots": its model is rebooted (new boot id,
# empty kernel log, the on-disk module loaded) and its slurmd restarts with -b.
REBOOT_PROGRAM = """#!{python}
import os, subprocess, sys, time
def slurmd_node():
    # 26.05 runs RebootProgram as a "power action" without slurmd's
    # environment: take the node from the calling `slurmd -N NAME`.
    pid = os.getppid()
    while pid > 1:
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as handle:
                argv = handle.read().decode("utf-8", "replace").split("\\0")
            with open("/proc/%d/stat" % pid) as handle:
                parent = int(handle.read().rsplit(") ", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return ""
        if "-N" in argv[:-1] and os.path.basename(argv[0]).startswith("slurmd"):
            return argv[argv.index("-N") + 1]
        pid = parent
    return ""
def gone(pid):
    # Exited, or a zombie its parent (the test run) has not reaped yet.
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(") ", 1)[1].startswith(("Z", "X"))
    except (OSError, IndexError):
        return True
node = os.environ.get("SLURMD_NODENAME", "") or slurmd_node()
if not node:
    sys.exit("reboot: SLURMD_NODENAME is not set and no slurmd -N among my parents")
subprocess.run(["{python}", "-m", "gpugate", "sim", "set", "{dir}/fleet", node, "reboot=1"],
               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
pidfile = "{dir}/run/slurmd-%s.pid" % node
with open(pidfile) as handle:
    pid = int(handle.read().split()[0])
# Restart slurmd from a detached child, after this program (its child) returns.
if os.fork() == 0:
    os.setsid()
    time.sleep(1)
    # A loaded machine's slurmd may take a while to stop; a new one started
    # beside it would find its port taken and the node would never return.
    for sig, tries in ((15, 300), (9, 100)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        for _ in range(tries):
            if gone(pid):
                break
            time.sleep(0.1)
        else:
            continue
        break
    env = {{"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_CONF": "{dir}/slurm.conf", "SLURMD_NODENAME": node}}
    log = open("{dir}/log/slurmd-%s.out" % node, "ab")
    subprocess.Popen(["/usr/sbin/slurmd", "-f", "{dir}/slurm.conf", "-N", node, "-b"], env=env,
                     stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    os._exit(0)
"""


def smoke_command(directory: str) -> List[str]:
    """The sweep's smoke job on the cluster in ``directory``: each node's
    replayed all_reduce_perf (FLEET/NODE/bin), run by slurmd."""
    return [os.path.join(os.path.abspath(directory), "fleet", "{node}", "bin", "all_reduce_perf"),
            "-b", "1G", "-e", "8G", "-f", "2", "-g", "{gpus}"]


def smoke_pair_command(directory: str) -> List[str]:
    """The 2-node pair job on that cluster: no MPI here, so no srun; the
    pair's first node replays the worse 2-node recording of the two."""
    return [os.path.join(os.path.abspath(directory), "fleet", "{node}", "bin", "all_reduce_perf"),
            "-b", "1G", "-e", "8G", "-f", "2", "-g", "1"]


def write_file(path: str, text: str, mode: int = 0o644) -> None:
    with open(path, "w") as handle:
        handle.write(text)
    os.chmod(path, mode)  # exactly: the umask could have left a group write bit


def node_names_from_conf(conf: str) -> List[str]:
    """The NodeName= entries of a test cluster's slurm.conf."""
    names = []
    try:
        with open(conf) as handle:
            for line in handle:
                if line.startswith("NodeName="):
                    names.append(line.split()[0].split("=", 1)[1])
    except OSError:
        pass
    return names


def _toml_value(value) -> str:
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{ %s }" % ", ".join("%s = %s" % (json.dumps(k), _toml_value(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return "[%s]" % ", ".join(_toml_value(v) for v in value)
    return json.dumps(value)  # strings and numbers: JSON's forms are TOML's
