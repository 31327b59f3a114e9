"""The Slurm backends against a real slurmctld, where pyslurm is built
(Slurm 25.11: scripts/test --release 25.11, which requires it).

Every Slurm integration test runs with the rig's backend
($GPUGATE_TEST_SLURM_BACKEND; scripts/test --release 25.11 runs them once
with each).  These check the backends against each other: what one writes
the other reads, node by node, and neither outlives its deadline when
slurmctld stops answering.  Elsewhere `auto` falling back to the commands
is tested without a cluster (test_slurm_backends.py)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from gpugate.errors import SlurmError
from gpugate.slurm import jobs
from gpugate.slurm.commands import CommandSlurm
from gpugate.slurm.pyslurm_backend import PyslurmMismatch, PyslurmSlurm
from gpugate.testbed.files import rig_backend
from gpugate.testbed.procs import ClusterError


def _has_pyslurm():
    # No init: without a slurm.conf at its default path libslurm would exit.
    env = dict(os.environ, PYSLURM_DISABLE_AUTO_INIT="1")
    return subprocess.run([sys.executable, "-c", "import pyslurm"], capture_output=True, env=env).returncode == 0


if os.environ.get("GPUGATE_REQUIRE_PYSLURM") and not _has_pyslurm():
    raise RuntimeError("pyslurm does not import here, and this run requires it (scripts/rootfs 25.11 builds it)")
# Skipped, without booting a cluster, where pyslurm is not built.
pytestmark = [pytest.mark.slurm, pytest.mark.skipif(not _has_pyslurm(), reason="pyslurm is not built here "
                                                    "(Slurm 25.11 only: scripts/test --release 25.11)")]
INTERVAL = 5
CLUSTER = {"nodes": 4, "interval": INTERVAL, "partitions": {"a": "gpu[01-02]", "b": "gpu[03-04]"}}


def _env(cluster):
    return {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "SLURM_CONF": cluster.conf}


def _commands(cluster, timeout=10.0, deadline=None):
    return CommandSlurm("/usr/bin", _env(cluster), timeout, deadline=deadline)


def _pyslurm(cluster, timeout=10.0, deadline=None):
    backend = PyslurmSlurm("/usr/bin", _env(cluster), timeout, deadline=deadline)
    backend.start()
    return backend


def _backend(cluster, name, **kwargs):
    return _pyslurm(cluster, **kwargs) if name == "pyslurm" else _commands(cluster, **kwargs)


def _read_alike(commands, pyslurm, names, tries=10):
    """Both backends' reads of the same moment: commands, pyslurm, commands
    again, until the two command reads agree (slurmctld may change a state
    between reads: 25.11 pings a resumed node back from not responding)."""
    for _ in range(tries):
        before, theirs, after = commands.nodes(names), pyslurm.nodes(names), commands.nodes(names)
        if before == after:
            return {"commands": before, "pyslurm": theirs}
        time.sleep(1)
    raise AssertionError("node states of %s kept changing" % names)


def test_both_backends_read_every_node_the_same(cluster):
    cluster.scontrol("update", "NodeName=gpu03", "State=DRAIN", "Reason=rack 7: fan | swap, 'quoted'")
    commands, pyslurm = _commands(cluster), _pyslurm(cluster)
    try:
        cluster.wait_for(lambda: "drain" in cluster.state("gpu03"), 20, "gpu03 drained")
        for names in (None, "gpu03", "gpu[01-03]", "gpu01,gpu04", "gpu99"):
            seen = _read_alike(commands, pyslurm, names)
            assert seen["pyslurm"] == seen["commands"], names
        fleet = pyslurm.nodes()
        assert sorted(fleet) == ["gpu01", "gpu02", "gpu03", "gpu04"]
        assert fleet["gpu03"].drain and fleet["gpu03"].reason == "rack 7: fan | swap, 'quoted'"
        assert fleet["gpu03"].reason_user == "root" and fleet["gpu03"].reason_time
        assert fleet["gpu01"].partitions == ("a",) and fleet["gpu04"].partitions == ("b",)
        assert pyslurm.version() == commands.version() == (25, 11)
    finally:
        pyslurm.close()
        cluster.scontrol("update", "NodeName=gpu03", "State=RESUME")


def test_what_pyslurm_writes_the_commands_read(cluster):
    commands, pyslurm = _commands(cluster), _pyslurm(cluster)
    try:
        pyslurm.drain("gpu[01,04]", "gpugate: drift driver=1 (want 2)")
        states = commands.nodes("gpu[01-04]")
        assert states["gpu01"].drain and states["gpu04"].drain and not states["gpu02"].drain
        assert states["gpu04"].reason == "gpugate: drift driver=1 (want 2)"
        pyslurm.undrain("gpu01")
        pyslurm.resume("gpu04")
        states = commands.nodes()
        assert not states["gpu01"].drain and not states["gpu04"].drain
        # 25.11 marks an undrained or resumed node not responding until its next ping.
        cluster.wait_for(lambda: all(s.in_service for s in commands.nodes().values()), 30, "every node in service")
        assert commands.nodes("gpu04")["gpu04"].reason == "" == pyslurm.nodes("gpu04")["gpu04"].reason

        pyslurm.reserve("gpugate_test_r", "gpu01")
        shown = cluster.scontrol("show", "reservation", "gpugate_test_r", "--oneliner")
        assert "Nodes=gpu01 " in shown and "MAINT" in shown and "IGNORE_JOBS" in shown, shown
        assert "Duration=365-00:00:00" in shown, shown  # pyslurm sends an end time, not UNLIMITED
        assert commands.reservations()["gpugate_test_r"] == "gpu01"
        pyslurm.update_reservation("gpugate_test_r", "gpu[01-02]")
        assert commands.reservations()["gpugate_test_r"] == "gpu[01-02]"
        assert pyslurm.reservations() == commands.reservations()
        pyslurm.unreserve("gpugate_test_r")
        assert "gpugate_test_r" not in commands.reservations()
        with pytest.raises(SlurmError):
            pyslurm.unreserve("gpugate_test_r")  # gone: Slurm's refusal, as an error
    finally:
        pyslurm.close()


def test_batch_jobs_through_either_backend_read_the_same(cluster, tmp_path):
    out_dir = tmp_path / "jobs"
    out_dir.mkdir()
    commands, pyslurm = _commands(cluster), _pyslurm(cluster)
    cluster.scontrol("create", "reservation", "ReservationName=gpugate_test_jobs", "Nodes=gpu02", "StartTime=now",
                     "Duration=UNLIMITED", "Users=root", "Flags=MAINT,IGNORE_JOBS")
    try:
        submitted, codes = {}, {}
        for name, backend in (("commands", commands), ("pyslurm", pyslurm)):
            # 3, and 255 (an MPI launcher's: pyslurm alone would say 127, "command not found")
            for code in (3, 255):
                key = "%s-%d" % (name, code)
                submitted[key] = jobs.submit(
                    backend, ["/bin/sh", "-c", "echo hello from $SLURM_JOB_NODELIST; exit %d" % code], "gpu02",
                    "gpugate_test_jobs", 2, str(out_dir / (key + ".out")), "gpugate-test-" + name)
                codes[submitted[key]] = code
        ids = sorted(submitted.values())

        def ended():
            return all(s.ended for s in commands.job_states(ids).values())
        cluster.wait_for(ended, 90, "the jobs to end")
        seen_c, seen_p = commands.job_states(ids), pyslurm.job_states(ids)
        for job in ids:
            assert (seen_p[job].state, seen_p[job].exit_code) == (seen_c[job].state, seen_c[job].exit_code), job
            assert seen_c[job].state == "FAILED" and seen_c[job].exit_code == codes[job]
        for key in submitted:
            assert (out_dir / (key + ".out")).read_text() == "hello from gpu02\n"
        assert pyslurm.job_states(["999999"])["999999"].state == jobs.GONE

        # A user's job waiting for gpu02 (held by the reservation) is not the
        # sweep's to cancel: scancel --nodelist matches the nodes a job was given.
        waiting = cluster.run(["/usr/bin/sbatch", "--parsable", "-w", "gpu02", "-o", "/dev/null", "--wrap",
                               "true"]).stdout.strip().split(";")[0]
        cluster.wait_for(lambda: commands.job_states([waiting])[waiting].state == "PENDING", 30, "a pending job")
        # A job left running is cancelled by name (the sweep's rerun), then by node (--force).
        for cancel in (lambda: pyslurm.cancel_named("gpugate-test-long", "gpugate_test_jobs"),
                       lambda: pyslurm.cancel_jobs("gpu02")):
            job = jobs.submit(pyslurm, ["/bin/sleep", "300"], "gpu02", "gpugate_test_jobs", 10,
                              str(out_dir / "long.out"), "gpugate-test-long")
            cluster.wait_for(lambda: commands.job_states([job])[job].state == "RUNNING", 60, "the long job runs")
            cancel()
            cluster.wait_for(lambda: commands.job_states([job])[job].ended, 60, "the long job cancelled")
            assert commands.job_states([job])[job].state == "CANCELLED"
        assert commands.job_states([waiting])[waiting].state == "PENDING"
        cluster.run(["/usr/bin/scancel", waiting])
        with pytest.raises(SlurmError) as err:
            jobs.submit(pyslurm, ["/bin/true"], "gpu02", "gpugate_test_jobs", 1, str(out_dir / "x.out"), "x",
                        extra=["--no-such-option=1"])
        assert "does not know it" in str(err.value) and 'backend = "commands"' in str(err.value)
    finally:
        pyslurm.close()
        cluster.scontrol("delete", "ReservationName=gpugate_test_jobs", check=False)


@pytest.mark.parametrize("name", ["commands", "pyslurm"])
def test_a_stopped_slurmctld_costs_a_call_its_deadline_and_no_more(cluster, name):
    backend = _backend(cluster, name, timeout=3.0)
    pid = cluster.pids()["slurmctld"]
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(SlurmError) as err:
            backend.nodes()
        took = time.monotonic() - started
        assert took < 3.0 + 2.0, took
        assert "slurmctld" in str(err.value), err.value
        # The run's own deadline wins over the call's timeout.
        short = _backend(cluster, name, timeout=30.0, deadline=time.monotonic() + 8.0)
        started = time.monotonic()
        with pytest.raises(SlurmError):
            short.nodes("gpu01")
        assert time.monotonic() - started < 8.0 + 2.0
    finally:
        os.kill(pid, signal.SIGCONT)
    # The next call works: for pyslurm, a new worker (the stuck one was killed).
    cluster.wait_for(lambda: bool(_backend(cluster, name).nodes("gpu01")), 30, "slurmctld to answer again")


def test_a_pyslurm_worker_killed_mid_call_is_an_error_and_the_next_call_starts_another(cluster):
    backend = _pyslurm(cluster, timeout=20.0)
    pid = cluster.pids()["slurmctld"]
    first = backend._proc.pid
    os.kill(pid, signal.SIGSTOP)  # the call waits on slurmctld...
    try:
        killer = subprocess.Popen(["/bin/sh", "-c", "sleep 1; kill -9 %d" % first])  # ...and its worker dies
        started = time.monotonic()
        with pytest.raises(SlurmError) as err:
            backend.nodes()
        killer.wait(timeout=10)
        assert time.monotonic() - started < 10
        assert "pyslurm worker died during nodes" in str(err.value), err.value
    finally:
        os.kill(pid, signal.SIGCONT)
    assert backend.nodes("gpu01")["gpu01"].name == "gpu01"
    assert backend._proc.pid != first
    backend.close()


def test_the_health_check_keeps_its_drain_when_pyslurm_cannot_reach_slurmctld(cluster):
    """What the tools shims do to the command backend (test_slurm_faults), for
    pyslurm: slurmctld does not answer; nothing is lost, nothing outlives
    the health check's budget, the drain lands once it answers."""
    if rig_backend() != "pyslurm":
        pytest.skip("the command backend's faults: test_slurm_faults.py")
    node = "gpu04"
    cluster.sim("set", "FLEET", node, "gpu.4.xid=79")
    pid = cluster.pids()["slurmctld"]
    os.kill(pid, signal.SIGSTOP)
    try:
        for _ in range(3):
            started = time.monotonic()
            result = subprocess.run([cluster.path("bin", "healthcheck")], env={"SLURMD_NODENAME": node},
                                    capture_output=True, text=True, timeout=120)
            took = time.monotonic() - started
            # slurmd's own health check may hold the node's lock (a loaded
            # machine: it runs long while slurmctld is stopped): this run is
            # then skipped (exit 0, said in its record); the next one judges.
            if result.returncode != 0 or cluster.log_records(node)[-1].get("verdict") != "skipped":
                break
    finally:
        os.kill(pid, signal.SIGCONT)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert took < 40 + 5, took
    record = cluster.log_records(node)[-1]
    assert record["verdict"] == "unfit" and record["action"] == "failed" and record["backend"] == "pyslurm"
    assert "pyslurm" in record["slurm_error"], record
    # Once slurmctld answers, the drain lands: by this run, or by slurmd's own
    # health check (one started while slurmctld was stopped may hold the
    # node's act lock past this run's wait), within two intervals.
    subprocess.run([cluster.path("bin", "healthcheck")], env={"SLURMD_NODENAME": node}, capture_output=True,
                   timeout=120, check=False)
    try:
        cluster.wait_for(lambda: cluster.reason(node).startswith("gpugate: health xid:gpu4=79 (want none)"),
                         2 * 5 + 20, "the drain of %s once slurmctld answers" % node)
    except ClusterError as exc:
        pytest.fail("%s; its last runs: %s" % (exc, cluster.log_records(node)[-3:]))
    cluster.sim("set", "FLEET", node, "reboot=1")
    cluster.scontrol("update", "NodeName=" + node, "State=RESUME")


def _status(cluster, conf):
    result = subprocess.run([sys.executable, "-m", "gpugate", "status", "--json", "--config", conf],
                            capture_output=True, text=True, timeout=120, env=cluster.env)
    return result.returncode, result.stdout, result.stderr


def _conf_with(cluster, tmp_path, backend, bin_dir=None):
    with open(cluster.gpugate_conf) as handle:
        text = handle.read().replace('backend = "%s"' % rig_backend(), 'backend = "%s"' % backend)
    if bin_dir:
        text = text.replace('bin_dir = "%s/slurm-bin"' % cluster.dir, 'bin_dir = "%s"' % bin_dir)
    path = tmp_path / "gpugate.toml"
    path.write_text(text)
    os.chmod(path, 0o644)
    return str(path)


def test_auto_says_which_backend_it_chose_and_a_mismatch_is_refused(cluster, tmp_path):
    code, out, err = _status(cluster, _conf_with(cluster, tmp_path, "auto"))
    assert code == 0, err
    chosen = json.loads(out)["slurm_backend"]
    assert chosen == {"name": "pyslurm", "why": "auto: pyslurm %s matches this Slurm"
                      % chosen["why"].split()[2]}, chosen
    # Another Slurm release on this host: sinfo says 24.11 (a tool that
    # prints a recorded answer, and otherwise runs the real one).
    other = tmp_path / "bin"
    other.mkdir()
    for tool in ("scontrol", "sinfo", "sbatch", "scancel"):
        (other / tool).write_text('#!/bin/sh\n[ "$1" = --version ] && { echo "slurm 24.11.5"; exit 0; }\n'
                                  'exec /usr/bin/%s "$@"\n' % tool)
        (other / tool).chmod(0o755)
    os.chmod(tmp_path, 0o755)
    code, out, err = _status(cluster, _conf_with(cluster, tmp_path, "auto", str(other)))
    assert code == 0, err
    chosen = json.loads(out)["slurm_backend"]
    assert chosen["name"] == "commands" and "built for Slurm 25.11, but this host runs Slurm 24.11" in chosen["why"]
    code, out, err = _status(cluster, _conf_with(cluster, tmp_path, "pyslurm", str(other)))
    assert code != 0 and out == ""
    assert "built for Slurm 25.11, but this host runs Slurm 24.11" in err and "rebuild it" in err, err
    with pytest.raises(PyslurmMismatch):
        PyslurmSlurm(str(other), _env(cluster), 10.0).start()
