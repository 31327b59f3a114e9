"""slurmd's own HealthCheckProgram runs gpugate against a real slurmctld."""

import os
import time

import pytest
from conftest import check_now, run_entry

from gpugate.testbed import slurm_version
from gpugate.testbed.files import rig_backend

pytestmark = pytest.mark.slurm
INTERVAL = 5
CLUSTER = {"nodes": 6, "interval": INTERVAL, "extra": "[budgets]\nhealthcheck = 8\n"}


def drained(cluster, node):
    return lambda: "drain" in cluster.state(node)


def test_drifted_node_drained_within_two_intervals_healthy_untouched(cluster):
    cluster.sim("set", "FLEET", "gpu02", "driver=550.54.15")
    started = time.monotonic()
    cluster.wait_for(drained(cluster, "gpu02"), 2 * INTERVAL + 15, "gpu02 drained")
    took = time.monotonic() - started
    reason = cluster.reason("gpu02")
    assert reason.startswith("gpugate: drift driver=550.54.15 (want 580.65.06)")
    sinfo = cluster.run(["/usr/bin/sinfo", "-R", "-h", "-o", "%E|%N"]).stdout
    assert "gpugate: drift driver=550.54.15 (want 580.65.06)" in sinfo and "|gpu02" in sinfo
    for node in ("gpu01", "gpu03"):
        assert cluster.state(node) == "idle" and cluster.reason(node) == ""
    assert took < 2 * INTERVAL + 15
    # The log line names the Slurm backend that drained (the rig's: both on 25.11).
    acted = cluster.records_when("gpu02", lambda r: r.get("action") == "drain")
    assert acted[-1]["backend"] == rig_backend(), acted[-1:]


# long: ~20 s; out of the default run for its ten minutes (CI runs it on every release).
@pytest.mark.long
def test_admin_drain_is_never_overwritten_nor_resumed(cluster):
    cluster.scontrol("update", "NodeName=gpu03", "State=DRAIN", "Reason=rack maintenance")
    cluster.sim("set", "FLEET", "gpu03", "gpu.3.xid=79")
    time.sleep(3 * INTERVAL)
    assert cluster.reason("gpu03") == "rack maintenance"
    records = [r for r in cluster.log_records("gpu03") if r.get("verdict") == "unfit"]
    assert records and records[-1]["action"] == "keep_admin"
    # Fit again: still the admin's drain.
    cluster.sim("set", "FLEET", "gpu03", "reboot=1")
    time.sleep(2 * INTERVAL)
    assert "drain" in cluster.state("gpu03") and cluster.reason("gpu03") == "rack maintenance"


# long: ~20 s; out of the default run for its ten minutes (CI runs it on every release).
@pytest.mark.long
def test_probe_drain_clears_itself_other_classes_wait(cluster):
    dcgmi = os.path.join(cluster.fleet, "gpu04", "bin", "dcgmi")
    os.rename(dcgmi, dcgmi + ".away")
    cluster.wait_for(drained(cluster, "gpu04"), 2 * INTERVAL + 15, "gpu04 drained")
    assert cluster.reason("gpu04").startswith("gpugate: probe dcgm=missing")
    os.rename(dcgmi + ".away", dcgmi)
    cluster.wait_for(lambda: cluster.state("gpu04") == "idle", 2 * INTERVAL + 15, "gpu04 undrained")
    cluster.records_when("gpu04", lambda r: r.get("action") == "undrain")  # the undrain's line, written as it ends
    records = cluster.log_records("gpu04")
    undrain = [i for i, r in enumerate(records) if r.get("action") == "undrain"]
    assert undrain
    # The undrain read the controller; the checks after it need not.
    cluster.wait_for(lambda: len(cluster.log_records("gpu04")) > undrain[-1] + 2, 3 * INTERVAL + 10,
                     "two more health checks on gpu04")
    records = cluster.log_records("gpu04")
    later = [r for r in records[undrain[-1] + 1:] if r.get("mode") == "healthcheck" and r.get("verdict") == "fit"]
    assert records[undrain[-1]]["rpc"] is True and later and all(r["rpc"] is False for r in later)
    if slurm_version() >= (26, 5):  # slurmd's word on 26.05: drained, then in service
        assert records[undrain[-1]]["slurm_in_service"] is False
        assert later[-1]["slurm_in_service"] is True


def _healthcheck_ages(cluster, node):
    """How long each live gpugate health check this cluster's slurmd started
    for ``node`` has run, in seconds.  A check's own NVML reader (a forked
    child) is part of that check, not another run; a check of another
    cluster's node of the same name (a test running beside this one) is not
    this node's: this cluster's shim sets its own GPUGATE_SLURM_TRACE."""
    mine = b"GPUGATE_SLURM_TRACE=" + cluster.path("log", "slurm-calls.log").encode()
    ticks = os.sysconf("SC_CLK_TCK")
    with open("/proc/uptime") as handle:
        uptime = float(handle.read().split()[0])
    ages = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as handle:
                cmdline = handle.read()
            with open("/proc/%s/environ" % pid, "rb") as handle:
                environ = handle.read().split(b"\0")
        except OSError:
            continue
        if b"gpugate-healthcheck" in cmdline and b"SLURMD_NODENAME=" + node.encode() in environ \
                and mine in environ:
            try:
                with open("/proc/%s/stat" % pid) as handle:
                    fields = handle.read().rsplit(") ", 1)[1].split()
                started, parent = int(fields[19]) / ticks, fields[1]
                with open("/proc/%s/cmdline" % parent, "rb") as handle:
                    parent_is_check = b"gpugate-healthcheck" in handle.read()
            except (OSError, IndexError, ValueError):
                continue
            if not parent_is_check:
                ages.append(uptime - started)
    return ages


@pytest.mark.parametrize("node,hang", [
    ("gpu05", ("replay", "FLEET", "gpu05", "--hang", "--", "dcgmi", "health", "-c", "-j")),
    pytest.param("gpu06", ("set", "FLEET", "gpu06", "nvml.hang=1"), marks=pytest.mark.slow),  # CI: -m slow
])
def test_hanging_tool_ends_within_budget_no_pile_up_probe_class(cluster, node, hang):
    cluster.sim(*hang)
    # No pile-up: every run ends within its budget (8 s; plus interpreter
    # start and exit, which took over 2 s on a loaded 2-core machine), so runs
    # cannot accumulate.  Without the budget a run would live until slurmd's
    # kill at 60 s, one more every interval.
    oldest, most, deadline = 0.0, 0, time.monotonic() + 4 * INTERVAL
    while time.monotonic() < deadline:
        ages = _healthcheck_ages(cluster, node)
        oldest, most = max([oldest] + ages), max(most, len(ages))
        time.sleep(0.25)
    assert oldest < 8 + 5 and most <= 3, (oldest, most)
    cluster.wait_for(drained(cluster, node), 3 * INTERVAL + 10, node + " drained")
    assert cluster.reason(node).startswith("gpugate: probe ")
    assert "timeout" in cluster.reason(node)
    runs = cluster.records_when(node, lambda r: r.get("verdict") == "unfit")
    # The configured budget (8 s), and what a run may still spend after its
    # deadline: a drain RPC cut at the deadline is killed and waited for,
    # then the log line and state are written (10.9 s once on a 2-core
    # machine running three CI chains).  Far below slurmd's 60 s kill.
    assert runs and max(r["duration"] for r in runs) < 8 + 4
    # Runs overlapped (budget 8 s, interval 5 s): later ones found the lock and left.
    assert any(r.get("verdict") == "skipped" for r in cluster.log_records(node))
    # The hung simulated tool was killed with its process group.
    stub = os.path.join(cluster.fleet, node, "bin", "dcgmi")
    leftovers = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline_has(p, stub)]
    assert len(leftovers) <= 1  # at most the one of a run still in progress


def _cmdline_has(pid, text):
    try:
        with open("/proc/%s/cmdline" % pid, "rb") as handle:
            return text.encode() in handle.read()
    except OSError:
        return False


def test_drain_is_not_lost_while_slurmctld_is_down(cluster):
    node = "gpu01"
    cluster.stop_slurmctld()
    try:
        cluster.sim("set", "FLEET", node, "gpu.2.xid=79")
        # What slurmd would run: no environment but the node name.
        result, _ = run_entry(cluster, "healthcheck", node, timeout=60)
        assert result.returncode == 1, result.stderr
        assert "Traceback" not in result.stderr
        last = cluster.log_records(node)[-1]
        assert last["verdict"] == "unfit" and last["action"] == "failed" and last["slurm_error"]
    finally:
        cluster._spawn(["/usr/sbin/slurmctld", "-f", cluster.conf, "-i"], "slurmctld")
    # The node's next check, run now as slurmd runs it rather than at slurmd's next tick.
    cluster.wait_for(lambda: drained(cluster, node)() or check_now(cluster, node), 60,
                     "gpu01 drained once slurmctld is back")
    assert cluster.reason(node).startswith("gpugate: health xid:gpu2=79 (want none)")


def test_slurmd_gives_the_health_check_no_path_and_only_the_node_name(cluster):
    """The fact every entry point is built on, checked on each Slurm release
    the suite runs against: no PATH, no SLURM_CONF, cwd slurmd's log dir, and
    a non-zero exit only logged.  From 26.05 (with health_check_report, which
    the test cluster sets) also SLURM_NODE_IS_HEALTHY: "no" for a node out of
    service, "yes" otherwise."""
    shim = cluster.path("bin", "healthcheck")
    dump = cluster.path("hc-env")
    with open(shim) as handle:
        original = handle.read()
    before = {node: (cluster.state(node), cluster.reason(node)) for node in cluster.nodes}
    try:
        # Every node's environment is kept; gpu01's check is replaced by exit 1.
        with open(shim + ".new", "w") as handle:
            handle.write("#!/bin/sh\n/usr/bin/env > %s.$SLURMD_NODENAME.tmp\n"
                         "/bin/mv %s.$SLURMD_NODENAME.tmp %s.$SLURMD_NODENAME\n"
                         "[ \"$SLURMD_NODENAME\" = gpu01 ] || exec %s\nexit 1\n"
                         % (dump, dump, dump, original.split("exec ", 1)[1].strip()))
        os.chmod(shim + ".new", 0o755)
        os.replace(shim + ".new", shim)
        cluster.wait_for(lambda: all(os.path.exists(dump + "." + n) for n in cluster.nodes), 2 * INTERVAL + 10,
                         "slurmd to run the health check on every node")
        envs = {}
        for node in cluster.nodes:
            with open(dump + "." + node) as handle:
                envs[node] = dict(line.split("=", 1) for line in handle.read().splitlines() if "=" in line)
        env = envs["gpu01"]
        assert env.get("SLURMD_NODENAME") == "gpu01"
        assert "PATH" not in env and "SLURM_CONF" not in env
        assert set(env) <= {"SLURMD_NODENAME", "PWD", "SHLVL", "_", "SLURM_NODE_IS_HEALTHY"}, env
        assert env.get("PWD") == cluster.path("log")
        for node, (state, _) in before.items():
            said = envs[node].get("SLURM_NODE_IS_HEALTHY")
            if slurm_version() >= (26, 5):
                out_of_service = any(word in state for word in ("drain", "down", "fail", "maint"))
                assert said == ("no" if out_of_service else "yes"), (node, state, said)
            else:
                assert said is None, (node, said)
        time.sleep(INTERVAL)
        assert (cluster.state("gpu01"), cluster.reason("gpu01")) == before["gpu01"]  # exit 1: only logged
    finally:
        with open(shim + ".new", "w") as handle:
            handle.write(original)
        os.chmod(shim + ".new", 0o755)
        os.replace(shim + ".new", shim)
