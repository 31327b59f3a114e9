"""Benchmark: how the installed prolog starts its Python (issue 34), as
slurmd runs it, interleaved on one simulated healthy 8-GPU node (a fresh
health-check verdict to reuse: the hot path).

    python3 bench/bench_launch.py [--repeat 15]

gpugate is installed into a new venv from a wheel of this tree, as the
README installs it (bench/_venv.py), and its prolog is timed three ways:

  gpugate-prolog         as pip installs it: the sh launcher execs python3 -I
  gpugate-prolog-reexec  an older gpugate's as pip installed it: the bare
                         interpreter (pip drops "-I"), which starts again isolated
  gpugate-prolog-dashI   that older one after the sed `gpugate slurm-conf` printed

Medians of wall and CPU time (user + system, children included).  Needs
root (bench_prolog.py's fleet) and the index for the venv's dependencies.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _venv  # noqa: E402
import bench_prolog as bp  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WAYS = ("gpugate-prolog", "gpugate-prolog-reexec", "gpugate-prolog-dashI")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="gpugate-bench-launch-")
    try:
        bindir = os.path.join(_venv.create(work, ROOT), "bin")
        python = os.path.join(bindir, "python3")
        with open(os.path.join(bindir, "gpugate-prolog")) as handle:
            body = handle.read().split("\n" + "'" * 3 + "\n", 1)[1]  # the Python after the launcher
        for suffix, first in (("-reexec", "#!" + python), ("-dashI", "#!%s -I" % python)):
            path = os.path.join(bindir, "gpugate-prolog" + suffix)
            with open(path, "w") as handle:
                handle.write(first + "\n" + body)
            os.chmod(path, 0o755)
        config = bp.setup(work, bindir)
        runs = {"reference": ([python, "-c", "pass"], {"SLURMD_NODENAME": bp.HOT})}
        for way in WAYS:
            runs[way] = ([os.path.join(bindir, way), "--config", config],
                         lambda i: bp.slurmd_env(bp.HOT, 1000 + i))
        bp.measure(runs, 2)  # warm the page cache and the last good copy
        results = bp.measure(runs, args.repeat)
        print("load average %.2f; medians of %d, interleaved" % (os.getloadavg()[0], args.repeat))
        for name, (wall, _, codes, cpu) in results.items():
            print("%-22s %8.1f ms wall %8.1f ms CPU  exit %s" % (
                name, statistics.median(wall) * 1000, statistics.median(cpu) * 1000, sorted(codes)))
        hot = bp.last_lines(work, bp.HOT, "prolog", len(WAYS) * args.repeat)
        reused = all(x.get("reused") and x.get("verdict") == "fit" for x in hot)
        print("every prolog reused a fit verdict: %s" % reused)
        return 0 if reused and all(results[w][2] == {0} for w in WAYS) else 1
    finally:
        from gpugate.node.lastgood import directory

        for node in (bp.HOT, bp.COLD):
            where = directory(os.path.join(work, "gpugate.toml"), node)
            if where.startswith("/var/lib/gpugate/last-good/"):
                shutil.rmtree(where, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
