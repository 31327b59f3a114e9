"""The Cluster: write its directory, start and stop its daemons (by the pids
they wrote), run Slurm's commands against it and wait for its states."""

import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Dict, List, Optional

from gpugate.sim import quiet
from gpugate.testbed import files
from gpugate.testbed.procs import BIN, SBIN, ClusterError, _is_ours, _pid_alive, free_ports, slurm_version

KEEPER = "budget"  # the keeper's pid file (run/budget.pid); `budget` is in its command line


class Cluster:
    def __init__(self, directory: str, nodes: int = 8, health_interval: int = 5,
                 partitions: Optional[Dict[str, str]] = None, sweep: Optional[Dict[str, object]] = None,
                 gpus: int = 0, cpus: int = 1):
        self.dir = os.path.abspath(directory)
        self.cpus = cpus  # per node: 2 lets two jobs share one (a user's CPU job beside their GPU job)
        # GPU GRES on every node (gres.conf over character devices made here),
        # so a job with --gres=gpu:N gets SLURM_JOB_GPUS as on a real node; 0: none.
        self.gpus = gpus
        self.nodes = files.node_names(nodes)
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
               "HOME": os.environ.get("HOME", "/root"),
               # The pyslurm backend's calls, beside the scontrol/sinfo shims' (slurm_calls()).
               "GPUGATE_SLURM_TRACE": self.path("log", "slurm-calls.log")}
        return env

    def path(self, *parts: str) -> str:
        return os.path.join(self.dir, *parts)

    # -------------------------------------------------------------- writing
    def write(self, baseline_text: str, gpugate_extra: str = "") -> None:
        """Create the directory: configuration, shims, the simulated fleet."""
        # gpugate refuses anything it reads or runs that is not root's alone
        # (gpugate.safety.trust): no group or other write bit, whatever the umask.
        os.makedirs(self.dir, mode=0o755, exist_ok=True)
        for sub in ("log", "run", "spool/ctld", "state", "bin", "munge", "slurm-bin"):
            os.makedirs(self.path(sub), mode=0o755, exist_ok=True)
        os.chmod(self.path("munge"), 0o700)
        files.write_file(self.baseline, baseline_text)
        files.write_gpugate_toml(self, gpugate_extra)
        ports = free_ports(len(self.nodes) + 1)
        files.write_file(self.conf, self.rig_slurm_conf(ports))
        if self.gpus:
            files.write_gres(self)
        if slurm_version() >= (24, 5):
            # 24.05+ slurmd loads a cgroup plugin even with proctrack/linuxproc
            # and task/none, and fails without a cgroup file system (chroot,
            # containers); slurmd reads cgroup.conf next to slurm.conf.
            files.write_file(self.path("cgroup.conf"), "CgroupPlugin=disabled\n")
        files.write_shims(self)
        self._write_munge_key()
        from gpugate.model.baseline import load_baseline
        from gpugate.sim import fleet as simfleet

        baseline = load_baseline(self.baseline)
        for name in self.nodes:
            simfleet.save(self.fleet, name, simfleet.new_model(name, baseline))

    def _write_munge_key(self) -> None:
        key = self.path("munge", "munge.key")
        if not os.path.exists(key):
            with open(key, "wb") as handle:
                handle.write(os.urandom(1024))
        os.chmod(key, 0o400)

    def rig_slurm_conf(self, ports: List[int]) -> str:
        """The text of this rig's slurm.conf (see files.rig_slurm_conf)."""
        return files.rig_slurm_conf(self, ports)

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

    def start_keeper(self, every: float = 30.0) -> None:
        """The controller's drain-budget keeper, as a site runs it
        (gpugate-budget.timer: every 30 s); its pid file lets `stop` end it."""
        if self._alive(self.path("run", KEEPER + ".pid")):
            return
        proc = self._spawn([sys.executable, "-m", "gpugate", "budget", "--watch", "%g" % every,
                            "--config", self.gpugate_conf], KEEPER)
        with open(self.path("run", KEEPER + ".pid"), "w") as handle:
            handle.write("%d\n" % proc.pid)

    def stop_keeper(self) -> None:
        self._stop_pid(KEEPER)

    def _spawn(self, argv: List[str], what: str, extra_env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
        log = open(self.path("log", what + ".out"), "ab")
        env = dict(self.env, **(extra_env or {}))
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True, close_fds=True)
        log.close()
        return proc

    def _sinfo_ok(self) -> bool:
        return self.run([BIN + "/sinfo", "-h"], check=False).returncode == 0

    def _wait(self, predicate, timeout: float, what: str) -> None:
        deadline, pause = time.monotonic() + timeout, 0.005
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(pause)
            pause = min(pause * 2, 0.3)  # quick for what is nearly there, then at most 0.3 s
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
        """Every scontrol/sinfo command gpugate ran, one line each (the
        pyslurm backend's calls in the same words: GPUGATE_SLURM_TRACE)."""
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

    def records_when(self, node: str, match, timeout: float = 15.0) -> List[dict]:
        """The node's log records that ``match``, once there is one: a run
        writes its line as it ends, after the drain Slurm already shows."""
        self._wait(lambda: any(match(r) for r in self.log_records(node)), timeout, "%s's log line" % node)
        return [r for r in self.log_records(node) if match(r)]

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

    def job(self, job: str) -> Dict[str, str]:
        """`scontrol -o show job`'s KEY=VALUE fields (a value with spaces
        keeps its first word only; {} once Slurm forgot the job)."""
        text = self.run([BIN + "/scontrol", "-o", "show", "job", job], check=False).stdout
        return dict(word.split("=", 1) for word in text.split() if "=" in word)

    def wait_job_ended(self, job: str, timeout: float) -> Dict[str, str]:
        """The job's fields once it completed, failed or was cancelled."""
        self._wait(lambda: self.job(job).get("JobState") in ("COMPLETED", "FAILED", "CANCELLED"), timeout,
                   "job %s ends" % job)
        return self.job(job)

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

    def reboot_node(self, name: str, *assignments: str) -> None:
        """An unplanned reboot that changes the node (e.g. into an old
        driver): slurmd stops and the checks it started end, the simulated
        node reboots with ``assignments`` in one write, slurmd comes back
        with -b.  No check reads the change half-made, as none runs on a
        real node that is rebooting (a `sim set driver=` on a live node can be
        read half-written: one version loaded, the other on disk)."""
        self.stop_slurmd(name)
        self._wait(lambda: not quiet.runs_for(name), 60, "the checks slurmd-%s started to end" % name)
        self.sim("set", "FLEET", name, *assignments, "reboot=1")
        self.start_slurmd(name, boot=True)

    def _stop_pid(self, what: str, timeout: float = 15.0) -> None:
        pid = self.pids().get(what)
        if pid is None or not _is_ours(pid, what):
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline, pause = time.monotonic() + timeout, 0.005
        while time.monotonic() < deadline and _pid_alive(pid):
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
        if _pid_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        """Stop what this cluster started, by the pids it wrote."""
        self.stop_keeper()
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
