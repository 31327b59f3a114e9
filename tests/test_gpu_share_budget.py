"""The drain budget counts a GPU held alone as its share of its node
(gpugate.kube.gpushare, gpugate.budget.rules): a Node hold counts 1, k of
n GPUs held count k/n, never more than 1; the allowance stays whole nodes
(max_share x the pool's nodes, at least 1) and the shares held are summed
against it.  So with an allowance of one node, eight GPUs held alone on
eight different 8-GPU nodes fit, a ninth does not, and neither does a
whole node once any GPU is held.  Property tests over generated fleets;
the keeper's reads and writes on the real API server:
tests/test_kube_device_holds.py."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from gpugate.budget import fleet_plan, rules as budget
from gpugate.kube import gpushare
from gpugate.kube import nodeview as nv
from gpugate.slurm import pending

TAG = "gpugate:"
DRIFT = "gpugate: drift driver=550.54.15 (want 580.95.05)"
PARTS = ("pool0", "pool1")


def xid(gpu: int) -> str:
    return "gpugate: health xid_repeat:gpu%d=13 x3 by 3 users (want none)" % gpu


def state(name, share=1.0, held=False, reason="", parts=("pool0",), at=100, comment=""):
    return gpushare.kind(share)(
        name=name, state="IDLE", flags=frozenset({"DRAIN"}) if held else frozenset(), reason=reason,
        reason_time=at if held else None, reason_user="", partitions=tuple(parts), comment=comment)


def spans_of(waiting):
    return {name: pending.Pending(reason, since) for name, (reason, since) in waiting.items()}


# ------------------------------------------------------------ the share of one node
@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 70), max_size=10), st.one_of(st.integers(-2, 80), st.none(), st.booleans()))
def test_a_share_is_k_of_n_never_more_than_one_and_anything_else_counts_whole(gpus, of):
    share = gpushare.fraction(gpus, of)
    assert 0 < share <= 1
    well_formed = (gpus and all(g < gpushare.MOST for g in gpus) and isinstance(of, int)
                   and not isinstance(of, bool) and 0 < of <= gpushare.MOST)
    if not well_formed:
        assert share == 1
    else:
        assert share == min(1.0, len(set(gpus)) / max(of, max(gpus) + 1))


def test_a_share_rides_on_the_state_through_replace():
    from gpugate.core.record import replace

    s = state("n1", 0.125, held=True, reason=xid(2))
    assert budget.share_of(replace(s, comment="x", partitions=("a", "b"))) == 0.125
    assert budget.share_of(state("n2")) == 1 and type(state("n2")).__name__ == "NodeState"
    assert gpushare.kind(1.0) is gpushare.kind(0.0) is type(state("n3"))  # no share: a plain NodeState


def node(annotations=None, taints=None):
    return {"metadata": {"name": "n1", "resourceVersion": "7", "labels": {}, "annotations": annotations or {}},
            "spec": {"taints": taints or []}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def test_a_node_reads_as_its_share_of_the_budget():
    record = {"reason": xid(2), "at": 100, "effects": [], "cordon": False, "devices": ["r2", "r5"],
              "gpus": [2, 5], "of": 8}
    held = nv.state_of(node({nv.OWNED: json.dumps(record)}))
    assert held.drain and budget.share_of(held) == 0.25
    # The Node held (gpugate's taint beside the record naming the rules): the whole node.
    whole = dict(record, effects=["NoSchedule"])
    taint = [{"key": nv.TAINT_KEY, "value": "health", "effect": "NoSchedule"}]
    assert budget.share_of(nv.state_of(node({nv.OWNED: json.dumps(whole)}, taint))) == 1
    # A record of rules without its GPUs and their count (an older agent's): the whole node.
    old = {k: v for k, v in record.items() if k not in ("gpus", "of")}
    assert budget.share_of(nv.state_of(node({nv.OWNED: json.dumps(old)}))) == 1
    # Waiting with an offer: its share where the cluster can hold GPUs alone, else whole.
    span = pending.publish("", xid(3), 100)
    offered = gpushare.with_offer(span, {3: {"uuid": "GPU-3"}}, [3], 8)
    waiting = node({nv.PENDING: offered})
    assert budget.share_of(nv.state_of(waiting, offers=True)) == 0.125
    assert budget.share_of(nv.state_of(waiting)) == 1
    # The offer is no part of the comment the keeper and the agent read.
    assert nv.state_of(waiting, offers=True).comment == span
    assert gpushare.split(offered) == (span, {"of": 8, "gpus": {3: {"uuid": "GPU-3"}}})


# ------------------------------------------------------------ the budget's decisions
def test_an_allowance_of_one_node_holds_eight_gpus_on_eight_nodes_and_no_ninth():
    # 10 pools' worth: 10 nodes at 10% is an allowance of 1 node.
    fleet = {"n%02d" % i: state("n%02d" % i, 0.125) for i in range(10)}
    waiting = {"n%02d" % i: (xid(i % 8), 1000 + i) for i in range(9)}
    decided = fleet_plan.plan_published(fleet, TAG, 0.1, {"pool0": 10}, spans_of(waiting))
    assert [n for n, _ in decided.drain] == ["n%02d" % i for i in range(8)]
    assert set(decided.held) == {"n08"}
    assert "spent: 1 of 1 nodes" in decided.held["n08"] and "n00 (0.125)" in decided.held["n08"]
    assert decided == budget.plan(fleet, TAG, 0.1, {"pool0": 10}, spans_of(waiting))


def test_the_other_way_whole_nodes_take_the_allowance_as_before():
    fleet = {"n%02d" % i: state("n%02d" % i) for i in range(10)}
    waiting = {"n%02d" % i: (DRIFT, 1000 + i) for i in range(8)}
    decided = fleet_plan.plan_published(fleet, TAG, 0.1, {"pool0": 10}, spans_of(waiting))
    assert [n for n, _ in decided.drain] == ["n00"]
    assert len(decided.held) == 7
    assert "spent: 1 of 1 nodes (10% of 10) drained for budgeted findings: n00" in decided.held["n01"]


def test_a_whole_node_does_not_fit_beside_one_gpu_held_and_a_gpu_fits_beside_nothing_else():
    fleet = {"a": state("a", 0.125, held=True, reason=xid(1)), "b": state("b"), "c": state("c", 0.125)}
    decided = fleet_plan.plan_published(fleet, TAG, 0.1, {"pool0": 10},
                                     spans_of({"b": (DRIFT, 1000), "c": (xid(4), 1001)}))
    assert [n for n, _ in decided.drain] == ["c"]
    assert "0.125 of 1 nodes" in decided.held["b"]


def test_over_gives_back_the_gpu_holds_ranked_beyond_the_allowance():
    # Two keepers raced: nine GPUs held alone on nine nodes, stamped since the read.
    fleet = {"n%d" % i: state("n%d" % i, 0.125, held=True, reason=xid(0), at=2000 + i,
                              comment=pending.publish("", xid(0), 1000)) for i in range(9)}
    assert budget.over(fleet, TAG, 0.1, 1999, {"pool0": 10}) == ("n8",)
    whole = {"n%d" % i: state("n%d" % i, held=True, reason=DRIFT, at=2000 + i,
                              comment=pending.publish("", DRIFT, 1000)) for i in range(3)}
    assert budget.over(whole, TAG, 0.1, 1999, {"pool0": 10}) == ("n1", "n2")


shares = st.sampled_from([1.0, 0.125, 0.25, 0.375, 0.5, 1 / 3])
fleets = st.lists(st.tuples(shares, st.booleans(), st.booleans(), st.sampled_from([PARTS[:1], PARTS[1:], PARTS]),
                            st.integers(0, 50)), min_size=1, max_size=40)


@settings(max_examples=300, deadline=None)
@given(fleets, st.sampled_from([0.05, 0.1, 0.2, 0.5]))
def test_the_shares_held_never_pass_the_allowance_and_what_is_refused_does_not_fit(rows, max_share):
    fleet, waiting = {}, {}
    for i, (share, held, publishes, parts, at) in enumerate(rows):
        name = "n%03d" % i
        reason = xid(i % 8) if share < 1 else DRIFT
        fleet[name] = state(name, share, held, reason if held else "", parts, at)
        if publishes and not held:
            waiting[name] = (reason, 1000 + at)
    sizes = {p: sum(1 for s in fleet.values() if p in s.partitions) for p in PARTS}
    sizes = {p: n for p, n in sizes.items() if n}
    spans = spans_of(waiting)
    decided = fleet_plan.plan_published(fleet, TAG, max_share, sizes, spans)
    assert decided == budget.plan(fleet, TAG, max_share, sizes, spans)  # the keeper's path and the plain one
    drained = {n for n, _ in decided.drain}
    assert drained | set(decided.held) == set(waiting)
    for part, use in decided.uses.items():
        before = budget.weigh(s for s in fleet.values() if s.drain and part in s.partitions)
        after = before + budget.weigh(fleet[n] for n in drained if part in fleet[n].partitions)
        assert abs(use.weight - before) < 1e-9
        assert after <= max(before, use.allowance) + 1e-9  # never past the budget by this run
        for name in decided.held:
            if part in fleet[name].partitions and after + budget.share_of(fleet[name]) <= use.allowance + 1e-9:
                # refused although its share fits here: another of its pools had no room
                assert any(p != part for p in fleet[name].partitions)
    for name in decided.held:  # refused: its share does not fit in one of its pools, even at the end
        room = [decided.uses[p].allowance - budget.weigh(s for s in fleet.values() if p in s.partitions and (
            s.drain or s.name in drained)) for p in fleet[name].partitions]
        assert min(room) < budget.share_of(fleet[name]) - 1e-9


def test_status_and_metrics_say_the_nodes_worth_held():
    from gpugate.fleet.status import _budget_figures

    fleet = {"n%d" % i: state("n%d" % i, 0.125, held=True, reason=xid(i)) for i in range(2)}
    use = budget.usage(fleet, TAG, 0.1, sizes={"pool0": 20})["pool0"]
    assert _budget_figures(use)["budget"] == {"allowance": 2, "drained": 2, "used": 0.25, "spent": False}
    whole = budget.usage({"a": state("a", held=True, reason=DRIFT)}, TAG, 0.1, sizes={"pool0": 20})["pool0"]
    assert whole.held < 0 and whole.weight == 1.0  # Slurm's and a Node hold's: one a node, as before
