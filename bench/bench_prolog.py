"""Benchmark: the prolog's hot path, as slurmd runs it, against the
interpreter it runs in and against LBNL NHC, measured in one interleaved run.

    python3 bench/bench_prolog.py [--repeat 30] [--venv DIR] [--nhc TARBALL|none] [--vendor amd]

gpugate is installed into a new venv (no system site-packages) from a wheel
of this tree, as the README installs it (--venv: an existing one, e.g.
/opt/gpugate).  On a simulated healthy 8-GPU node it times, with only the
variables slurmd sets (no PATH):

  reference     the environment's `python3 -c pass` (the python3 the entry points exec)
  NHC trivial   LBNL NHC from ../shared/vendor with four trivial checks
  prolog hot    gpugate-prolog reusing a fresh health-check verdict
  prolog cold   gpugate-prolog with no verdict to reuse (baseline read and checked)
  healthcheck   gpugate-healthcheck (reported, no target)

Medians of interleaved runs, wall time (the targets) and CPU time (user +
system, children included: less moved by other load on the machine); peak RSS from GNU time (/usr/bin/time, Debian's
"time"; without it wait4's, an upper bound).  Targets: hot <= 3x the
reference and faster than NHC, cold <= 5x, peak RSS <= 50 MB.  --vendor amd
measures the same on a simulated 8x MI300X node of the mixed example
baseline (amdgpu's sysfs read instead of NVML).  Exit 1 when
a target is missed, 2 when the reference is not the prolog's own clean
interpreter (it would import site packages the prolog's environment does not).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _venv  # noqa: E402
from _measure import run_once  # noqa: E402

from gpugate.testbed import nhcbuild as _nhc  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOT, COLD = "gpu01", "gpu02"
SOURCE_BASELINE = [os.path.join(ROOT, "gpugate", "data", "demo-baseline.toml")]
VENDORS = {"nvidia": ("gpu01", "gpu02", "gpu[01-02]", os.path.join(ROOT, "gpugate", "data", "demo-baseline.toml")),
           "amd": ("mi001", "mi002", "mi[001-002]", os.path.join(ROOT, "slurm_conf", "baseline.mixed.example.toml"))}
TARGETS = {"hot_x": 3.0, "cold_x": 5.0, "rss_mb": 50.0}


def slurmd_env(node: str, job: int) -> dict:
    """What slurmd gives a prolog (no PATH, no SLURM_CONF from the caller)."""
    return {"SLURMD_NODENAME": node, "SLURM_JOB_ID": str(job), "SLURM_JOB_UID": "1000",
            "SLURM_JOB_USER": "alice", "SLURM_JOB_GID": "1000", "SLURM_JOB_PARTITION": "gpu",
            "SLURM_CLUSTER_NAME": "bench", "SLURM_JOB_NODELIST": node, "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
            "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}


def setup(work: str, bindir: str) -> str:
    """A root-only simulated fleet (gpugate refuses anything else) and its
    gpugate.toml; a fresh fit verdict on HOT, none on COLD."""
    baseline = os.path.join(work, "baseline.toml")
    shutil.copyfile(SOURCE_BASELINE[0], baseline)
    fleet = os.path.join(work, "fleet")
    subprocess.run([os.path.join(bindir, "gpugate"), "sim", "init", fleet, "--nodes", "%s,%s" % (HOT, COLD),
                    "--baseline", baseline], check=True, stdout=subprocess.DEVNULL, timeout=120)
    config = os.path.join(work, "gpugate.toml")
    with open(config, "w") as handle:
        handle.write('baseline = "%s"\nstate_dir = "%s/state/{node}"\nlog = "file"\n'
                     '[sim]\nfleet = "%s"\n[slurm]\nbin_dir = "%s/no-slurm"\n' % (baseline, work, fleet, work))
    for _ in range(2):  # the first run also looks for a drain of ours to clear
        subprocess.run([os.path.join(bindir, "gpugate-healthcheck"), "--config", config],
                       env={"SLURMD_NODENAME": HOT}, check=False, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=120)
    return config


def last_lines(work: str, node: str, mode: str, count: int) -> list:
    with open(os.path.join(work, "state", node, "gpugate.log")) as handle:
        lines = [json.loads(x) for x in handle if x.strip()]
    return [x for x in lines if x.get("mode") == mode][-count:]


def measure(runs: dict, repeat: int) -> dict:
    """name -> (wall times, peak RSS in MB, exit codes, CPU times),
    interleaved so that every command sees the same machine load."""
    out = {name: ([], [], set(), []) for name in runs}
    for i in range(repeat):
        for name, (argv, env) in runs.items():
            took, cpu, rss, code = run_once(argv, env(i) if callable(env) else env)
            out[name][0].append(took)
            out[name][1].append(rss)
            out[name][2].add(code)
            out[name][3].append(cpu)
    return out


GNU_TIME = "/usr/bin/time"  # Debian's package "time"


def peak_rss(argv: list, env: dict, work: str, runs: int = 3) -> float:
    """Peak RSS in MB of argv's own process tree, from GNU time: wait4 on a
    child of this benchmark also counts the pages it shared with it before
    exec (about 16 MB of Python), which hides a small process's own figure."""
    out = os.path.join(work, "rss")
    peak = 0.0
    for _ in range(runs):
        subprocess.run([GNU_TIME, "-f", "%M", "-o", out] + argv, env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=120, check=False)
        with open(out) as handle:
            peak = max(peak, int(handle.read().split()[-1]) / 1024.0)
    return peak


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--venv", help="an environment gpugate is installed in (default: a new clean venv)")
    parser.add_argument("--python", default="", help="the interpreter to make the new venv with")
    parser.add_argument("--nhc", default=_nhc.vendored(ROOT), help="NHC source tarball, or 'none'")
    parser.add_argument("--vendor", choices=sorted(VENDORS), default="nvidia", help="the simulated node's GPUs")
    args = parser.parse_args()
    global HOT, COLD
    HOT, COLD, _, SOURCE_BASELINE[0] = VENDORS[args.vendor]
    work = tempfile.mkdtemp(prefix="gpugate-bench-")  # root's, mode 0700
    lastgood = []
    try:
        venv = args.venv or _venv.create(work, ROOT, args.python)
        bindir = os.path.join(venv, "bin")  # the entry points as pip installed them: nothing fixed after it
        prolog, healthcheck = os.path.join(bindir, "gpugate-prolog"), os.path.join(bindir, "gpugate-healthcheck")
        python = _venv.interpreter(prolog)
        foreign = _venv.foreign_site_packages(python, {"SLURMD_NODENAME": HOT})
        if foreign:
            print("refused: the reference %s loads what a clean gpugate environment would not: %s\n"
                  "run without --venv (a clean venv is made), or point --venv at one made without "
                  "--system-site-packages" % (python, ", ".join(foreign)), file=sys.stderr)
            return 2
        config = setup(work, bindir)
        lastgood = [subprocess.run([python, "-c", "import sys; from gpugate.node.lastgood import directory; "
                                    "print(directory(sys.argv[1], sys.argv[2]))", config, n],
                                   capture_output=True, text=True, timeout=60).stdout.strip() for n in (HOT, COLD)]
        runs = {"reference": ([python, "-c", "pass"], {"SLURMD_NODENAME": HOT})}
        if args.nhc != "none" and args.nhc:
            runs["NHC trivial"] = (_nhc.install(args.nhc, os.path.join(work, "nhc")), {"SLURMD_NODENAME": HOT})
        elif args.nhc != "none":
            print("NHC not measured: no ../shared/vendor/nhc-*.tar.gz beside this checkout (--nhc TARBALL)",
                  file=sys.stderr)
        runs["prolog hot"] = ([prolog, "--config", config], lambda i: slurmd_env(HOT, 1000 + i))
        runs["prolog cold"] = ([prolog, "--config", config], lambda i: slurmd_env(COLD, 5000 + i))
        runs["healthcheck"] = ([healthcheck, "--config", config], {"SLURMD_NODENAME": HOT})
        measure(runs, 2)  # warm the page cache and the last good copies
        results = measure(runs, args.repeat)
        rss = {}
        if os.access(GNU_TIME, os.X_OK):
            rss = {name: peak_rss(argv, env(0) if callable(env) else env, work) for name, (argv, env) in runs.items()}
        return report(results, rss, work, python, args.repeat)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        for where in lastgood:
            if where.startswith("/var/lib/gpugate/last-good/"):
                shutil.rmtree(where, ignore_errors=True)


def report(results: dict, rss: dict, work: str, python: str, repeat: int) -> int:
    """rss: name -> peak MB from GNU time; without it, wait4's (an upper bound)."""
    med = {name: statistics.median(r[0]) for name, r in results.items()}
    cpu = {name: statistics.median(r[3]) for name, r in results.items()}
    rss = rss or {name: max(r[1]) for name, r in results.items()}
    ref = med["reference"]
    print("reference: %s; load average %.2f" % (python, os.getloadavg()[0]))
    print("%-14s %10s %8s %12s %8s %10s  %s" % ("", "median ms", "x ref", "CPU ms", "x ref", "peak RSS",
                                                 "exit codes"))
    for name, (_, _, codes, _) in results.items():
        print("%-14s %10.1f %8.2f %12.1f %8.2f %8.1f MB  %s" % (
            name, med[name] * 1000, med[name] / ref, cpu[name] * 1000, cpu[name] / cpu["reference"], rss[name],
            sorted(codes)))
    failures = []
    hot = last_lines(work, HOT, "prolog", repeat)
    cold = last_lines(work, COLD, "prolog", repeat)
    if not all(x.get("reused") and x.get("verdict") == "fit" for x in hot):
        failures.append("the hot prolog did not reuse a fit verdict on every run")
    if not all(x.get("reused") is False and x.get("verdict") == "fit" for x in cold):
        failures.append("the cold prolog did not judge the node fit without a verdict on every run")
    for name in ("prolog hot", "prolog cold", "healthcheck"):
        if results[name][2] != {0}:
            failures.append("%s exited %s on a healthy node" % (name, sorted(results[name][2])))
    checks = [("prolog hot <= %gx reference" % TARGETS["hot_x"], med["prolog hot"] / ref <= TARGETS["hot_x"]),
              ("prolog cold <= %gx reference" % TARGETS["cold_x"], med["prolog cold"] / ref <= TARGETS["cold_x"])]
    if "NHC trivial" in med:
        checks.append(("prolog hot faster than NHC trivial (%.2fx)" % (med["prolog hot"] / med["NHC trivial"]),
                       med["prolog hot"] < med["NHC trivial"]))
    peak = max(rss["prolog hot"], rss["prolog cold"])
    checks.append(("prolog peak RSS %.1f MB <= %g MB" % (peak, TARGETS["rss_mb"]), peak <= TARGETS["rss_mb"]))
    for text, ok in checks:
        print("%-4s %s" % ("ok" if ok else "MISS", text))
        if not ok:
            failures.append(text)
    for text in failures:
        print("FAILED: " + text, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
