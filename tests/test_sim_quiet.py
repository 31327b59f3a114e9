"""The simulator writes a node's files while no check started for that node
reads them: a change the model makes at once is never seen half-made."""

import os
import subprocess
import sys
import time

from conftest import gpugate_cmd
from gpugate.sim import quiet

SLEEPER = "import time, sys; time.sleep(float(sys.argv[1]))\n"


def seen(proc, node, within=10.0):
    """The sleeper is listed as a run for ``node`` (it takes a moment to exec)."""
    deadline = time.monotonic() + within
    while proc.pid not in quiet.runs_for(node):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def start(tmp_path, name, node, seconds):
    """A process named like a gpugate entry point (or not), started with
    slurmd's SLURMD_NODENAME, that reads nothing and sleeps."""
    script = tmp_path / name
    script.write_text(SLEEPER)
    env = dict(os.environ, SLURMD_NODENAME=node)
    return subprocess.Popen([sys.executable, str(script), str(seconds)], env=env)


def test_runs_for_names_the_checks_of_that_node_only(tmp_path):
    check = start(tmp_path, "gpugate-healthcheck", "gpu07", 30)
    other_node = start(tmp_path, "gpugate-prolog", "gpu08", 30)
    not_gpugate = start(tmp_path, "slurmd", "gpu07", 30)
    try:
        assert seen(check, "gpu07")
        assert seen(other_node, "gpu08") and other_node.pid not in quiet.runs_for("gpu07")
        assert not_gpugate.pid not in quiet.runs_for("gpu07")
    finally:
        for proc in (check, other_node, not_gpugate):
            proc.kill()
            proc.wait()
    assert check.pid not in quiet.runs_for("gpu07")


def test_a_save_waits_for_the_running_check_then_writes(fleet, tmp_path):
    check = start(tmp_path, "gpugate-healthcheck", "gpu02", 2)
    try:
        assert seen(check, "gpu02")
        result = gpugate_cmd("sim", "set", fleet, "gpu02", "driver=550.54.15")
        assert result.returncode == 0, result.stderr
        # Written after the check ended, not during it.
        assert check.poll() is not None
    finally:
        check.kill()
        check.wait()
    with open(os.path.join(fleet, "gpu02", "root", "proc", "driver", "nvidia", "version")) as handle:
        assert "550.54.15" in handle.read()


def test_a_hung_check_delays_a_save_only_so_long(tmp_path):
    check = start(tmp_path, "gpugate-epilog", "gpu03", 60)
    try:
        assert seen(check, "gpu03")
        t0 = time.monotonic()
        quiet.wait_quiet("gpu03", timeout=0.5)
        assert 0.5 <= time.monotonic() - t0 < 5 and check.poll() is None
    finally:
        check.kill()
        check.wait()
