"""Benchmark: folding 10,000 nodes' facts into the audit.

    python3 bench/bench_audit.py [--nodes 10000] [--repeat 5]

Reports the median time of `fold()` over 8-GPU nodes' facts (target <= 1 s)
and, as a reference measured in the same run, the time to json-load the same
facts (what reading the saved audit costs).
"""

import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpugate.model.baseline import load_baseline  # noqa: E402
from gpugate.fleet.audit import DRIFT, fold  # noqa: E402
from _measure import report, timed  # noqa: E402

BASELINE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpugate", "data",
                        "demo-baseline.toml")


def node_facts(rng):
    driver = "580.65.06" if rng.random() > 0.02 else "550.54.15"
    gpus = [{"index": i, "name": "NVIDIA H100 80GB HBM3", "gsp_firmware": driver,
             "vbios": "96.00.99.00.01" if rng.random() > 0.001 else "96.00.74.00.01",
             "uuid": "GPU-%08x" % rng.getrandbits(32), "pci_bus_id": "00000000:%02X:00.0" % (0x18 + i)}
            for i in range(8)]
    return {"kernel_release": "6.1.0-27-amd64", "module_resident": driver, "dcgm_version": "4.2.3",
            "image": {"version": "gpu-2026.11.1"},
            "packages": {"container_toolkit": {"version": "1.17.8"}, "fabricmanager": {"version": driver}},
            "nvml": {"driver_version": driver, "cuda_driver_version": "13.0", "gpus": gpus}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rng = random.Random(3)
    fleet = {"gpu%05d" % i: node_facts(rng) for i in range(args.nodes)}
    text = json.dumps(fleet)
    baseline = load_baseline(BASELINE)
    ref, _ = timed(lambda: json.loads(text), args.repeat)
    took, audit = timed(lambda: fold(fleet, baseline), args.repeat)
    drift = {r.component for r in audit.rows if r.status == DRIFT}
    print("fleet: %d nodes x 8 GPUs; %d audit rows; drift in %s" % (args.nodes, len(audit.rows), sorted(drift)))
    return report("json.loads of the facts", ref, "fold into the audit", took, 1.0)


if __name__ == "__main__":
    sys.exit(main())
