"""Issue 33, item 5 against a real slurmctld and slurmd: a compromised node
answering its verification 100,000 levels deep fails alone; the sweep
finishes, the other node of the batch is resumed, and the batch's
maintenance reservation, made with an end, is gone."""

import re
import sys

import pytest

from test_slurm_sweep import drain_flag, drift_and_drain, journal_events, new_cluster, run_sweep  # noqa: F401

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# `gpugate` as the sweep runs it for each node: the real one, except that
# gpu02 (root there is the attacker) answers its verification 100,000 deep.
NODE_SIDE = r'''
import os, sys
argv = sys.argv[1:]
if argv[0] == "check" and argv[argv.index("--node") + 1] == "gpu02":
    print('{"node": "gpu02", "fit": true, "facts": ' + "[" * 100000 + "]" * 100000 + "}")
    sys.exit(0)
os.execv(sys.executable, [sys.executable, "-m", "gpugate"] + argv)
'''


def test_a_100000_deep_answer_fails_that_node_alone_and_leaves_no_reservation(new_cluster, tmp_path):  # noqa: F811
    stub = tmp_path / "gpugate-node.py"
    stub.write_text(NODE_SIDE)
    cluster = new_cluster(nodes=4, sweep={"floor": 0, "gpugate": [sys.executable, str(stub)]})
    drift_and_drain(cluster, "gpu[01-02]")
    code, report, err = run_sweep(cluster)
    assert code == 0 and not report["stopped"], err  # before: internal error: RecursionError
    results = {n: o["result"] for n, o in report["outcomes"].items()}
    assert results["gpu01"] == "resumed" and results["gpu02"] in ("escalated", "deferred"), results
    failed = [e for e in journal_events(cluster, "gpu02") if e[1:3] == ("verify", "failed")]
    assert len(failed) >= 2 and drain_flag(cluster, "gpu02")  # each attempt (the rig rolls back too)
    with open(cluster.path("log", "slurm-calls.log")) as handle:
        made = re.findall(r"create reservation ReservationName=gpugate_sweep_\S+ .*Duration=(\S+)", handle.read())
    assert made and all(d.isdigit() and int(d) < 24 * 60 for d in made), made  # before: UNLIMITED
    assert "gpugate_sweep" not in cluster.scontrol("show", "reservation")
