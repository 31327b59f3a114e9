"""Whole-process wall time and peak RSS of a command, measured with wait4."""

import os
import statistics
import subprocess
import time


def run_once(argv, env):
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    took = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    return took, usage.ru_maxrss / 1024.0, proc.returncode  # ru_maxrss is KiB on Linux


def measure(argv, env, repeat):
    """(median seconds, max peak RSS MiB, exit codes seen).  Runs are
    interleaved by the caller with the reference so both see the same machine."""
    times, rss, codes = [], [], set()
    for _ in range(repeat):
        took, mib, code = run_once(argv, env)
        times.append(took)
        rss.append(mib)
        codes.add(code)
    return statistics.median(times), max(rss), codes
