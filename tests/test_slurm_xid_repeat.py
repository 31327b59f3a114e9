"""Issue 33, item 1, against a real slurmctld: a node drained by the budget
keeper for xid_repeat, then RESUMEd by an admin, is not drained again for
the same evidence (before: drained, and escalated, a minute later).  The
node's health check reads its own record (scontrol), marks the drain once it
is older than the keeper's give-back, and clears the GPU's history when it
sees the node back in service; then it clears its published finding, and
the keeper has nothing to drain."""

import json
import os
import sys
import time

import pytest

from gpugate.slurm import pending

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
INTERVAL = 5
CLUSTER = {"nodes": 2, "interval": INTERVAL, "partitions": {"a": "gpu[01-02]"},
           "extra": "[drain_budget]\nmax_share = 0.5\n[budgets]\nhealthcheck = 15\n"}
BUS = "0000:3a:00"


def _history(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def _comment(cluster, node):
    out = cluster.run(["/usr/bin/sinfo", "-h", "-N", "-n", node, "--Format=NodeList:0|,Comment:0"]).stdout
    for line in out.splitlines():
        name, _, comment = line.partition("|")
        if name.strip() == node:
            return "" if comment.strip() == "(null)" else comment.strip()
    return ""


def _keeper(cluster):
    """One run of the budget keeper: what it drained."""
    return json.loads(cluster.run([sys.executable, "-m", "gpugate", "budget", "--json", "--config",
                                   cluster.gpugate_conf]).stdout)


def _write(path, gpus):
    with open(path + ".new", "w") as handle:
        json.dump({"gpus": gpus}, handle)
    os.replace(path + ".new", path)


def _publishes(cluster, node, words):
    def published():
        seen = pending.read(_comment(cluster, node))
        return seen is not None and words in seen.reason
    return published


def test_an_admins_resume_clears_the_history_and_the_keeper_drains_nothing_again(cluster):
    node = "gpu01"
    path = cluster.path("state", node, "xid-history.json")
    now = time.time()
    # What three epilogs of three users' jobs recorded on GPU 2 (the epilog's own tests build it job by job).
    jobs = {str(500 + i): [now - 120 + i, str(1001 + i), [31], 1] for i in range(3)}
    _write(path, {BUS: {"jobs": jobs, "seen": []}})
    published = _publishes(cluster, node, "xid_repeat")
    cluster.wait_for(published, 6 * INTERVAL, "the health check to publish xid_repeat")
    out = _keeper(cluster)
    assert out["drained"] == [node], out
    assert "xid_repeat:gpu2=xids in >=3 jobs" in cluster.reason(node)
    # A health check that sees the drain past the keeper's give-back (60 s) marks the GPU.
    cluster.wait_for(lambda: BUS in ((_history(path) or {}).get("drained") or {}), 90, "the drain to be marked")
    cluster.scontrol("update", "NodeName=" + node, "State=RESUME")
    cluster.wait_for(lambda: not (_history(path) or {}).get("drained") and not published(), 6 * INTERVAL,
                     "the RESUME to clear the history and the published finding")
    assert not ((_history(path) or {"gpus": {}})["gpus"].get(BUS) or {}).get("jobs")
    # The run that cleared them writes its line as it ends: wait for it.
    cluster.records_when(node, lambda r: "returned to service" in (r.get("xid_history") or ""))
    records = [r for r in cluster.log_records(node) if "xid_history" in r]
    assert records and "returned to service" in records[-1]["xid_history"], records[-1:]
    out = _keeper(cluster)
    assert out["drained"] == [] and cluster.reason(node) == "", out


def test_a_fault_on_several_gpus_across_users_is_published_and_drained_for_the_node(cluster):
    """Issue 44, item 6, on a real slurmctld: three users' jobs each with
    Xid 13 on GPU 2 and Xid 43 on GPU 5 (before: every user's faults
    'followed them across GPUs', nothing published, nothing drained).  The
    node's health check publishes one finding for the node, naming both
    GPUs; the budget keeper drains it."""
    node = "gpu02"
    path = cluster.path("state", node, "xid-history.json")
    now = time.time()
    gpus = {}
    for bus, xid in ((BUS, 13), ("0000:ab:00", 43)):  # the simulated HGX's GPUs 2 and 5
        gpus[bus] = {"jobs": {str(700 + i): [now - 120 + i, str(1001 + i), [xid], 1] for i in range(3)}, "seen": []}
    _write(path, gpus)
    published = _publishes(cluster, node, "xid_repeat=xids on gpus 2+5 of >=2 users")
    cluster.wait_for(published, 6 * INTERVAL, "the health check to publish the node's xid_repeat")
    out = _keeper(cluster)
    assert node in out["drained"], out
    assert "health xid_repeat=xids on gpus 2+5 of >=2 users (want < 3 jobs within 24h)" in cluster.reason(node)
