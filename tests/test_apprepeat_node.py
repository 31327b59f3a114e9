"""Issue 44, item 6: the xid_repeat rule never hides a fault on several
GPUs (gpugate.judges.apprepeat).  A user's faults on several GPUs are set
aside only where other users' jobs on those GPUs show none
(test_apprepeat.py); the same faults on several GPUs in jobs of several
users are one finding for the node, budgeted, its first rung every GPU's
reset and the deep diagnostic; ``xid_app_jobs_max`` 1 is refused."""

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpugate.model.baseline import parse_baseline
from gpugate.errors import ConfigError
from gpugate.model.facts import NodeFacts, XidEvent
from gpugate.model.findings import is_acute
from gpugate.judges import apprepeat
from test_apprepeat import _SEQ, BUSES, POLICY, _facts, _replay

BUSES8 = {**BUSES, 4: "0000:9a:00", 5: "0000:ab:00", 6: "0000:ba:00", 7: "0000:db:00"}


def _node():
    """What judge reads of a node: its GPUs' indexes by PCI bus id (NVML's)."""
    gpus = [SimpleNamespace(index=i, pci_bus_id="00000000:%s.0" % bus[5:].upper()) for i, bus in BUSES8.items()]
    return SimpleNamespace(nvml=SimpleNamespace(gpus=gpus), amd=None)


def _on(job_xids, users, gpus=(2, 5), at=0.0, policy=POLICY):
    """Each user's job (ids 600...) on these GPUs, its Xids {gpu: [xid]}."""
    history = None
    for i, user in enumerate(users):
        events = []
        for gpu, xids in sorted(job_xids.items()):
            for x in xids:
                _SEQ[0] += 1
                events.append(XidEvent(xid=x, pci_bus_id=BUSES8[gpu], text="pid=1, name=python3", gpu=gpu,
                                       seq=_SEQ[0], timestamp=1.7e9))
        facts = NodeFacts(node="n", mode="epilog", collected_at=at + i, xids=tuple(events))
        history = apprepeat.record(history, facts, str(600 + i), user, list(gpus), at + i, policy)
    return history


def test_attack_a_fault_on_several_gpus_across_users_is_the_nodes_finding():
    """Issue 44, item 6: three users' jobs, each with Xid 13 on GPU 2 and
    Xid 43 on GPU 5 (a shared NVSwitch, PCIe switch or baseboard shows so).
    Before: each user's faults 'followed them across GPUs', all set aside,
    no finding; the same jobs on GPU 2 alone were flagged."""
    from gpugate.budget import rules as budget
    from gpugate.model import reason as reasons
    from gpugate.model.findings import RESET_GPU
    from gpugate.sweep.plan import Options, remedy_for
    from gpugate.sweep.reset_step import _gpus

    history = _on({2: [13], 5: [43]}, ("1001", "1002", "1003"))
    (finding,) = apprepeat.judge(history, _node(), 9.0, POLICY)
    assert (finding.cls, finding.component, finding.gpu, finding.observed, finding.expected) == (
        "health", "xid_repeat", None, "xids on gpus 2+5 of >=2 users", "< 3 jobs within 24h")
    assert finding.detail.startswith("xid 13+43 on 2 GPUs (0000:3a:00, 0000:ab:00) in 3 jobs of 3 users, 3 of them "
                                     "with faults on several of these GPUs: jobs 600, 601, 602 of users 1001, ")
    assert "the node's, a shared NVSwitch, PCIe switch or baseboard" in finding.detail
    assert apprepeat.standing(history, 9.0, POLICY) == ["0000:3a:00", "0000:ab:00"]
    text = reasons.render("gpugate:", "health", [finding])
    assert text == "gpugate: health xid_repeat=xids on gpus 2+5 of >=2 users (want < 3 jobs within 24h)"
    # Its first rung: every GPU reset (no GPU named), then the verification's deep diagnostic.
    ours = reasons.parse(text, "gpugate:")
    assert remedy_for(ours, Options(reset=True))[0] == "reset" and _gpus(text, "gpugate:") == ()
    assert finding.action == RESET_GPU
    # The jobs' applications can raise it: budgeted, and an escalation of it is marked so.
    assert not finding.acute and not is_acute("health", "xid_repeat")
    assert budget.escalation_mark([finding]).observed == "health xid_repeat"
    # Without index (NVML unread) the GPUs are named by bus.
    assert apprepeat.judge(history, _facts(), 9.0, POLICY)[0].observed == "xids on gpus 3a:00+ab:00 of >=2 users"
    # The same jobs on GPU 2 alone: GPU 2's finding, as before.
    (alone,) = apprepeat.judge(_on({2: [13]}, ("1001", "1002", "1003"), gpus=(2,)), _node(), 9.0, POLICY)
    assert (alone.gpu, alone.observed) == (2, "xids in >=3 jobs")
    # Two users' faults span GPUs 2 and 5 (2 jobs of one, 1 of the other): the node's too.
    history = _on({2: [31], 5: [31]}, ("1001", "1001", "1002"))
    assert [f.observed for f in apprepeat.judge(history, _node(), 9.0, POLICY)] == ["xids on gpus 2+5 of >=2 users"]


def test_separate_gpus_faulting_for_separate_users_stay_separate():
    """GPU 2 for users 1-3, GPU 5 for users 4-6, one user on both: two
    GPUs' findings (each GPU's reset), not the node's."""
    history = None
    runs = [("1", 2), ("2", 2), ("3", 2), ("4", 5), ("5", 5), ("6", 5)]
    for i, (user, gpu) in enumerate(runs):
        history = apprepeat.record(history, _facts(13, bus=BUSES8[gpu], gpu=gpu), "j" + user, user, [gpu],
                                   float(i), POLICY)
    facts = NodeFacts(node="n", mode="epilog", collected_at=7.0, xids=(
        XidEvent(xid=31, pci_bus_id=BUSES8[2], text="", gpu=2, seq=1, timestamp=7.0),
        XidEvent(xid=31, pci_bus_id=BUSES8[5], text="", gpu=5, seq=2, timestamp=7.0)))
    history = apprepeat.record(history, facts, "j7", "7", [2, 5], 7.0, POLICY)
    assert [(f.gpu, f.observed) for f in apprepeat.judge(history, _node(), 8.0, POLICY)] == [
        (2, "xids in >=3 jobs"), (5, "xids in >=3 jobs")]


def test_xid_app_jobs_max_1_is_refused_2_at_the_least():
    """Issue 44, item 6: before, 1 was accepted and one user's single job
    with one Xid 13 made a finding."""
    with pytest.raises(ConfigError, match=r"health\.xid_app_jobs_max: expected 0 \(off\) or 2 at the least, got 1: "
                                          r"one job is one user's"):
        parse_baseline({"pin": {"driver": "1"}, "health": {"xid_app_jobs_max": 1}}, "b")
    for value in (0, 2, 50):
        assert parse_baseline({"pin": {"driver": "1"}, "health": {"xid_app_jobs_max": value}},
                              "b").health.xid_app_jobs_max == value
    # A policy built past the schema still needs two users.
    one = SimpleNamespace(xid_app_jobs_max=1, xid_app_window_seconds=86400.0)
    assert apprepeat.judge(_replay([("101", [13])], policy=one)[1], _facts(), 0.0, one) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["u1", "u2", "u3", "u4"]),
                          st.sets(st.sampled_from([0, 2, 3, 5, 7]), min_size=1, max_size=3),
                          st.lists(st.sampled_from([13, 31, 43, 94]), max_size=2)), max_size=20),
       st.sampled_from([2, 3, 4]))
def test_a_fault_of_enough_users_on_a_gpu_set_is_never_hidden_and_one_user_alone_never_makes_one(runs, limit):
    """Issue 44, item 6 (hypothesis): jobs of users on GPU sets, each job's
    Xids on every GPU it held.  Whenever at least ``xid_app_jobs_max``
    distinct users' jobs saw application Xids on the same GPU set, a
    finding names every GPU of the set (one GPU: its own or the node's; several:
    the node's); one user alone never makes one."""
    policy = parse_baseline({"pin": {"driver": "1"}, "health": {"xid_app_jobs_max": limit}}, "b").health
    history = None
    for i, (user, gpus, xids) in enumerate(runs):
        events = []
        for gpu in sorted(gpus):
            for x in xids:
                _SEQ[0] += 1
                events.append(XidEvent(xid=x, pci_bus_id=BUSES8[gpu], text="", gpu=gpu, seq=_SEQ[0], timestamp=1.7e9))
        facts = NodeFacts(node="n", mode="epilog", collected_at=float(i), xids=tuple(events))
        history = apprepeat.record(history, facts, "j%d" % i, user, sorted(gpus), float(i), policy)
    found = apprepeat.judge(history, _node(), float(len(runs)), policy)
    named = [{f.gpu} if f.gpu is not None else {int(g) for g in f.observed.split(" on gpus ")[1].split()[0].split("+")}
             for f in found]
    faulted = [(user, frozenset(gpus)) for user, gpus, xids in runs if xids]
    for _, place in faulted:
        users = {u for u, gpus in faulted if place <= gpus}
        if len(users) >= limit:
            if len(place) > 1:
                assert any(place <= gpus for gpus, f in zip(named, found) if f.gpu is None), (place, found)
            else:
                assert any(place <= gpus for gpus in named), (place, found)
    if len({u for u, _ in faulted}) < 2:
        assert found == [] and apprepeat.standing(history, float(len(runs)), policy) == []
    for f in found:  # every finding has two users or more behind it
        assert len(f.detail.split(" of users ")[1].split(" (")[0].split(", ")) >= 2
