"""`gpugate sweep` against a real slurmctld and slurmd: batches under the
floor, verification before RESUME, escalation, the journal surviving kill -9."""

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest
from ClusterShell.NodeSet import NodeSet

from conftest import DEMO_BASELINE, check_now, make_cluster

pytestmark = pytest.mark.slurm
TERMINAL = {("resume", "done"), ("escalate", "done"), ("left", "done"), ("deferred", "done"), ("halted", "done")}


@pytest.fixture
def new_cluster(tmp_path):
    clusters = []

    def boot(**kwargs):
        kwargs.setdefault("nodes", 8)
        kwargs.setdefault("interval", 5)
        sweep = kwargs.pop("sweep", {})
        c = make_cluster(tmp_path / ("c%d" % len(clusters)), sweep=sweep, **kwargs)
        clusters.append(c)
        return c
    yield boot
    for c in clusters:
        c.stop()


def sweep_argv(cluster, *args):
    return [sys.executable, "-m", "gpugate", "sweep", "--config", cluster.gpugate_conf] + list(args)


def run_sweep(cluster, *args, timeout=300):
    result = subprocess.run(sweep_argv(cluster, "--apply", "--json", *args), capture_output=True, text=True,
                            timeout=timeout, env=cluster.env)
    assert "Traceback" not in result.stderr, result.stderr
    data = json.loads(result.stdout) if result.stdout.strip().startswith("{") else None
    return result.returncode, data, result.stderr


def why(cluster, err, lines=25):
    """What a failed assertion shows: the sweep's stderr, then the end of
    slurmctld's log (CI keeps no cluster behind)."""
    try:
        with open(cluster.path("log", "slurmctld.log"), errors="replace") as handle:
            tail = handle.readlines()[-lines:]
    except OSError as exc:
        tail = ["(no slurmctld.log: %s)\n" % exc]
    return "%s\n--- slurmctld.log, last %d lines ---\n%s" % (err, lines, "".join(tail))


def journal_rows(cluster):
    path = cluster.path("state", "sweep.db")
    if not os.path.exists(path):
        return {}
    db = sqlite3.connect(path, timeout=10)
    try:
        return {r[0]: (r[1], r[2], r[3]) for r in db.execute("SELECT node, step, status, attempt FROM nodes")}
    except sqlite3.OperationalError:
        return {}
    finally:
        db.close()


def journal_events(cluster, node=None):
    """The sweep journal's events; none while the sweep that has just
    created the file has not yet created its table (a poll every few
    milliseconds sees that moment)."""
    path = cluster.path("state", "sweep.db")
    db = sqlite3.connect("file:%s?mode=ro" % path, uri=True, timeout=10)
    try:
        query = "SELECT node, step, status, attempt FROM events" + (" WHERE node = ?" if node else "") + " ORDER BY id"
        return db.execute(query, (node,) if node else ()).fetchall()
    except sqlite3.OperationalError as err:
        if "no such table" in str(err):
            return []
        raise
    finally:
        db.close()


class InFlightSampler(threading.Thread):
    """Most nodes the journal has in the sweep's hands at once."""

    def __init__(self, cluster):
        super().__init__(daemon=True)
        self.cluster, self.most, self.stop = cluster, 0, threading.Event()

    def run(self):
        while not self.stop.is_set():
            rows = journal_rows(self.cluster)
            flying = [n for n, (step, status, _) in rows.items() if (step, status) not in TERMINAL]
            self.most = max(self.most, len(flying))
            time.sleep(0.1)


def drift_and_drain(cluster, nodes, *assignments):
    """The nodes drift and their health checks drain them: run now, as
    slurmd runs them, not at slurmd's next HealthCheckInterval tick."""
    cluster.sim("set", "FLEET", nodes, *(assignments or ("driver=550.54.15",)))
    names = list(NodeSet(nodes))

    def drained():
        left = [n for n in names if "drain" not in cluster.state(n)]
        return not left or check_now(cluster, *left)
    cluster.wait_for(drained, 60, "%s drained" % nodes)
    return names


def drain_flag(cluster, node):
    """The DRAIN flag, not sinfo's %T: Slurm can miss the completion of a
    reboot (a ping answered in the second it is issued, with
    ReturnToService=2); %T then shows "reboot^" while the node is drained.
    The sweep treats such a reboot as failed: retried, then escalated."""
    return re.search(r"State=\S*DRAIN", cluster.scontrol("show", "node", node)) is not None


def fit(cluster, node):
    result = subprocess.run([sys.executable, "-m", "gpugate", "check", "--config", cluster.gpugate_conf,
                             "--node", node, "--json"], capture_output=True, text=True, timeout=60)
    return json.loads(result.stdout)["fit"]


@pytest.mark.long
def test_six_of_eight_drifted_converged_in_batches_under_the_floor(new_cluster):
    cluster = new_cluster(sweep={"floor": 0.5})
    drifted = drift_and_drain(cluster, "gpu[01-06]")
    plan = subprocess.run(sweep_argv(cluster), capture_output=True, text=True, env=cluster.env, timeout=60)
    assert plan.returncode == 0 and "budget" in plan.stdout, plan.stdout
    # Oldest drain first, and the health checks' jitter decides which drained first.
    batches = re.findall(r"^Batch (\d+): reconverge  (\S+) \((\d+)\)$", plan.stdout, re.M)
    assert [(b, int(n)) for b, _, n in batches] == [("1", 4), ("2", 2)], plan.stdout
    assert NodeSet.fromlist([nodes for _, nodes, _ in batches]) == NodeSet("gpu[01-06]")
    assert journal_rows(cluster) == {}  # the plan changes nothing
    sampler = InFlightSampler(cluster)
    sampler.start()
    code, report, err = run_sweep(cluster)
    sampler.stop.set()
    sampler.join()
    assert code == 0, why(cluster, err)
    assert {n: o["result"] for n, o in report["outcomes"].items()} == {n: "resumed" for n in drifted}
    assert sampler.most <= 4 and report["max_out"]["gpu"] <= 4
    assert len(report["batches"]) >= 2
    # 24.11 shows a resumed node not responding (idle*) until its next ping.
    cluster.wait_for(lambda: all(s == "idle" for s in cluster.node_states().values()), 30, "all nodes idle")
    assert all(cluster.reason(n) == "" for n in cluster.nodes)
    assert all(fit(cluster, n) for n in drifted)
    assert "gpugate_sweep" not in cluster.scontrol("show", "reservation")


@pytest.mark.long
def test_unfixable_node_is_retried_rolled_back_then_escalated(new_cluster):
    cluster = new_cluster(nodes=4)
    drift_and_drain(cluster, "gpu02")
    cluster.sim("set", "FLEET", "gpu02", "converge=noop")
    code, report, err = run_sweep(cluster)
    assert code == 0, why(cluster, err)
    outcome = report["outcomes"]["gpu02"]
    assert (outcome["result"], outcome["attempts"]) == ("escalated", 3)
    steps = [(s, st, a) for _, s, st, a in journal_events(cluster, "gpu02")]
    assert ("converge", "done", 2) in steps and ("rollback", "done", 3) in steps
    assert not any(s == "resume" for s, _, _ in steps)
    assert drain_flag(cluster, "gpu02")
    assert cluster.reason("gpu02").startswith("gpugate: rma ")
    # Slurm appends " : reboot issued" to the sweep's reason while the node
    # reboots: the node's own health check still never replaces it.
    actions = [r.get("action") for r in cluster.log_records("gpu02")]
    assert "keep" in actions and "update" not in actions, actions
    # A later sweep leaves the escalated node alone.
    code, report, err = run_sweep(cluster)
    assert code == 0 and report["outcomes"] == {}, why(cluster, err)
    assert cluster.reason("gpu02").startswith("gpugate: rma ")


def test_admin_reason_change_during_the_sweep_is_never_resumed(new_cluster):
    cluster = new_cluster(nodes=4)
    drift_and_drain(cluster, "gpu03")
    # Verification takes a while: the admin acts in the middle of it.
    cluster.sim("replay", "FLEET", "gpu03", "--delay", "4", "--", "dcgmi", "diag", "-r", "1", "-j")
    proc = subprocess.Popen(sweep_argv(cluster, "--apply"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=cluster.env)
    cluster.wait_for(lambda: os.path.exists(cluster.path("state", "sweep.db")) and
                     ("gpu03", "verify", "started", 1) in journal_events(cluster, "gpu03"), 90, "verify to start")
    cluster.scontrol("update", "NodeName=gpu03", "State=DRAIN", "Reason=hands off: bad DIMM")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, why(cluster, err)
    assert cluster.reason("gpu03") == "hands off: bad DIMM" and drain_flag(cluster, "gpu03")
    assert journal_rows(cluster)["gpu03"][:2] == ("left", "done")


@pytest.mark.long
def test_circuit_breaker_stops_when_verification_keeps_failing(new_cluster):
    cluster = new_cluster(nodes=6, sweep={"floor": 0, "max_batch": 2, "circuit_breaker": 2})
    drifted = drift_and_drain(cluster, "gpu[01-04]")
    cluster.sim("set", "FLEET", "gpu[01-04]", "converge=noop")  # "succeeds", fixes nothing
    code, report, err = run_sweep(cluster)
    assert code == 1 and "circuit breaker" in err, why(cluster, err)
    assert len(report["batches"]) == 1  # no further batch started
    enrolled = set(journal_rows(cluster))
    assert len(enrolled) == 2
    for node in drifted:
        assert drain_flag(cluster, node)
        assert cluster.reason(node).startswith("gpugate: drift ")  # still gpugate's, never resumed
    assert "gpugate_sweep" not in cluster.scontrol("show", "reservation")


@pytest.mark.slow  # a cluster of its own and a slurmctld stopped for 12 s: CI runs it (-m slow)
def test_a_reboot_wait_rides_out_a_slurmctld_that_stops_answering(new_cluster):
    """slurmctld stops answering while a batch reboots (the moment it is
    busiest at scale: every slurmd registers): the sweep's reads time out,
    settle nothing, and are made again until it answers; the node is then
    proved and resumed, not counted "did not come back"."""
    cluster = new_cluster(nodes=2)
    drift_and_drain(cluster, "gpu01")
    proc = subprocess.Popen(sweep_argv(cluster, "--apply"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=cluster.env)
    cluster.wait_for(lambda: os.path.exists(cluster.path("state", "sweep.db")) and
                     ("gpu01", "wait_up", "started", 1) in journal_events(cluster, "gpu01"), 90, "the reboot wait")
    pid = cluster.pids()["slurmctld"]
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(12)  # past the rig's [slurm] timeout_seconds (10) and MessageTimeout (5)
    finally:
        os.kill(pid, signal.SIGCONT)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0 and "Traceback" not in err, why(cluster, err)
    assert "no answer (" in out and "reading again" in out, out
    assert journal_rows(cluster)["gpu01"][:2] == ("resume", "done")
    assert ("gpu01", "wait_up", "failed", 1) not in journal_events(cluster, "gpu01")
    assert cluster.reason("gpu01") == "" and not drain_flag(cluster, "gpu01")


def test_second_sweeper_refuses_to_run(new_cluster):
    from gpugate.safety.lock import RunLock

    cluster = new_cluster(nodes=2)
    lock = RunLock(cluster.path("state", "locks", "sweep.lock"))
    assert lock.acquire()
    try:
        code, report, err = run_sweep(cluster)
        assert code == 2 and "another gpugate sweep" in err, why(cluster, err)
    finally:
        lock.release()


@pytest.mark.parametrize("step", [
    pytest.param("wait_drained", marks=pytest.mark.slow), pytest.param("converge", marks=pytest.mark.slow),
    "reboot", pytest.param("wait_up", marks=pytest.mark.slow), "verify",
    pytest.param("resume", marks=pytest.mark.slow)])
def test_kill9_at_each_step_next_run_completes(new_cluster, step):
    cluster = new_cluster(nodes=3)
    drift_and_drain(cluster, "gpu02")
    cluster.sim("replay", "FLEET", "gpu02", "--delay", "1", "--", "dcgmi", "diag", "-r", "1", "-j")
    proc = subprocess.Popen(sweep_argv(cluster, "--apply"), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=cluster.env)
    cluster.wait_for(lambda: os.path.exists(cluster.path("state", "sweep.db")) and
                     any(e[1] == step and e[2] == "started" for e in journal_events(cluster, "gpu02")),
                     120, "step %s to start" % step)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    # Invariants right after the crash: out of service unless it was verified.
    verified = ("gpu02", "verify", "done", 1) in journal_events(cluster, "gpu02")
    state = cluster.state("gpu02")
    if not verified:
        assert "drain" in state or "down" in state or "reboot" in state or "maint" in state, state
    reason = cluster.reason("gpu02")
    assert reason == "" or reason.startswith("gpugate: "), reason
    code, report, err = run_sweep(cluster)
    assert code == 0, why(cluster, err)
    # The killed run may have finished its last step before it died.
    assert report["outcomes"].get("gpu02", {}).get("result", "resumed") == "resumed"
    assert journal_rows(cluster)["gpu02"][:2] == ("resume", "done")
    cluster.wait_for(lambda: cluster.state("gpu02") == "idle", 30, "gpu02 idle")
    assert cluster.reason("gpu02") == "" and fit(cluster, "gpu02")
    events = journal_events(cluster, "gpu02")
    resumed_at = max(i for i, e in enumerate(events) if e[1] == "resume")
    assert any(e[1] == "verify" and e[2] == "done" for e in events[:resumed_at])
    assert "gpugate_sweep" not in cluster.scontrol("show", "reservation")


@pytest.mark.slow
def test_rollout_of_a_new_pin_canary_first_never_more_than_two_out(new_cluster, tmp_path):
    text = open(DEMO_BASELINE).read().replace("in_progress = false", "in_progress = true")
    baseline = tmp_path / "rollout.toml"
    baseline.write_text(text)
    cluster = new_cluster(baseline=str(baseline), sweep={"floor": 0.75, "max_batch": 8})
    cluster.sim("set", "FLEET", "gpu[01-08]", "driver=570.133.20", "fabricmanager=570.133.20", "cuda=12080",
                "dcgm=4.1.1", "image_version=gpu-2026.09.2")
    changed = time.time()

    def judged_pending(node):
        try:
            with open(cluster.path("state", node, "last-healthcheck.json")) as handle:
                last = json.load(handle)
        except FileNotFoundError:
            return False  # its first health check has not finished yet
        return last["at"] > changed + 1 and last["fit"] and last["pending"]

    # Every node's health check has seen it on [previous]: pending, not drained.
    cluster.wait_for(lambda: all(judged_pending(n) for n in cluster.nodes), 3 * 5 + 10, "health checks on [previous]")
    assert all(s == "idle" for s in cluster.node_states().values())
    sampler = InFlightSampler(cluster)
    sampler.start()
    code, report, err = run_sweep(cluster, "--rollout", timeout=600)
    sampler.stop.set()
    sampler.join()
    assert code == 0, why(cluster, err)
    assert report["batches"][0]["canary"] is True and report["batches"][0]["nodes"].count("gpu") == 1
    assert sampler.most <= 2 and report["max_out"]["gpu"] <= 2
    assert sorted(report["outcomes"]) == cluster.nodes
    assert all(o["result"] == "resumed" for o in report["outcomes"].values())
    for node in cluster.nodes:
        result = subprocess.run([sys.executable, "-m", "gpugate", "check", "--config", cluster.gpugate_conf,
                                 "--node", node, "--json"], capture_output=True, text=True, timeout=60)
        data = json.loads(result.stdout)
        assert data["fit"] and data["pending"] == [] and data["facts"]["nvml"]["driver_version"] == "580.65.06"
    assert all(s == "idle" for s in cluster.node_states().values())


def test_running_jobs_are_waited_for_unless_forced(new_cluster):
    cluster = new_cluster(nodes=3, sweep={"drain_timeout": 3})
    job = cluster.run(["/usr/bin/sbatch", "--parsable", "-w", "gpu02", "-o", "/dev/null", "--wrap", "sleep 300"]).stdout
    job = job.strip().split(";")[0]
    cluster.wait_for(lambda: "alloc" in cluster.state("gpu02") or "mix" in cluster.state("gpu02"), 30, "job running")
    # 26.05 shows the node allocated while the job's prolog still runs: a
    # drift set now would be the prolog's to find, not the sweep's.
    cluster.wait_for(lambda: any(r["mode"] == "prolog" and r.get("job") == job
                                 for r in cluster.log_records("gpu02")), 30, "the job's prolog")
    drift_and_drain(cluster, "gpu02")
    assert "drng" in cluster.state("gpu02") or "draining" in cluster.state("gpu02")
    code, report, err = run_sweep(cluster)
    # The job was not touched.
    assert code == 0 and report["outcomes"]["gpu02"]["result"] == "deferred", why(cluster, err)
    assert "RUNNING" in cluster.scontrol("show", "job", job)
    code, report, err = run_sweep(cluster, "--force")
    assert code == 0, why(cluster, err)
    assert report["outcomes"]["gpu02"]["result"] == "resumed", (report["outcomes"]["gpu02"],
                                                                journal_events(cluster, "gpu02"), err[-3000:])
    assert "CANCELLED" in cluster.scontrol("show", "job", job)


@pytest.mark.slow
def test_node_rebooting_into_an_old_driver_during_verification_is_not_left_in_service(new_cluster):
    """An unplanned reboot in the middle of the sweep's verification, and the
    node comes back on an old driver.  Either the verification sees it (no
    RESUME: retried, converged again, verified), or it had read the node
    before the reboot: then the node-side gate drains it again within its
    health-check interval.  Never in service on the old driver for longer."""
    cluster = new_cluster(nodes=3)
    drift_and_drain(cluster, "gpu02")
    cluster.sim("replay", "FLEET", "gpu02", "--delay", "3", "--", "dcgmi", "diag", "-r", "1", "-j")
    proc = subprocess.Popen(sweep_argv(cluster, "--apply", "--json"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cluster.env)
    cluster.wait_for(lambda: os.path.exists(cluster.path("state", "sweep.db")) and
                     ("gpu02", "verify", "started", 1) in journal_events(cluster, "gpu02"), 120, "verify to start")
    cluster.reboot_node("gpu02", "driver=550.54.15")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0 and "Traceback" not in err, why(cluster, err)
    result = json.loads(out)["outcomes"]["gpu02"]["result"]
    events = journal_events(cluster, "gpu02")
    if result == "resumed":  # verified on what it read before the reboot
        assert any(e[1] == "verify" and e[2] == "done" for e in events)
    # Within two health-check intervals plus the drain jitter (5 s) and settle time.
    cluster.wait_for(lambda: drain_flag(cluster, "gpu02") or fit(cluster, "gpu02"), 2 * 5 + 5 + 15,
                     "gpu02 drained again or fit")
    reason = cluster.reason("gpu02")
    if drain_flag(cluster, "gpu02"):
        assert reason.startswith(("gpugate: drift driver=550.54.15", "gpugate: rma ")), (reason, result, events)
    else:
        assert fit(cluster, "gpu02") and result == "resumed"
        resumed_at = max(i for i, e in enumerate(events) if e[1] == "resume")
        # Verified after the unplanned reboot: the failed verify led to another attempt.
        assert [e for e in events[:resumed_at] if e[1] == "verify" and e[2] == "done"]


@pytest.mark.slow  # a cluster of its own: CI runs it (-m slow, and -m slurm on every release)
def test_one_host_whose_converge_always_fails_does_not_stop_the_others(new_cluster):
    """Issue 13, item 3: the site's converge fails for the whole batch
    because of one host.  Retried node by node, the other three converge,
    reboot, verify and resume; the bad one alone is retried, rolled back and
    escalated.  One bad node is under the circuit breaker: the sweep goes on."""
    cluster = new_cluster(nodes=6, sweep={"floor": 0})
    drifted = drift_and_drain(cluster, "gpu[01-04]")
    cluster.sim("set", "FLEET", "gpu03", "converge=error")  # `gpugate sim converge` exits 1 when it holds gpu03
    code, report, err = run_sweep(cluster)
    assert code == 0 and not report["stopped"], why(cluster, err)
    assert report["batches"][0]["nodes"] == "gpu[01-04]"
    results = {n: o["result"] for n, o in report["outcomes"].items()}
    assert results == {"gpu01": "resumed", "gpu02": "resumed", "gpu03": "escalated", "gpu04": "resumed"}
    steps = [(s, st, a) for _, s, st, a in journal_events(cluster, "gpu03")]
    assert ("converge", "failed", 1) in steps and ("converge", "failed", 2) in steps
    assert ("rollback", "failed", 3) in steps and steps[-1][:2] == ("escalate", "done")
    assert not any(s in ("reboot", "resume") for s, _, _ in steps)
    assert drain_flag(cluster, "gpu03") and cluster.reason("gpu03").startswith(
        "gpugate: rma budgeted=drift driver (want counted); driver=550.54.15")  # counted by the drain budget
    cluster.wait_for(lambda: all(cluster.state(n) == "idle" for n in drifted if n != "gpu03"), 30, "others idle")
    assert all(fit(cluster, n) for n in drifted if n != "gpu03")
    assert "gpugate_sweep" not in cluster.scontrol("show", "reservation")


def _node_reads(lines):
    """The sweep's reads of node states (the controller's calls carry no
    SLURMD_NODENAME): (whole fleet?, what they named)."""
    reads = []
    for line in lines:
        if not line.startswith(" "):
            continue  # a node's own health check, prolog or reboot program
        words = line.split()
        if words[0] == "sinfo" and "--version" not in words:
            reads.append(words[words.index("-n") + 1] if "-n" in words else None)
        elif words[0] == "scontrol" and "show" in words and "node" in words:
            after = words[words.index("node") + 1:]
            reads.append(after[0] if after else None)
    return reads


@pytest.mark.slow  # a cluster of its own: CI runs it (-m slow, and -m slurm on every release)
def test_waits_poll_only_the_nodes_in_flight_at_poll_seconds(new_cluster):
    """Issue 13, item 2: a sweep of one node on an 8-node cluster reads the
    whole fleet only to plan; every wait reads that node alone, every
    poll_seconds (2 s here; before, every second whatever it said)."""
    cluster = new_cluster(nodes=8, sweep={"poll_seconds": 2})
    drift_and_drain(cluster, "gpu02")
    before = len(cluster.slurm_calls())
    started = time.monotonic()
    code, report, err = run_sweep(cluster)
    took = time.monotonic() - started
    assert code == 0 and report["outcomes"]["gpu02"]["result"] == "resumed", why(cluster, err)
    reads = _node_reads(cluster.slurm_calls()[before:])
    whole = [r for r in reads if r is None]
    named = [r for r in reads if r is not None]
    print("sweep of gpu02: %d node reads in %.0f s: %d of the whole fleet, %d of gpu02 alone"
          % (len(reads), took, len(whole), len(named)))
    assert len(whole) == 2  # the plan, and the plan that finds nothing left
    assert set(named) == {"gpu02"}
    # The three waits read at once, then every 2 s; the reboot and resume
    # steps read once each; verification may read once more.  Before, the
    # reboot wait alone read every second.
    assert len(named) <= took / 2 + 3 + 2 + 3


@pytest.mark.slow  # a cluster of its own: CI runs it (-m slow, and -m slurm on every release)
def test_a_node_drained_again_for_the_same_component_is_escalated_and_forgiven(new_cluster):
    """Issue 13, item 6, with repeat_limit = 1: returned to service once for
    the driver, drained for it again: escalated `rma repeat=...`, never
    reconverged again; `gpugate status` lists it; one command clears it and
    the next sweep repairs and verifies it."""
    cluster = new_cluster(nodes=4, sweep={"repeat_limit": 1})
    drift_and_drain(cluster, "gpu02")
    code, report, err = run_sweep(cluster)
    assert code == 0 and report["outcomes"]["gpu02"]["result"] == "resumed", why(cluster, err)
    cluster.wait_for(lambda: cluster.state("gpu02") == "idle", 30, "gpu02 idle")
    drift_and_drain(cluster, "gpu02")  # the same component again
    code, report, err = run_sweep(cluster)
    assert code == 0, why(cluster, err)
    outcome = report["outcomes"]["gpu02"]
    assert outcome["result"] == "escalated" and "repeat offender" in outcome["detail"]
    assert cluster.reason("gpu02").startswith("gpugate: rma budgeted=drift driver (want counted); "
                                              "repeat=driver 1x in 7d (want under 1)")
    assert drain_flag(cluster, "gpu02")
    assert not any(s == "converge" for _, s, _, a in journal_events(cluster, "gpu02")[-6:])
    status = subprocess.run([sys.executable, "-m", "gpugate", "status", "--config", cluster.gpugate_conf],
                            capture_output=True, text=True, timeout=60, env=cluster.env)
    assert status.returncode == 0, status.stderr
    lines = [x for x in status.stdout.splitlines() if x.strip().startswith("gpu02  driver")]
    assert lines, status.stdout + status.stderr
    line = lines[0]
    assert "1x" in line and "ESCALATED rma" in line, status.stdout
    code, report, err = run_sweep(cluster)  # rma waits for a human
    assert code == 0 and report["outcomes"] == {}, why(cluster, err)
    forgive = subprocess.run(sweep_argv(cluster, "forgive", "gpu02"), capture_output=True, text=True, timeout=60,
                             env=cluster.env)
    assert forgive.returncode == 0 and "drained again" in forgive.stdout, forgive.stderr
    assert cluster.reason("gpu02").startswith("gpugate: drift driver=550.54.15")
    code, report, err = run_sweep(cluster)
    assert code == 0 and report["outcomes"]["gpu02"]["result"] == "resumed", why(cluster, err)
    cluster.wait_for(lambda: cluster.state("gpu02") == "idle", 30, "gpu02 idle")
    assert fit(cluster, "gpu02")
