"""The fleet drain budget against a real slurmctld (issue 26): a wrong pin
pushed to every node is published on each node's own record and drains
nothing until the budget keeper (`gpugate budget`) runs; the keeper drains
exactly the budget of each partition, two keepers racing never more;
acute findings always drain at once; held nodes keep running jobs; no
node-side run reads the whole node table."""

import json
import os
import re
import sys
import time

import pytest

from gpugate.slurm import pending
from gpugate.testbed.calls import about, kind

pytestmark = pytest.mark.slurm
INTERVAL = 5
CLUSTER = {
    "nodes": 8, "interval": INTERVAL, "partitions": {"a": "gpu[01-04]", "b": "gpu[05-08]"},
    # Half of each 4-node partition: 2 nodes may be out for drift at once.
    "extra": "[drain_budget]\nmax_share = 0.5\n[budgets]\nhealthcheck = 15\n",
}
PARTS = {"a": ["gpu01", "gpu02", "gpu03", "gpu04"], "b": ["gpu05", "gpu06", "gpu07", "gpu08"]}
WRONG = "580.95.05"


def _push_wrong_driver_pin(cluster):
    """What a bad merge does: every node gets a baseline whose driver pin
    no node runs.  Written the way the docs ask (write, then rename)."""
    with open(cluster.baseline) as handle:
        text = handle.read()
    text = text.replace('driver = "580.65.06"', 'driver = "%s"' % WRONG, 1)
    text = text.replace('fabricmanager = "580.65.06"', 'fabricmanager = "%s"' % WRONG, 1)
    assert text.count(WRONG) == 2
    tmp = cluster.baseline + ".new"
    with open(tmp, "w") as handle:
        handle.write(text)
    os.replace(tmp, cluster.baseline)


def _drift_drained(cluster):
    return {p: sorted(n for n in nodes if "drain" in cluster.state(n)
                      and cluster.reason(n).startswith("gpugate: drift driver=580.65.06 (want %s)" % WRONG))
            for p, nodes in PARTS.items()}


def _held(cluster, node, since):
    """Runs of ``node`` logged after the ``since`` count of its records that held it."""
    return [r for r in cluster.log_records(node)[since[node]:] if r.get("action") == "held"]


def _comments(cluster):
    """node -> its Slurm Comment ("" for none)."""
    out = cluster.run(["/usr/bin/sinfo", "-h", "-N", "--Format=NodeList:0|,Comment:0"]).stdout
    found = {}
    for line in out.splitlines():
        name, _, comment = line.partition("|")
        found[name] = "" if comment.strip() == "(null)" else comment.strip()
    return found


def _signed(cluster, admin, reason, since, node):
    """The comment ``node``'s own publish writes (gpugate.node.hold): signed
    with the rig's drain budget key now, first published at ``since``."""
    with open(cluster.path("drain-budget.key"), "rb") as handle:
        key = handle.read().strip()
    return pending.publish(admin, reason, int(time.time()), key, node, since=since)  # since: its published.json


def _keeper(cluster, config=None, check=True):
    return cluster.run([sys.executable, "-m", "gpugate", "budget", "--json", "--config", config or cluster.gpugate_conf],
                       check=check)


def _per_node(lines, nodes):
    """node -> {full, single, update, other} counts of the Slurm calls about
    it, and "" -> those about no one node (full reads)."""
    counts = {n: {"full": 0, "single": 0, "update": 0, "other": 0} for n in list(nodes) + [""]}
    for line in lines:
        counts.setdefault(about(line), {"full": 0, "single": 0, "update": 0, "other": 0})[kind(line)] += 1
    return counts


def test_two_keepers_racing_never_drain_beyond_the_budget(cluster, tmp_path):
    """Two keepers (two controller hosts: their own state directories and
    host locks) decide on different views of the same fleet: keeper A reads
    while gpu02 and gpu04 have published; then gpu01 publishes an older
    finding and keeper B runs to the end (it drains gpu01 and gpu02); A
    goes on with its decision.  A's re-read of gpu02 skips it (drained
    meanwhile), it drains gpu04: three drains for an allowance of two, until
    A's re-read of the fleet gives back the newest.  Then both keepers, run
    at the same moment a few times, hold the partition at its budget."""
    from gpugate.keeper import run as keeper
    from gpugate.model.config import load_settings
    from gpugate.slurm import connect

    reason = "gpugate: drift driver=580.65.06 (want %s)" % WRONG
    other = str(tmp_path / "keeper-b.toml")
    with open(cluster.gpugate_conf) as handle:
        text = handle.read()
    with open(other, "w") as handle:
        handle.write(text.replace(cluster.path("state", "sweep.db"), str(tmp_path / "b" / "sweep.db")))
    os.chmod(other, 0o644)
    for node, since in (("gpu02", 200), ("gpu04", 201)):
        cluster.scontrol("update", "NodeName=" + node, "Comment=" + _signed(cluster, "", reason, since, node))
    settings = load_settings(cluster.gpugate_conf)
    slurm = connect(settings)
    # The command backend's lean read (slurm.fleet); the pyslurm backend has none: the keeper reads nodes().
    read, read_fleet = slurm.nodes, getattr(slurm, "fleet", None)
    raced = []

    def race():
        if not raced:  # keeper A has its view: now the world moves on
            raced.append(True)
            cluster.scontrol("update", "NodeName=gpu01", "Comment=" + _signed(cluster, "rack 1", reason, 100, "gpu01"))
            b = json.loads(_keeper(cluster, other).stdout)
            assert b["drained"] == ["gpu01", "gpu02"], b

    def nodes(names=None, **kw):
        found = read(names, **kw)
        if names is None:
            race()
        return found

    def fleet():  # the keeper's full read (gpugate.slurm.nodestate.lean)
        found = read_fleet()
        race()
        return found
    slurm.nodes = nodes
    if read_fleet is not None:
        slurm.fleet = fleet
    try:
        figures = keeper.run_once(settings, slurm)
    finally:
        slurm.close()
    assert figures["drained"] == ["gpu04"] and figures["given_back"] == ["gpu04"], figures
    assert figures["skipped"] == {"gpu02": "changed since the fleet read"}
    assert _drift_drained(cluster)["a"] == ["gpu01", "gpu02"]
    assert _comments(cluster)["gpu01"].startswith("rack 1 [gpugate-pending @100 seen @")  # the admin's text kept

    # Both at once, again and again: a held node is never drained beyond the budget.
    cluster.scontrol("update", "NodeName=gpu[01-02]", "State=RESUME")
    # (25.11 has a resumed node NOT_RESPONDING until its next ping; 24.11 keeps its reason.)
    cluster.wait_for(lambda: all(cluster.state(n) == "idle" for n in PARTS["a"]), 30, "gpu01, gpu02 back in service")
    for node, since in (("gpu01", 300), ("gpu02", 301), ("gpu03", 302), ("gpu04", 303)):
        cluster.scontrol("update", "NodeName=" + node, "Comment=" + _signed(cluster, "", reason, since, node))
    for _ in range(3):
        import subprocess

        argv = [sys.executable, "-m", "gpugate", "budget", "--json", "--config"]
        procs = [subprocess.Popen(argv + [conf], env=cluster.env, stdout=subprocess.PIPE, text=True)
                 for conf in (cluster.gpugate_conf, other)]
        outs = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
        assert all(o["ok"] for o in outs), outs
        assert len(_drift_drained(cluster)["a"]) == 2, outs
    assert _drift_drained(cluster)["a"] == ["gpu01", "gpu02"]  # oldest published first
    # Clean up for the next test: these nodes are fit, nothing of theirs is published.
    cluster.scontrol("update", "NodeName=gpu[01-02]", "State=RESUME")
    cluster.scontrol("update", "NodeName=gpu[01-04]", "Comment=")


@pytest.mark.slow
def test_an_admins_pasted_tag_drains_nothing_and_a_nodes_own_still_drains(cluster):
    """Issue 33, item 6, on a real slurmctld: an admin pastes a gpugate tag
    older than anything real into healthy gpu01's Comment (scontrol); gpu02
    drifts for real and its own health check publishes it, signed.  The
    keeper drains gpu02 only and names gpu01's an unverified tag.  gpu02's
    signed comment copied onto gpu03 drains nothing either.  Before, the
    keeper drained gpu01 first."""
    reason = "gpugate: drift driver=580.65.06 (want %s)" % WRONG
    cluster.scontrol("update", "NodeName=gpu01", "Comment=PSU swap; was [gpugate-pending @1] %s [/gpugate-pending]"
                     % reason)
    cluster.sim("set", "FLEET", "gpu02", "driver=550.54.15")
    try:
        cluster.wait_for(lambda: " proof " in _comments(cluster)["gpu02"], 3 * INTERVAL + 20, "gpu02 published, signed")
        out = json.loads(_keeper(cluster).stdout)
        assert out["drained"] == ["gpu02"], out
        assert out["held_nodes"]["gpu01"].startswith("unverified tag: no proof"), out
        assert "drain" not in cluster.state("gpu01")
        cluster.scontrol("update", "NodeName=gpu03", "Comment=" + _comments(cluster)["gpu02"])
        _keeper(cluster)  # decides on the last run's re-read (kept 40 s, used once): before the copy
        out = json.loads(_keeper(cluster).stdout)
        assert out["drained"] == [] and "not this node's" in out["held_nodes"]["gpu03"], out
        assert "drain" not in cluster.state("gpu03")
    finally:
        cluster.sim("set", "FLEET", "gpu02", "driver=580.65.06")
        cluster.wait_for(lambda: pending.read(_comments(cluster)["gpu02"]) is None, 3 * INTERVAL + 20,
                         "gpu02 fit again, its finding cleared")
        cluster.scontrol("update", "NodeName=gpu[01-03]", "Comment=")
        if "drain" in cluster.state("gpu02"):
            cluster.scontrol("update", "NodeName=gpu02", "State=RESUME")


@pytest.mark.long
def test_wrong_pin_everywhere_is_held_without_a_keeper_and_the_keeper_drains_only_the_budget(cluster):
    cluster.sim("set", "FLEET", "gpu03", "gpu.3.xid=79")
    cluster.wait_for(lambda: cluster.reason("gpu03").startswith("gpugate: health"), 3 * INTERVAL + 20,
                     "gpu03 drained for Xid 79")
    pushed = {n: len(cluster.log_records(n)) for n in cluster.nodes}
    calls = len(cluster.slurm_calls())
    _push_wrong_driver_pin(cluster)
    drifted = [n for n in cluster.nodes if n != "gpu03"]

    # No keeper, no harm: every drifted node publishes its finding and is
    # held (jobs run); none is drained.
    def published():
        comments = _comments(cluster)
        return all(pending.read(comments[n]) is not None and _held(cluster, n, pushed) for n in drifted)
    cluster.wait_for(published, 3 * INTERVAL + 30, "every drifted node published and held")
    assert _drift_drained(cluster) == {"a": [], "b": []}
    assert cluster.reason("gpu03").startswith("gpugate: health xid")  # acute: drained by the node itself
    # What that cost slurmctld, per node: its own record (the single-node
    # RPC) and one comment update; no full node-table read on any node.
    # (No keeper runs meanwhile: every call in this window is a node's.)
    counts = _per_node(cluster.slurm_calls()[calls:], cluster.nodes)
    assert all(c["full"] == 0 for c in counts.values()), counts
    for node in drifted:
        assert 1 <= counts[node]["single"] <= 2 and 1 <= counts[node]["update"] <= 2, counts
    # Steady: more health checks, and no node asks the controller anything.
    calls = len(cluster.slurm_calls())
    runs = {n: len(cluster.log_records(n)) for n in drifted}
    # (Waited for, not slept: on a loaded 2-core CI machine slurmd's timer
    # may run a node's check late.)
    cluster.wait_for(lambda: all(len(cluster.log_records(n)) > runs[n] for n in drifted), 4 * INTERVAL + 30,
                     "every drifted node ran its health check again")
    assert cluster.slurm_calls()[calls:] == []
    assert _drift_drained(cluster) == {"a": [], "b": []}

    # The keeper: one run drains the budget of each partition (half of 4: 2;
    # gpu03's acute drain does not count), oldest published first.
    calls = len(cluster.slurm_calls())
    figures = json.loads(_keeper(cluster).stdout)
    drained = _drift_drained(cluster)
    assert [len(v) for v in drained.values()] == [2, 2] and figures["given_back"] == []
    assert sorted(figures["drained"]) == sorted(drained["a"] + drained["b"])
    mine = [kind(c) for c in cluster.slurm_calls()[calls:]]
    assert mine.count("full") == 2 and mine.count("single") == 4 and mine.count("update") == 1, mine
    # The next run decides on that run's re-read (no read at all), the one
    # after reads the fleet once; the budget is spent: nothing else.
    for reads in ([], ["full"]):
        calls = len(cluster.slurm_calls())
        again = json.loads(_keeper(cluster).stdout)
        assert again["drained"] == [] and again["held"] == 3
        # ("other": the pyslurm worker's start asks `sinfo --version`.)
        assert [kind(c) for c in cluster.slurm_calls()[calls:] if kind(c) != "other"] == reads
    held = [n for n in drifted if n not in drained["a"] + drained["b"]]
    assert len(held) == 3
    for node in held:
        assert cluster.state(node) == "idle" and cluster.reason(node) == ""
        assert pending.read(_comments(cluster)[node]) is not None
        record = _held(cluster, node, pushed)[-1]
        assert record["verdict"] == "unfit" and record["cls"] == "drift" and "budget keeper" in record["why"]

    # The admin sees it: gpugate status and the controller's metrics.
    gpugate = [sys.executable, "-m", "gpugate"]
    status = cluster.run(gpugate + ["status", "--config", cluster.gpugate_conf], check=False)
    assert status.returncode == 0, status.stderr
    for part in ("a", "b"):
        assert "drain budget 2/2 SPENT" in [line for line in status.stdout.splitlines()
                                            if line.startswith("partition " + part)][0]
    assert "HELD 3 nodes" in status.stdout and "budget keeper: last good run" in status.stdout
    summary = json.loads(cluster.run(gpugate + ["status", "--json", "--config", cluster.gpugate_conf]).stdout)
    # used: the nodes' worth held (on Slurm a node is whole: as many as drained)
    assert summary["partitions"]["b"]["budget"] == {"allowance": 2, "drained": 2, "used": 2, "spent": True}
    assert sorted(summary["held"]) == sorted(held)
    metrics = cluster.run(gpugate + ["metrics", "--config", cluster.gpugate_conf]).stdout
    assert 'gpugate_drain_budget_used_nodes{partition="a"} 2' in metrics
    assert 'gpugate_drain_budget_nodes{partition="b"} 2' in metrics
    assert 'gpugate_drain_budget_held_nodes{partition="b"} 2' in metrics
    assert "gpugate_budget_keeper_last_run_timestamp_seconds 0" not in metrics

    # A held node keeps running jobs: its prolog lets them start.
    calls = len(cluster.slurm_calls())  # from here on only nodes call Slurm (prolog, epilog, health check)
    node = held[0]
    job = cluster.run(["/usr/bin/sbatch", "--parsable", "-w", node, "-o", "/dev/null", "--wrap", "true"]).stdout.strip()
    cluster.wait_for(lambda: "JobState=COMPLETED" in cluster.scontrol("show", "job", job, check=False),
                     60, "job %s to complete on held %s" % (job, node))
    assert "Restarts=0" in cluster.scontrol("show", "job", job)
    prolog = [r for r in cluster.log_records(node) if r.get("mode") == "prolog" and r.get("job") == job]
    assert prolog and prolog[-1]["action"] == "held" and prolog[-1]["exit"] == 0

    # An acute finding on a held node drains it at once, keeper or not: a
    # GPU lost (fewer than the node showed), an Xid 79; its published
    # finding is cleared (the keeper must not count it).
    cluster.sim("set", "FLEET", node, "gpus=7")
    cluster.sim("set", "FLEET", held[1], "gpu.5.xid=79")
    cluster.wait_for(lambda: cluster.reason(node).startswith("gpugate: health gpus_lost=7"), 3 * INTERVAL + 20,
                     "held %s drained for a lost GPU" % node)
    cluster.wait_for(lambda: cluster.reason(held[1]).startswith("gpugate: health xid:gpu5=79"), 3 * INTERVAL + 20,
                     "held %s drained for Xid 79" % held[1])
    assert pending.read(_comments(cluster)[node]) is None
    assert _drift_drained(cluster) == drained
    # No node-side path read the whole node table: prolog, epilog, health check.
    assert [c for c in cluster.slurm_calls()[calls:] if kind(c) == "full"] == []
