"""How a Kubernetes Node reads as a NodeState and what gpugate writes on it
(gpugate.kube.nodeview): pure rules, properties over arbitrary foreign
taints and cordons.  The same writes against a real kube-apiserver:
tests/test_kube_agent.py."""

import copy
import json

from hypothesis import given, settings, strategies as st

from gpugate.kube import nodeview as nv
from gpugate.model import ownership
from gpugate.model.verdict import decide
from gpugate.model.findings import Finding

TAG = "gpugate:"
DRIFT = "gpugate: drift driver=550.54.15 (want 580.65.06)"
ECC = "gpugate: health ecc:gpu6=4 uncorrected (want <= 0)"


def merge(target, patch):
    """RFC 7386 JSON merge patch, as the API server applies one."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge(out.get(key), value)
    return out


def node(taints=(), cordon=False, annotations=None, ready="True", labels=None):
    return {"metadata": {"name": "gpu01", "resourceVersion": "7", "annotations": dict(annotations or {}),
                         "labels": dict(labels or {})},
            "spec": {"taints": [dict(t) for t in taints], **({"unschedulable": True} if cordon else {})},
            "status": {"conditions": [{"type": "Ready", "status": ready}]}}


def unfit(reason_findings):
    return decide(reason_findings, TAG)


ECC_VERDICT = unfit([Finding("health", "ecc", "4 uncorrected", "<= 0", "", gpu=6)])

foreign_taint = st.fixed_dictionaries({
    "key": st.sampled_from(["nvidia.com/gpu", "dedicated", "node.kubernetes.io/not-ready", "example.com/maint"]),
    "value": st.sampled_from(["", "true", "team-a"]),
    "effect": st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"])})


def test_a_plain_node_is_in_service_and_an_admins_cordon_is_theirs():
    assert nv.state_of(node()).in_service and not nv.state_of(node()).drain
    admin = nv.state_of(node(cordon=True))
    assert admin.drain and admin.reason == nv.FOREIGN_CORDON
    assert ownership.decide(admin, ECC_VERDICT, TAG, ("probe",)).kind == ownership.KEEP_ADMIN
    assert ownership.decide(nv.state_of(node()), ECC_VERDICT, TAG, ("probe",)).kind == ownership.DRAIN


def test_a_taint_with_gpugates_key_it_did_not_write_is_someone_elses():
    pasted = node(taints=[{"key": nv.TAINT_KEY, "value": "health", "effect": "NoSchedule"}])
    state = nv.state_of(pasted)
    assert state.drain and "not written by gpugate" in state.reason
    assert ownership.decide(state, ECC_VERDICT, TAG, ("probe",)).kind == ownership.KEEP_ADMIN
    try:
        nv.drain_patch(pasted, ECC, "health", False, 100)
    except ValueError as exc:
        assert "left alone" in str(exc)
    else:
        raise AssertionError("drained over a taint gpugate did not write")


def test_a_damaged_ownership_record_owns_nothing():
    for text in ("{", "[]", json.dumps({"reason": 3, "effects": ["NoSchedule"]}),
                 json.dumps({"reason": ECC, "effects": ["Evict"]})):
        n = node(taints=[{"key": nv.TAINT_KEY, "value": "health", "effect": "NoSchedule"}],
                 annotations={nv.OWNED: text})
        assert nv.owned(n) == {} and nv.our_taints(n) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(foreign_taint, max_size=4, unique_by=lambda t: (t["key"], t["effect"])), st.booleans(),
       st.booleans(), st.sampled_from([ECC, DRIFT]), st.booleans())
def test_drain_then_undrain_leaves_everyone_elses_taints_and_cordon_as_they_were(taints, cordon, no_execute,
                                                                                 reason, ours_cordons):
    # ours_cordons=False: Slurm on Kubernetes, the taint alone (gpugate.kube.paired).
    before = node(taints=taints, cordon=cordon)
    cls = reason.split()[1]
    held = merge(before, nv.drain_patch(before, reason, cls, no_execute, 1000, ours_cordons))
    state = nv.state_of(held)
    assert state.drain and state.reason == reason and state.reason_time == 1000
    assert bool(held["spec"].get("unschedulable")) == (ours_cordons or cordon)
    ours = nv.our_taints(held)
    assert {(t["effect"], t["value"]) for t in ours} == {("NoSchedule", cls)} | (
        {("NoExecute", cls)} if no_execute else set())
    assert [t for t in held["spec"]["taints"] if t not in ours] == taints
    # Drained again with the same reason: its time is kept (the keeper's oldest-first order).
    again = merge(held, nv.drain_patch(held, reason, cls, no_execute, 2000, ours_cordons))
    assert nv.state_of(again).reason_time == 1000
    back = merge(again, nv.undrain_patch(again))
    assert back["spec"]["taints"] == taints
    assert bool(back["spec"].get("unschedulable")) == cordon  # an admin's cordon stays, ours goes
    assert nv.OWNED not in back["metadata"]["annotations"]
    assert not nv.state_of(back).drain or nv.state_of(back).reason == nv.FOREIGN_CORDON


def test_a_record_left_behind_owns_no_later_cordon_and_no_place_in_the_queue():
    """An admin lifted gpugate's hold by hand (taint removed, uncordoned)
    and the annotation stayed; weeks later the admin cordons the node: that
    cordon is the admin's, never lifted by gpugate, and a new drain starts
    its own time (the keeper's oldest-first order)."""
    held = merge(node(), nv.drain_patch(node(), DRIFT, "drift", False, 1000))
    by_hand = merge(held, {"spec": {"taints": [], "unschedulable": True}})  # the admin's cordon now
    state = nv.state_of(by_hand)
    assert state.reason == nv.FOREIGN_CORDON and state.reason_time is None
    assert ownership.decide(state, ECC_VERDICT, TAG, ("probe",)).kind == ownership.KEEP_ADMIN
    assert "unschedulable" not in nv.undrain_patch(by_hand).get("spec", {})
    again = merge(by_hand, {"spec": {"unschedulable": None}})  # the admin uncordons
    redrained = merge(again, nv.drain_patch(again, DRIFT, "drift", False, 5000))
    assert nv.state_of(redrained).reason_time == 5000


def test_a_node_read_without_a_resource_version_is_never_written():
    blind = node()
    del blind["metadata"]["resourceVersion"]
    for write in (lambda: nv.drain_patch(blind, ECC, "health", False, 1), lambda: nv.undrain_patch(blind),
                  lambda: nv.comment_patch(blind, "x")):
        try:
            write()
        except ValueError as exc:
            assert "resourceVersion" in str(exc)
        else:
            raise AssertionError("a write without a precondition")


def test_only_what_gpugate_reads_is_kept_of_a_node():
    big = node(labels={"a": "b"})
    big["status"]["images"] = [{"names": ["x" * 100], "sizeBytes": 1}] * 50
    big["metadata"]["managedFields"] = [{"manager": "kubelet"}] * 20
    small = nv.slim(big)
    assert "images" not in small["status"] and "managedFields" not in small["metadata"]
    assert nv.state_of(small) == nv.state_of(big)
    assert nv.drain_patch(small, ECC, "health", True, 1) == nv.drain_patch(big, ECC, "health", True, 1)


def test_every_write_carries_the_resource_version_read():
    n = node()
    for patch in (nv.drain_patch(n, ECC, "health", False, 1), nv.undrain_patch(n), nv.comment_patch(n, "x")):
        assert patch["metadata"]["resourceVersion"] == "7"


def test_the_pool_is_the_label_the_site_names():
    labelled = node(labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
    assert nv.state_of(labelled, "nvidia.com/gpu.product").partitions == ("NVIDIA-H100-80GB-HBM3",)
    assert nv.state_of(node(), "nvidia.com/gpu.product").partitions == ()  # in no pool: the keeper holds it
    assert nv.state_of(node()).partitions == ("all",)


def test_a_node_not_ready_is_out_of_service():
    assert not nv.state_of(node(ready="False")).in_service
    assert "NOT_RESPONDING" in nv.state_of(node(ready="Unknown")).flags
