"""A hold survives the Node object (issue 45 item 3; gpugate.kube.survive):
the node's own record in its state directory, not the Node, is the
authority for a one-time event.  On a real kube-apiserver: an Xid 79 held,
the Node deleted and registered again (clean, as the kubelet or a cloud
node controller registers it), the next health check holds it again with
the same reason, and only the sweep's proof (its return on the Node)
lets the node forget it.  The pure decision: properties below."""

import json
import os

import pytest
from hypothesis import given, settings, strategies as st

from gpugate.kube import nodeview as nv
from gpugate.kube import survive
from gpugate.kube.client import node_path
from test_kube_agent import DEDICATED, api  # noqa: F401 (the module's API server)
from test_kube_sweep import site, sweep  # noqa: F401 (the fleet with its test kubelets)

TAG = "gpugate:"
XID = "gpugate: health xid:gpu2=79 (want none)"
LABELS = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def reason_on(admin, name):
    notes = admin.get(node_path(name))["metadata"].get("annotations") or {}
    return json.loads(notes[nv.OWNED])["reason"] if nv.OWNED in notes else ""


def condition(node):
    return [c for c in node["status"].get("conditions") or [] if c["type"] == nv.CONDITION][0]


@pytest.mark.kube
def test_a_node_registered_anew_is_held_again_until_the_sweep_proves_it(site):  # noqa: F811
    from gpugate.model.config import load_settings
    from gpugate.node.kube_agent import Agent
    from gpugate.testbed.kube import add_node

    admin, agent = site.admin, site.config("agent")
    site.sim("gpu03", "gpu.2.xid=79")
    site.healthcheck(agent, "gpu03")
    reason = reason_on(admin, "gpu03")
    assert reason.startswith("gpugate: health xid:gpu2=79"), reason
    state_dir = os.path.join(site.dir, "state", "gpu03")
    assert survive.read(state_dir)["reason"] == reason

    # kubectl delete node; the kubelet registers it again: a clean Node, another uid.
    old_uid = admin.get(node_path("gpu03"))["metadata"]["uid"]
    admin.request("DELETE", node_path("gpu03"))
    add_node(admin, "gpu03", LABELS, [DEDICATED])
    fresh = admin.get(node_path("gpu03"))
    assert fresh["metadata"]["uid"] != old_uid and nv.our_taints(fresh) == [] and nv.OWNED not in (
        fresh["metadata"].get("annotations") or {})

    # The node agent sees its Node anew without the hold and runs a health check at once.
    watcher = Agent(load_settings(agent), "gpu03", agent, ["/bin/true"], interval=300, poll=1)
    watcher.serve_once()
    assert watcher.check_now
    site.healthcheck(agent, "gpu03")  # fit (the Xid was read once), and held again with the same reason
    held = admin.get(node_path("gpu03"))
    assert reason_on(admin, "gpu03") == reason
    assert [t["value"] for t in nv.our_taints(held)] == ["health"] and held["spec"]["unschedulable"] is True
    assert DEDICATED in held["spec"]["taints"]
    cond = condition(held)
    assert (cond["status"], cond["reason"]) == ("True", "FitHeld") and reason in cond["message"]
    site.healthcheck(agent, "gpu03")  # and it stays so
    assert reason_on(admin, "gpu03") == reason
    assert survive.read(state_dir)["uid"] == held["metadata"]["uid"]

    # The sweep's proof (verify, reboot, smoke Pod) returns it; only then does the node forget the hold.
    out, report, _ = sweep(site)
    assert report["outcomes"].get("gpu03", {}).get("result") == "resumed", (report, out.stderr[-2000:])
    site.healthcheck(agent, "gpu03")
    back = admin.get(node_path("gpu03"))
    assert nv.our_taints(back) == [] and not back["spec"].get("unschedulable")
    assert (condition(back)["status"], condition(back)["reason"]) == ("True", "Fit")
    assert survive.read(state_dir) is None
    # Registered anew once more after the proof: nothing to hold.
    admin.request("DELETE", node_path("gpu03"))
    add_node(admin, "gpu03", LABELS, [DEDICATED])
    site.healthcheck(agent, "gpu03")
    assert nv.our_taints(admin.get(node_path("gpu03"))) == []


@pytest.mark.kube
def test_the_sweeps_hold_on_a_node_registered_during_its_work_is_followed_and_its_return_proves_it(site):  # noqa: F811
    """The Node registered anew during the sweep's reboot, held again there
    by the sweep with its work reason: the node agent follows that hold
    from its watch (the new uid), so the sweep's return on that Node is the
    proof, and the node is not held again after it."""
    from gpugate.model.config import load_settings
    from gpugate.node.kube_agent import Agent
    from gpugate.kube.nodes import connect
    from gpugate.testbed.kube import add_node

    admin, agent = site.admin, site.config("agent")
    site.sim("gpu02", "gpu.1.xid=79")
    site.healthcheck(agent, "gpu02")
    state_dir = os.path.join(site.dir, "state", "gpu02")
    assert survive.read(state_dir)["reason"].startswith("gpugate: health xid:gpu1=79")
    admin.request("DELETE", node_path("gpu02"))
    add_node(admin, "gpu02", LABELS, [DEDICATED])
    work = "gpugate: health sweep=reboot (want verified)"
    sweep = connect(load_settings(site.config("sweep")))
    try:
        sweep.drain("gpu02", work)  # the sweep's wait_up holds the new Node with its work reason
        watcher = Agent(load_settings(agent), "gpu02", agent, ["/bin/true"], interval=300, poll=1)
        watcher.serve_once()
        uid = admin.get(node_path("gpu02"))["metadata"]["uid"]
        assert survive.read(state_dir) == dict(survive.read(state_dir), reason=work, uid=uid)
        assert not watcher.check_now  # held already: nothing to restore
        sweep.resume("gpu02")  # its return, after its proof
    finally:
        sweep.close()
    site.healthcheck(agent, "gpu02")
    assert nv.our_taints(admin.get(node_path("gpu02"))) == [] and survive.read(state_dir) is None


def node(uid, reason="", taint=True, cordon=False, foreign_cordon=False):
    notes = {}
    taints = []
    if reason:
        notes[nv.OWNED] = json.dumps({"reason": reason, "at": 1, "effects": ["NoSchedule"], "cordon": cordon})
        if taint:
            taints.append({"key": nv.TAINT_KEY, "value": "health", "effect": "NoSchedule"})
    spec = {"taints": taints}
    if cordon or foreign_cordon:
        spec["unschedulable"] = True
    return {"metadata": {"name": "gpu03", "uid": uid, "resourceVersion": "9", "annotations": notes}, "spec": spec,
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


uids = st.sampled_from(["u1", "u2", "u3"])
reasons_ = st.sampled_from([XID, "gpugate: drift driver=1 (want 2)", "gpugate: health sweep=reboot (want verified)"])


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.none(), st.fixed_dictionaries({"reason": reasons_, "uid": uids})), uids,
       st.one_of(st.just(""), reasons_), st.booleans(), st.booleans())
def test_the_record_is_forgotten_only_on_a_lift_of_the_node_it_was_on(record, uid, on_node, taint, foreign):
    n = node(uid, on_node, taint=taint, foreign_cordon=foreign)
    action, reason = survive.decide(record, n, TAG)
    ours = bool(on_node and taint)
    if ours:  # the Node carries gpugate's hold: the record follows it
        assert reason == on_node and action in (survive.REMEMBER, survive.NOTHING)
        assert (action == survive.NOTHING) == (record == {"reason": on_node, "uid": uid})
    elif record is None:
        assert action == survive.NOTHING
    elif record["uid"] == uid:  # lifted on the very Node object it was on: the proof (or an admin's lift)
        assert action == survive.FORGET
    elif foreign:  # someone else's cordon stands: ours waits, the record stays
        assert (action, reason) == (survive.NOTHING, record["reason"])
    else:  # a Node registered anew: held again, with the same reason
        assert (action, reason) == (survive.RESTORE, record["reason"])


def test_a_damaged_record_is_dropped_never_written_on_a_node():
    for record in ({"reason": 3, "uid": "u1"}, {"reason": "someone's words", "uid": "u1"}, {}):
        assert survive.decide(record, node("u2"), TAG) == (survive.FORGET, "")
