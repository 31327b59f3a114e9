"""Node-side entry points run as slurmd runs them (no PATH, only
SLURMD_NODENAME), without Slurm: metrics, the log line, configuration errors."""

import json
import os
import subprocess
import sysconfig

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import DEMO_BASELINE, EXAMPLE_BASELINE, ROOT, gpugate_cmd


def entry(mode):
    return os.path.join(sysconfig.get_path("scripts"), "gpugate-" + mode)


@pytest.fixture
def node_env(fleet, tmp_path):
    config = tmp_path / "gpugate.toml"
    prom = tmp_path / "gpugate.prom"
    config.write_text('baseline = "%s"\nstate_dir = "%s/state/{node}"\nlog = "file"\n'
                      '[healthcheck]\nboot_grace_seconds = 0\nprometheus_textfile = "%s"\n'
                      '[sim]\nfleet = "%s"\n[slurm]\nbin_dir = "%s/no-slurm-here"\n'
                      % (DEMO_BASELINE, tmp_path, prom, fleet, tmp_path))
    return {"config": str(config), "prom": str(prom), "state": str(tmp_path / "state"), "fleet": fleet}


def run_entry(mode, env, node="gpu01", extra_env=None):
    child_env = {"SLURMD_NODENAME": node}
    child_env.update(extra_env or {})
    return subprocess.run([entry(mode), "--config", env["config"]], env=child_env, capture_output=True,
                          text=True, timeout=120)


def metrics(path):
    out = {}
    with open(path) as handle:
        for family in text_string_to_metric_families(handle.read()):
            for sample in family.samples:
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_healthcheck_writes_prometheus_textfile_and_one_log_line(node_env):
    result = run_entry("healthcheck", node_env)
    assert result.returncode == 0, result.stderr
    m = metrics(node_env["prom"])
    assert m[("gpugate_node_fit", ())] == 1
    assert m[("gpugate_component_matches_pin", (("component", "driver"),))] == 1
    gpugate_cmd("sim", "set", node_env["fleet"], "gpu01", "driver=550.54.15", check=True)
    with open(node_env["config"], "a") as handle:  # no Slurm to spread a drift out for
        handle.write("[drain_budget]\njitter_seconds = 0\n")
    result = run_entry("healthcheck", node_env)
    assert result.returncode == 1  # unfit; Slurm is not there to drain it
    m = metrics(node_env["prom"])
    assert m[("gpugate_node_fit", ())] == 0
    assert m[("gpugate_node_unfit", (("class", "drift"),))] == 1
    assert m[("gpugate_component_matches_pin", (("component", "driver"),))] == 0
    assert m[("gpugate_component_matches_pin", (("component", "kernel"),))] == 1
    with open(os.path.join(node_env["state"], "gpu01", "gpugate.log")) as handle:
        lines = [json.loads(line) for line in handle]
    assert len(lines) == 2
    last = lines[-1]
    assert {"node", "mode", "verdict", "reason", "durations", "duration", "ts"} <= set(last)
    assert (last["node"], last["mode"], last["verdict"], last["action"]) == ("gpu01", "healthcheck", "unfit", "failed")
    assert "slurm_error" in last
    # The drain could not be applied: the kernel-log cursor did not move.
    state = json.load(open(os.path.join(node_env["state"], "gpu01", "last-healthcheck.json")))
    assert state["pending_drain"] is True


def test_bad_configuration_changes_nothing_and_says_so(node_env, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('baseline = "relative/path.toml"\n')
    for mode, code in (("healthcheck", 2), ("prolog", 0), ("epilog", 0)):
        # The prolog and epilog exit 0: non-zero would make slurmd drain the
        # node ("Prolog error") for gpugate's own problem, fleet-wide.
        result = subprocess.run([entry(mode), "--config", str(bad)], env={"SLURMD_NODENAME": "gpu01"},
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == code, mode
        assert "baseline: expected an absolute path" in result.stderr and "Traceback" not in result.stderr


def _log(env):
    return [json.loads(line) for line in open(os.path.join(env["state"], "gpu01", "gpugate.log"))]


def test_bad_baseline_push_keeps_judging_with_the_last_good_copy(node_env, tmp_path):
    """A broken baseline pushed to a node that loaded a good one: gating
    goes on with the last good copy (an Xid still drains), nothing is
    drained for the push, and every run says so."""
    from gpugate.node import lastgood

    assert run_entry("healthcheck", node_env).returncode == 0
    where = lastgood.directory(node_env["config"], "gpu01")
    kept = lastgood.kept(where)
    assert kept["baseline.toml"]["source"] == DEMO_BASELINE and kept["gpugate.toml"]["sha256"]
    assert os.stat(os.path.join(where, "baseline.toml")).st_mode & 0o077 == 0  # root's alone
    baseline = tmp_path / "pushed.toml"
    baseline.write_text("[pin\n")  # a broken push
    config = open(node_env["config"]).read().replace(DEMO_BASELINE, str(baseline))
    with open(node_env["config"], "w") as handle:
        handle.write(config)
    result = run_entry("prolog", node_env, extra_env={"SLURM_JOB_ID": "5"})
    assert result.returncode == 0, result.stderr
    assert run_entry("healthcheck", node_env).returncode == 0
    for record in _log(node_env)[-2:]:
        assert record["verdict"] == "fit" and "invalid TOML" in record["config_error"]
        assert "last good baseline" in record["config_error"]
    assert metrics(node_env["prom"])[("gpugate_config_error", ())] == 1
    # Still a gate: an Xid 79 is judged with the last good baseline.
    gpugate_cmd("sim", "set", node_env["fleet"], "gpu01", "gpu.3.xid=79", check=True)
    assert run_entry("healthcheck", node_env).returncode == 1
    assert run_entry("prolog", node_env, extra_env={"SLURM_JOB_ID": "6"}).returncode == 1
    record = _log(node_env)[-1]
    assert record["reason"].startswith("gpugate: health xid:gpu3=79") and record["config_error"]
    # The push is fixed: the error is gone everywhere.
    baseline.write_text(open(DEMO_BASELINE).read())
    os.utime(str(baseline), (1, 1))  # settled: load_toml waits on a file written this instant
    gpugate_cmd("sim", "set", node_env["fleet"], "gpu01", "gpu.3.xid=0", check=True)
    run_entry("healthcheck", node_env)
    assert "config_error" not in _log(node_env)[-1] or not _log(node_env)[-1]["config_error"]
    assert metrics(node_env["prom"])[("gpugate_config_error", ())] == 0


def test_broken_gpugate_toml_falls_back_too_and_first_install_changes_nothing(node_env, tmp_path):
    assert run_entry("healthcheck", node_env).returncode == 0
    good = open(node_env["config"]).read()
    with open(node_env["config"], "w") as handle:
        handle.write(good + "\n[drain_budget]\nmax_share = 7\n")
    assert run_entry("healthcheck", node_env).returncode == 0
    assert run_entry("prolog", node_env, extra_env={"SLURM_JOB_ID": "8"}).returncode == 0
    for record in _log(node_env)[-2:]:
        assert "drain_budget.max_share" in record["config_error"] and "last good gpugate.toml" in record["config_error"]
    # First install: nothing kept for this configuration path yet.
    fresh = tmp_path / "fresh.toml"
    fresh.write_text(good.replace(DEMO_BASELINE, str(tmp_path / "missing.toml")))
    for mode, code in (("healthcheck", 2), ("prolog", 0), ("epilog", 0)):
        result = subprocess.run([entry(mode), "--config", str(fresh)], env={"SLURMD_NODENAME": "gpu01"},
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == code, (mode, result.stderr)
        assert "no last good copy" in result.stderr and "baseline not found" in result.stderr
    record = _log(node_env)[-1]
    assert record["verdict"] == "error" and "no last good copy" in record["config_error"]


def test_prolog_reuses_fresh_verdict_and_records_job_counters(node_env):
    assert run_entry("healthcheck", node_env).returncode == 0
    result = run_entry("prolog", node_env, extra_env={"SLURM_JOB_ID": "77", "SLURM_JOB_GPUS": "0,1"})
    assert result.returncode == 0, result.stderr
    job = json.load(open(os.path.join(node_env["state"], "gpu01", "jobs", "77.json")))
    assert job["gpus"] == [0, 1] and set(job["counters"]) == {"0", "1"}
    log = [json.loads(line) for line in open(os.path.join(node_env["state"], "gpu01", "gpugate.log"))]
    assert log[-1]["mode"] == "prolog" and log[-1]["reused"] is True
    # A changed baseline file invalidates the reuse.
    os.utime(DEMO_BASELINE, None)
    assert run_entry("prolog", node_env, extra_env={"SLURM_JOB_ID": "78"}).returncode == 0
    log = [json.loads(line) for line in open(os.path.join(node_env["state"], "gpu01", "gpugate.log"))]
    assert log[-1]["reused"] is False


def test_epilog_sees_ecc_errors_raised_during_the_job(node_env):
    assert run_entry("healthcheck", node_env).returncode == 0
    assert run_entry("prolog", node_env, extra_env={"SLURM_JOB_ID": "90", "SLURM_JOB_GPUS": "2"}).returncode == 0
    gpugate_cmd("sim", "set", node_env["fleet"], "gpu01", "gpu.2.ecc.uncorrected.volatile=1", check=True)
    result = run_entry("epilog", node_env, extra_env={"SLURM_JOB_ID": "90", "SLURM_JOB_GPUS": "2"})
    assert result.returncode == 1  # unfit and Slurm unreachable: slurmd drains it ("Epilog error")
    log = [json.loads(line) for line in open(os.path.join(node_env["state"], "gpu01", "gpugate.log"))]
    assert log[-1]["reason"].startswith("gpugate: health ")
    # Both the absolute count and the delta against the prolog's counters.
    assert "ecc:gpu2=1 uncorrected (want <= 0)" in log[-1]["reason"]
    assert "ecc_during_job:gpu2=+1 (want +0)" in log[-1]["reason"]
    assert not os.path.exists(os.path.join(node_env["state"], "gpu01", "jobs", "90.json"))


def test_example_configuration_files_are_valid():
    from gpugate.model.baseline import load_baseline
    from gpugate.model.config import load_settings

    settings = load_settings(os.path.join(ROOT, "slurm_conf", "gpugate.example.toml"))
    assert settings.budgets["healthcheck"] < 60 and settings.sweep["converge"]
    assert load_baseline(EXAMPLE_BASELINE).pin.driver


def test_slurm_conf_names_installed_entry_points():
    result = gpugate_cmd("slurm-conf")
    assert result.returncode == 0
    for mode, key in (("healthcheck", "HealthCheckProgram"), ("prolog", "Prolog"), ("epilog", "Epilog")):
        line = [l for l in result.stdout.splitlines() if l.startswith(key + "=")][0]
        path = line.split("=", 1)[1]
        assert path == entry(mode) and os.access(path, os.X_OK)
    assert "HealthCheckTimeout" in gpugate_cmd("slurm-conf", "--release", "26.05").stdout
    assert "health_check_report" in gpugate_cmd("slurm-conf", "--release", "26.05").stdout
    for release in ("24.11", "26.11"):  # not there yet; always on
        assert "health_check_report" not in gpugate_cmd("slurm-conf", "--release", release).stdout
    assert "NONDRAINED_IDLE" in gpugate_cmd("slurm-conf", "--release", "24.11").stdout
    assert gpugate_cmd("slurm-conf", "--release", "latest").returncode == 2


@pytest.mark.parametrize("release", ["22.05", "26.05"])
def test_slurm_conf_adds_to_list_parameters_instead_of_replacing_them(release):
    # A pasted SchedulerParameters= or PrologFlags= line would drop the site's own values.
    lines = gpugate_cmd("slurm-conf", "--release", release, check=True).stdout.splitlines()
    for key in ("SchedulerParameters", "PrologFlags", "SlurmctldParameters"):
        assert not [l for l in lines if l.startswith(key + "=")]
    assert "#SchedulerParameters=nohold_on_prolog_fail" in lines and "#PrologFlags=Alloc" in lines
    text = "\n".join(lines)
    assert "add nohold_on_prolog_fail\n# to yours" in text and "add Alloc to yours" in text


def test_boot_grace_reports_transient_findings_without_draining_or_undraining(node_env):
    config = open(node_env["config"]).read().replace("boot_grace_seconds = 0", "boot_grace_seconds = 86400")
    with open(node_env["config"], "w") as handle:
        handle.write(config)
    os.rename(os.path.join(node_env["fleet"], "gpu01", "bin", "dcgmi"),
              os.path.join(node_env["fleet"], "gpu01", "bin", "dcgmi.away"))
    result = run_entry("healthcheck", node_env)
    assert result.returncode == 0
    log = [json.loads(line) for line in open(os.path.join(node_env["state"], "gpu01", "gpugate.log"))]
    assert log[-1]["boot_grace"] is True and log[-1]["action"] == "none"
    state = json.load(open(os.path.join(node_env["state"], "gpu01", "last-healthcheck.json")))
    assert state["fit"] is False  # the prolog must not reuse it as fit
    # A real fault during the grace period still drains (here: Slurm is absent, so it fails).
    gpugate_cmd("sim", "set", node_env["fleet"], "gpu01", "gpu.3.xid=79", check=True)
    assert run_entry("healthcheck", node_env).returncode == 1
    log = [json.loads(line) for line in open(os.path.join(node_env["state"], "gpu01", "gpugate.log"))]
    assert log[-1]["reason"] == "gpugate: health xid:gpu3=79 (want none)" and log[-1]["action"] == "failed"


def test_prolog_exits_1_when_unfit_whatever_happened_to_the_drain(node_env):
    assert run_entry("healthcheck", node_env).returncode == 0
    gpugate_cmd("sim", "set", node_env["fleet"], "gpu01", "gpu.4.remapped_rows.pending=1", check=True)
    result = run_entry("prolog", node_env, extra_env={"SLURM_JOB_ID": "12"})
    assert result.returncode == 1  # Slurm requeues the job
    log = [json.loads(line) for line in open(os.path.join(node_env["state"], "gpu01", "gpugate.log"))]
    assert log[-1]["reason"] == "gpugate: health row_remap:gpu4=pending (want none)"


@pytest.mark.parametrize("text, expected", [
    ("", None),
    ("HealthCheckInterval=300\nHealthCheckTimeout=90\n", 90),
    ("healthchecktimeout = 45   # short\n", 45),
    ("NodeName=x HealthCheckTimeout=30 Port=1\n", 30),  # several keys on one line
    ("# HealthCheckTimeout=10\nHealthCheckTimeout=20\nHealthCheckTimeout=25\n", 25),  # the last wins
    ("HealthCheckTimeout=0\n", None),  # Slurm resets 0 to its default
    ("HealthCheckTimeout=abc\n", None),
    ("MyHealthCheckTimeout=5\n", None),
])
def test_health_check_timeout_from_slurm_conf(text, expected):
    from gpugate.node.slurmd_limits import parse_health_check_timeout

    assert parse_health_check_timeout(text) == expected


def test_healthcheck_budget_ends_before_slurmd_kills_it():
    from gpugate.node.slurmd_limits import healthcheck_budget

    assert healthcheck_budget(40, None) == 40  # up to 25.11: killed at 60 s
    assert healthcheck_budget(40, 120) == 40  # a longer timeout: the configured budget rules
    assert healthcheck_budget(100, 120) == 110 - 10 and healthcheck_budget(40, 30) == 20
    assert healthcheck_budget(40, 8) == 4  # tiny: half of it, rather than nothing


def test_healthcheck_honours_healthchecktimeout_of_26_05(node_env, tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nHealthCheckTimeout=20\n")
    with open(node_env["config"]) as handle:
        text = handle.read()
    with open(node_env["config"], "w") as handle:
        handle.write(text.replace("[slurm]\n", '[slurm]\nslurm_conf = "%s"\n' % conf))
    result = run_entry("healthcheck", node_env)
    assert result.returncode == 0, result.stderr
    with open(os.path.join(node_env["state"], "gpu01", "gpugate.log")) as handle:
        record = json.loads(handle.read().splitlines()[-1])
    assert record["budget"] == 10.0 and record["verdict"] == "fit"


@pytest.mark.parametrize("value, expected", [
    ("yes", True), ("no", False), ("YES\n", True), ("", None), ("maybe", None), (None, None),
])
def test_slurm_node_is_healthy_from_slurmd(value, expected):
    from gpugate.node.slurmd_limits import slurm_node_is_healthy

    environ = {} if value is None else {"SLURM_NODE_IS_HEALTHY": value}
    assert slurm_node_is_healthy(environ) is expected


def test_fit_node_slurmd_reports_in_service_needs_no_controller(node_env):
    """26.05.2+ slurmd tells the health check whether slurmctld holds the node
    in service.  A fit node with gpugate's drain marker (its drain may have
    been lifted by the sweep or an admin) then needs no controller read; "no",
    or no word from slurmd, still reads it (Slurm is absent here: that read
    fails, which is what shows it was tried)."""
    marker = os.path.join(node_env["state"], "gpu01", "drained-by-gpugate")

    def last_record(**env):
        os.makedirs(os.path.dirname(marker), exist_ok=True)
        open(marker, "w").close()
        result = run_entry("healthcheck", node_env, extra_env=env)
        with open(os.path.join(node_env["state"], "gpu01", "gpugate.log")) as handle:
            return result.returncode, json.loads(handle.read().splitlines()[-1])

    code, record = last_record(SLURM_NODE_IS_HEALTHY="yes")
    assert code == 0 and record["verdict"] == "fit"
    assert (record["action"], record["rpc"], record["slurm_in_service"]) == ("none", False, True)
    assert "slurm_error" not in record and os.path.exists(marker)
    code, record = last_record(SLURM_NODE_IS_HEALTHY="no")
    assert (record["action"], record["rpc"], record["slurm_in_service"]) == ("failed", True, False)
    code, record = last_record()
    assert (record["action"], record["rpc"]) == ("failed", True) and "slurm_in_service" not in record
    # Unfit: slurmd's word does not spare the read, the drain is attempted.
    with open(node_env["config"], "a") as handle:
        handle.write("[drain_budget]\njitter_seconds = 0.2\n")
    gpugate_cmd("sim", "set", node_env["fleet"], "gpu01", "driver=550.54.15", check=True)
    code, record = last_record(SLURM_NODE_IS_HEALTHY="yes")
    assert code == 1 and (record["verdict"], record["action"], record["rpc"]) == ("unfit", "failed", True)
    # Nothing is spread out: a node reads only its own record and publishes
    # a budgeted finding for the keeper (issue 26), so a fleet-wide finding
    # costs slurmctld no full read to spread.
    assert "jitter" not in record
    code, record = last_record(SLURM_NODE_IS_HEALTHY="no")
    assert code == 1 and record["action"] == "failed" and "jitter" not in record


def test_one_run_acts_on_a_node_at_a_time(tmp_path):
    from gpugate.errors import GpugateError
    from gpugate.node.act import _act_lock

    where = str(tmp_path / "state")
    with _act_lock(where, 0.1):
        with pytest.raises(GpugateError, match="another gpugate run is acting"):
            with _act_lock(where, 0.1):
                pass
    with _act_lock(where, 0.1):  # released on the way out, the failed attempt's file closed too
        assert os.path.exists(os.path.join(where, "locks", "act.lock"))
