"""The sweep's smoke stage against the real slurmctld/slurmd: the job runs
under slurmd inside the batch's reservation; only all_reduce_perf is a
replaying executable (gpugate sim set NODE smoke=..., real recorded outputs)."""

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys

import pytest

from conftest import make_cluster
from test_slurm_sweep import drain_flag, drift_and_drain, journal_events, journal_rows, run_sweep, sweep_argv

pytestmark = pytest.mark.slurm
HEALTHY = os.path.join(os.path.dirname(__file__), os.pardir, "gpugate", "data", "smoke", "healthy.txt")


def boot(tmp_path, nodes=4, **sweep):
    from gpugate.testbed import smoke_command, smoke_pair_command

    values = {"floor": 0.5, "smoke_deadline": 30, "smoke": smoke_command(str(tmp_path)),
              "smoke_pair": smoke_pair_command(str(tmp_path))}
    values.update(sweep)
    return make_cluster(tmp_path, nodes=nodes, sweep=values)


def proofs(cluster, node):
    db = sqlite3.connect(cluster.path("state", "sweep.db"), timeout=10)
    try:
        rows = db.execute("SELECT step, status FROM events WHERE node = ? AND (step LIKE 'diag r%' OR "
                          "step LIKE 'smoke %') ORDER BY id", (node,)).fetchall()
    finally:
        db.close()
    return rows


def journal_details(cluster):
    db = sqlite3.connect(cluster.path("state", "sweep.db"), timeout=10)
    try:
        return db.execute("SELECT node, step, status, detail FROM events ORDER BY id").fetchall()
    finally:
        db.close()


def smoke_events(cluster, node):
    return [(step, status, attempt) for _, step, status, attempt in journal_events(cluster, node)
            if step == "smoke"]


def no_smoke_job_left(cluster):
    out = cluster.run(["/usr/bin/squeue", "-h", "-n", "gpugate-smoke", "-o", "%i %T"]).stdout
    return out.strip() == ""


@pytest.fixture
def smoke_cluster(tmp_path):
    clusters = []

    def make(**kwargs):
        clusters.append(boot(tmp_path / ("c%d" % len(clusters)), **kwargs))
        return clusters[-1]
    yield make
    for c in clusters:
        c.stop()


def pair_proofs(cluster, node):
    db = sqlite3.connect(cluster.path("state", "sweep.db"), timeout=10)
    try:
        return db.execute("SELECT status, detail FROM events WHERE node = ? AND step = 'smoke pair' ORDER BY id",
                          (node,)).fetchall()
    finally:
        db.close()


def test_healthy_node_resumed_after_its_smoke_job_pcie_degraded_one_escalated(smoke_cluster):
    # pairs: gpu01 is the odd one out (gpu02 fails alone).
    cluster = smoke_cluster(pairs=True, floor=0.25)
    drift_and_drain(cluster, "gpu[01-02]")
    cluster.sim("set", "FLEET", "gpu02", "smoke=pcie-degraded")
    code, report, err = run_sweep(cluster)
    assert code == 0, err
    outcomes = report["outcomes"]
    assert outcomes["gpu01"]["result"] == "resumed", outcomes
    assert (outcomes["gpu02"]["result"], outcomes["gpu02"]["attempts"]) == ("escalated", 3), outcomes
    assert smoke_events(cluster, "gpu01")[-1][:2] == ("smoke", "done")
    # Every proof of the attempt that resumed it, cheapest first.
    assert proofs(cluster, "gpu01") == [("diag r1", "done"), ("diag r3", "done"), ("smoke single", "done"),
                                        ("smoke pair", "done")]
    assert pair_proofs(cluster, "gpu01") == [("done", "pair not run: odd node out")]
    status = subprocess.run(sweep_argv(cluster, "status"), capture_output=True, text=True, env=cluster.env,
                            timeout=60).stdout
    assert re.search(r"gpu01\s+smoke single\s+pass .*job \d+ passed", status), status
    assert re.search(r"gpu01\s+diag r3\s+pass", status), status
    # Failed on the first try and the retry, judged on the real PCIe output; the
    # rollback then verifies the previous pin (which gpugate never resumes on its own).
    assert [(s, a) for s, st, a in smoke_events(cluster, "gpu02") if st == "failed"] == [("smoke", 1), ("smoke", 2)]
    assert drain_flag(cluster, "gpu02")
    reason = cluster.reason("gpu02")
    assert reason.startswith("gpugate: rma budgeted=smoke (want counted); smoke=all_reduce busbw=22.9"), reason
    assert "want >= 350" in reason, reason
    assert cluster.reason("gpu01") == ""
    # The last attempt's proofs: diagnostics clean, the smoke job slow.
    assert proofs(cluster, "gpu02")[:3] == [("diag r1", "done"), ("diag r3", "done"), ("smoke single", "failed")]
    # The jobs ran under slurmd in the sweep's reservation, which is gone now.
    jobs = [line for line in cluster.slurm_calls() if " sbatch " in " " + line]
    assert jobs and all("--reservation=gpugate_sweep_" in line for line in jobs), jobs
    assert "gpugate_sweep" not in cluster.scontrol("show", "reservation")
    assert no_smoke_job_left(cluster)


@pytest.mark.slow
def test_two_healthy_nodes_pair_up_after_their_single_jobs(smoke_cluster):
    # A batch of two healthy nodes: their single jobs, then one 2-node job together.
    cluster = smoke_cluster(pairs=True, floor=0.25)
    drift_and_drain(cluster, "gpu[03-04]")
    code, report, err = run_sweep(cluster)
    assert code == 0, err
    assert [report["outcomes"][n]["result"] for n in ("gpu03", "gpu04")] == ["resumed"] * 2, report
    for node, partner in (("gpu03", "gpu04"), ("gpu04", "gpu03")):
        assert proofs(cluster, node)[-2:] == [("smoke single", "done"), ("smoke pair", "done")]
        status, detail = pair_proofs(cluster, node)[-1]
        assert re.fullmatch(r"round 1 with %s: job \d+ passed in \d+s" % partner, detail), detail
    pair_jobs = [line for line in cluster.slurm_calls() if " sbatch " in " " + line and "--nodes=2" in line]
    assert len(pair_jobs) == 1 and "--nodelist=gpu03,gpu04" in pair_jobs[0], pair_jobs
    assert "--reservation=gpugate_sweep_" in pair_jobs[0]
    assert cluster.reason("gpu03") == cluster.reason("gpu04") == ""
    assert no_smoke_job_left(cluster)


@pytest.mark.slow
def test_a_node_failing_pairs_with_two_partners_is_told_from_them(smoke_cluster):
    cluster = smoke_cluster(pairs=True, floor=0)
    drift_and_drain(cluster, "gpu[01-04]")
    cluster.sim("set", "FLEET", "gpu02", "smoke=pair-slow")  # its single job is healthy, its link slow
    code, report, err = run_sweep(cluster, timeout=600)
    events = journal_details(cluster)  # what a failure here needs to be told from a slow machine
    assert code == 0, (err, report.get("outcomes"), events)
    outcomes = report["outcomes"]
    assert [outcomes[n]["result"] for n in ("gpu01", "gpu03", "gpu04")] == ["resumed"] * 3, (outcomes, events)
    assert outcomes["gpu02"]["result"] == "escalated", outcomes
    # Round 1 (01,02) slow, (03,04) good; round 2 each suspect with a good node.
    first = [d for _, d in pair_proofs(cluster, "gpu01")]
    assert first[0].startswith("round 1 with gpu02: job ") and "busbw=17.8GB/s (want >= 50)" in first[0], first
    assert first[1].startswith("round 2 with gpu03: job ") and "passed" in first[1], first
    assert [d.split(":")[0] for s, d in pair_proofs(cluster, "gpu02")][:2] == ["round 1 with gpu01",
                                                                             "round 2 with gpu04"]
    # Retried alone, nothing re-proves its link: rma with the pair it failed.
    assert ("failed", "not re-proven: no partner (it failed its pairs in an earlier attempt)") in \
        pair_proofs(cluster, "gpu02")
    assert ("done", "pair not run: odd node out") not in pair_proofs(cluster, "gpu02")
    reason = cluster.reason("gpu02")
    assert reason.startswith("gpugate: rma budgeted=smoke (want counted); smoke=all_reduce pair=gpu04 "
                             "busbw=17.8GB/s (want >= 50)"), reason
    assert no_smoke_job_left(cluster)


@pytest.mark.slow
def test_the_odd_one_out_pairs_with_an_idle_node_lent_to_the_reservation(smoke_cluster):
    cluster = smoke_cluster(nodes=3, pairs=True, pair_with_in_service=True)
    drift_and_drain(cluster, "gpu01")
    code, report, err = run_sweep(cluster)
    assert code == 0, err
    assert report["outcomes"]["gpu01"]["result"] == "resumed", report
    status, detail = pair_proofs(cluster, "gpu01")[-1]
    assert status == "done", detail
    assert re.fullmatch(r"round 1 with gpu02 \(in service\): job \d+ passed in \d+s", detail), detail
    calls = cluster.slurm_calls()
    lend = [c for c in calls if "update ReservationName=gpugate_sweep_" in c]
    assert [c.split("Nodes=")[1] for c in lend] == ["gpu[01-02]", "gpu01"], lend  # lent, then given back
    pair_jobs = [c for c in calls if " sbatch " in " " + c and "--nodes=2" in c]
    assert len(pair_jobs) == 1 and "--nodelist=gpu01,gpu02" in pair_jobs[0], pair_jobs
    assert "gpugate_sweep" not in cluster.scontrol("show", "reservation")
    assert cluster.reason("gpu02") == "" and not drain_flag(cluster, "gpu02")
    assert no_smoke_job_left(cluster)


@pytest.mark.slow
def test_a_smoke_command_that_cannot_run_stops_the_sweep_and_fails_no_node(smoke_cluster, tmp_path):
    missing = str(tmp_path / "no-nccl-tests" / "all_reduce_perf")
    cluster = smoke_cluster(nodes=2, smoke=[missing, "-g", "{gpus}"])
    drift_and_drain(cluster, "gpu01")
    code, report, err = run_sweep(cluster)
    assert code == 1, err
    assert report["outcomes"]["gpu01"]["result"] == "halted", report
    assert "the smoke command cannot run (%s" % missing in report["stopped"], report["stopped"]
    assert "smoke = []" in report["stopped"] and "exit 127" in report["stopped"], report["stopped"]
    print(report["stopped"])
    # Out of service with the sweep's own work reason (the next run takes it
    # up), never retried, rolled back or escalated.
    reason = cluster.reason("gpu01")
    assert drain_flag(cluster, "gpu01") and re.match(r"gpugate: \w+ sweep=\w+ batch \d+ attempt 1", reason), reason
    steps = [(e[1], e[2], e[3]) for e in journal_events(cluster, "gpu01")]
    assert ("smoke", "started", 1) in steps and not [s for s in steps if s[0] in ("smoke", "escalate", "rollback")
                                                     and s[1] != "started" or s[2] > 1]
    assert proofs(cluster, "gpu01")[-1] == ("smoke single", "failed")
    assert no_smoke_job_left(cluster)
    assert "gpugate_sweep" not in cluster.scontrol("show", "reservation")


@pytest.mark.slow
def test_a_smoke_job_that_never_ends_is_cancelled_at_the_deadline(smoke_cluster):
    cluster = smoke_cluster(nodes=2, smoke_deadline=15, circuit_breaker=5)
    drift_and_drain(cluster, "gpu01")
    cluster.sim("set", "FLEET", "gpu01", "smoke=hang", "converge=ok")
    code, report, err = run_sweep(cluster)
    assert code == 0, err
    assert report["outcomes"]["gpu01"]["result"] == "escalated"
    failed = [e for e in journal_events(cluster, "gpu01") if e[1] == "smoke" and e[2] == "failed"]
    assert failed
    # The rma reason names the evidence bundle kept before the retry (issue 28).
    # A failed smoke job is budgeted: the rma says so and holds its budget (issue 33).
    assert re.fullmatch(r"gpugate: rma budgeted=smoke \(want counted\); smoke=all_reduce timeout after 15s "
                        r"\(want pass\); "
                        r"evidence=gpu01-\d{8}T\d{6}Z-a2", cluster.reason("gpu01")), cluster.reason("gpu01")
    assert no_smoke_job_left(cluster)
    assert "gpugate_sweep" not in cluster.scontrol("show", "reservation")


@pytest.mark.slow
def test_gpugate_smoke_by_hand_prints_verdicts_and_changes_no_node_state(smoke_cluster):
    cluster = smoke_cluster(nodes=2)
    cluster.sim("set", "FLEET", "gpu02", "smoke=pcie-degraded")
    before = {n: (cluster.state(n), cluster.reason(n)) for n in cluster.nodes}
    result = subprocess.run([sys.executable, "-m", "gpugate", "smoke", "--config", cluster.gpugate_conf,
                             "-w", "gpu[01-02]"], capture_output=True, text=True, timeout=120, env=cluster.env)
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1, result.stdout + result.stderr
    lines = dict(line.split(None, 1) for line in result.stdout.splitlines() if line.startswith("gpu0"))
    assert lines["gpu01"].startswith("pass"), result.stdout
    assert lines["gpu02"].startswith("FAIL") and "busbw=22.9" in lines["gpu02"], result.stdout
    assert {n: (cluster.state(n), cluster.reason(n)) for n in cluster.nodes} == before
    # --pairs: both single jobs pass, their 2-node job aborts; nobody else can tell them apart.
    cluster.sim("set", "FLEET", "gpu02", "smoke=pair-abort")
    result = subprocess.run([sys.executable, "-m", "gpugate", "smoke", "--config", cluster.gpugate_conf,
                             "-w", "gpu[01-02]", "--pairs", "--json"], capture_output=True, text=True, timeout=120,
                            env=cluster.env)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stdout + result.stderr
    verdicts = json.loads(result.stdout)
    for node, partner in (("gpu01", "gpu02"), ("gpu02", "gpu01")):
        pair = verdicts[node]["pair"]
        assert (pair["verdict"], pair["partner"]) == ("fail", partner), verdicts
        assert pair["problem"].startswith("nccl error: h100-4: NCCL WARN Net : connecting"), pair
        assert [(r["nodes"], r["round"], r["passed"]) for r in pair["runs"]] == [(["gpu01", "gpu02"], 1, False)]
        assert verdicts[node]["detail"].startswith("job ") and not verdicts[node]["passed"], verdicts
    assert {n: (cluster.state(n), cluster.reason(n)) for n in cluster.nodes} == before
    assert no_smoke_job_left(cluster)
    assert "gpugate_smoke" not in cluster.scontrol("show", "reservation")


@pytest.mark.slow
def test_a_node_failing_dcgm_r1_never_runs_r3_nor_the_smoke_job(smoke_cluster):
    cluster = smoke_cluster(nodes=2)
    drift_and_drain(cluster, "gpu01")
    cluster.sim("set", "FLEET", "gpu01", "dcgm.diag_fail=3")
    code, report, err = run_sweep(cluster)
    assert code == 0, err
    assert report["outcomes"]["gpu01"]["result"] == "escalated"
    steps = proofs(cluster, "gpu01")
    assert steps and all(step == "diag r1" and status == "failed" for step, status in steps), steps
    assert not any(e[1] == "smoke" for e in journal_events(cluster, "gpu01"))
    assert cluster.reason("gpu01").startswith("gpugate: rma dcgm_diag"), cluster.reason("gpu01")
    assert not [line for line in cluster.slurm_calls() if " sbatch " in " " + line]


def replay_healthy(cluster, node, delay):
    """The node's all_reduce_perf prints the healthy recording after ``delay`` seconds."""
    cluster.sim("replay", "FLEET", node, "--delay", str(delay), "--stdout-file", HEALTHY, "--",
                "all_reduce_perf", "-b", "1G", "-e", "8G", "-f", "2", "-g", "8")


def sweep_while_the_smoke_job_runs(cluster, node, delay):
    """A sweep of the drifted ``node`` (JSON on its stdout), returned once its smoke job runs."""
    drift_and_drain(cluster, node)
    replay_healthy(cluster, node, delay)
    proc = subprocess.Popen(sweep_argv(cluster, "--apply", "--json"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=cluster.env, text=True)
    cluster.wait_for(lambda: "RUNNING" in cluster.run(["/usr/bin/squeue", "-h", "-n", "gpugate-smoke", "-o",
                                                       "%T"]).stdout, 120, "the smoke job to run")
    return proc


@pytest.mark.slow
def test_a_sweeper_killed_during_the_smoke_job_redoes_it_and_leaves_no_job(smoke_cluster):
    cluster = smoke_cluster(nodes=2)
    proc = sweep_while_the_smoke_job_runs(cluster, "gpu02", 20)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    # The drain was lifted for the job (UNDRAIN clears the reason); the reservation still holds the node.
    assert "gpugate_sweep" in cluster.scontrol("show", "reservation")
    replay_healthy(cluster, "gpu02", 0)
    code, report, err = run_sweep(cluster)
    assert code == 0, err
    assert report["outcomes"]["gpu02"]["result"] == "resumed", report
    assert journal_rows(cluster)["gpu02"][:2] == ("resume", "done")
    assert proofs(cluster, "gpu02")[-1] == ("smoke single", "done")
    assert len([line for line in cluster.slurm_calls() if " sbatch " in " " + line]) == 2
    assert no_smoke_job_left(cluster)
    assert "gpugate_sweep" not in cluster.scontrol("show", "reservation")


@pytest.mark.slow
def test_an_admin_reason_set_during_the_smoke_job_wins(smoke_cluster):
    cluster = smoke_cluster(nodes=2)
    proc = sweep_while_the_smoke_job_runs(cluster, "gpu02", 8)
    cluster.scontrol("update", "NodeName=gpu02", "State=DRAIN", "Reason=admin: swapping a NIC")
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert json.loads(out)["outcomes"]["gpu02"]["result"] == "left"
    assert cluster.reason("gpu02") == "admin: swapping a NIC" and drain_flag(cluster, "gpu02")
    assert no_smoke_job_left(cluster)
    assert "gpugate_sweep" not in cluster.scontrol("show", "reservation")
