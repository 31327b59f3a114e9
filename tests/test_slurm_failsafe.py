"""Fail safe against a real slurmctld (issue 12): whatever a baseline or a
broken push says, gpugate drains at most each partition's drain budget,
keeps gating with the last good copy, and ends before slurmd's kill however
slowly Slurm answers.  The entry points run as slurmd runs them, every node
at once (the worst case: a push reaches the fleet in the same minute)."""

import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from test_slurm_faults import Shims, run_entry, tools_only

pytestmark = pytest.mark.slurm
# Two 4-node partitions, a quarter of each: one node of each may be out for
# findings a file can cause.  slurmd runs the health check at start only.
CLUSTER = {
    "nodes": 8, "interval": 600, "partitions": {"a": "gpu[01-04]", "b": "gpu[05-08]"},
    "extra": "[drain_budget]\nmax_share = 0.25\n",
}
PARTS = {"a": ["gpu01", "gpu02", "gpu03", "gpu04"], "b": ["gpu05", "gpu06", "gpu07", "gpu08"]}


def _push(cluster, text):
    """As the docs ask: write a temporary file, rename it into place."""
    tmp = cluster.baseline + ".new"
    with open(tmp, "w") as handle:
        handle.write(text)
    os.replace(tmp, cluster.baseline)
    time.sleep(0.4)  # settled: load_toml re-reads a file written this instant


def _everyone(cluster, mode="healthcheck"):
    with ThreadPoolExecutor(len(cluster.nodes)) as pool:
        return dict(zip(cluster.nodes, pool.map(lambda n: run_entry(cluster, mode, n), cluster.nodes)))


def _drained(cluster, prefix):
    return {p: sorted(n for n in nodes if "drain" in cluster.state(n) and cluster.reason(n).startswith(prefix))
            for p, nodes in PARTS.items()}


def _restore(cluster, good):
    _push(cluster, good)
    for node in cluster.nodes:
        if "drain" in cluster.state(node):
            cluster.scontrol("update", "NodeName=" + node, "State=RESUME")
    _everyone(cluster)
    cluster.wait_for(lambda: not any("drain" in cluster.state(n) for n in cluster.nodes), 30, "every node resumed")


def _bounded(cluster, prefix):
    """The nodes published their findings and drained none of them; the
    budget keeper's run drains exactly the budget of each partition, every
    other node stays held (issue 26)."""
    keeper = cluster.run([sys.executable, "-m", "gpugate", "budget", "--json", "--config", cluster.gpugate_conf])
    assert json.loads(keeper.stdout)["ok"], keeper.stdout
    drained = _drained(cluster, prefix)
    assert all(len(nodes) == 1 for nodes in drained.values()), drained
    out = {n for nodes in drained.values() for n in nodes}
    for node in cluster.nodes:
        if node not in out:
            record = cluster.log_records(node)[-1]
            assert record["action"] == "held" and "budget keeper" in record["why"], record
            assert cluster.state(node).rstrip("*") == "idle"  # in service ("*": a ping late under load)
    return drained


@pytest.fixture
def good(cluster):
    with open(cluster.baseline) as handle:
        text = handle.read()
    yield text
    _restore(cluster, text)


def test_a_wrong_gpu_count_for_every_node_drains_only_the_budget(cluster, good):
    """`gpus = 8` typed as `gpus = 4`: a health finding, but one the file
    causes: budgeted.  Twice over, the fleet stays as the budget allows."""
    _push(cluster, good.replace("gpus = 8", "gpus = 4", 1))
    for _ in range(2):
        results = _everyone(cluster)
        assert all(r.returncode == 1 for r, _ in results.values())
        if _ == 0:  # no keeper has run: nothing is drained
            assert _drained(cluster, "gpugate: health gpu_count") == {"a": [], "b": []}
        drained = _bounded(cluster, "gpugate: health gpu_count=8 (want 4)")
    assert _drained(cluster, "gpugate: health gpu_count") == drained


def test_a_wrong_runtime_setting_pin_for_every_node_drains_only_the_budget(cluster, good):
    """`compute_mode = "prohibited"` pushed where every GPU runs in default
    mode: drift read through NVML on every node, budgeted (issue 14)."""
    assert 'compute_mode = "default"' in good
    _push(cluster, good.replace('compute_mode = "default"', 'compute_mode = "prohibited"', 1))
    results = _everyone(cluster)
    assert all(r.returncode == 1 for r, _ in results.values())
    _bounded(cluster, "gpugate: drift compute_mode=default (want prohibited)")


@pytest.mark.slow  # the same protocol as the GPU-count case: CI runs it with -m slow
def test_persistenced_required_where_none_runs_drains_only_the_budget(cluster, good):
    """A site that keeps persistence mode with `nvidia-smi -pm 1`, not the
    daemon, and a baseline asking for nvidia-persistenced: broken, budgeted."""
    for node in cluster.nodes:
        cluster.sim("set", "FLEET", node, "service.nvidia-persistenced=inactive")
    try:
        _everyone(cluster)
        _bounded(cluster, "gpugate: broken persistenced=inactive (want active)")
    finally:
        for node in cluster.nodes:
            cluster.sim("set", "FLEET", node, "service.nvidia-persistenced=active")


def test_a_broken_push_keeps_gating_with_the_last_good_baseline(cluster, good):
    """A baseline that does not parse reaches every node; then an Xid 79 on
    one: that node drains, judged with the last good baseline; the others
    keep running jobs; every node, the audit and status say so."""
    gpugate = [sys.executable, "-m", "gpugate"]
    _everyone(cluster)  # every node has loaded the good baseline once
    last_good = cluster.path("good-baseline.toml")
    with open(last_good, "w") as handle:
        handle.write(good)
    _push(cluster, good.replace("[pin]", "[pin", 1))
    cluster.sim("set", "FLEET", "gpu02", "gpu.6.xid=79")
    try:
        results = _everyone(cluster)
        assert results["gpu02"][0].returncode == 1
        assert all(r.returncode == 0 for n, (r, _) in results.items() if n != "gpu02")
        assert cluster.reason("gpu02").startswith("gpugate: health xid:gpu6=79 (want none)")
        assert [n for n in cluster.nodes if "drain" in cluster.state(n)] == ["gpu02"]
        for node in cluster.nodes:
            record = cluster.log_records(node)[-1]
            assert "invalid TOML" in record["config_error"] and "last good baseline" in record["config_error"]
        # A job still goes through the prolog, judged with the last good copy.
        job = cluster.run(["/usr/bin/sbatch", "--parsable", "-p", "b", "-w", "gpu05", "-o", "/dev/null", "--wrap", "true"]
                          ).stdout.strip()
        cluster.wait_for(lambda: "JobState=COMPLETED" in cluster.scontrol("show", "job", job, check=False),
                         60, "job %s to complete on gpu05" % job)
        prolog = [r for r in cluster.log_records("gpu05") if r.get("mode") == "prolog" and r.get("job") == job]
        assert prolog[-1]["verdict"] == "fit" and prolog[-1]["config_error"]
        # The admin's views: the audit (against the good baseline the
        # controller still has) lists every node, status repeats it.
        audit = cluster.run(gpugate + ["audit", "--config", cluster.gpugate_conf, "-b", last_good, "--json"],
                            check=False)
        assert audit.returncode == 1, audit.stderr
        errors = json.loads(audit.stdout)["config_error"]
        assert errors["count"] == 8 and errors["nodes"] == "gpu[01-08]"
        status = cluster.run(gpugate + ["status", "--config", cluster.gpugate_conf])
        assert "CONFIG ERROR on 8 nodes" in status.stdout and "gpu[01-08]" in status.stdout
    finally:
        cluster.sim("set", "FLEET", "gpu02", "gpu.6.xid=0")


@pytest.fixture
def patient(cluster):
    """Slurm calls may take 30 s each ([slurm] timeout_seconds): only the
    run's deadline keeps the health check inside slurmd's kill."""
    with open(cluster.gpugate_conf) as handle:
        text = handle.read()
    assert text.count("[slurm]\n") == 1
    with open(cluster.gpugate_conf, "w") as handle:
        handle.write(text.replace("[slurm]\n", "[slurm]\ntimeout_seconds = 30\n"))
    time.sleep(0.4)  # settled
    yield
    with open(cluster.gpugate_conf, "w") as handle:
        handle.write(text)


@tools_only
@pytest.mark.slow
@pytest.mark.parametrize("delay", [20, 5])
def test_slurm_answering_slowly_the_health_check_ends_before_the_kill(cluster, good, patient, delay):
    """scontrol and sinfo answer only after 20 s (or 5 s), four drifted
    nodes of a partition at once: every health check still ends well before
    slurmd's 60 s kill, and nothing is drained: a node only publishes a
    budgeted finding (its own record read, one comment update; issue 26).
    The shims slow the tools only: [slurm] library names a file dlopen
    refuses, so a node reads itself with the slow sinfo (issue 34's
    fallback), not through libslurm."""
    slow = "#!/bin/sh\nsleep %d\nexec /usr/bin/%%s \"$@\"\n" % delay
    for node in PARTS["a"]:
        cluster.sim("set", "FLEET", node, "driver=550.54.15")
    try:
        with Shims(cluster, {"scontrol": slow % "scontrol", "sinfo": slow % "sinfo", "library": "/bin/true"}):
            with ThreadPoolExecutor(4) as pool:
                runs = list(pool.map(lambda n: run_entry(cluster, "healthcheck", n), PARTS["a"]))
        for result, took in runs:
            assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
            assert took < 50, took  # 40 s budget; slurmd kills at 60
        drained = _drained(cluster, "gpugate: drift")["a"]
        assert not drained, drained  # the keeper drains, within the budget; no node does
        records = {n: cluster.log_records(n)[-1] for n in PARTS["a"]}
        for node, record in records.items():
            assert record["verdict"] == "unfit"
            assert record["action"] in ("failed", "held"), record
        if delay == 20:
            # Two calls use the budget up: the third is never started.
            assert not drained
            assert all("no time left" in r["slurm_error"] or "timed out" in r["slurm_error"]
                       for r in records.values()), records
        else:
            # Slow, but both calls fit in the run: published and held.
            assert all(r["action"] == "held" and "budget keeper" in r["why"] for r in records.values()), records
    finally:
        for node in PARTS["a"]:
            cluster.sim("set", "FLEET", node, "driver=580.65.06")
