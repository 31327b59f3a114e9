"""Benchmark: the drain-budget decision of a node about to drain, in a
10,000-node fleet.

    python3 bench/bench_budget.py [--nodes 10000] [--repeat 5]

A node about to drain for drift reads the fleet's node states once before
draining (admit) and once after (keep).  Reports the median time of one
admit() + keep() (target <= 0.1 s: well inside the prolog's 8 s), and as a
reference measured in the same run, parsing the same fleet's `sinfo --json`
(the read itself, which the decision cannot avoid).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpugate import budget  # noqa: E402
from _measure import report, timed  # noqa: E402
from bench_sweep_plan import TAG, parsed_fleet  # noqa: E402

CLASSES = ("drift", "probe")


def main():
    args, parse_t, states = parsed_fleet(__doc__)
    node = next(n for n, st in sorted(states.items()) if not st.drain)

    def decide():
        return budget.admit(node, states, TAG, CLASSES, 0.1), budget.keep(node, states, TAG, CLASSES, 0.1)
    decide_t, (admitted, kept) = timed(decide, args.repeat)
    uses = budget.usage(states, TAG, CLASSES, 0.1)
    print("fleet: %d nodes in %d partitions; %s: admit=%s keep=%s" % (
        len(states), len(uses), node, admitted[0], kept[0]))
    return report("parse sinfo --json", parse_t, "admit + keep", decide_t, 0.1)


if __name__ == "__main__":
    sys.exit(main())
