"""The one way gpugate runs a command: argv, timeout, process group, typed errors."""

import os
import time

import pytest

from gpugate.errors import CommandError
from gpugate.runner import run


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
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("child %d outlived the timeout" % child)


def test_no_budget_left_does_not_start_anything():
    with pytest.raises(CommandError) as info:
        run(["/bin/true"], 0)
    assert info.value.timed_out


def test_environment_is_exactly_what_is_given():
    result = run(["/usr/bin/env"], 5, env={"A": "1"})
    assert result.stdout == "A=1\n"
