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


def test_an_admins_resume_clears_the_history_and_the_keeper_drains_nothing_again(cluster):
    node = "gpu01"
    path = cluster.path("state", node, "xid-history.json")
    now = time.time()
    # What three epilogs of three users' jobs recorded on GPU 2 (the epilog's own tests build it job by job).
    jobs = {str(500 + i): [now - 120 + i, str(1001 + i), [31], 1] for i in range(3)}
    with open(path + ".new", "w") as handle:
        json.dump({"gpus": {BUS: {"jobs": jobs, "seen": []}}}, handle)
    os.replace(path + ".new", path)

    def published():
        seen = pending.read(_comment(cluster, node))
        return seen is not None and "xid_repeat" in seen.reason

    cluster.wait_for(published, 6 * INTERVAL, "the health check to publish xid_repeat")
    out = json.loads(cluster.run([sys.executable, "-m", "gpugate", "budget", "--json", "--config",
                                  cluster.gpugate_conf]).stdout)
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
    out = json.loads(cluster.run([sys.executable, "-m", "gpugate", "budget", "--json", "--config",
                                  cluster.gpugate_conf]).stdout)
    assert out["drained"] == [] and cluster.reason(node) == "", out
