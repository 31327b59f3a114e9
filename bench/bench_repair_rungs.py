"""Benchmark: time from drain to RESUME on the reset rung and on the reboot
rung (issue 28), on the test cluster: a real slurmctld and one slurmd per
node, the sweep of this tree (`gpugate sweep --apply`, local transport),
the simulated node's GPU reset (`gpugate reset-gpus` -> nvidia-smi -r) and
the rig's RebootProgram (slurmd restarted with -b).

    python3 bench/bench_repair_rungs.py [--runs 3] [--smoke]

Each run: a fresh 3-node cluster, uncorrected volatile ECC and a pending row
remap injected on gpu02 (a reset clears both), the health check drains it,
then one sweep with ``[sweep] reset = true`` and one with ``reset = false``.
Printed per rung: drain -> RESUME (Slurm's drain time to the journal's
RESUME), sweep -> RESUME (the sweep's own time), and the rung's step (reset,
or reboot + wait_up).  The rig's reboot restarts a slurmd in seconds, where
an HGX node takes ~20 minutes (NVIDIA NVSentinel's figure, issue 28): the
reset rung's advantage on real hardware is the reboot time it saves, which
the rig cannot show; what it shows is the sweep's own cost of each rung.
"""

import argparse
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpugate.testbed import Cluster, smoke_command  # noqa: E402

BASELINE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpugate", "data",
                        "demo-baseline.toml")
FAULT = ("gpu.2.ecc.uncorrected.volatile=2", "gpu.2.remapped_rows.pending=1")


def one(reset: bool, smoke: bool) -> dict:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    work = tempfile.mkdtemp(prefix="gpugate-bench-rungs-")
    sweep = {"reset": reset, "floor": 0.5}
    if smoke:
        sweep.update(smoke=smoke_command(work), smoke_deadline=60)
    cluster = Cluster(work, nodes=3, health_interval=5, sweep=sweep)
    try:
        with open(BASELINE) as handle:
            cluster.write(handle.read(), "[drain_budget]\nmax_share = 1.0\n")
        cluster.start()
        cluster.sim("set", "FLEET", "gpu02", *FAULT)
        cluster.wait_for(lambda: "drain" in cluster.state("gpu02"), 60, "gpu02 drained")
        drained = time.time()  # seen drained (Slurm's own reason time has whole seconds only)
        result = subprocess.run([sys.executable, "-m", "gpugate", "sweep", "--config", cluster.gpugate_conf,
                                 "--apply"], cwd=here, env=cluster.env, capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stderr
        db = sqlite3.connect(cluster.path("state", "sweep.db"))
        rows = db.execute("SELECT step, status, at FROM events WHERE node = 'gpu02' ORDER BY id").fetchall()
        db.close()
        at = {}
        for step, status, when in rows:
            at.setdefault((step, status), when)
        rung = ("reset",) if reset else ("reboot", "wait_up")
        assert ("resume", "done") in at, rows
        return {"drain_to_resume": at[("resume", "done")] - drained,
                "sweep_to_resume": at[("resume", "done")] - at[("planned", "done")],
                "rung": at[(rung[-1], "done")] - at[(rung[0], "started")],
                "evidence": at[("evidence", "done")] - at[("evidence", "started")]}
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="with the smoke job (the rig's replayed nccl-tests)")
    args = parser.parse_args()
    results = {True: [], False: []}
    for _ in range(args.runs):
        for reset in (True, False):
            results[reset].append(one(reset, args.smoke))
    print("%-8s %-22s %-22s %-26s %s" % ("rung", "drain -> RESUME", "sweep -> RESUME", "rung step(s)", "evidence"))
    for reset in (True, False):
        rows = results[reset]

        def med(key):
            values = [r[key] for r in rows]
            return "%.1f s (%.1f-%.1f)" % (statistics.median(values), min(values), max(values))
        print("%-8s %-22s %-22s %-26s %s" % ("reset" if reset else "reboot", med("drain_to_resume"),
                                             med("sweep_to_resume"), med("rung"), med("evidence")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
