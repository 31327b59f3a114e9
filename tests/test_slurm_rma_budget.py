"""RMA never bypasses the budget (issue 33, item 2) on a real slurmctld: a
deferred escalation goes through scontrol, `gpugate sweep --apply`,
`gpugate status` and the node's own health check as it does in
tests/test_rma_budget.py on the stand-in."""

import subprocess
import sys
import time

import pytest

from test_slurm_sweep import drain_flag, drift_and_drain, new_cluster, run_sweep  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_an_escalation_below_the_floor_waits_as_drained_and_goes_once_there_is_room(new_cluster):
    """4 nodes, floor 3, gpu01 in rma: gpu03's converge fails on every
    attempt; an rma would leave 2 nodes able to return to service.  It stays
    drained, `sweep=rma deferred` (its health checks keep it), and the
    sweep's next run after gpu01 came back escalates it."""
    cluster = new_cluster(nodes=4, sweep={"floor": 3})
    cluster.scontrol("update", "NodeName=gpu01", "State=DRAIN", "Reason=gpugate: rma xid:gpu3=79 (want none)")
    drift_and_drain(cluster, "gpu03")
    cluster.sim("set", "FLEET", "gpu03", "converge=error")
    code, report, err = run_sweep(cluster)
    assert code == 0 and report["outcomes"]["gpu03"]["result"] == "deferred", (report, err)
    assert "partition gpu at its floor: 3 of 4" in report["outcomes"]["gpu03"]["detail"]
    deferred = cluster.reason("gpu03")
    assert deferred.startswith("gpugate: drift sweep=rma deferred (want room in budget and floor); driver=550.54.15"), \
        deferred
    time.sleep(2 * cluster.health_interval + 1)
    assert cluster.reason("gpu03") == deferred and drain_flag(cluster, "gpu03")  # its health checks keep it
    status = subprocess.run([sys.executable, "-m", "gpugate", "status", "--config", cluster.gpugate_conf],
                            capture_output=True, text=True, env=cluster.env, timeout=60).stdout
    assert "escalation deferred: partition gpu at its floor" in status, status
    preview = subprocess.run([sys.executable, "-m", "gpugate", "sweep", "--config", cluster.gpugate_conf],
                             capture_output=True, text=True, env=cluster.env, timeout=60).stdout
    assert "gpu03      deferred  escalation deferred: partition gpu at its floor" in preview, preview
    cluster.scontrol("update", "NodeName=gpu01", "State=RESUME")  # its GPU replaced
    cluster.wait_for(lambda: cluster.state("gpu01") == "idle", 30, "gpu01 idle")
    code, report, err = run_sweep(cluster)
    assert code == 0 and report["outcomes"].get("gpu03", {}).get("result") == "escalated", (report, err)
    assert cluster.reason("gpu03").startswith("gpugate: rma budgeted=drift driver (want counted); driver=550.54.15")
