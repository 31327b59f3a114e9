"""Issue 28 on a real slurmctld and slurmd: a health drain a GPU reset clears
is repaired by the reset rung (no reboot, the smoke job in the batch's
reservation, RESUME), a reset the node refuses falls to the reboot rung, and
each attempt keeps its evidence bundle on the controller."""

import json
import os
import stat
import sys
import tarfile
import time

import pytest

from conftest import make_cluster
from test_slurm_sweep import drift_and_drain, journal_events, run_sweep

pytestmark = pytest.mark.slurm


def boot(tmp_path, **sweep):
    from gpugate.testbed import smoke_command

    values = {"floor": 0.5, "smoke_deadline": 30, "smoke": smoke_command(str(tmp_path))}
    values.update(sweep)
    return make_cluster(tmp_path, nodes=3, sweep=values)


def bundles(cluster, node):
    directory = cluster.path("state", "evidence")
    names = sorted(n for n in os.listdir(directory) if n.startswith(node + "-")) if os.path.isdir(directory) else []
    return directory, names


def contents(path):
    with tarfile.open(path) as tar:
        manifest = json.load(tar.extractfile("MANIFEST.json"))
        return set(tar.getnames()), manifest


def test_a_reset_repairs_an_ecc_drain_without_a_reboot(tmp_path):
    cluster = boot(tmp_path)
    try:
        drift_and_drain(cluster, "gpu02", "gpu.2.ecc.uncorrected.volatile=2", "gpu.2.remapped_rows.pending=1")
        assert cluster.reason("gpu02").startswith("gpugate: health ")
        code, report, err = run_sweep(cluster)
        assert code == 0, err
        assert report["outcomes"]["gpu02"]["result"] == "resumed", report
        steps = [(s, st) for _, s, st, _ in journal_events(cluster, "gpu02")]
        assert ("reset", "done") in steps and ("smoke single", "done") in steps
        assert not any(s in ("reboot", "wait_up") for s, _ in steps)  # the reset rung: no reboot
        assert steps.index(("evidence", "done")) < steps.index(("reset", "done"))
        cluster.wait_for(lambda: cluster.state("gpu02") == "idle", 30, "gpu02 idle")
        assert cluster.reason("gpu02") == ""
        # The bundle taken before the reset: root's alone, with the node's state as it was.
        directory, names = bundles(cluster, "gpu02")
        assert len(names) == 1 and stat.S_IMODE(os.stat(directory).st_mode) == 0o700
        assert stat.S_IMODE(os.stat(os.path.join(directory, names[0])).st_mode) == 0o600
        parts, manifest = contents(os.path.join(directory, names[0]))
        assert {"kernel.log", "nvidia-smi-q.txt", "gpugate-last.json"} <= parts
        assert manifest["attempt"] == 1 and manifest["reason"].startswith("gpugate: health ")
        status = json.loads(cluster.run([sys.executable, "-m", "gpugate", "sweep", "status", "--config",
                                         cluster.gpugate_conf, "--json"]).stdout)
        assert status["nodes"]["gpu02"]["evidence_id"] == names[0][:-len(".tar.gz")]
    finally:
        cluster.stop()


@pytest.mark.slow  # a cluster of its own: CI runs it (-m slow, and -m slurm on every release)
def test_a_refused_reset_falls_to_the_reboot_rung_with_a_bundle_per_attempt(tmp_path):
    cluster = boot(tmp_path)
    try:
        # A process holds GPU 1: the node refuses the reset; the reboot clears both.
        drift_and_drain(cluster, "gpu03", "gpu.2.ecc.uncorrected.volatile=2", "gpu.1.processes=4242")
        code, report, err = run_sweep(cluster)
        assert code == 0, err
        assert report["outcomes"]["gpu03"]["result"] == "resumed", report
        steps = [(s, st, a) for _, s, st, a in journal_events(cluster, "gpu03")]
        assert ("reset", "failed", 1) in steps and ("reboot", "done", 2) in steps
        directory, names = bundles(cluster, "gpu03")
        assert [n.rsplit("-a", 1)[1] for n in names] == ["1.tar.gz", "2.tar.gz"]
        _, first = contents(os.path.join(directory, names[0]))
        assert first["remedy"] == "reset"
        cluster.wait_for(lambda: cluster.state("gpu03") == "idle", 30, "gpu03 idle")
    finally:
        cluster.stop()


@pytest.mark.slow  # a cluster of its own: CI runs it (-m slow, and -m slurm on every release)
def test_a_sweeper_killed_during_the_reset_is_taken_up_by_the_next_run(tmp_path):
    import signal
    import subprocess

    from test_slurm_sweep import journal_rows, sweep_argv

    cluster = boot(tmp_path)
    try:
        drift_and_drain(cluster, "gpu02", "gpu.2.ecc.uncorrected.volatile=2")
        cluster.sim("set", "FLEET", "gpu02", "reset_delay=4")
        proc = subprocess.Popen(sweep_argv(cluster, "--apply"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env=cluster.env)
        cluster.wait_for(lambda: os.path.exists(cluster.path("state", "sweep.db")) and
                         ("gpu02", "reset", "started", 1) in journal_events(cluster, "gpu02"), 120, "reset to start")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        # Out of service with the sweep's reason while the reset is in the air.
        assert "drain" in cluster.state("gpu02") and cluster.reason("gpu02").startswith("gpugate: ")
        time.sleep(5)  # the orphaned node side finishes (or not): either way the next run resets again
        code, report, err = run_sweep(cluster)
        assert code == 0, err
        assert report["outcomes"]["gpu02"]["result"] == "resumed", report
        assert journal_rows(cluster)["gpu02"][:2] == ("resume", "done")
        model = json.load(open(os.path.join(cluster.fleet, "gpu02", "node.json")))
        assert model["services"]["nvidia-persistenced"] == "active"  # nothing left stopped
        assert "gpugate_sweep" not in cluster.scontrol("show", "reservation")
    finally:
        cluster.stop()
