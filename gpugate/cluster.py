"""A real Slurm cluster on this machine, for the tests and `gpugate demo`.

munged, one slurmctld and N ``slurmd -N gpuNN`` (Debian's multiple-slurmd
build) on loopback, everything under one directory: DIR/slurm.conf,
DIR/gpugate.toml, DIR/baseline.toml, the simulated fleet in DIR/fleet, state
in DIR/state/<node>.  slurmd runs gpugate's installed entry points through
small shims that name DIR/gpugate.toml (slurmd passes no arguments and no
environment).  Processes are stopped by the pids they wrote, nothing else.
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from typing import Dict, List, Optional, Tuple

from .errors import GpugateError

SBIN = "/usr/sbin"
BIN = "/usr/bin"
ENTRY_POINTS = ("healthcheck", "prolog", "epilog")


class ClusterError(GpugateError):
    pass


def installed_entry_point(mode: str) -> str:
    """The gpugate-<mode> script pip installed next to this interpreter."""
    path = os.path.join(sysconfig.get_path("scripts"), "gpugate-" + mode)
    if not os.access(path, os.X_OK):
        raise ClusterError("%s is missing: install gpugate with pip (pip install .) first" % path)
    return path


def free_ports(count: int) -> List[int]:
    """``count`` consecutive free loopback ports (slurmd ports must not clash)."""
    for base in range(17000, 30000, 50):
        ports = list(range(base, base + count))
        if all(_port_free(p) for p in ports):
            return ports
    raise ClusterError("no %d free consecutive ports on 127.0.0.1" % count)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


_VERSIONS: Dict[str, Tuple[int, ...]] = {}


def slurm_version(slurmd: str = SBIN + "/slurmd") -> Tuple[int, ...]:
    """(major, minor) of the installed slurmd, from ``slurmd -V`` ("slurm 24.11.5");
    the configuration this cluster writes differs between releases."""
    if slurmd not in _VERSIONS:
        result = subprocess.run([slurmd, "-V"], capture_output=True, text=True, timeout=30,
                                stdin=subprocess.DEVNULL, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        match = re.search(r"(\d+)\.(\d+)", result.stdout)
        if result.returncode != 0 or not match:
            raise ClusterError("cannot read the Slurm version from `%s -V`: %s"
                               % (slurmd, (result.stdout + result.stderr).strip()[:200]))
        _VERSIONS[slurmd] = (int(match.group(1)), int(match.group(2)))
    return _VERSIONS[slurmd]


def node_names(count: int) -> List[str]:
    return ["gpu%02d" % i for i in range(1, count + 1)]


class Cluster:
    def __init__(self, directory: str, nodes: int = 8, health_interval: int = 5,
                 partitions: Optional[Dict[str, str]] = None, sweep: Optional[Dict[str, object]] = None):
        self.dir = os.path.abspath(directory)
        self.nodes = node_names(nodes)
        self.health_interval = health_interval
        self.partitions = partitions
        self.sweep_overrides = dict(sweep or {})
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.gpugate_conf = os.path.join(self.dir, "gpugate.toml")
        self.baseline = os.path.join(self.dir, "baseline.toml")
        self.fleet = os.path.join(self.dir, "fleet")

    # ------------------------------------------------------------------ env
    @property
    def env(self) -> Dict[str, str]:
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_CONF": self.conf, "LC_ALL": "C",
               "HOME": os.environ.get("HOME", "/root")}
        return env

    def path(self, *parts: str) -> str:
        return os.path.join(self.dir, *parts)

    # -------------------------------------------------------------- writing
    def write(self, baseline_text: str, gpugate_extra: str = "") -> None:
        """Create the directory: configuration, shims, the simulated fleet."""
        # gpugate refuses anything it reads or runs that is not root's alone
        # (gpugate.trust): no group or other write bit, whatever the umask.
        os.makedirs(self.dir, mode=0o755, exist_ok=True)
        for sub in ("log", "run", "spool/ctld", "state", "bin", "munge", "slurm-bin"):
            os.makedirs(self.path(sub), mode=0o755, exist_ok=True)
        os.chmod(self.path("munge"), 0o700)
        _write_file(self.baseline, baseline_text)
        self._write_gpugate_toml(gpugate_extra)
        ports = free_ports(len(self.nodes) + 1)
        _write_file(self.conf, self.slurm_conf(ports))
        if slurm_version() >= (24, 5):
            # 24.05+ slurmd loads a cgroup plugin even with proctrack/linuxproc
            # and task/none, and fails without a cgroup file system (chroot,
            # containers); slurmd reads cgroup.conf next to slurm.conf.
            _write_file(self.path("cgroup.conf"), "CgroupPlugin=disabled\n")
        self._write_shims()
        self._write_munge_key()
        from .baseline import load_baseline
        from .sim import fleet as simfleet

        baseline = load_baseline(self.baseline)
        for name in self.nodes:
            simfleet.save(self.fleet, name, simfleet.new_model(name, baseline))

    def _write_gpugate_toml(self, extra: str) -> None:
        text = """# gpugate.toml of a local test cluster (gpugate demo / tests)
baseline = "{dir}/baseline.toml"
state_dir = "{dir}/state/{{node}}"
log = "file"

[healthcheck]
boot_grace_seconds = 0

[slurm]
slurm_conf = "{dir}/slurm.conf"
# Logging shims in front of scontrol/sinfo: tests count gpugate's Slurm calls.
bin_dir = "{dir}/slurm-bin"

[sim]
fleet = "{dir}/fleet"

[sweep]
{sweep}
{extra}
""".format(dir=self.dir, extra=extra, sweep=self._sweep_toml())
        _write_file(self.gpugate_conf, text)

    def _sweep_toml(self) -> str:
        """The sweep of a simulated fleet: local transport, `gpugate sim
        converge` as the reconverge command, short timeouts."""
        gpugate = [sys.executable, "-m", "gpugate"]
        converge = gpugate + ["sim", "converge", self.fleet, "{nodes}", "--baseline", self.baseline]
        values: Dict[str, object] = {
            "journal": self.path("state", "sweep.db"), "transport": "local", "gpugate": gpugate,
            "converge": converge, "rollback": converge + ["--previous"],
            "poll_seconds": 0.5, "drain_timeout": 60, "reboot_timeout": 90, "verify_timeout": 120,
            # No smoke job unless a test asks (smoke_command()); the rig has no gres.
            "smoke": [], "smoke_sbatch": [], "smoke_output_dir": self.path("smoke"),
        }
        values.update(self.sweep_overrides)
        return "\n".join("%s = %s" % (k, _toml_value(v)) for k, v in values.items())

    def _write_shims(self) -> None:
        for mode in ENTRY_POINTS:
            target = installed_entry_point(mode)
            _write_file(self.path("bin", mode), "#!/bin/sh\n# slurmd passes no arguments: name this cluster's "
                        "configuration.\nexec %s --config %s\n" % (target, self.gpugate_conf), 0o755)
        for tool in ("scontrol", "sinfo", "scancel", "sbatch"):
            _write_file(self.path("slurm-bin", tool), '#!/bin/sh\necho "$SLURMD_NODENAME %s $*" >> %s\nexec %s/%s "$@"\n'
                        % (tool, self.path("log", "slurm-calls.log"), BIN, tool), 0o755)
        _write_file(self.path("bin", "reboot"), REBOOT_PROGRAM.format(python=sys.executable, dir=self.dir), 0o755)

    def _write_munge_key(self) -> None:
        key = self.path("munge", "munge.key")
        if not os.path.exists(key):
            with open(key, "wb") as handle:
                handle.write(os.urandom(1024))
        os.chmod(key, 0o400)

    def slurm_conf(self, ports: List[int]) -> str:
        d = self.dir
        lines = [
            "# Local gpugate test cluster: one slurmctld, %d slurmd on loopback." % len(self.nodes),
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
            "HealthCheckInterval=%d" % self.health_interval,
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
        for name, port in zip(self.nodes, ports[1:]):
            lines.append("NodeName=%s NodeHostname=localhost NodeAddr=127.0.0.1 Port=%d CPUs=1 "
                         "RealMemory=100 State=UNKNOWN" % (name, port))
        partitions = self.partitions or {"gpu": self.nodeset()}
        for i, (part, members) in enumerate(partitions.items()):
            lines.append("PartitionName=%s Nodes=%s Default=%s MaxTime=INFINITE State=UP"
                         % (part, members, "YES" if i == 0 else "NO"))
        return "\n".join(lines) + "\n"

    def nodeset(self) -> str:
        from ClusterShell.NodeSet import NodeSet

        return str(NodeSet.fromlist(self.nodes))

    # ------------------------------------------------------------- running
    def start(self, timeout: float = 60.0) -> None:
        self._start_munge()
        self._spawn([SBIN + "/slurmctld", "-f", self.conf, "-i"], "slurmctld")
        self._wait(lambda: self._sinfo_ok(), timeout, "slurmctld to answer")
        for name in self.nodes:
            self.start_slurmd(name)
        self.wait_nodes_up(timeout)

    def start_slurmd(self, name: str, boot: bool = False) -> None:
        argv = [SBIN + "/slurmd", "-f", self.conf, "-N", name]
        if boot:
            argv.append("-b")  # report a reboot: completes `scontrol reboot`
        # slurmd runs RebootProgram with its own environment: name the node there.
        self._spawn(argv, "slurmd-" + name, {"SLURMD_NODENAME": name})

    def _start_munge(self) -> None:
        if self._alive(self.path("run", "munged.pid")):
            return
        subprocess.run(
            [SBIN + "/munged", "--force", "--socket=" + self.path("munge", "munge.sock"),
             "--key-file=" + self.path("munge", "munge.key"), "--pid-file=" + self.path("run", "munged.pid"),
             "--log-file=" + self.path("log", "munged.log"), "--seed-file=" + self.path("munge", "seed")],
            check=True, timeout=30, env=self.env, stdin=subprocess.DEVNULL, capture_output=True)

    def _spawn(self, argv: List[str], what: str, extra_env: Optional[Dict[str, str]] = None) -> None:
        log = open(self.path("log", what + ".out"), "ab")
        env = dict(self.env, **(extra_env or {}))
        subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                         start_new_session=True, close_fds=True)
        log.close()

    def _sinfo_ok(self) -> bool:
        return self.run([BIN + "/sinfo", "-h"], check=False).returncode == 0

    def _wait(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.3)
        raise ClusterError("timed out waiting for %s; see %s/log" % (what, self.dir))

    def wait_nodes_up(self, timeout: float = 60.0) -> None:
        def up():
            states = self.node_states()
            return len(states) == len(self.nodes) and all(
                not s.startswith(("unk", "down")) and not s.endswith("*") for s in states.values())
        self._wait(up, timeout, "every slurmd to register")

    def node_states(self) -> Dict[str, str]:
        out = self.run([BIN + "/sinfo", "-h", "-N", "-o", "%N %T"], check=False).stdout
        states = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1]
        return states

    def run(self, argv: List[str], check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
        result = subprocess.run(argv, env=self.env, stdin=subprocess.DEVNULL, capture_output=True,
                                text=True, timeout=timeout)
        if check and result.returncode != 0:
            raise ClusterError("%s exited %d: %s" % (" ".join(argv), result.returncode,
                                                     (result.stderr or result.stdout).strip()[:300]))
        return result

    def scontrol(self, *args: str, check: bool = True) -> str:
        return self.run([BIN + "/scontrol"] + list(args), check=check).stdout

    def slurm_calls(self) -> List[str]:
        """Every scontrol/sinfo command gpugate ran, one line each."""
        try:
            with open(self.path("log", "slurm-calls.log")) as handle:
                return handle.read().splitlines()
        except FileNotFoundError:
            return []

    def log_records(self, node: str) -> List[dict]:
        import json

        try:
            with open(self.path("state", node, "gpugate.log")) as handle:
                return [json.loads(line) for line in handle if line.strip()]
        except FileNotFoundError:
            return []

    def sim(self, *args: str) -> str:
        """`gpugate sim ...` on this cluster's fleet."""
        return self.run([sys.executable, "-m", "gpugate", "sim"] + [a.replace("FLEET", self.fleet) for a in args]).stdout

    def reason(self, node: str) -> str:
        """The reason holding the node out of service.  A node in service has
        none, whatever `scontrol show node` still prints: 24.11 without
        accounting storage keeps the reason after RESUME (gpugate reads such
        a leftover as no reason too, see slurm.nodestate)."""
        if self.state(node).rstrip("*") in ("idle", "allocated", "mixed"):
            return ""
        out = self.scontrol("show", "node", node)
        for line in out.splitlines():
            line = line.strip()
            if line.startswith("Reason="):
                return line[len("Reason="):].rsplit(" [", 1)[0]
        return ""

    def state(self, node: str) -> str:
        return self.node_states().get(node, "")

    def wait_for(self, predicate, timeout: float, what: str) -> None:
        self._wait(predicate, timeout, what)

    def pids(self) -> Dict[str, int]:
        out = {}
        for name in os.listdir(self.path("run")):
            if name.endswith(".pid"):
                try:
                    with open(self.path("run", name)) as handle:
                        out[name[:-4]] = int(handle.read().split()[0])
                except (OSError, ValueError, IndexError):
                    continue
        return out

    def stop_slurmctld(self) -> None:
        self._stop_pid("slurmctld")

    def stop_slurmd(self, name: str) -> None:
        self._stop_pid("slurmd-" + name)

    def _stop_pid(self, what: str, timeout: float = 15.0) -> None:
        pid = self.pids().get(what)
        if pid is None or not _is_ours(pid, what):
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _pid_alive(pid):
            time.sleep(0.1)
        if _pid_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        """Stop what this cluster started, by the pids it wrote."""
        for name in self.nodes:
            self.stop_slurmd(name)
        self.stop_slurmctld()
        self._stop_pid("munged")

    def _alive(self, pidfile: str) -> bool:
        try:
            with open(pidfile) as handle:
                return _pid_alive(int(handle.read().split()[0]))
        except (OSError, ValueError, IndexError):
            return False

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours counts as gone
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


def _is_ours(pid: int, what: str) -> bool:
    """A pid file can outlive its process: only signal the daemon it names."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            cmdline = handle.read().replace(b"\0", b" ").decode("utf-8", "replace")
    except OSError:
        return False
    return what.split("-")[0] in cmdline


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
    os.kill(pid, 15)
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
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


def _write_file(path: str, text: str, mode: int = 0o644) -> None:
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
