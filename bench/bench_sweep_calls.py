"""Benchmark: Slurm commands the sweep issues to drain and resume a batch of
1,000 nodes, counted at the scontrol/sinfo binaries (logging shims in front
of the real ones) against a real slurmctld with 1,000 configured nodes.

    python3 bench/bench_sweep_calls.py [--nodes 1000]

Target: <= 10 commands for the whole batch (drain + resume).  The
reference printed beside it is what one command per node would cost.

    python3 bench/bench_sweep_calls.py --polls [--nodes 8] [--poll-seconds 5]

What the sweep reads while it waits: a real cluster (slurmctld, one slurmd
per node), one drifted node reconverged by `gpugate sweep --apply` (this
tree's code), every node-state read of the sweep counted: how many, how many
of the whole fleet, how many per second of the sweep.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpugate.testbed import SBIN, Cluster  # noqa: E402
from gpugate.model.config import load_settings  # noqa: E402
from gpugate.errors import SlurmError  # noqa: E402
from gpugate.slurm import connect  # noqa: E402
from gpugate.sweep.engine import Sweeper  # noqa: E402
from gpugate.sweep.journal import Journal  # noqa: E402
from gpugate.sweep.plan import Options  # noqa: E402

BASELINE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpugate", "data",
                        "demo-baseline.toml")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=None)
    parser.add_argument("--polls", action="store_true", help="measure the sweep's reads while it waits")
    parser.add_argument("--poll-seconds", type=float, default=5.0)
    args = parser.parse_args()
    if args.polls:
        return polls(args.nodes or 8, args.poll_seconds)
    args.nodes = args.nodes or 1000
    work = tempfile.mkdtemp(prefix="gpugate-bench-calls-")
    cluster = Cluster(work, nodes=args.nodes, health_interval=0)
    try:
        with open(BASELINE) as handle:
            text = handle.read().replace("in_progress = false", "in_progress = true")
        cluster.nodes = cluster.nodes[:1]  # no simulated fleet needed beyond one node
        cluster.write(text)
        cluster.nodes = ["gpu%02d" % i for i in range(1, args.nodes + 1)]
        with open(cluster.conf, "w") as handle:  # every node configured, no slurmd started
            from gpugate.testbed import free_ports

            ports = free_ports(2)
            handle.write(cluster.rig_slurm_conf([ports[0]] + [ports[1]] * args.nodes))
        cluster._start_munge()
        cluster._spawn([SBIN + "/slurmctld", "-f", cluster.conf, "-i"], "slurmctld")
        cluster._wait(cluster._sinfo_ok, 60, "slurmctld")
        settings = load_settings(cluster.gpugate_conf)
        from gpugate.model.baseline import load_baseline

        baseline = load_baseline(cluster.baseline)
        journal = Journal(cluster.path("state", "bench.db"))
        journal.start_run(["bench"])
        sweeper = Sweeper(settings, baseline, connect(settings), None, journal, Options())
        nodes = list(cluster.nodes)
        reason = sweeper._rollout_reason(nodes[0])
        for name in nodes:
            journal.enrol(name, "rollout", 1, reason)
        before = len(cluster.slurm_calls())
        started = time.monotonic()
        sweeper._step_drain(nodes, journal.nodes())
        drained = cluster.scontrol("show", "node", nodes[-1])
        note = ""
        try:
            sweeper._step_resume(nodes, journal.nodes())
        except SlurmError as exc:
            # These nodes never registered (no slurmd runs for them), so
            # slurmctld refuses RESUME; the command was issued all the same.
            note = "  (slurmctld refused RESUME of never-registered nodes: %s)" % str(exc)[-60:]
        took = time.monotonic() - started
        calls = cluster.slurm_calls()[before:]
        assert "DRAIN" in drained, drained
        print("drain + resume of %d nodes: %d Slurm commands in %.2f s (target <= 10)" % (len(nodes), len(calls), took))
        print("reference, one command per node and step: %d%s" % (2 * len(nodes), note))
        for line in calls[:12]:
            print("  " + line.strip()[:110])
        if len(calls) > 12:
            print("  ... %d more" % (len(calls) - 12))
        journal.close()
        return 0 if len(calls) <= 10 else 1
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


def polls(count, poll_seconds):
    import subprocess

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    work = tempfile.mkdtemp(prefix="gpugate-bench-polls-")
    cluster = Cluster(work, nodes=count, health_interval=5, sweep={"poll_seconds": poll_seconds})
    try:
        with open(BASELINE) as handle:
            cluster.write(handle.read(), "[drain_budget]\nmax_share = 1.0\n")
        cluster.start()
        cluster.sim("set", "FLEET", "gpu02", "driver=550.54.15")
        cluster.wait_for(lambda: "drain" in cluster.state("gpu02"), 60, "gpu02 drained")
        before = len(cluster.slurm_calls())
        started = time.monotonic()
        result = subprocess.run([sys.executable, "-m", "gpugate", "sweep", "--config", cluster.gpugate_conf,
                                 "--apply"], cwd=here, env=cluster.env, capture_output=True, text=True, timeout=600)
        took = time.monotonic() - started
        assert result.returncode == 0, result.stderr
        reads = []
        for line in cluster.slurm_calls()[before:]:
            words = line.split()
            if not line.startswith(" ") or "--version" in words:
                continue  # a node's own calls carry SLURMD_NODENAME
            if words[0] == "sinfo" or (words[0] == "scontrol" and "show" in words and "node" in words):
                named = words[words.index("-n") + 1] if "-n" in words else (
                    words[words.index("node") + 1] if words[-1] != "node" and "node" in words else None)
                reads.append(named)
        whole = sum(1 for r in reads if r is None)
        print("sweep of 1 node on a %d-node cluster, poll_seconds = %g: %.1f s, %d node-state reads "
              "(%.2f per second): %d of the whole fleet, %d of the node alone"
              % (count, poll_seconds, took, len(reads), len(reads) / took, whole, len(reads) - whole))
        print("nodes read in all: %d (each read of the fleet reads %d)" % (
            whole * count + len(reads) - whole, count))
        return 0
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
