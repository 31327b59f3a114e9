"""The one way gpugate runs a command: argv, timeout, process group, typed errors."""

import os
import subprocess
import sys
import time

import pytest

from gpugate.errors import CommandError
from gpugate.runner import run


def gone_within(pid, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_output_and_exit_codes():
    result = run(["/bin/sh", "-c", "echo out; echo err >&2; exit 3"], 5, ok_codes=(3,))
    assert (result.rc, result.stdout, result.stderr) == (3, "out\n", "err\n")
    with pytest.raises(CommandError) as info:
        run(["/bin/sh", "-c", "echo boom >&2; exit 4"], 5)
    assert info.value.rc == 4 and "exited 4: boom" in str(info.value) and info.value.stderr == "boom\n"


def test_missing_binary_is_typed():
    with pytest.raises(CommandError) as info:
        run(["/nonexistent/dcgmi", "--version"], 5)
    assert info.value.missing and "not found" in str(info.value)


def test_timeout_kills_the_whole_process_group(tmp_path):
    marker = tmp_path / "child.pid"
    started = time.monotonic()
    with pytest.raises(CommandError) as info:
        # The child survives its parent unless the group is killed.
        run(["/bin/sh", "-c", "sleep 300 & echo $! > %s; wait" % marker], 1.0)
    assert info.value.timed_out and time.monotonic() - started < 5
    child = int(marker.read_text())
    if not gone_within(child, 5):
        pytest.fail("child %d outlived the timeout" % child)


def test_no_budget_left_does_not_start_anything():
    with pytest.raises(CommandError) as info:
        run(["/bin/true"], 0)
    assert info.value.timed_out


def test_environment_is_exactly_what_is_given():
    result = run(["/usr/bin/env"], 5, env={"A": "1"})
    assert result.stdout == "A=1\n"


LEAVER = """
import sys, threading, time
from gpugate import runner
from gpugate.node.entry import leave

def call():
    try:
        runner.run(["/bin/sh", "-c", "sleep 300 & echo $! > %s; wait"], 60.0)
    except Exception:
        pass

threading.Thread(target=call, daemon=True).start()
deadline = time.monotonic() + 20
while not runner._running and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(0.3)  # the tool has written its child's pid
leave(0)  # the run's deadline: the tool has not answered
"""


def test_a_run_leaving_with_a_tool_in_flight_takes_the_tool_with_it(tmp_path):
    """A node-side run leaves at its deadline (os._exit: no thread's timeout
    fires any more): a tool still hanging, and its children, must not stay
    behind, one more per health-check interval."""
    marker = tmp_path / "child.pid"
    done = subprocess.run([sys.executable, "-c", LEAVER % marker], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    child = int(marker.read_text())
    if not gone_within(child, 5):  # SIGKILL lands asynchronously
        os.kill(child, 9)
        pytest.fail("the tool's child %d outlived the run" % child)
