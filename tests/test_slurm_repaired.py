"""The way back from rma after a hardware repair, on a real slurmctld and
slurmd: `gpugate sweep repaired` hands a node gpugate escalated back to the
sweep, whose next run reboots, verifies and smoke-tests it and only then
RESUMEs it; a node drained with an admin's reason is refused and untouched."""

import subprocess
import time

import pytest

from conftest import check_now
from test_slurm_sweep import drain_flag, fit, journal_events, new_cluster, run_sweep, sweep_argv  # noqa: F401

pytestmark = pytest.mark.slurm

RMA = "gpugate: rma xid:gpu3=79 (want none)"  # what the sweep writes for an Xid 79 its policy escalates
ADMIN = "admin: PSU swap, ticket 4711"
WORK = "gpugate: health sweep=reboot after repair (want verified)"


def test_a_repaired_node_is_proved_then_resumed_and_an_admin_s_drain_is_refused(new_cluster):
    cluster = new_cluster(nodes=4)
    cluster.scontrol("update", "NodeName=gpu02", "State=DRAIN", "Reason=%s" % RMA)
    cluster.scontrol("update", "NodeName=gpu03", "State=DRAIN", "Reason=%s" % ADMIN)
    code, report, err = run_sweep(cluster)  # rma waits for a human; the admin's drain is not gpugate's
    assert code == 0 and report["outcomes"] == {}, (report, err)

    # The GPU is replaced; the admin hands both nodes back.
    result = subprocess.run(sweep_argv(cluster, "repaired", "gpu[02-03]"), capture_output=True, text=True,
                            timeout=60, env=cluster.env)
    assert result.returncode == 1, result.stdout + result.stderr  # one node refused
    assert result.stdout.startswith("gpu02: repaired") and "only then resumes it" in result.stdout
    assert "gpu03: refused, left as it is" in result.stderr and "never replaced" in result.stderr
    assert cluster.reason("gpu02") == WORK and drain_flag(cluster, "gpu02")
    assert cluster.reason("gpu03") == ADMIN and drain_flag(cluster, "gpu03")

    # Its own health check finds it fit, and still leaves it to the sweep: never a bare RESUME.
    check_now(cluster, "gpu02")
    time.sleep(1)
    assert cluster.reason("gpu02") == WORK and drain_flag(cluster, "gpu02")

    code, report, err = run_sweep(cluster)
    assert code == 0, err
    assert report["outcomes"]["gpu02"]["result"] == "resumed", report
    assert "gpu03" not in report["outcomes"]
    steps = [(s, st) for _, s, st, _ in journal_events(cluster, "gpu02")]
    done = [s for s, st in steps if st == "done"]
    order = [done.index(s) for s in ("repaired", "planned", "reboot", "wait_up", "verify", "smoke", "resume")]
    assert order == sorted(order), steps
    cluster.wait_for(lambda: cluster.state("gpu02") == "idle", 30, "gpu02 idle")
    assert fit(cluster, "gpu02")
    assert cluster.reason("gpu03") == ADMIN and drain_flag(cluster, "gpu03")

    # Once back in service there is nothing to repair: refused, untouched.
    again = subprocess.run(sweep_argv(cluster, "repaired", "gpu02"), capture_output=True, text=True, timeout=60,
                           env=cluster.env)
    assert again.returncode == 1 and "nothing to return" in again.stderr, again.stderr
    assert cluster.state("gpu02") == "idle"
