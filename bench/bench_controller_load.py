"""Controller load of a fleet-wide event, measured on a real slurmctld.

Boots a real cluster of N ``slurmd -N`` on loopback (default 48, two equal
partitions), pushes a baseline whose driver pin no node runs (a budgeted
drift on every node), runs every node's health check at once (the worst
case: a push reaches the fleet in the same minute), waits out
``recheck_seconds`` and runs them all again (held nodes ask again).  Reads
slurmctld's own RPC statistics (``sdiag``, by message type) before and
after each wave, and gpugate's own record of the Slurm commands it ran.

Reports, per unfit node and recheck period: node-state reads (full fleet and
single node) and updates; the bytes one full read moves (the JSON the same
command prints) and extrapolates both to 10,000 nodes.  The reference,
measured in the same run, is one full-fleet read per unfit node: the ratio
says how many full reads gpugate costs per unfit node and period (target:
at most 2).  A healthy wave is measured too (target: 0 RPCs).

    python3 bench/bench_controller_load.py [--nodes 48] [--keep DIR]
"""

import argparse
import os
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from gpugate.testbed import Cluster  # noqa: E402

DEMO_BASELINE = os.path.join(ROOT, "gpugate", "data", "demo-baseline.toml")
RECHECK = 20
_RPC = re.compile(r"^\s+(REQUEST_\w+|MESSAGE_\w+)\s+\(\s*\d+\)\s+count:(\d+)", re.M)
# Every node-state read is one of the first two (22.05's sinfo adds a
# partition read to each; scontrol from 23.02 does not).
READS = ("REQUEST_NODE_INFO", "REQUEST_NODE_INFO_SINGLE", "REQUEST_PARTITION_INFO")
FULL = ("REQUEST_NODE_INFO",)


def sdiag(cluster):
    """message type -> count since the last reset (slurmctld's own count)."""
    out = cluster.run(["/usr/bin/sdiag"]).stdout
    section = out.split("Remote Procedure Call statistics by message type", 1)[-1]
    section = section.split("Remote Procedure Call statistics by user", 1)[0]
    return {name: int(count) for name, count in _RPC.findall(section)}


def wave(cluster):
    """Every node's health check at once, as slurmd runs it; the RPCs it cost."""
    import subprocess

    cluster.run(["/usr/bin/sdiag", "-r"])
    calls = len(cluster.slurm_calls())

    def one(node):
        return subprocess.run([cluster.path("bin", "healthcheck")], env={"SLURMD_NODENAME": node},
                              capture_output=True, timeout=120).returncode
    started = time.monotonic()
    with ThreadPoolExecutor(len(cluster.nodes)) as pool:
        codes = list(pool.map(one, cluster.nodes))
    took = time.monotonic() - started
    rpcs = sdiag(cluster)
    ours = cluster.slurm_calls()[calls:]
    return codes, rpcs, ours, took


def full_read_bytes(cluster):
    """What one full node-state read moves, as the JSON the command prints."""
    version = tuple(int(x) for x in re.findall(r"\d+", cluster.run(["/usr/bin/sinfo", "--version"]).stdout)[:2])
    argv = ["/usr/bin/scontrol", "show", "node", "--json"] if version >= (23, 2) else ["/usr/bin/sinfo", "--json"]
    return len(cluster.run(argv).stdout.encode())


def summarize(label, nodes, codes, rpcs, ours, took):
    reads = {k: rpcs.get(k, 0) for k in READS}
    updates = rpcs.get("REQUEST_UPDATE_NODE", 0)
    print("%-34s %3d nodes  %5.1f s  RPCs %s  updates %d  (gpugate ran %d commands)" % (
        label, nodes, took, " ".join("%s=%d" % (k[8:].lower(), v) for k, v in reads.items()), updates, len(ours)))
    return reads, updates


def main(argv=None, figures=None) -> int:
    """Exit status 0 when every target holds; ``figures`` (a dict) receives
    the measurements (tests/test_slurm_scale.py reads them)."""
    figures = {} if figures is None else figures
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=48)
    parser.add_argument("--keep", help="run in this directory and leave it")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_controller_load: needs root (slurmctld, slurmd, munged)", file=sys.stderr)
        return 2
    directory = args.keep or tempfile.mkdtemp(prefix="gpugate-load-")
    os.chmod(directory, 0o755)
    half = args.nodes // 2
    cluster = Cluster(directory, nodes=args.nodes, health_interval=600,
                      partitions={"a": "gpu[01-%02d]" % half, "b": "gpu[%02d-%02d]" % (half + 1, args.nodes)})
    with open(DEMO_BASELINE) as handle:
        good = handle.read()
    cluster.write(good, "[drain_budget]\nmax_share = 0.1\nrecheck_seconds = %d\n" % RECHECK)
    try:
        cluster.start(timeout=180)
        n = args.nodes
        codes, rpcs, ours, took = wave(cluster)
        assert all(c == 0 for c in codes), codes
        healthy, _ = summarize("healthy fleet (every node fit)", n, codes, rpcs, ours, took)
        bad = good.replace('driver = "580.65.06"', 'driver = "580.95.05"', 1).replace(
            'fabricmanager = "580.65.06"', 'fabricmanager = "580.95.05"', 1)
        tmp = cluster.baseline + ".new"
        with open(tmp, "w") as handle:
            handle.write(bad)
        os.replace(tmp, cluster.baseline)
        time.sleep(0.5)
        codes, rpcs, ours, took = wave(cluster)
        first, first_updates = summarize("wrong pin, first wave", n, codes, rpcs, ours, took)
        time.sleep(RECHECK + 1)
        codes, rpcs, ours, took = wave(cluster)
        later, later_updates = summarize("one recheck period later", n, codes, rpcs, ours, took)
        drained = sum(1 for s in cluster.node_states().values() if "drain" in s)
        size = full_read_bytes(cluster)
        print()
        print("drained %d of %d (budget 10%% of each partition, at least 1)" % (drained, n))
        print("reference: 1 full read per unfit node and period = %d reads, each printing %d bytes of JSON "
              "(%.0f bytes/node)" % (n, size, size / n))
        worst = 0.0
        for label, reads, updates in (("first wave", first, first_updates),
                                      ("each later period", later, later_updates)):
            full, single = sum(reads[k] for k in FULL), reads["REQUEST_NODE_INFO_SINGLE"]
            worst = max(worst, (full + single) / float(n))
            print("%-18s node-state reads per unfit node %.2f (full %.2f = ratio to the reference, single %.2f; "
                  "target <= 2); updates %d; all RPCs %.2f per node" % (
                      label, (full + single) / float(n), full / float(n), single / float(n), updates,
                      (sum(reads.values()) + updates) / float(n)))
        print("healthy wave: %d RPCs (target 0)" % sum(healthy.values()))
        full_first = sum(first[k] for k in FULL)
        full_later = sum(later[k] for k in FULL)
        print("at 10,000 nodes, all unfit: %.0f full reads of ~%.1f MB of JSON each in the first wave, %.0f per "
              "later period" % (full_first / n * 10000, size / n * 10000 / 1e6, full_later / n * 10000))
        figures.update(drained=drained, worst_reads_per_node=worst, healthy_rpcs=sum(healthy.values()),
                       first=first, later=later, updates=(first_updates, later_updates))
        return 0 if worst <= 2 and not sum(healthy.values()) else 1
    finally:
        cluster.stop()
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
