"""The Slurm backends' shared parts, without a cluster: the node records the
pyslurm worker sends, the frames it sends them in, the sbatch options it
accepts, the trace in scontrol's words, and how `connect` chooses.  The
backends against a real slurmctld: tests/test_slurm_backend_rig.py."""

import os
import subprocess
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpugate.errors import ParseError, SlurmError
from gpugate.slurm import connect
from gpugate.slurm.commands import CommandSlurm
from gpugate.slurm.jobs import sbatch_argv
from gpugate.slurm.nodestate import parse_nodes_text
from gpugate.slurm.nodestate.records import parse_node_records
from gpugate.slurm.pyslurm_backend import PyslurmMismatch, PyslurmSlurm, check_release
from gpugate.slurm.pyslurm_worker import Refused, _sbatch_options
from gpugate.slurm.trace import in_scontrol_words
from gpugate.slurm.wire import WireClosed, WireTimeout, read_frame, write_frame


def _pyslurm_missing():
    env = dict(os.environ, PYSLURM_DISABLE_AUTO_INIT="1")  # no init: no slurm.conf needed
    return subprocess.run([sys.executable, "-c", "import pyslurm"], capture_output=True, env=env).returncode != 0


# ------------------------------------------------------------- node records

def test_records_read_as_sinfo_text_reads_the_same_nodes():
    records = [
        {"name": "gpu01", "state": "IDLE", "reason": "", "reason_time": 0, "reason_user": "", "partitions": ["a"]},
        {"name": "gpu02", "state": "IDLE+DRAIN", "reason": "gpugate: drift driver=1 (want 2)",
         "reason_time": 1764000000, "reason_user": "root", "partitions": ["b", "a"]},
        {"name": "gpu03", "state": "MIXED+DRAIN", "reason": "admin: fan", "reason_time": 1764000001,
         "reason_user": "alice", "partitions": ["a"]},
        {"name": "gpu04", "state": "DOWN+NOT_RESPONDING", "reason": "Not responding", "reason_time": 1764000002,
         "reason_user": "slurm", "partitions": []},
        # 24.11+ without accounting storage keeps the reason after RESUME.
        {"name": "gpu05", "state": "IDLE", "reason": "gpugate: old", "reason_time": 5, "reason_user": "root",
         "partitions": ["a"]},
    ]
    text = ("gpu01|a|idle|Unknown|Unknown|none\n"
            "gpu02|a|idle+drain|1764000000|root|gpugate: drift driver=1 (want 2)\n"
            "gpu02|b|idle+drain|1764000000|root|gpugate: drift driver=1 (want 2)\n"
            "gpu03|a|mixed+drain|1764000001|alice|admin: fan\n"
            "gpu05|a|idle|5|root|gpugate: old\n")
    mine = parse_node_records(records)
    theirs = parse_nodes_text(text)
    for name in ("gpu01", "gpu02", "gpu03", "gpu05"):
        assert mine[name] == theirs[name]
    assert mine["gpu04"].down and mine["gpu04"].partitions == ()
    assert mine["gpu05"].reason == ""  # a leftover on a node in service reads as none


@pytest.mark.parametrize("bad", [
    None, {"name": "gpu01"}, [{"name": "gpu01", "state": ""}], [{"name": "gpu[01-02]", "state": "IDLE"}],
    [{"name": "gpu01", "state": "IDLE", "partitions": "a"}], [{"name": "gpu01", "state": "IDLE+ALLOCATED"}],
    [{"name": "gpu01", "state": "IDLE", "reason_time": -1}], [{"name": "gpu01", "state": "IDLE", "reason": 3}],
    [{"name": "gpu01", "state": "IDLE"}, {"name": "gpu01", "state": "IDLE"}], ["gpu01"],
])
def test_bad_records_are_a_parse_error(bad):
    with pytest.raises(ParseError):
        parse_node_records(bad)


_JUNK = st.none() | st.booleans() | st.integers(-2, 2**40) | st.text(max_size=10) | st.lists(st.text(max_size=4),
                                                                                        max_size=2)
_RECORD = st.fixed_dictionaries({}, optional={
    "name": st.sampled_from(["gpu01", "gpu02", "", "gpu[1-2]"]) | _JUNK,
    "state": st.sampled_from(["IDLE", "IDLE+DRAIN", "MIXED+DRAIN+COMPLETING", "DOWN*", "ALLOCATED+IDLE",
                              "FUTURE+NEWFLAG"]) | _JUNK,
    "reason": _JUNK, "reason_time": _JUNK, "reason_user": _JUNK,
    "partitions": st.lists(st.sampled_from(["a", "b", "", "x y"]), max_size=3) | _JUNK})


@given(st.lists(_RECORD, max_size=4))
def test_records_raise_parse_error_and_nothing_else(records):
    try:
        found = parse_node_records(records)
    except ParseError:
        return
    assert len(found) == len(records)


# ------------------------------------------------------------------- frames

@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary(),
                    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
                    | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=20))
def test_frames_carry_plain_values_unchanged(value):
    read, write = os.pipe()
    try:
        write_frame(write, value)
        assert read_frame(read, time.monotonic() + 5) == value
    finally:
        os.close(read)
        os.close(write)


def test_a_frame_that_does_not_come_times_out_and_a_closed_pipe_says_so():
    read, write = os.pipe()
    started = time.monotonic()
    with pytest.raises(WireTimeout):
        read_frame(read, time.monotonic() + 0.2)
    assert time.monotonic() - started < 2
    os.write(write, b"\x00\x00\x00\x10abc")  # 3 of 16 bytes, then the writer dies
    os.close(write)
    with pytest.raises(WireClosed):
        read_frame(read, time.monotonic() + 2)
    os.close(read)


# ----------------------------------------------------------- sbatch options

@pytest.mark.parametrize("argv,want", [
    (["--gres=gpu:8"], [("gres", "gpu:8")]),
    (["--gres", "gpu:8", "--mem=0"], [("gres", "gpu:8"), ("mem", "0")]),
    (["-G", "8"], [("G", "8")]),
    (["--contiguous", "--qos=maint"], [("contiguous", None), ("qos", "maint")]),
    ([], []),
])
def test_sbatch_options_are_read_as_sbatch_reads_them(argv, want):
    assert list(_sbatch_options(argv)) == want


@pytest.mark.parametrize("argv", [["gpu:8"], ["--nodelist=gpu09"], ["-w", "gpu09"], ["--reservation", "x"],
                                  ["--wrap=true"], ["--time=5"]])
def test_sbatch_options_gpugate_sets_itself_or_no_option_are_refused(argv):
    with pytest.raises(Refused):
        list(_sbatch_options(argv))


# -------------------------------------------------------------------- trace

def test_the_trace_of_a_submit_is_the_sbatch_line_the_command_backend_runs():
    spec = {"name": "gpugate-smoke", "reservation": "r1", "node": "gpu01,gpu02", "minutes": 5,
            "output": "/shared/smoke/x.out", "extra": ["--gres=gpu:8"], "wrap": "exec /opt/nccl/all_reduce_perf -b 8"}
    backend = PyslurmSlurm("/usr/bin", {}, 1.0)
    worker_spec = backend._submit_spec(spec)
    assert in_scontrol_words("submit", (worker_spec,)) == ["sbatch " + " ".join(sbatch_argv(spec))]


@given(st.sampled_from(["nodes", "update_nodes", "reservations", "reserve", "update_reservation", "unreserve",
                        "jobs", "cancel", "jobs_now"]),
       st.text(alphabet="abcgpu0123[]-,", min_size=1, max_size=12))
def test_every_call_has_one_line_per_request_in_the_trace(op, names):
    args = {"nodes": (names,), "update_nodes": (names, "DRAIN", "gpugate: x"), "reservations": (),
            "reserve": ("r", names), "update_reservation": ("r", names), "unreserve": ("r",),
            "jobs": (["1", "2"],), "cancel": (["3"],), "jobs_now": ()}[op]
    lines = in_scontrol_words(op, args)
    assert lines and all("\n" not in line for line in lines)
    assert len(lines) == (2 if op == "jobs" else 1)


# ------------------------------------------------------- choosing a backend

@pytest.mark.parametrize("pyslurm,running,ok", [
    ("25.11.2", (25, 11), True), ("25.11.0", (25, 11), True), ("25.11.2", (25, 5), False),
    ("25.11.2", (26, 5), False), ("24.11.1", (25, 11), False), ("25.1.0", (25, 11), False),
    ("26.5.0", (26, 5), True), ("24.11.1", (24, 11), False), ("x.y", (25, 11), False),
])
def test_pyslurm_is_used_only_for_its_own_major_minor_and_proven_releases(pyslurm, running, ok):
    if ok:
        check_release(pyslurm, running, "/usr/bin")
    else:
        with pytest.raises(PyslurmMismatch) as err:
            check_release(pyslurm, running, "/usr/bin")
        assert pyslurm in str(err.value)
        if pyslurm.startswith("25.11"):
            assert "rebuild it" in str(err.value) and 'backend = "commands"' in str(err.value)


class _Settings:
    def __init__(self, backend, bin_dir="/usr/bin", timeout=10.0):
        self.slurm = {"backend": backend, "bin_dir": bin_dir, "timeout_seconds": timeout}
        self.slurm_env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C"}


def test_commands_backend_is_the_default_and_starts_nothing():
    backend = connect(_Settings("commands"))
    assert isinstance(backend, CommandSlurm) and backend.name == "commands" and backend.why == "configured"


@pytest.mark.skipif(not _pyslurm_missing(), reason="pyslurm imports here: the rig's tests cover it")
def test_without_pyslurm_auto_falls_back_and_says_why_pyslurm_refuses():
    backend = connect(_Settings("auto"))
    assert backend.name == "commands"
    assert backend.why.startswith("auto: pyslurm does not load") and "pyslurm" in backend.why
    with pytest.raises(PyslurmMismatch) as err:
        connect(_Settings("pyslurm"))
    assert "pyslurm does not load" in str(err.value)


def test_a_worker_that_cannot_start_in_its_time_is_killed_and_said(tmp_path):
    # An interpreter that never answers: the start's deadline, not a hang.
    slow = tmp_path / "python"
    slow.write_text("#!/bin/sh\nexec sleep 60\n")
    slow.chmod(0o755)
    backend = PyslurmSlurm("/usr/bin", {}, 1.0, deadline=time.monotonic() + 1.5, python=str(slow))
    started = time.monotonic()
    with pytest.raises(SlurmError) as err:
        backend.nodes()
    assert time.monotonic() - started < 3
    assert "did not start within" in str(err.value)
    assert backend._proc is None


def test_no_call_starts_without_time_left():
    backend = PyslurmSlurm("/usr/bin", {}, 1.0, deadline=time.monotonic() + 0.1)
    with pytest.raises(SlurmError) as err:
        backend.nodes("gpu01")
    assert "no time left" in str(err.value) and backend._proc is None


# ------------------------------------------- the protocol with a worker double
#
# The real worker needs pyslurm (Slurm 25.11: test_slurm_backend_rig.py);
# here a stand-in speaks the same frames, to test what the caller does with
# a slow start, an interrupted call and a late answer.

_WORKER = r'''
import os, sys, time
from gpugate.slurm.wire import WireClosed, read_frame, write_frame
start_delay, answer_delay, log = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
answers = os.dup(1)
os.dup2(2, 1)
time.sleep(start_delay)
write_frame(answers, (0, "ok", {"pyslurm": "25.11.2", "pid": os.getpid()}))
while True:
    try:
        number, op, args = read_frame(0)
    except WireClosed:
        sys.exit(0)
    with open(log, "a") as handle:
        handle.write("%d %s %d\n" % (os.getpid(), op, number))
    time.sleep(answer_delay)
    write_frame(answers, (number, "ok", [op, os.getpid()]))
'''


@pytest.fixture
def double(tmp_path):
    """(make backend, log of the requests the doubles received)."""
    os.chmod(tmp_path, 0o755)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "sinfo").write_text('#!/bin/sh\necho "slurm 25.11.7"\n')
    (bindir / "sinfo").chmod(0o755)
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    log = tmp_path / "requests.log"
    log.write_text("")

    def make(start_delay=0.0, answer_delay=0.0, timeout=5.0, deadline=None):
        python = tmp_path / ("python-%s-%s" % (start_delay, answer_delay))
        python.write_text('#!/bin/sh\nexec %s %s %s %s %s\n' % (sys.executable, script, start_delay, answer_delay, log))
        python.chmod(0o755)
        backend = PyslurmSlurm(str(bindir), {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.getcwd()}, timeout,
                               deadline=deadline, python=str(python))
        return backend
    return make, log


def _requests(log):
    return [line.split() for line in log.read_text().splitlines()]


def test_an_interrupted_call_never_hands_its_answer_to_the_next(double):
    import signal

    make, log = double
    backend = make(answer_delay=0.5)
    assert backend._call("reservations")[0] == "reservations"
    first = backend._proc.pid

    def interrupt(*_):
        raise KeyboardInterrupt
    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.15)
    try:
        with pytest.raises(KeyboardInterrupt):
            backend._call("nodes", None)  # ctrl-C while its answer is on the way
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert backend._proc is None  # that worker is gone...
    answer = backend._call("unreserve", "r1")
    assert answer[0] == "unreserve" and answer[1] != first  # ...and the next call has its own answer
    backend.close()


def test_a_slow_worker_start_leaves_the_call_its_own_time_or_sends_nothing(double):
    make, log = double
    backend = make(start_delay=0.8, timeout=0.6)  # a start may take START_SECONDS, the call keeps its 0.6 s
    assert backend._call("reservations")[0] == "reservations"
    backend.close()
    short = make(start_delay=0.8, timeout=30.0, deadline=time.monotonic() + 1.0)
    with pytest.raises(SlurmError) as err:
        short._call("update_nodes", "gpu01", "DRAIN", "gpugate: x")
    # Started with less than 0.5 s left (or, on a loaded machine, not in the second at all).
    assert "not started: no time left" in str(err.value) or "did not start within" in str(err.value)
    assert [r for r in _requests(log) if r[1] == "update_nodes"] == []  # never sent
    short.close()


def test_a_late_answer_is_a_timeout_and_the_worker_is_replaced(double):
    make, log = double
    backend = make(answer_delay=2.0, timeout=0.6)
    started = time.monotonic()
    with pytest.raises(SlurmError) as err:
        backend._call("reservations")
    assert time.monotonic() - started < 2.0 and "no answer within 0.6 s" in str(err.value)
    assert backend._proc is None


# ------------------------------------- a read slurmctld dropped half-way
#
# Stand-ins for sinfo and scontrol that fail their first N calls the way
# the real clients do when slurmctld drops a connection (killed by SIGPIPE,
# or Slurm's own message and exit 1), then answer; each call is logged.

_FLAKY = '''#!/bin/sh
echo "$0 $*" >> {log}
n=$(wc -l < {log})
if [ "$n" -le {fail} ]; then
    case "{how}" in
        pipe) kill -PIPE $$ ;;
        sleep) sleep 5 ;;
        *) echo "{how}" >&2; exit 1 ;;
    esac
fi
case "$1" in
    --version) echo "slurm 25.11.7" ;;
    show) echo "ReservationName=maint StartTime=now Nodes=gpu[01-02] NodeCnt=2" ;;
esac
'''


def _flaky(tmp_path, how, fail=1):
    os.chmod(tmp_path, 0o755)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "calls.log"
    log.write_text("")
    for tool in ("sinfo", "scontrol"):
        (bindir / tool).write_text(_FLAKY.format(log=log, fail=fail, how=how))
        (bindir / tool).chmod(0o755)
    return str(bindir), log


@pytest.mark.parametrize("how", ["pipe", "sinfo: error: Unexpected missing socket error",
                                 "slurm_load_reservations error: Zero Bytes were transmitted or received"])
def test_a_read_dropped_half_way_is_tried_once_more(tmp_path, how):
    bindir, log = _flaky(tmp_path, how)
    slurm = CommandSlurm(bindir, timeout=5.0)
    assert slurm.reservations() == {"maint": "gpu[01-02]"}
    assert len(log.read_text().splitlines()) == 2 and slurm.retried == 1


def test_a_read_failing_twice_says_both_and_a_third_is_never_tried(tmp_path):
    bindir, log = _flaky(tmp_path, "pipe", fail=5)
    slurm = CommandSlurm(bindir, timeout=5.0)
    with pytest.raises(SlurmError) as err:
        slurm.version()
    assert "exited -13 (tried twice; the first: " in str(err.value)
    assert len(log.read_text().splitlines()) == 2


@pytest.mark.parametrize("how", ["slurm_update error: Invalid node name specified",
                                 "Unable to contact slurm controller (connect failure)",
                                 "slurm_load_reservations error: Socket timed out on send/recv operation"])
def test_a_refusal_a_controller_down_or_its_own_timeout_is_not_tried_again(tmp_path, how):
    bindir, log = _flaky(tmp_path, how)
    with pytest.raises(SlurmError):
        CommandSlurm(bindir, timeout=5.0).reservations()
    assert len(log.read_text().splitlines()) == 1


def test_a_write_is_never_tried_again_even_where_a_read_would_be(tmp_path):
    # The update may have landed before the connection broke.
    bindir, log = _flaky(tmp_path, "pipe")
    with pytest.raises(SlurmError):
        CommandSlurm(bindir, timeout=5.0).update("gpu01", "DRAIN", "gpugate: test")
    assert len(log.read_text().splitlines()) == 1


def test_a_timeout_is_never_waited_out_again(tmp_path):
    # A slurmctld that did not answer in its time is not busy for a moment:
    # a stopped one costs one timeout (test_slurm_backend_rig), with or without a deadline.
    bindir, log = _flaky(tmp_path, "sleep")
    for deadline in (time.monotonic() + 30, None):
        log.write_text("")
        with pytest.raises(SlurmError) as err:
            CommandSlurm(bindir, timeout=1.0, deadline=deadline).version()
        assert "timed out" in str(err.value) and len(log.read_text().splitlines()) == 1
