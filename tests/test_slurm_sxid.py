"""A real cluster: a fatal NVSwitch SXid drains the node with a precise
reason; a non-fatal one does not drain on its first occurrence, only at the
policy's rate (xid_nonfatal_max within xid_window_seconds)."""

import pytest

from test_slurm_faults import run_entry

pytestmark = pytest.mark.slurm

CLUSTER = {"nodes": 2, "interval": 600}


def test_nonfatal_sxid_is_counted_then_drains_at_the_rate(cluster):
    node = "gpu01"
    cluster.sim("set", "FLEET", node, "sxid=12028:nonfatal@2")
    result, _ = run_entry(cluster, "healthcheck", node)
    assert result.returncode == 0, result.stderr
    assert "drain" not in cluster.state(node) and cluster.reason(node) == ""
    cluster.sim("set", "FLEET", node, *["sxid=12028:nonfatal@2"] * 9)  # 10 in the window: the default rate
    result, _ = run_entry(cluster, "healthcheck", node)
    assert result.returncode == 1
    assert "drain" in cluster.state(node)
    assert cluster.reason(node).startswith("gpugate: health sxid=nvswitch2 12028 non-fatal >=10 (want < 10 in")


def test_fatal_sxid_drains_at_once_with_a_precise_reason(cluster):
    node = "gpu02"
    cluster.sim("set", "FLEET", node, "sxid=20034@1")
    result, _ = run_entry(cluster, "healthcheck", node)
    assert result.returncode == 1, result.stderr
    assert "drain" in cluster.state(node)
    assert cluster.reason(node).startswith("gpugate: health sxid=nvswitch1 20034 fatal (want none)")
    # The next check no longer sees it as new, but a health drain stays (the sweep reboots the node).
    run_entry(cluster, "healthcheck", node)
    assert "drain" in cluster.state(node) and "sxid=nvswitch1 20034" in cluster.reason(node)
