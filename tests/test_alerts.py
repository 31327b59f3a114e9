"""slurm_conf/gpugate-alerts.yml, checked by the real promtool: its unit
tests are fed with metrics gpugate itself wrote (the health check entry
point on simulated nodes, the controller's families), each written sample
held constant over the test.  Timestamps are rebased: the moment gpugate
wrote them is the test's t=0 (promtool's clock starts at the epoch)."""

import json
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import DEMO_BASELINE, ROOT, gpugate_cmd

pytestmark = pytest.mark.promtool
RULES = os.path.join(ROOT, "slurm_conf", "gpugate-alerts.yml")
STEPS = 70  # one sample a minute; alerts are evaluated at 60m, past every `for:`


def promtool() -> str:
    path = shutil.which("promtool")
    if not path:
        why = "promtool is not installed (apt-get install prometheus; scripts/setup does)"
        if os.environ.get("GPUGATE_REQUIRE_PROMTOOL"):
            pytest.fail(why)
        pytest.skip(why)
    return path


def test_alert_rules_are_valid():
    result = subprocess.run([promtool(), "check", "rules", RULES], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def _run_healthcheck(config, node):
    # As slurmd runs it: no PATH, only SLURMD_NODENAME (this tree's code).
    result = subprocess.run([sys.executable, os.path.join(ROOT, "healthcheck", "gpugate-healthcheck"),
                             "--config", config], env={"SLURMD_NODENAME": node, "PYTHONPATH": ROOT},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode in (0, 1), result.stderr


def node_textfiles(tmp_path) -> dict:
    """node -> the textfile its health check wrote."""
    fleet, prom = str(tmp_path / "fleet"), str(tmp_path / "node.prom")
    baseline = tmp_path / "baseline.toml"
    baseline.write_text(open(DEMO_BASELINE).read())
    os.utime(str(baseline), (1, 1))  # settled: load_toml waits on a file written this instant
    gpugate_cmd("sim", "init", fleet, "--nodes", "gpu[01-03]", "--baseline", str(baseline), check=True)
    gpugate_cmd("sim", "set", fleet, "gpu03", "driver=550.54.15", check=True)
    config = tmp_path / "gpugate.toml"
    config.write_text('baseline = "%s"\nstate_dir = "%s/state/{node}"\nlog = "file"\n'
                      '[healthcheck]\nboot_grace_seconds = 0\nprometheus_textfile = "%s"\n'
                      '[drain_budget]\njitter_seconds = 0\n[sim]\nfleet = "%s"\n[slurm]\nbin_dir = "%s/no-slurm"\n'
                      % (baseline, tmp_path, prom, fleet, tmp_path))
    out = {}

    def _healthcheck(config, node):  # with gpugate kmsg-follow running: its heartbeat, fresh
        _follower_heartbeat(str(tmp_path / "state" / node), fleet, node)
        _run_healthcheck(config, node)

    for node in ("gpu01", "gpu02"):
        _healthcheck(str(config), node)
        out[node] = open(prom).read()
    from gpugate.node.metrics import write_lock_stuck

    assert write_lock_stuck(prom, "healthcheck", 1000) == ""  # gpu05: gpu02's textfile, its lock stuck since
    out["gpu05"] = open(prom).read()
    baseline.write_text("[pin\n")  # a broken push: gpu02 judges with its last good copy
    _healthcheck(str(config), "gpu02")
    out["gpu02"] = open(prom).read()
    baseline.write_text(open(DEMO_BASELINE).read())
    os.utime(str(baseline), (1, 1))
    # Held needs Slurm's view of the partition: gpugate's writer, given a real check's verdict.
    from gpugate.model.config import load_checked_baseline, load_settings
    from gpugate.node.metrics import write_node_textfile
    from gpugate.node.check import run_check

    settings = load_settings(str(config))
    loaded = load_checked_baseline(settings)
    _follower_heartbeat(str(tmp_path / "state" / "gpu03"), fleet, "gpu03")
    result = run_check(settings, loaded, "gpu03", "healthcheck")
    assert not result.verdict.fit
    write_node_textfile(prom, "gpu03", result.verdict, result.facts, loaded, held=True)
    out["gpu03"] = open(prom).read()
    return out


def _follower_heartbeat(state_dir, fleet, node):
    import time

    from gpugate.node.kmsgfollow import Follower
    from gpugate.probes.files import boot_id

    Follower(state_dir, boot_id(os.path.join(fleet, node, "root")), time.time()).close(time.time())
    path = os.path.join(state_dir, "kmsg", "follower.json")
    beat = json.load(open(path))
    beat["running"] = True  # as the running follower's last heartbeat says
    with open(path, "w") as handle:
        json.dump(beat, handle)


def flooded_textfile() -> str:
    """A node whose ring a flood overwrote, no follower running: what its health check writes."""
    from gpugate.node.metrics import kernel_log_families
    from gpugate.core.promtext import render

    facts = SimpleNamespace(kernel_log_lost={"records": 2000, "first": 1001, "last": 3000},
                            kernel_log_follower={"follower": "absent", "covered": False, "why": "no follower"})
    return render(kernel_log_families(facts))


def write_error_textfile(tmp_path) -> str:
    """A node whose state directory filled up: the follower's heartbeat after
    its journal write failed (ENOSPC at the write boundary), read back as the
    health check reads it, and what the check writes of it."""
    import errno
    import time

    from unittest import mock

    from gpugate.node.kmsgfollow import Follower
    from gpugate.node.metrics import kernel_log_families
    from gpugate.probes.gpujournal import coverage, read_heartbeat
    from gpugate.core.promtext import render

    state, boot = str(tmp_path / "full"), "b" * 32
    follower = Follower(state, boot, time.time())

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    with mock.patch("gpugate.probes.gpujournal.os.write", full):
        follower.feed(["3,1001,5,-;NVRM: Xid (PCI:0000:1b:00): 79, pid=1, GPU has fallen off the bus."])
    follower.heartbeat(time.time())
    cover = coverage(read_heartbeat(state), boot, None, time.time() + 1, 60)  # the next check's
    assert cover["follower"] == "following" and cover["follower_write_errors"] >= 1, cover
    return render(kernel_log_families(SimpleNamespace(kernel_log_lost=None, kernel_log_follower=cover)))


def controller_textfile(alarm: bool) -> str:
    from gpugate.budget.rules import Use
    from gpugate.fleet.metrics import fleet_families, keeper_families
    from gpugate.core.promtext import render

    def view(cls):
        return SimpleNamespace(ours=SimpleNamespace(cls=cls) if cls else None, in_service=cls is None)

    nodes = {"gpu01": view(None), "gpu02": view("drift"), "gpu03": view("rma" if alarm else None)}
    budget = {"gpu": Use("gpu", 8, 1, ("gpu02",) if alarm else ())}
    audit = {"at": 1.0, "facts": {}, "config_errors": {"gpu05": "baseline.toml: invalid TOML"} if alarm else {}}
    last_run = (3, 1.0, 2.0, 42, "stopped" if alarm else "ok")
    # The budget keeper: it ran (quiet), or never ran here (alarm: nothing budgeted is drained).
    keeper = None if alarm else {"ok": True, "last_ok": 1.0, "drained": ["gpu02"], "given_back": [], "held": 0}
    return render(fleet_families(SimpleNamespace(nodes=nodes), {}, audit, None, budget, last_run)
                  + keeper_families(keeper, 1.0, {"gpu": 0}))


def series(text: str, instance: str, stale: bool) -> list:
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = dict(s.labels, instance=instance)
            name = "%s{%s}" % (s.name, ",".join('%s="%s"' % kv for kv in sorted(labels.items())))
            if s.name.endswith("_timestamp_seconds"):
                values = "0x%d" % STEPS if stale else "0+60x%d" % STEPS  # rewritten every minute, or never again
            else:
                values = "%sx%d" % (repr(float(s.value)), STEPS)
            out.append({"series": name, "values": values})
    return out


def expected(rules, alert, labels) -> dict:
    rule = rules[alert]
    annotations = {}
    for key, text in rule.get("annotations", {}).items():
        for label, value in labels.items():
            text = text.replace("{{ $labels.%s }}" % label, value)
        annotations[key] = text
    return {"exp_labels": dict(labels, **rule.get("labels", {})), "exp_annotations": annotations}


def test_alerts_fire_on_what_gpugate_wrote(tmp_path):
    tool = promtool()
    import yaml  # pyyaml: a test dependency (setup.cfg)
    with open(RULES) as handle:
        rules = {r["alert"]: r for g in yaml.safe_load(handle)["groups"] for r in g["rules"]}
    node = node_textfiles(tmp_path)
    quiet = series(node["gpu01"], "gpu01", False) + series(controller_textfile(False), "ctl", False)
    from gpugate.node.metrics import clock_families
    from gpugate.core.promtext import render

    # A power brake on three nodes at once (the room): what each node's health check writes.
    braked = render(clock_families({"power_brake": 0.3}))
    alarm = (series(node["gpu02"], "gpu02", False) + series(node["gpu03"], "gpu03", False)
             + [s for n in ("gpu06", "gpu07", "gpu08") for s in series(braked, n, False)]
             + series(node["gpu01"], "gpu04", True) + series(node["gpu05"], "gpu05", False)
             + series(flooded_textfile(), "gpu09", False)
             + series(write_error_textfile(tmp_path), "gpu10", False)
             + series(controller_textfile(True), "ctl", True))
    fire = {
        "GpugateDrainHeld": [{"instance": "gpu03"}],
        "GpugateDrainBudgetSpent": [{"instance": "ctl", "partition": "gpu"}],
        "GpugateConfigError": [{"instance": "gpu02"}],
        "GpugateAuditConfigError": [{"instance": "ctl"}],
        "GpugateRmaEscalation": [{"instance": "ctl", "class": "rma"}],
        "GpugateSweepStopped": [{"instance": "ctl"}],
        "GpugateHealthCheckStale": [{"instance": "gpu04"}],
        "GpugateControllerMetricsStale": [{"instance": "ctl"}],
        "GpugateBudgetKeeperStale": [{"instance": "ctl"}],
        "GpugateLockStuck": [{"instance": "gpu05", "lock": "healthcheck"}],
        "GpugateClockEventsRoomWide": [{"reason": "power_brake"}],
        "GpugateKmsgFollowerDown": [{"instance": "gpu09"}],
        "GpugateKernelLogUnwatched": [{"instance": "gpu09"}],
        "GpugateKernelLogFlood": [{"instance": "gpu09"}],
        "GpugateKmsgJournalWriteError": [{"instance": "gpu10"}],
    }
    assert set(fire) == set(rules)  # every rule is tested
    tests = [
        {"interval": "1m", "input_series": quiet,
         "alert_rule_test": [{"eval_time": "60m", "alertname": a, "exp_alerts": []} for a in sorted(rules)]},
        {"interval": "1m", "input_series": alarm,
         "alert_rule_test": [{"eval_time": "60m", "alertname": a,
                              "exp_alerts": [expected(rules, a, l) for l in fire[a]]} for a in sorted(rules)]},
    ]
    spec = tmp_path / "gpugate-alerts.test.yml"
    spec.write_text(json.dumps({"rule_files": [RULES], "evaluation_interval": "1m", "tests": tests}, indent=1))
    result = subprocess.run([tool, "test", "rules", str(spec)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
