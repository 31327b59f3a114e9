"""No trap on day one: `baseline capture --nodes HOSTLIST` writes the node
section for the whole hostlist (and says so when it writes one node
only), `baseline check` refuses a baseline that leaves audited nodes
uncovered, and the controller's timers for `gpugate audit` and `gpugate
metrics -o` ship beside the keeper's and the sweep's, their commands
parsed by the real CLI."""

import os
import re
import shlex

import click
import pytest
import yaml

from conftest import DEMO_BASELINE, ROOT, gpugate_cmd
from gpugate.model.baseline import load_baseline
from test_kmsg_follow_restart import _unit
from test_predict import audited, check, demo_with  # noqa: F401 (a fixture)

SLURM_CONF = os.path.join(ROOT, "slurm_conf")


def sim_fleet(tmp_path, nodes):
    path = str(tmp_path / "fleet")
    gpugate_cmd("sim", "init", path, "--nodes", nodes, "--baseline", DEMO_BASELINE, check=True)
    return path


def fit(fleet, node, baseline):
    import json

    result = gpugate_cmd("check", "--sim", fleet, "--node", node, "--baseline", baseline, "--json")
    return json.loads(result.stdout)


# ---------------------------------------------------------------------------
# baseline capture --nodes


def test_capture_for_a_hostlist_covers_every_node_of_it(tmp_path):
    fleet = sim_fleet(tmp_path, "gpu[01-03]")
    out = str(tmp_path / "b.toml")
    result = gpugate_cmd("baseline", "capture", "--node", "gpu01", "--nodes", "gpu01,gpu02,gpu03", "--sim", fleet,
                         "-o", out)
    assert result.returncode == 0, result.stderr
    text = open(out).read()
    assert '[nodes."gpu[01-03]"]' in text  # folded as ClusterShell writes it
    assert "covers gpu01 only" not in result.stderr and "uncovered" not in result.stderr
    captured = load_baseline(out)
    assert all(captured.covers(n) for n in ("gpu01", "gpu02", "gpu03")) and not captured.covers("gpu04")
    for node in ("gpu02", "gpu03"):  # the other nodes are fit under it, not `probe uncovered`
        verdict = fit(fleet, node, out)
        assert verdict["fit"] is True, verdict["reason"]


def test_capture_of_one_node_says_every_other_node_reads_uncovered(tmp_path):
    fleet = sim_fleet(tmp_path, "gpu[01-02]")
    out = str(tmp_path / "b.toml")
    result = gpugate_cmd("baseline", "capture", "--node", "gpu01", "--sim", fleet, "-o", out)
    assert result.returncode == 0, result.stderr
    assert '[nodes."gpu01"]' in open(out).read()
    assert "covers gpu01 only" in result.stderr and "probe uncovered=" in result.stderr
    assert "--nodes 'gpu[001-200]'" in result.stderr
    verdict = fit(fleet, "gpu02", out)  # what the note warns of
    assert verdict["fit"] is False and "uncovered=gpu02" in verdict["reason"]


def test_capture_refuses_a_hostlist_the_baseline_would_refuse_and_warns_when_the_node_is_outside(tmp_path):
    fleet = sim_fleet(tmp_path, "gpu01")
    result = gpugate_cmd("baseline", "capture", "--node", "gpu01", "--nodes", "@gpus", "--sim", fleet)
    assert result.returncode == 2 and "--nodes '@gpus'" in result.stderr, result.stderr
    result = gpugate_cmd("baseline", "capture", "--node", "gpu01", "--nodes", "gpu[02-08]", "--sim", fleet)
    assert result.returncode == 0, result.stderr
    assert "does not name gpu01" in result.stderr
    assert '[nodes."gpu[02-08]"]' in result.stdout


def test_capture_warns_when_the_node_named_is_not_this_host(tmp_path):
    """--node only names the result: the facts are this machine's unless a
    simulated fleet is read.  Captured on the controller "for gpu01", the
    baseline would pin the controller's stack; said on stderr, before the
    facts are read (a controller without a driver then fails as well)."""
    import socket

    from gpugate.fleet.coverage import host_notes

    assert host_notes("gpu01", "gpu01") == [] and host_notes("gpu01", "gpu01.cluster.example") == []
    assert host_notes("GPU01", "gpu01.example") == [] and host_notes("gpu01.example", "gpu01.example") == []
    assert host_notes("gpu01", None) == []  # a simulated fleet: the node's own facts
    (note,) = host_notes("gpu01", "ctl01.cluster.example")
    assert "--node gpu01 is not this host (ctl01)" in note and "on gpu01 itself" in note

    config = tmp_path / "gpugate.toml"  # no [sim]: this machine's facts
    config.write_text('baseline = "%s"\n' % (tmp_path / "none.toml"))
    other = "not-" + socket.gethostname().split(".")[0]
    result = gpugate_cmd("baseline", "capture", "--config", str(config), "--node", other, "-o",
                         str(tmp_path / "b.toml"))
    assert "Traceback" not in result.stderr
    assert "warning: --node %s is not this host" % other in result.stderr, result.stderr
    fleet = sim_fleet(tmp_path, "gpu01")
    result = gpugate_cmd("baseline", "capture", "--node", "gpu01", "--nodes", "gpu01", "--sim", fleet)
    assert result.returncode == 0 and "not this host" not in result.stderr, result.stderr


# ---------------------------------------------------------------------------
# baseline check refuses uncovered audited nodes


def test_check_refuses_a_baseline_leaving_an_audited_node_uncovered(audited, tmp_path):
    """gpu[01-08] answered the audit, gpu09 did not.  Covering gpu[01-07]
    leaves gpu08 uncovered: within the budget (1 of 7 in partition gpu), so
    the budget alone passed it; now it is refused, naming gpu08."""
    tmp, config = audited
    new = demo_with(tmp_path, "seven.toml", ('[nodes."gpu[01-99]"]', '[nodes."gpu[01-07]"]'))
    result = check(config, new)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "within budget" in result.stdout and "OVER" not in result.stdout  # not the budget's refusal
    assert "leaves 1 audited node uncovered: gpu08" in result.stderr
    assert "--nodes" in result.stderr  # what to do
    assert "did not reach them (not refused for them): gpu09" in result.stderr
    data = check(config, new, "--json")
    import json

    body = json.loads(data.stdout)
    assert data.returncode == 1 and body["exit_code"] == 1
    assert body["uncovered_refused"] == {"count": 1, "nodes": "gpu08"}


def test_check_passes_a_baseline_covering_every_audited_node(audited, tmp_path):
    tmp, config = audited
    new = demo_with(tmp_path, "split.toml", ('[nodes."gpu[01-99]"]', '[nodes."gpu[01-04]"]\ngpus = 8\n'
                                            '[nodes."gpu[05-08]"]'))
    result = check(config, new)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "uncovered" not in result.stderr


def test_check_help_says_there_is_no_override():
    text = gpugate_cmd("baseline", "check", "--help", check=True).stdout
    assert "uncovered" in text and "no override" in text


# ---------------------------------------------------------------------------
# the controller's timers


def unit(name):
    """{section: {key: value}} of a shipped systemd unit (the last assignment wins)."""
    return _unit(os.path.join(SLURM_CONF, name))


def seconds(span):
    """A systemd time span (systemd.time(7)): "1h 30min", "45min", "30s", "120"."""
    units = {"": 1, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600, "hr": 3600, "d": 86400}
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", span)
    assert parts and re.fullmatch(r"(\s*\d+(?:\.\d+)?\s*[a-z]*)+\s*", span), span
    return sum(float(number) * units[suffix] for number, suffix in parts)


def parse_cli(argv):
    """The click context the real CLI builds for argv (parsed, never run):
    a UsageError for an unknown command or option."""
    from gpugate.cli.main import main

    def rest(ctx):
        protected = getattr(ctx, "_protected_args", None)
        return list(protected if protected is not None else ctx.protected_args) + list(ctx.args)

    ctx, cmd = main.make_context("gpugate", list(argv)), main
    args = rest(ctx)
    while isinstance(cmd, click.Group) and args:
        name, cmd, args = cmd.resolve_command(ctx, args)
        ctx = cmd.make_context(name, args, parent=ctx)
        args = rest(ctx)
    assert not args, args
    return ctx


def exec_start(service):
    argv = shlex.split(unit(service)["Service"]["ExecStart"])
    assert argv[0] == "/opt/gpugate/bin/gpugate", argv
    return parse_cli(argv[1:])


TIMERS = ("gpugate-audit", "gpugate-metrics", "gpugate-budget", "gpugate-sweep")


@pytest.mark.parametrize("name", TIMERS)
def test_every_shipped_timer_runs_a_command_the_cli_parses(name):
    timer = unit(name + ".timer")
    assert timer["Install"]["WantedBy"] == "timers.target" and seconds(timer["Timer"]["OnUnitInactiveSec"]) > 0
    service = unit(name + ".service")
    assert service["Service"]["Type"] == "oneshot" and "slurmctld.service" in service["Unit"]["After"]
    ctx = exec_start(name + ".service")
    assert ctx.command.name == name.split("-", 1)[1]
    assert ctx.params["config"] == "/etc/gpugate/gpugate.toml"
    with pytest.raises(click.UsageError):  # the parser really checks
        parse_cli(["audit", "--no-such-flag"])


def test_the_metrics_timer_writes_the_textfile_well_within_the_alert_s_staleness():
    ctx = exec_start("gpugate-metrics.service")
    assert ctx.params["output"].endswith(".prom") and os.path.isabs(ctx.params["output"])
    rules = yaml.safe_load(open(os.path.join(SLURM_CONF, "gpugate-alerts.yml")))
    alert = next(r for g in rules["groups"] for r in g["rules"] if r.get("alert") == "GpugateControllerMetricsStale")
    stale = float(re.fullmatch(r"time\(\) - gpugate_metrics_timestamp_seconds > (\d+)", alert["expr"]).group(1))
    timer, service = unit("gpugate-metrics.timer")["Timer"], unit("gpugate-metrics.service")["Service"]
    worst = (seconds(timer["OnUnitInactiveSec"]) + seconds(timer.get("RandomizedDelaySec", "0s"))
             + seconds(timer.get("AccuracySec", "1min")) + seconds(service["TimeoutStartSec"]))
    assert worst * 5 < stale, (worst, stale)  # a few failed runs in a row are not yet an alert


def test_the_audit_timer_keeps_what_baseline_check_needs():
    """`baseline check` reads audit.json next to the sweep journal of the
    same gpugate.toml, with Slurm's partitions: every node (no -w/-p), run
    on the controller after slurmctld; drift (exit 1) is not a failure."""
    ctx = exec_start("gpugate-audit.service")
    assert ctx.params["nodes"] is None and ctx.params["partition"] == () and ctx.params["baseline_path"] is None
    assert exec_start("gpugate-sweep.service").params["config"] == ctx.params["config"]
    service = unit("gpugate-audit.service")["Service"]
    assert "1" in service["SuccessExitStatus"].split()
    assert seconds(service["TimeoutStartSec"]) < seconds(unit("gpugate-audit.timer")["Timer"]["OnUnitInactiveSec"])
    assert ctx.params["max_age"] < seconds(unit("gpugate-audit.timer")["Timer"]["OnUnitInactiveSec"])


def test_the_sweep_timer_runs_the_timer_safe_rollout_mode():
    params = exec_start("gpugate-sweep.service").params
    assert params["apply_"] and params["rollout_if"] and not params["rollout"]
