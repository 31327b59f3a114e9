"""Benchmark: `gpugate-prolog` on a simulated healthy 8-GPU node, as slurmd
runs it, against `python3 -c pass` measured in the same run.

    python3 bench/bench_prolog.py [--repeat 40]

Reports the median whole-process wall time of each, their ratio (target
<= 5) and the prolog's peak RSS (target <= 50 MB).
"""

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import run_once  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASELINE = os.path.join(ROOT, "gpugate", "data", "demo-baseline.toml")


def setup(work):
    fleet = os.path.join(work, "fleet")
    subprocess.run([sys.executable, "-m", "gpugate", "sim", "init", fleet, "--nodes", "gpu01",
                    "--baseline", BASELINE], check=True, stdout=subprocess.DEVNULL)
    config = os.path.join(work, "gpugate.toml")
    with open(config, "w") as handle:
        handle.write('baseline = "%s"\nstate_dir = "%s/state/{node}"\nlog = "file"\n'
                     '[sim]\nfleet = "%s"\n[slurm]\nbin_dir = "%s/no-slurm"\n' % (BASELINE, work, fleet, work))
    return config


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=40)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="gpugate-bench-")
    try:
        config = setup(work)
        scripts = sysconfig.get_path("scripts")
        env = {"SLURMD_NODENAME": "gpu01"}
        healthcheck = [os.path.join(scripts, "gpugate-healthcheck"), "--config", config]
        for _ in range(2):  # a fresh, fit verdict for the prolog to reuse
            subprocess.run(healthcheck, env=env, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        prolog = [os.path.join(scripts, "gpugate-prolog"), "--config", config]
        reference = [sys.executable, "-c", "pass"]
        ref_t, pro_t, pro_rss, ref_rss, codes = [], [], [], [], set()
        for i in range(args.repeat):  # interleaved: both see the same machine load
            t, rss, _ = run_once(reference, {})
            ref_t.append(t)
            ref_rss.append(rss)
            t, rss, code = run_once(prolog, dict(env, SLURM_JOB_ID=str(1000 + i)))
            pro_t.append(t)
            pro_rss.append(rss)
            codes.add(code)
        import statistics

        ref, pro = statistics.median(ref_t), statistics.median(pro_t)
        print("python3 -c pass     median %.1f ms   peak RSS %.1f MB" % (ref * 1000, max(ref_rss)))
        print("gpugate-prolog      median %.1f ms   peak RSS %.1f MB   exit codes %s"
              % (pro * 1000, max(pro_rss), sorted(codes)))
        print("ratio prolog / python3 -c pass = %.2f   (target <= 5; RSS target <= 50 MB)" % (pro / ref))
        if codes != {0}:
            print("WARNING: the prolog did not pass on the healthy node", file=sys.stderr)
            return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
