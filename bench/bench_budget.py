"""Benchmark: the budget keeper's decision over a 100,000-node fleet in
which every node published a budgeted finding (a wrong pin pushed to all).

    python3 bench/bench_budget.py [--nodes 100000] [--repeat 3]

The keeper (gpugate.keeper) reads the fleet once per run, in sinfo's text
format (SINFO_TEXT_ARGV: only the fields gpugate reads, every release),
parses it, keeps the parts each node signed (gpugate.keeper.screen: issue
33, item 6, an HMAC per published node) and plans the drains of every
partition (gpugate.budget.plan).
Each repetition runs in a fresh process that reads the generated output
from a file, so the peak RSS is the keeper's own.  Reports the median time
of parse + decision (target < 2 s) and the peak RSS (target < 1 GB), and
as a reference measured in the same run, the same in a process that parses
the same fleet as 24.11's `scontrol --json show node` (recorded fixture
entries, 1.6 KB a node), which is what a full read prints there.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

REASON = ("gpugate: drift driver=580.65.06 (want 580.95.05); gsp_firmware=580.65.06 (want 580.95.05); "
          "fabricmanager=580.65.06 (want 580.95.05)")
PARTITIONS = 16  # every node is in "gpu" and in one of 16 pools

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, %(root)r)
started = time.perf_counter()
from gpugate import budget
from gpugate.slurm.nodestate import parse_nodes_json, parse_nodes_text
with open(sys.argv[2]) as handle:
    text = handle.read()
states = (parse_nodes_text if sys.argv[1] == "text" else parse_nodes_json)(text)
if sys.argv[3] == "screen":
    from gpugate.keeper import screen
    states, unverified = screen(states, %(key)r, %(now)d)
    assert not unverified
plan = budget.plan(states, "gpugate:", 0.1)
took = time.perf_counter() - started
print(json.dumps({"took": took, "cpu": time.process_time(), "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                  "nodes": len(states), "drain": len(plan.drain), "held": len(plan.held)}))
"""


KEY, NOW = b"bench drain budget key, 32 bytes", 1795750000


def comment(i: int) -> str:
    """What node i's own publish writes: signed (gpugate.slurm.pending)."""
    from gpugate.slurm import pending

    return pending.publish("", REASON, NOW - 6000 + i % 6000, KEY, "gpu%06d" % i)


def sinfo_text(count: int) -> str:
    lines = []
    for i in range(count):
        for part in ("gpu", "pool%d" % (i % PARTITIONS)):
            lines.append("gpu%06d|%s|idle|Unknown|Unknown|%s\x1fnone" % (i, part, comment(i)))
    return "\n".join(lines) + "\n"


def scontrol_json(count: int) -> str:
    with open(os.path.join(ROOT, "tests", "fixtures", "slurm", "24.11", "scontrol-show-node.json")) as handle:
        doc = json.load(handle)
    template = doc["nodes"][0]
    doc["nodes"] = [dict(template, name="gpu%06d" % i, comment=comment(i),
                         partitions=["gpu", "pool%d" % (i % PARTITIONS)]) for i in range(count)]
    return json.dumps(doc)


def measure(kind: str, path: str, repeat: int, screen: str = "screen"):
    runs = []
    for _ in range(repeat):
        out = subprocess.run([sys.executable, "-c", CHILD % {"root": ROOT, "key": KEY, "now": NOW}, kind, path,
                              screen], capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout))
    last = dict(runs[-1], cpu=statistics.median(r["cpu"] for r in runs))
    return statistics.median(r["took"] for r in runs), max(r["rss_mb"] for r in runs), last


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        text_path, json_path = os.path.join(tmp, "sinfo.txt"), os.path.join(tmp, "scontrol.json")
        with open(text_path, "w") as handle:
            handle.write(sinfo_text(args.nodes))
        with open(json_path, "w") as handle:
            handle.write(scontrol_json(args.nodes))
        sizes = os.path.getsize(text_path) / 1e6, os.path.getsize(json_path) / 1e6
        ref_t, ref_rss, _ = measure("json", json_path, args.repeat)
        took, rss, last = measure("text", text_path, args.repeat)
        plain_t, plain_rss, plain = measure("text", text_path, args.repeat, "no-screen")
    print("fleet: %d nodes in %d partitions, every one published; drain %d, held %d" % (
        last["nodes"], PARTITIONS + 1, last["drain"], last["held"]))
    print("reference: 24.11 scontrol --json (%.0f MB): parse + decision median %.2f s, peak RSS %.0f MB" % (
        sizes[1], ref_t, ref_rss))
    print("keeper:    sinfo text (%.0f MB):            parse + decision median %.2f s, peak RSS %.0f MB "
          "(targets < 2 s, < 1024 MB)" % (sizes[0], took, rss))
    print("           the same without checking the proofs: median %.2f s, peak RSS %.0f MB" % (plain_t, plain_rss))
    print("CPU time (median; steadier than wall time on a shared machine): keeper %.2f s, without the proofs %.2f s"
          % (last["cpu"], plain["cpu"]))
    return 0 if took < 2 and rss < 1024 else 1


if __name__ == "__main__":
    sys.exit(main())
