"""`gpugate demo up` runs what a site runs, the drain-budget keeper
included (issue 34: a cluster left running by `demo up` drained nothing
budgeted, a drifted node stayed in service forever); `--no-keeper` leaves
it out; `gpugate status` shows its runs; `demo down` stops it."""

import json
import os
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from conftest import _require_slurm


class FakeCluster:
    made = []

    def __init__(self, directory, nodes=8, health_interval=5, **kwargs):
        self.dir, self.conf, self.fleet = directory, directory + "/slurm.conf", directory + "/fleet"
        self.gpugate_conf = directory + "/gpugate.toml"
        self.calls = []
        FakeCluster.made.append(self)

    def write(self, *args):
        self.calls.append("write")

    def start(self):
        self.calls.append("start")

    def start_keeper(self, every=30.0):
        self.calls.append(("keeper", every))

    def nodeset(self):
        return "gpu[01-02]"

    def stop_keeper(self):
        self.calls.append("stop_keeper")

    def stop(self):
        self.calls.append("stop")

    def remove(self):
        self.calls.append("remove")


@pytest.mark.parametrize("flags, keeper", [([], True), (["--no-keeper"], False)])
def test_demo_up_starts_the_keeper_unless_told_not_to(monkeypatch, tmp_path, flags, keeper):
    from gpugate.cli.main import main

    monkeypatch.setattr("gpugate.testbed.Cluster", FakeCluster)
    FakeCluster.made.clear()
    result = CliRunner().invoke(main, ["demo", "up", "--dir", str(tmp_path), "--nodes", "2"] + flags)
    assert result.exit_code == 0, result.output
    calls = FakeCluster.made[0].calls
    assert (("keeper", 30) in calls) == keeper
    if keeper:
        assert calls.index(("keeper", 30)) > calls.index("start")  # the keeper reads a cluster that answers
        assert "drain-budget keeper every 30 s" in result.output and "gpugate status --config" in result.output
    else:
        assert "no drain-budget keeper (--no-keeper)" in result.output


@pytest.mark.parametrize("keep", [True, False])
def test_the_narrated_demo_left_running_keeps_its_keeper(monkeypatch, tmp_path, keep):
    from gpugate.cli.main import main

    monkeypatch.setattr("gpugate.testbed.Cluster", FakeCluster)
    monkeypatch.setattr("gpugate.testbed.smoke_command", lambda directory: "true")
    monkeypatch.setattr("gpugate.cli.demo._walkthrough", lambda cluster: cluster.calls.append("walkthrough"))
    FakeCluster.made.clear()
    result = CliRunner().invoke(main, ["demo", "--dir", str(tmp_path)] + (["--keep"] if keep else []))
    assert result.exit_code == 0, result.output
    calls = FakeCluster.made[0].calls
    if keep:
        assert calls[-2:] == ["stop_keeper", ("keeper", 30)] and "drain-budget keeper every 30 s" in result.output
    else:
        assert ("keeper", 30) not in calls and calls[-2:] == ["stop", "remove"]


def _gpugate(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "gpugate"] + list(args), capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.mark.slurm
@pytest.mark.slow
def test_demo_up_drains_a_drifted_node_by_its_keeper_and_down_stops_it(tmp_path):
    _require_slurm()
    where = str(tmp_path / "gg")
    up = _gpugate("demo", "up", "--dir", where, "--nodes", "2", "--interval", "5", timeout=240)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "drain-budget keeper" in up.stdout
        with open(os.path.join(where, "run", "budget.pid")) as handle:
            pid = int(handle.read())
        conf = os.path.join(where, "gpugate.toml")
        # A drift, budgeted: published by the node, drained by the keeper (budget: 1 of 2).
        assert _gpugate("sim", "set", os.path.join(where, "fleet"), "gpu02", "driver=550.54.15").returncode == 0
        deadline, status = time.monotonic() + 120, {}
        while time.monotonic() < deadline:
            out = _gpugate("status", "--json", "--config", conf)
            status = json.loads(out.stdout) if out.returncode == 0 else {}
            if "gpu02" in (status.get("budget_keeper") or {}).get("drained", []):
                break
            time.sleep(3)
        keeper = status.get("budget_keeper") or {}
        assert "gpu02" in keeper.get("drained", []) and keeper.get("ok", True), status
    finally:
        down = _gpugate("demo", "down", "--dir", where, timeout=120)
    assert down.returncode == 0, down.stderr
    time.sleep(0.5)
    with open("/proc/%d/stat" % pid) if os.path.exists("/proc/%d" % pid) else open(os.devnull) as handle:
        stat = handle.read()
    assert not stat or stat.split(") ", 1)[1][0] == "Z", "the keeper outlived demo down"
