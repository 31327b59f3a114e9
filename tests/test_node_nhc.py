"""gpugate.node.nhc without Slurm: the argv, the result, and the kill of a
hung NHC's whole session (a real bash child, like NHC itself)."""

import time
from gpugate.core.record import replace

from gpugate.model.config import parse_settings
from gpugate.node import nhc


def _settings(tmp_path, body, timeout=2.0):
    script = tmp_path / "fake-nhc"
    script.write_text("#!/bin/bash\n" + body)
    script.chmod(0o755)
    base = parse_settings({"nhc": {"command": [str(script), "HOSTNAME={node}"], "timeout_seconds": timeout}}, "(test)")
    return replace(base, slurm=dict(base.slurm, slurm_conf=str(tmp_path / "slurm.conf")))


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_argv_names_the_node_and_keeps_nhc_from_lifting_when_asked(tmp_path):
    settings = _settings(tmp_path, "exit 0\n")
    assert nhc.argv(settings, "gpu07", False)[1:] == ["HOSTNAME=gpu07"]
    assert nhc.argv(settings, "gpu07", True)[1:] == ["HOSTNAME=gpu07", "ONLINE_NODE=:"]
    assert not nhc.configured(parse_settings({}, "(test)"))


def test_pass_and_fail_with_nhc_output_and_slurm_environment(tmp_path):
    passed = nhc.run(_settings(tmp_path, 'echo "$SLURM_CONF $SLURMD_NODENAME $1"\n'), "gpu01", False,
                     time.monotonic() + 10)
    assert passed["result"] == nhc.PASSED and passed["exit"] == 0 and "error" not in passed
    failed = nhc.run(_settings(tmp_path, 'echo "ERROR:  nhc:  Health check failed:  $SLURM_CONF $SLURMD_NODENAME"\n'
                               "exit 1\n"), "gpu01", False, time.monotonic() + 10)
    assert failed["result"] == nhc.FAILED and failed["exit"] == 1
    assert failed["error"] == "ERROR:  nhc:  Health check failed:  %s gpu01" % (tmp_path / "slurm.conf")


def test_hung_nhc_is_killed_with_everything_in_its_session(tmp_path):
    pids = tmp_path / "pids"
    # A grandchild in a process group of its own, as NHC's watchdog is.
    body = "set -m\nsleep 300 &\necho $! > %s\nset +m\nsleep 300\n" % pids
    started = time.monotonic()
    outcome = nhc.run(_settings(tmp_path, body, timeout=1.5), "gpu01", False, time.monotonic() + 30)
    assert outcome["result"] == nhc.TIMED_OUT
    assert outcome["error"] == "NHC timed out after 1.5 s (killed)"
    assert time.monotonic() - started < 5
    grandchild = int(pids.read_text())
    for _ in range(50):
        if not _alive(grandchild):
            break
        time.sleep(0.05)
    assert not _alive(grandchild)


def test_no_time_left_runs_nothing_and_is_not_a_pass(tmp_path):
    marker = tmp_path / "ran"
    outcome = nhc.run(_settings(tmp_path, "touch %s\n" % marker), "gpu01", False, time.monotonic() + 0.5)
    assert outcome["result"] == nhc.NOT_RUN and not marker.exists()


def test_metric_names_the_last_nhc_result_only_when_nhc_runs():
    from gpugate.model.baseline import load_baseline
    from gpugate.model.facts import NodeFacts
    from gpugate.node.metrics import NHC_RESULTS, node_families
    from gpugate.core.promtext import render
    from gpugate.model.verdict import decide

    from conftest import DEMO_BASELINE

    assert NHC_RESULTS == (nhc.PASSED, nhc.FAILED, nhc.TIMED_OUT, nhc.NOT_RUN)
    baseline = load_baseline(DEMO_BASELINE)
    verdict, facts = decide([], "gpugate:"), NodeFacts(node="gpu01", mode="healthcheck", collected_at=0.0)
    text = render(node_families("gpu01", verdict, facts, baseline, nhc=nhc.TIMED_OUT))
    assert 'gpugate_nhc_result{result="timed out"} 1' in text
    assert 'gpugate_nhc_result{result="passed"} 0' in text
    assert "gpugate_nhc_result" not in render(node_families("gpu01", verdict, facts, baseline))


def test_an_nhc_command_others_can_change_is_not_run(tmp_path):
    # Root runs it: the same trust walk as every tool gpugate starts.
    marker = tmp_path / "ran"
    settings = _settings(tmp_path, "touch %s\n" % marker)
    (tmp_path / "fake-nhc").chmod(0o777)
    outcome = nhc.run(settings, "gpu01", False, time.monotonic() + 10)
    assert outcome["result"] == nhc.NOT_RUN and "NHC not run" in outcome["error"], outcome
    assert not marker.exists()


def test_an_nhc_printing_without_end_is_killed_at_its_cap(tmp_path):
    """Issue 24, item 8: NHC's output is read with a cap (1 MiB) too; over
    it, its session is killed and it has not answered (never a pass)."""
    started = time.monotonic()
    outcome = nhc.run(_settings(tmp_path, "exec yes\n", timeout=20), "gpu01", False, time.monotonic() + 30)
    assert outcome["result"] == nhc.NOT_RUN
    assert outcome["error"].endswith(": printed more than 1 MiB on stdout; killed")
    assert time.monotonic() - started < 10


def test_the_file_checked_is_the_file_run_and_nhc_keeps_its_name(tmp_path, monkeypatch):
    """Issue 24 review (nice-to-have c): NHC was checked by path and then
    run by path: a swap between the two ran another file.  It runs from the
    checked fd (/proc/self/fd/N), and gets NAME= its file's name (NHC names
    its config files by $0)."""
    import os

    from gpugate.safety import trust

    settings = _settings(tmp_path, 'echo "ERROR: the checked file ran"; exit 1\n')
    other = tmp_path / "swapped-in"
    other.write_text("#!/bin/bash\necho swapped\n")
    other.chmod(0o755)
    real = trust.open_executable
    checked = []

    def open_then_swap(path, what="command", owners=None):
        fd = real(path, what, owners)
        checked.append(path)
        os.replace(str(other), path)  # the path now names another file
        return fd

    monkeypatch.setattr(trust, "open_executable", open_then_swap)
    outcome = nhc.run(settings, "gpu01", False, time.monotonic() + 30)
    assert checked and outcome["result"] == nhc.FAILED, outcome  # before: "passed", the swapped-in file ran
    assert outcome["error"] == "ERROR: the checked file ran"
    monkeypatch.undo()
    failed = nhc.run(_settings(tmp_path, 'echo "ERROR: $*"; exit 1\n'), "gpu01", True, time.monotonic() + 30)
    assert failed["error"] == "ERROR: HOSTNAME=gpu01 ONLINE_NODE=: NAME=fake-nhc", failed
    assert nhc._named(["/usr/sbin/nhc", "-n", "site"]) == ["/usr/sbin/nhc", "-n", "site"]
    assert nhc._named(["/usr/sbin/nhc", "NAME=x"]) == ["/usr/sbin/nhc", "NAME=x"]
