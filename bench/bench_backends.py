"""The two Slurm backends reading a 1,000-node cluster, in the same run.

Boots a real slurmctld (and munged) with N configured nodes (default
1,000; no slurmd: the nodes go down "Not responding", and a tenth are
drained with gpugate reasons, as a fleet under a sweep would be), then
measures, interleaved, with each backend:

- a read of the whole fleet's node states (what `gpugate status`, the
  sweep's plan and a budgeted drain read), of one node with its partitions
  (the sweep's waits), and of one node in one RPC (``own_record``: a node's
  own check, the keeper's re-read; issue 34);
- slurmctld's own RPC count per read (``sdiag`` by message type);
- a new process that imports gpugate, chooses the backend and reads one
  node (what a CLI run or a node-side drain costs once).

The reference is the command backend (scontrol/sinfo, gpugate's default),
measured in the same run: the figures are ratios to it.  Run where pyslurm
is built (Slurm 25.11):

    scripts/chroot-run 25.11 python bench/bench_backends.py [--nodes 1000] [--repeat 15]
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from gpugate.slurm.commands import CommandSlurm  # noqa: E402
from gpugate.slurm.pyslurm_backend import PyslurmSlurm  # noqa: E402
from gpugate.testbed import Cluster  # noqa: E402
from gpugate.testbed.procs import free_ports  # noqa: E402

_RPC = re.compile(r"^\s+(REQUEST_\w+)\s+\(\s*\d+\)\s+count:(\d+)", re.M)

# One new process: import, choose (connect), read one node.
_ONE_SHOT = """
import sys, time
started = time.monotonic()
from gpugate.slurm import connect
class S:
    slurm = {"backend": sys.argv[1], "bin_dir": "/usr/bin", "timeout_seconds": 30}
    slurm_env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "SLURM_CONF": sys.argv[2]}
backend = connect(S())
assert backend.name == sys.argv[1], backend.why
assert backend.nodes(sys.argv[3])
backend.close()
"""


def sdiag(env):
    out = subprocess.run(["/usr/bin/sdiag"], env=env, capture_output=True, text=True, timeout=30).stdout
    section = out.split("Remote Procedure Call statistics by message type", 1)[-1]
    section = section.split("Remote Procedure Call statistics by user", 1)[0]
    return {name: int(count) for name, count in _RPC.findall(section)}


def rpcs_per_read(env, read, times=5):
    subprocess.run(["/usr/bin/sdiag", "-r"], env=env, capture_output=True, timeout=30, check=True)
    for _ in range(times):
        read()
    counts = sdiag(env)
    counts.pop("REQUEST_STATS_INFO", None)  # sdiag's own
    return {k[8:].lower(): v / times for k, v in sorted(counts.items()) if v}


def median(values):
    values = sorted(values)
    return values[len(values) // 2]


def boot(directory, count):
    cluster = Cluster(directory, nodes=count, health_interval=0)
    cluster.nodes = ["gpu%04d" % i for i in range(1, count + 1)]
    for sub in ("log", "run", "spool/ctld", "state", "bin", "munge"):
        os.makedirs(cluster.path(sub), mode=0o755, exist_ok=True)
    os.chmod(cluster.path("munge"), 0o700)
    first = free_ports(2)[0]
    ports = [first] + [first + 1 + i for i in range(count)]  # no slurmd listens: not checked free
    with open(cluster.conf, "w") as handle:
        handle.write(cluster.rig_slurm_conf(ports))
    with open(cluster.path("cgroup.conf"), "w") as handle:
        handle.write("CgroupPlugin=disabled\n")
    cluster._write_munge_key()
    cluster._start_munge()
    cluster._spawn(["/usr/sbin/slurmctld", "-f", cluster.conf, "-i"], "slurmctld")
    cluster._wait(cluster._sinfo_ok, 60, "slurmctld to answer")
    drained = cluster.nodes[::10]
    for i in range(0, len(drained), 50):
        names = ",".join(drained[i:i + 50])
        cluster.scontrol("update", "NodeName=" + names, "State=DRAIN", "Reason=gpugate: drift driver=1 (want 2)")
    return cluster


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_backends: needs root (slurmctld, munged)", file=sys.stderr)
        return 2
    directory = tempfile.mkdtemp(prefix="gpugate-backends-")
    os.chmod(directory, 0o755)
    cluster = boot(directory, args.nodes)
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "SLURM_CONF": cluster.conf}
    one = cluster.nodes[len(cluster.nodes) // 2]
    try:
        backends = {"commands": CommandSlurm("/usr/bin", env, 60.0), "pyslurm": PyslurmSlurm("/usr/bin", env, 60.0)}
        started = time.monotonic()
        backends["pyslurm"].start()
        worker_start = time.monotonic() - started
        fleets = {name: b.nodes() for name, b in backends.items()}
        assert fleets["commands"] == fleets["pyslurm"], "the backends read different states"
        assert len(fleets["commands"]) == args.nodes
        assert backends["commands"].own_record(one) == backends["pyslurm"].own_record(one)
        assert backends["commands"].node_read == backends["pyslurm"].node_read == "libslurm"
        times = {(name, what): [] for name in backends for what in ("fleet", "one", "own", "process")}
        for _ in range(args.repeat):  # interleaved: the machine's load falls on both alike
            for name, backend in backends.items():
                for what, read in (("fleet", backend.nodes), ("one", lambda: backend.nodes(one)),
                                   ("own", lambda: backend.own_record(one))):
                    t = time.monotonic()
                    read()
                    times[(name, what)].append(time.monotonic() - t)
                t = time.monotonic()
                subprocess.run([sys.executable, "-c", _ONE_SHOT, name, cluster.conf, one], check=True, timeout=120,
                               env=dict(env, PYTHONPATH=ROOT))
                times[(name, "process")].append(time.monotonic() - t)
        rpcs = {(name, what): rpcs_per_read(env, read) for name, backend in backends.items()
                for what, read in (("fleet", backend.nodes), ("one", lambda b=backend: b.nodes(one)),
                                   ("own", lambda b=backend: b.own_record(one)))}
        size = len(subprocess.run(["/usr/bin/scontrol", "--all", "--json", "show", "node"], env=env,
                                  capture_output=True, timeout=60).stdout)
        print("Slurm %s, %d configured nodes (%d drained), median of %d interleaved runs; scontrol's JSON for the "
              "fleet: %.1f MB; the pyslurm worker's start: %.0f ms"
              % (".".join(map(str, backends["commands"].version())), args.nodes, len(cluster.nodes[::10]),
                 args.repeat, size / 1e6, worker_start * 1000))
        print("%-52s %12s %12s %8s   %s" % ("read", "commands", "pyslurm", "ratio", "RPCs per read (commands | pyslurm)"))
        for what, label in (("fleet", "every node's state"), ("one", "one node's state, partitions (%s)" % one),
                            ("own", "one node's state, one RPC (own_record)"),
                            ("process", "new process: import, choose, read one node")):
            c, p = median(times[("commands", what)]), median(times[("pyslurm", what)])
            rpc = ""
            if what != "process":
                rpc = "%s | %s" % (rpcs[("commands", what)], rpcs[("pyslurm", what)])
            print("%-52s %9.1f ms %9.1f ms %7.2fx   %s" % (label, c * 1000, p * 1000, p / c, rpc))
        backends["pyslurm"].close()
        return 0
    finally:
        cluster.stop()


if __name__ == "__main__":
    sys.exit(main())
