"""Benchmark: what a job's preflight adds to its start, on a real slurmctld
with one slurmd per simulated node (GPU GRES, PrologFlags=Alloc), gpugate's
prolog as slurmd runs it, the nodes' dcgmi and all_reduce_perf replaying
real recordings (so the proof's own tools cost nothing here: what is
measured is gpugate's part, the meeting and the rounds).

    python3 bench/bench_preflight.py [--sizes 2,4,8,16] [--repeat 3] [--healthy 50]

For each size N: jobs of N whole nodes without a preflight (the reference)
and with one, interleaved; per job, the slowest node's prolog (Slurm starts
the job when the last prolog ends), and the preflight's parts on the first
node (DCGM, the single-node all_reduce, the proof across the nodes).  Then
``--healthy`` 8-node preflighted jobs in a row (none may be requeued or
drain a node), and one slow node among nine: found and drained by one
preflight, the job requeued by Slurm and run on eight good nodes.  Exit 1
when a healthy run drained or requeued, or the slow node was not the one
drained."""

import argparse
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpugate.testbed import Cluster  # noqa: E402

BASELINE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpugate", "data",
                        "demo-baseline.toml")


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _preflight(fleet: str) -> str:
    return ('\n[drain_budget]\nmax_share = 1.0\n[preflight]\nmin_nodes = 2\ntimeout_seconds = 60\n'
            'across_seconds = 120\nrun_seconds = 30\nrendezvous_host = "127.0.0.1"\nport = %d\nports = 1\n'
            'allreduce = ["%s/{node}/bin/all_reduce_perf", "-b", "8", "-e", "8G", "-g", "{gpus}"]\n'
            'allreduce_multi = ["%s/{node}/bin/all_reduce_perf", "-b", "1G", "-e", "8G", "-f", "2", "-g", '
            '"{gpus}"]\n' % (_port(), fleet, fleet))


def _submit(cluster, nodes: int, preflight: bool) -> str:
    out = cluster.path("log", "bench-%j.out")
    argv = ["/usr/bin/sbatch", "--parsable", "--exclusive", "--gres=gpu:8", "-N", str(nodes), "-o", out,
            "--comment", "gpugate-preflight" if preflight else "none",
            "--wrap", "date +%%s.%%N > %s/start-$SLURM_JOB_ID" % cluster.path("log")]
    return cluster.run(argv).stdout.strip().split(";")[0]


def _done(cluster, job, timeout=300.0):
    info = cluster.wait_job_ended(job, timeout)
    # Every node idle again (epilogs done) before the next job: else the next
    # one waits for backfill's next pass, and that is Slurm's time, not ours.
    cluster.wait_for(lambda: not any("COMP" in s.upper() for s in cluster.node_states().values()), 60,
                     "the nodes leave COMPLETING")
    return info


def _prologs(cluster, job, nodes):
    out = {}
    for node in nodes:
        recs = [r for r in cluster.log_records(node) if r.get("mode") == "prolog" and r.get("job") == job]
        if recs:
            out[node] = recs[-1]
    return out


def _one(cluster, size, preflight):
    from ClusterShell.NodeSet import NodeSet

    submitted = time.time()
    job = _submit(cluster, size, preflight)
    info = _done(cluster, job)
    with open(cluster.path("log", "start-" + job)) as handle:
        began = float(handle.read()) - submitted  # sbatch to the script's first line
    nodes = list(NodeSet(info["NodeList"]))
    recs = _prologs(cluster, job, nodes)
    slowest = max(r["duration"] for r in recs.values())
    parts = {}
    if preflight:
        first = recs[nodes[0]]["preflight"]
        parts = dict(first["seconds"], across=first["across"]["seconds"], rounds=first["across"]["rounds"],
                     total=first["seconds_total"])
    return info, slowest, parts, began


def sizes_run(cluster, sizes, repeat):
    print("nodes | slowest prolog: none (reference) / with preflight, ratio | sbatch to the script: none / with | "
          "first node's parts (median s): dcgm / all_reduce / across (rounds)")
    for size in sizes:
        ref, pre, ref_start, pre_start, parts = [], [], [], [], []
        for _ in range(repeat):
            _, slowest, _, began = _one(cluster, size, False)
            ref.append(slowest)
            ref_start.append(began)
            _, slowest, p, began = _one(cluster, size, True)
            pre.append(slowest)
            pre_start.append(began)
            parts.append(p)
        r, w = statistics.median(ref), statistics.median(pre)
        med = {k: statistics.median(p[k] for p in parts) for k in ("dcgm", "allreduce", "across", "rounds")}
        print("%5d | %.3f s / %.3f s, %.2fx (+%.3f s) | %.2f s / %.2f s | %.3f / %.3f / %.3f (%d)" % (
            size, r, w, w / r, w - r, statistics.median(ref_start), statistics.median(pre_start), med["dcgm"],
            med["allreduce"], med["across"], med["rounds"]))


def healthy_run(cluster, count):
    requeued = drained = 0
    started = time.monotonic()
    for _ in range(count):
        info = _done(cluster, _submit(cluster, 8, True))
        requeued += info.get("Restarts") != "0" or info.get("JobState") != "COMPLETED"
    states = cluster.node_states()
    drained = sum("DRAIN" in s.upper() for s in states.values())
    print("%d healthy 8-node preflighted jobs in a row: %d requeued or failed, %d nodes drained, %.1f s in all"
          % (count, requeued, drained, time.monotonic() - started))
    return requeued == 0 and drained == 0


def one_bad_run(cluster):
    from ClusterShell.NodeSet import NodeSet

    cluster.sim("set", "FLEET", "gpu05", "smoke=pair-slow")
    started = time.monotonic()
    job = _submit(cluster, 8, True)
    info = _done(cluster, job)
    took = time.monotonic() - started
    ran_on = list(NodeSet(info["NodeList"]))
    drained = [n for n, s in cluster.node_states().items() if "DRAIN" in s.upper()]
    first = [r for r in cluster.log_records("gpu05") if r.get("mode") == "prolog" and r.get("job") == job]
    rounds = first[0]["preflight"]["across"]["rounds"] if first else None
    print("one slow node (gpu05) among 9: drained %s (reason %r), %s rounds; the job restarted %s time(s) and "
          "ran on %s (%d nodes); %.1f s from submission to its end" % (
              drained, cluster.reason("gpu05"), rounds, info.get("Restarts"), info["NodeList"], len(ran_on), took))
    return drained == ["gpu05"] and "gpu05" not in ran_on and len(ran_on) == 8


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2,4,8,16")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--healthy", type=int, default=50)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    work = tempfile.mkdtemp(prefix="gpugate-bench-preflight-")
    cluster = Cluster(work, nodes=max(max(sizes), 9), health_interval=600, gpus=8)
    ok = True
    try:
        with open(BASELINE) as handle:
            cluster.write(handle.read(), _preflight(os.path.join(work, "fleet")))
        cluster.start()
        sizes_run(cluster, sizes, args.repeat)
        ok = healthy_run(cluster, args.healthy) and ok
        ok = one_bad_run(cluster) and ok
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
