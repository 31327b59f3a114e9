"""The budget keeper on Kubernetes against a real kube-apiserver (issue 45,
items 4 and 5): a held node's pool cannot be changed under the budget (the
pools ride on the keeper's Lease), a leader whose runs fail gives its Lease
up so another keeper takes over, and `gpugate status` reads the keeper's
last good run from the Lease.  What it serves over HTTP and the alerts
that fire from it: tests/test_kube_alerts.py."""

import json
import os
import socket
import subprocess
import sys
import time
from unittest import mock

import pytest

from gpugate.keeper import kube_lease_memory as lease_memory
from gpugate.kube import lease
from gpugate.kube import nodeview as nv
from gpugate.kube.client import KubeError, node_path
from test_kube_agent import DEMO_BASELINE, api  # noqa: F401 (the module's API server)

pytestmark = pytest.mark.kube

POOL = "nvidia.com/gpu.product"
H100 = "NVIDIA-H100-80GB-HBM3"
SIX = ("gpu01", "gpu02", "gpu03", "gpu04", "gpu05", "gpu06")
LEASE = "/apis/coordination.k8s.io/v1/namespaces/gpugate/leases/" + lease.NAME


@pytest.fixture
def six(api, tmp_path):  # noqa: F811
    from gpugate.testbed.kube import KubeFleet

    try:
        api.admin().request("DELETE", LEASE)  # another test's keeper may hold it
    except KubeError:
        pass
    return KubeFleet(api, str(tmp_path), SIX, DEMO_BASELINE, labels={POOL: H100})


DRIFT = "gpugate: drift driver=550.54.15 (want 580.65.06)"


def _publish_drift(fleet, share):
    """Each node publishes its drift for the keeper, signed with the drain
    budget key, one second apart (gpu01 the oldest), as its agent does
    (gpugate.node.hold; the agent's own writes are tests/test_kube_agent.py's)."""
    from gpugate.slurm import pending

    with open(fleet.key, "rb") as handle:
        key = handle.read().strip()  # as gpugate.safety.budgetkey reads it
    now = int(time.time())
    for i, name in enumerate(SIX):
        text = pending.publish("", DRIFT, now - 60 + i, key, name)
        fleet.admin.patch(node_path(name), {"metadata": {"annotations": {nv.PENDING: text}}})


def _tainted(fleet):
    return [n for n in SIX if nv.our_taints(fleet.admin.get(node_path(n)))]


def test_a_held_node_that_loses_its_pool_label_still_counts_in_its_pool(six):
    """Issue 45 item 4 as reproduced: six drifted Nodes, a budget of one;
    the held node loses its nvidia.com/gpu.product label.  Before, the
    next keeper run held a second node (the pool counted (5, 1, none));
    now the held node still counts there, and the budget stays one."""
    _publish_drift(six, 0.2)  # 20% of six: one node
    keeper = six.config("keeper", share=0.2)
    first = six.keeper(keeper)
    assert first["_exit"] == 0 and len(first["drained"]) == 1, json.dumps(first)
    held = first["drained"][0]
    six.admin.patch(node_path(held), {"metadata": {"labels": {POOL: None}}})  # anyone with Node patch rights
    assert POOL not in (six.admin.get(node_path(held))["metadata"].get("labels") or {})
    for _ in range(2):  # the first decides on the last run's re-read (gpugate.keeper.run's view), the second reads
        again = six.keeper(keeper)
        assert _tainted(six) == [held], again  # before: gpu02 as well
        assert again["_exit"] == 0 and again["drained"] == [], again
        assert again["partitions"][H100]["drained"] == 1, again["partitions"]
    stored = json.loads(six.admin.get(LEASE)["metadata"]["annotations"][lease.MEMORY])
    assert stored["pools"] == {H100: [held]}, stored  # where the keeper remembers it
    # Moved into another pool instead: counted in both while held.
    six.admin.patch(node_path(held), {"metadata": {"labels": {POOL: "NVIDIA-A100-SXM4-80GB"}}})
    both = six.keeper(keeper)
    assert both["drained"] == [] and both["partitions"][H100]["drained"] == 1, both
    assert both["partitions"]["NVIDIA-A100-SXM4-80GB"]["drained"] == 1, both["partitions"]
    assert _tainted(six) == [held]


def test_a_held_node_out_of_the_keepers_selector_still_counts(six):
    """The keeper lists the Nodes its node_selector names; a held node that
    loses that label is read on its own and still counted."""
    _publish_drift(six, 0.2)
    for name in SIX:
        six.admin.patch(node_path(name), {"metadata": {"labels": {"nvidia.com/gpu.present": "true"}}})
    keeper = six.config("keeper", share=0.2, extra='node_selector = "nvidia.com/gpu.present=true"')
    first = six.keeper(keeper)
    assert len(first["drained"]) == 1, first
    held = first["drained"][0]
    six.admin.patch(node_path(held), {"metadata": {"labels": {"nvidia.com/gpu.present": None, POOL: None}}})
    for _ in range(2):  # the first decides on the last run's re-read (gpugate.keeper.run's view), the second reads
        again = six.keeper(keeper)
        assert _tainted(six) == [held], again
        assert again["_exit"] == 0 and again["drained"] == [], again
        assert again["partitions"][H100]["drained"] == 1
    # Returned by an admin: forgotten, and the budget goes to the next node.
    six.admin.patch(node_path(held), {"metadata": {"annotations": {nv.OWNED: None}}, "spec": {
        "taints": [], "unschedulable": False}})
    later = six.keeper(keeper)
    assert len(later["drained"]) == 1 and later["drained"] != [held], later
    stored = json.loads(six.admin.get(LEASE)["metadata"]["annotations"][lease.MEMORY])
    assert stored["pools"] == {H100: later["drained"]}, stored


def _with_key(config: str, key: str, controller: str) -> str:
    """The keeper's gpugate.toml with another drain budget key file and its own state directory."""
    text = open(config).read()
    start = text.index('key_file = "') + len('key_file = "')
    text = text[:start] + key + text[text.index('"', start):]
    text = text.replace("/controller/sweep.db", "/%s/sweep.db" % controller)
    path = config.replace(".toml", "-%s.toml" % controller)
    with open(path, "w") as handle:
        handle.write(text)
    return path


def _run_as(identity: str, config: str) -> dict:
    """One keeper run in this process under another pod's name (a second replica)."""
    from gpugate.model.config import load_settings
    from gpugate.keeper.run import run

    with mock.patch("gpugate.keeper.kube_lead.socket.gethostname", return_value=identity):
        return run(load_settings(config))


def test_a_leader_whose_runs_fail_gives_its_lease_up_and_another_keeper_takes_it(six):
    """Issue 45 item 5: the leader renews its Lease before each run; runs
    that all fail (here its drain budget key is gone) used to keep it for
    ever, nothing budgeted drained.  After lease_give_up_runs (3) failed
    runs it releases the Lease; a second keeper takes it and drains."""
    _publish_drift(six, 0.2)
    good = six.config("keeper", share=0.2)
    broken = _with_key(good, os.path.join(six.dir, "no-such.key"), "controller-a")
    me = socket.gethostname()
    for run in (1, 2, 3):
        figures = six.keeper(broken)
        assert figures["_exit"] == 1 and figures["ok"] is False and "missing" in figures["error"], figures
        assert figures["failed_runs"] == run and figures["drained"] == [], figures
        spec = six.admin.get(LEASE)["spec"]
        assert spec.get("holderIdentity") == (me if run < 3 else None), (run, spec)
    said = json.loads(six.admin.get(LEASE)["metadata"]["annotations"][lease.STATUS])
    assert said["ok"] is False and said["failed_runs"] == 3 and "missing" in said["error"], said
    # The keeper that gave up stands back while another may take it ...
    back = six.keeper(broken)
    assert back["_exit"] == 0 and back["standby"].startswith("this keeper gave up the Lease"), back
    # ... and another replica does, and drains within the budget.
    other = _with_key(good, six.key, "controller-b")
    taken = _run_as("gpugate-keeper-7d9f-b", other)
    assert taken["ok"] is True and len(taken["drained"]) == 1, taken
    assert six.admin.get(LEASE)["spec"]["holderIdentity"] == "gpugate-keeper-7d9f-b"
    assert not any(n for n in SIX if n not in taken["drained"] and nv.our_taints(six.admin.get(node_path(n))))
    # The failing one, now a standby, says the keeper's last good run is the other's (from the Lease).
    standby = six.keeper(broken)
    assert standby["standby"].startswith("another keeper leads: gpugate-keeper-7d9f-b"), standby
    assert abs(standby["last_ok"] - taken["at"]) < 5 and standby["failed_runs"] == 0, standby


def test_gpugate_status_shows_the_keepers_last_good_run_from_the_lease(six):
    """Not from a replica's emptyDir: the status files here are removed first."""
    _publish_drift(six, 0.2)
    keeper = six.config("keeper", share=0.2)
    assert six.keeper(keeper)["_exit"] == 0
    controller = os.path.join(six.dir, "controller")
    for name in os.listdir(controller):
        if name.startswith("budget-keeper"):
            os.unlink(os.path.join(controller, name))

    def status(*flags):
        out = subprocess.run([sys.executable, "-m", "gpugate", "status", "--config", keeper] + list(flags),
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout

    said = json.loads(status("--json"))["budget_keeper"]
    assert said["ok"] is True and said["last_ok_by"] == socket.gethostname() and said["drained"] == 1, said
    assert time.time() - said["last_ok"] < 120 and said["holder"] == socket.gethostname()
    text = status()
    assert "budget keeper: last good run" in text and "by %s" % socket.gethostname() in text, text
    broken = _with_key(keeper, os.path.join(six.dir, "no-such.key"), "controller")
    assert six.keeper(broken)["_exit"] == 1
    text = status()
    assert "1 FAILED RUNS IN A ROW" in text and "LATEST RUN FAILED" in text and "missing" in text, text


def test_the_pools_are_kept_whole_or_not_written_and_a_status_alone_keeps_the_memory(api):  # noqa: F811
    from gpugate.budget.memory import Memory

    admin = api.admin()
    try:
        admin.request("DELETE", LEASE)
    except KubeError:
        pass
    assert lease.acquire(admin, "gpugate", "keeper-x", 60) == ""
    spans = {"gpu01": {"since": 1, "drained": 2.0, "returned": None}}
    lease_memory.write_memory(admin, "gpugate", "keeper-x", Memory(spans, {"gpu01": (H100,)}), status={"ok": True})
    assert lease_memory.read_memory(admin, "gpugate") == spans
    assert lease_memory.read_memory(admin, "gpugate").pools == {"gpu01": (H100,)}
    lease_memory.write_memory(admin, "gpugate", "keeper-x", None, status={"ok": True, "last_ok": 5.0})  # budget off
    assert lease_memory.read_memory(admin, "gpugate").pools == {"gpu01": (H100,)}
    assert lease.read_status(admin, "gpugate")["last_ok"] == 5.0
    huge = Memory({}, {"node-%06d.rack-%04d.example.com" % (i, i): (H100,) for i in range(6000)})
    with pytest.raises(KubeError, match="pools is over 128 KiB: not written"):
        lease_memory.write_memory(admin, "gpugate", "keeper-x", huge)
    assert lease_memory.read_memory(admin, "gpugate").pools == {"gpu01": (H100,)}  # the last one kept
    with pytest.raises(KubeError, match="no longer keeper-y's"):
        lease_memory.write_memory(admin, "gpugate", "keeper-y", Memory(spans, {}))
