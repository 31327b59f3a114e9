"""The one way gpugate runs a command: argv, timeout, process group, typed errors."""

import os
import subprocess
import sys
import time

import pytest

from gpugate.errors import CommandError
from gpugate.safety.runner import run


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
from gpugate.safety import runner
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


FLOOD = """
import json, resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))  # before the cap: MemoryError, not the test box's RAM
from gpugate.errors import CommandError
from gpugate.safety.runner import run
started = time.monotonic()
try:
    run(sys.argv[1:], 60)
    outcome = {"error": None}
except CommandError as exc:
    outcome = {"error": str(exc), "overflow": exc.overflow}
outcome["seconds"] = time.monotonic() - started
# This process's own peak (VmHWM): ru_maxrss keeps the forking parent's
# high-water mark across exec (a long pytest run's ~280 MB).
outcome["maxrss_kb"] = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps(outcome))
"""


@pytest.mark.parametrize("argv, pipe", [(["/usr/bin/yes"], "stdout"), (["/bin/sh", "-c", "yes >&2"], "stderr")])
def test_a_tool_printing_without_end_is_killed_at_the_cap_with_bounded_memory(tmp_path, argv, pipe):
    """Issue 24, item 8: a tool printing forever took the health check to
    3.6 GB RSS.  Its output is read up to a cap (16 MiB stdout, 1 MiB
    stderr), then its process group is killed and the call fails, typed."""
    import json

    done = subprocess.run([sys.executable, "-c", FLOOD] + argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    outcome = json.loads(done.stdout)
    cap = "16 MiB" if pipe == "stdout" else "1 MiB"
    assert outcome["error"] == "%s: printed more than %s on %s; killed" % (argv[0], cap, pipe)
    assert outcome["overflow"] is True
    assert outcome["seconds"] < 10  # at the cap, not at the 60 s timeout
    assert outcome["maxrss_kb"] < 200 * 1024


def test_over_the_cap_the_whole_group_is_killed_and_a_call_may_raise_its_cap(tmp_path):
    marker = tmp_path / "child.pid"
    with pytest.raises(CommandError) as info:
        run(["/bin/sh", "-c", "sleep 300 & echo $! > %s; head -c 5000 /dev/zero; wait" % marker], 30,
            max_stdout=4096)
    assert info.value.overflow and not info.value.timed_out
    assert str(info.value) == "/bin/sh: printed more than 4096 bytes on stdout; killed"
    child = int(marker.read_text())
    if not gone_within(child, 5):
        os.kill(child, 9)
        pytest.fail("the tool's child %d outlived the kill at the cap" % child)
    assert run(["/bin/sh", "-c", "head -c 5000 /dev/zero"], 30, max_stdout=8192).stdout == "\0" * 5000


def test_input_larger_than_a_pipe_is_written_while_the_answer_is_read():
    text = "".join("line %d\n" % i for i in range(100000))  # ~1 MB each way: a pipe holds 64 KB
    assert run(["/bin/cat"], 30, input_text=text).stdout == text
    assert run(["/bin/cat"], 5, input_text="").stdout == ""
    assert run(["/bin/true"], 5, input_text=text).rc == 0  # it never reads: no hang, no error


def test_a_tool_over_the_cap_is_a_probe_finding_not_a_crash(fleet):
    """dcgmi printing forever on a simulated node: the check ends at once
    with `probe dcgm=overflow`, the tool named in the detail."""
    from conftest import gpugate_cmd

    dcgmi = os.path.join(fleet, "gpu01", "bin", "dcgmi")
    with open(dcgmi, "w") as handle:
        handle.write('#!/bin/sh\nexec /usr/bin/yes "dcgmi  version: 3.3.5"\n')
    os.chmod(dcgmi, 0o755)
    started = time.monotonic()
    result = gpugate_cmd("check", "--sim", fleet, "--node", "gpu01", "--json")
    assert time.monotonic() - started < 30
    assert result.returncode == 1, result.stderr
    import json

    out = json.loads(result.stdout)
    assert "probe dcgm=overflow" in out["reason"]
    details = [f["detail"] for f in out["findings"] if f["component"] == "dcgm"]
    assert details and "printed more than 16 MiB on stdout; killed" in details[0]
