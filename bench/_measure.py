"""Shared by the benchmarks: a command's wall and CPU time and peak RSS
(wait4), and the median time of a function."""

import os
import statistics
import subprocess
import time


def run_once(argv, env):
    """(wall seconds, CPU seconds of the process and its children, wait4's
    peak RSS in MB, exit code)."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    took = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    # ru_maxrss is KiB on Linux
    return took, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024.0, proc.returncode


def timed(fn, repeat):
    """(median seconds of fn() over repeat runs, the last value)."""
    times, value = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), value


def report(reference: str, ref_t: float, measured: str, took: float, target: float) -> int:
    """Print the reference, the measurement and their ratio; exit status 1
    when the measurement misses its target."""
    width = max(len(reference), len(measured)) + 2
    print("%s median %.3f s" % ((reference + " (reference)").ljust(width + 12), ref_t))
    print("%s median %.3f s   (target <= %g s)" % (measured.ljust(width + 12), took, target))
    print("ratio %s / %s = %.2f" % (measured.split()[0], reference.split()[0], took / ref_t))
    return 0 if took <= target else 1
