"""The fleet drain budget (gpugate.budget): the pure rule, and the protocol
every node follows (admit, drain, re-read, keep or give back) simulated with
many nodes deciding at once."""

from hypothesis import given, settings, strategies as st

from gpugate import budget
from gpugate.slurm.nodestate import NodeState

TAG = "gpugate:"
CLASSES = ("drift", "probe")
DRIFT = "gpugate: drift driver=550.54.15 (want 550.90.07)"


def node(name, parts=("gpu",), reason="", when=None, drain=None, base="IDLE"):
    flags = frozenset({"DRAIN"}) if (reason if drain is None else drain) else frozenset()
    return NodeState(name, base, flags, reason, when, "root" if reason else "", tuple(sorted(parts)))


def fleet(*nodes):
    return {n.name: n for n in nodes}


def test_allowance_is_a_share_of_the_partition_but_at_least_one_node():
    assert budget.allowance(2000, 0.10) == 200
    assert budget.allowance(8, 0.10) == 1
    assert budget.allowance(15, 0.10) == 1
    assert budget.allowance(10, 0.30) == 3  # no float surprise: 10 * 0.3 = 2.9999999999999996
    assert budget.allowance(8, 0.0) == 1


def test_active_only_below_a_full_share_and_for_budgeted_classes():
    assert budget.active(0.1, CLASSES, "drift")
    assert not budget.active(0.1, CLASSES, "health")
    assert not budget.active(0.1, CLASSES, "broken")
    assert not budget.active(1.0, CLASSES, "drift")
    assert not budget.active(0.1, (), "drift")


def test_counted_only_our_drains_of_budgeted_classes():
    assert budget.counted(node("a", reason=DRIFT, when=1), TAG, CLASSES)
    assert budget.counted(node("a", reason="gpugate: drift sweep=converge batch 1 attempt 1 (want verified)",
                               when=1), TAG, CLASSES)
    assert not budget.counted(node("a", reason="gpugate: health xid:gpu3=79 (want none)", when=1), TAG, CLASSES)
    assert not budget.counted(node("a", reason="admin: drift of the rack, ticket 42", when=1), TAG, CLASSES)
    assert not budget.counted(node("a", reason=DRIFT, when=1, drain=False, base="DOWN"), TAG, CLASSES)
    assert not budget.counted(node("a"), TAG, CLASSES)


def test_admit_refuses_once_the_partition_share_is_drained():
    states = fleet(*[node("n%02d" % i) for i in range(10)])
    states["n01"] = node("n01", reason=DRIFT, when=100)
    ok, why = budget.admit("n05", states, TAG, CLASSES, 0.2)  # allowance 2, one used
    assert ok and why == ""
    states["n02"] = node("n02", reason=DRIFT, when=101)
    ok, why = budget.admit("n05", states, TAG, CLASSES, 0.2)
    assert not ok
    assert why == "drain budget of partition gpu spent: 2 of 2 nodes drained for drift/probe (20% of 10)"


def test_acute_and_foreign_drains_do_not_use_the_budget():
    states = fleet(*[node("n%02d" % i) for i in range(10)])
    states["n01"] = node("n01", reason="gpugate: health gpu_lost:gpu0=lost (want present)", when=100)
    states["n02"] = node("n02", reason="admin: fan swap", when=100)
    assert budget.admit("n05", states, TAG, CLASSES, 0.1) == (True, "")


def test_every_partition_of_the_node_must_have_room():
    states = fleet(node("a1", ("a",)), node("a2", ("a",), reason=DRIFT, when=5),
                   node("x", ("a", "b")), node("b1", ("b",)), node("b2", ("b",)))
    ok, why = budget.admit("x", states, TAG, CLASSES, 0.1)
    assert not ok and "partition a " in why
    assert budget.admit("b1", states, TAG, CLASSES, 0.1) == (True, "")


def test_keep_ranks_oldest_reason_first_then_name():
    states = fleet(*[node("n%02d" % i) for i in range(10)])
    states["n07"] = node("n07", reason=DRIFT, when=100)
    states["n03"] = node("n03", reason=DRIFT, when=101)
    states["n02"] = node("n02", reason=DRIFT, when=101)
    assert budget.keep("n07", states, TAG, CLASSES, 0.2) == (True, "")
    assert budget.keep("n02", states, TAG, CLASSES, 0.2) == (True, "")
    ok, why = budget.keep("n03", states, TAG, CLASSES, 0.2)
    assert not ok and "3 of 2" in why


def test_unknown_reason_time_ranks_last():
    states = fleet(node("a", reason=DRIFT, when=None), node("b", reason=DRIFT, when=500),
                   *[node("n%d" % i) for i in range(8)])
    assert budget.keep("b", states, TAG, CLASSES, 0.1)[0]
    assert not budget.keep("a", states, TAG, CLASSES, 0.1)[0]


def test_a_node_slurm_does_not_list_is_not_held():
    assert budget.admit("ghost", {}, TAG, CLASSES, 0.1) == (True, "")
    assert budget.keep("ghost", {}, TAG, CLASSES, 0.1) == (True, "")


# ---------------------------------------------------------------- protocol
PARTS = ("a", "b", "c")


@st.composite
def fleets(draw, multi=True):
    size = draw(st.integers(1, 30))
    nodes, candidates = {}, []
    for i in range(size):
        name = "n%02d" % i
        if multi:
            parts = draw(st.sets(st.sampled_from(PARTS), min_size=1, max_size=2))
        else:
            parts = {"a"}
        kind = draw(st.sampled_from(["idle", "idle", "candidate", "candidate", "drift", "health", "admin"]))
        reason = {"drift": DRIFT, "health": "gpugate: health xid:gpu1=79 (want none)",
                  "admin": "admin: bad PSU"}.get(kind, "")
        nodes[name] = node(name, parts, reason, draw(st.integers(0, 50)) if reason else None)
        if kind == "candidate":
            candidates.append(name)
    share = draw(st.floats(0.0, 0.99))
    return nodes, candidates, share


def _drain(states, name, when):
    old = states[name]
    states[name] = node(name, old.partitions, DRIFT, when)


def _budgeted_counts(states, share):
    return {p: len(u.drained) for p, u in budget.usage(states, TAG, CLASSES, share).items()}


def _allowances(states, share):
    return {p: u.allowance for p, u in budget.usage(states, TAG, CLASSES, share).items()}


@settings(max_examples=150, deadline=None)
@given(fleets())
def test_all_nodes_at_once_never_leave_a_partition_over_its_budget(case):
    """The worst case: every unfit node reads the same view, all drain in the
    same second, then each re-reads and keeps or gives back its drain."""
    states, candidates, share = case
    before = _budgeted_counts(states, share)
    admitted = [n for n in candidates if budget.admit(n, states, TAG, CLASSES, share)[0]]
    for name in admitted:
        _drain(states, name, 1000)
    released = [n for n in admitted if not budget.keep(n, states, TAG, CLASSES, share)[0]]
    for name in released:
        old = states[name]
        states[name] = node(name, old.partitions)
    after = _budgeted_counts(states, share)
    for part, count in after.items():
        # Never over budget by gpugate's new drains (drains older than the
        # budget, e.g. a lowered share, are left to the sweep).
        assert count <= max(_allowances(states, share)[part], before.get(part, 0))
    # Whoever kept its drain was admitted and ranked within every partition.
    for name in admitted:
        if name not in released:
            assert budget.keep(name, states, TAG, CLASSES, share)[0]


@settings(max_examples=150, deadline=None)
@given(fleets(multi=False), st.data())
def test_one_partition_fills_its_budget_exactly(case, data):
    """Single partition: concurrent or one by one, the partition ends with
    exactly min(allowance, drained + unfit) budgeted drains."""
    states, candidates, share = case
    allowance = budget.allowance(len(states), share)
    pre = _budgeted_counts(states, share).get("a", 0)
    concurrent = data.draw(st.booleans())
    if concurrent:
        admitted = [n for n in candidates if budget.admit(n, states, TAG, CLASSES, share)[0]]
        for name in admitted:
            _drain(states, name, 1000)
        for name in admitted:
            if not budget.keep(name, states, TAG, CLASSES, share)[0]:
                states[name] = node(name, ("a",))
    else:
        for when, name in enumerate(candidates, start=1000):
            if budget.admit(name, states, TAG, CLASSES, share)[0]:
                _drain(states, name, when)
                assert budget.keep(name, states, TAG, CLASSES, share)[0]
    expected = pre if pre >= allowance else min(allowance, pre + len(candidates))
    assert _budgeted_counts(states, share).get("a", 0) == expected
