"""Benchmark: the install-trust walk every health check makes (issue 30),
against a plain os.walk with an lstat of every entry of the same trees
measured in the same run.

    python3 bench/bench_install_walk.py [--repeat 25]

The walk opens each directory by descriptor and checks owner and mode of
every entry below gpugate's packages and every imported module; the
reference only lists and lstats them.  The ratio is the walk's overhead;
the target is its absolute median on this machine (the health check's
whole budget is seconds; the prolog never walks).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _measure import report, timed  # noqa: E402

from gpugate.probes import install_trust  # noqa: E402


def _reference(roots):
    count = 0
    for root in roots:
        for where, dirs, files in os.walk(root):
            for name in dirs + files:
                os.lstat(os.path.join(where, name))
                count += 1
    return count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=25)
    parser.add_argument("--target", type=float, default=0.05, help="seconds, median of the walk")
    args = parser.parse_args()
    path = install_trust.isolated_path()
    import gpugate
    roots = [os.path.dirname(os.path.abspath(gpugate.__file__))]
    ref_t, listed = timed(lambda: _reference(roots), args.repeat)
    took, checked = timed(lambda: install_trust.check_install(path=path), args.repeat)
    print("entries: reference %d (gpugate's package), walk %d (packages and imported modules)" % (listed, checked))
    return report("os.walk+lstat of gpugate/", ref_t, "check_install", took, args.target)


if __name__ == "__main__":
    sys.exit(main())
