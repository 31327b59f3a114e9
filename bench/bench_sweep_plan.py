"""Benchmark: planning the sweep over a 10,000-node snapshot.

    python3 bench/bench_sweep_plan.py [--nodes 10000] [--repeat 5]

Reports the median time of `plan()` (target <= 1 s), and as a reference
measured in the same run, the time to parse the same fleet's 22.05
`sinfo --json` output (the step that precedes every plan).
"""

import argparse
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpugate.model import reason as reasons  # noqa: E402
from gpugate.model.findings import Finding  # noqa: E402
from gpugate.slurm.nodestate import parse_nodes_json  # noqa: E402
from gpugate.sweep.plan import Options, plan  # noqa: E402
from gpugate.sweep.snapshot import take  # noqa: E402
from _measure import report, timed  # noqa: E402

TAG = "gpugate:"


def sinfo_json(count: int, seed: int = 7) -> str:
    """A 22.05-shaped `sinfo --json` of a fleet: 8% drained by gpugate
    (drift, broken, health), 2% by admins, the rest in service."""
    rng = random.Random(seed)
    reasons_by_class = {
        "drift": reasons.render(TAG, "drift", [Finding("drift", "driver", "550.54.15", "580.65.06", "")]),
        "broken": reasons.render(TAG, "broken", [Finding("broken", "module", "loaded 1", "on-disk 2", "")]),
        "health": reasons.render(TAG, "health", [Finding("health", "xid", "79", "none", "", gpu=3)]),
    }
    nodes = []
    for i in range(count):
        roll = rng.random()
        state, flags, reason = "idle", [], ""
        if roll < 0.08:
            state, flags, reason = "idle", ["DRAIN"], reasons_by_class[rng.choice(list(reasons_by_class))]
        elif roll < 0.10:
            state, flags, reason = "idle", ["DRAIN"], "rack maintenance"
        elif roll < 0.6:
            state = "allocated"
        nodes.append({"name": "gpu%05d" % i, "state": state, "state_flags": flags, "reason": reason,
                      "reason_changed_at": 1700000000 + rng.randint(0, 10**6) if reason else 0,
                      "reason_set_by_user": "root" if reason else "",
                      "partitions": ["gpu", "pool%d" % (i % 16)]})
    return json.dumps({"meta": {"plugin": {"type": "openapi/v0.0.38"}}, "errors": [], "nodes": nodes})


def parsed_fleet(doc: str):
    """(args, median parse time, node states) of a synthetic fleet: the
    --nodes/--repeat options and the reference every fleet benchmark uses."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    text = sinfo_json(args.nodes)
    parse_t, states = timed(lambda: parse_nodes_json(text), args.repeat)
    return args, parse_t, states


def main():
    args, parse_t, states = parsed_fleet(__doc__)
    snap = take(states, TAG, time.time())
    options = Options(max_batch=32, floor=0.5)
    plan_t, result = timed(lambda: plan(snap, options), args.repeat)
    pending = sum(1 for v in snap.nodes.values() if v.ours is not None)
    print("fleet: %d nodes, %d drained by gpugate, %d batches planned" % (len(states), pending, len(result.batches)))
    return report("parse sinfo --json", parse_t, "plan", plan_t, 1.0)


if __name__ == "__main__":
    sys.exit(main())
