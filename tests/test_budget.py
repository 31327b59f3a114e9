"""The fleet drain budget (gpugate.budget): the pure rule, and the protocol
every node follows (admit, drain, re-read, keep or give back) simulated with
many nodes deciding at once."""

from hypothesis import given, settings, strategies as st

from gpugate import budget
from gpugate.findings import (BROKEN, DRIFT, HEALTH, INVESTIGATE, PROBE, REBOOT, RECONVERGE, RELOAD_OR_REBOOT,
                              RESET_GPU, RMA_ACTION, Finding)
from gpugate.verdict import decide
from gpugate.slurm.nodestate import NodeState

TAG = "gpugate:"
DRIFT_REASON = "gpugate: drift driver=550.54.15 (want 550.90.07)"


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


def _verdict(*findings):
    return decide(list(findings), TAG)


def test_every_finding_a_file_can_cause_is_budgeted_whatever_its_class():
    """A wrong GPU count, product, MIG or persistence expectation, a required
    service, a pin: budgeted, though their classes are health/broken/drift."""
    for finding in (Finding(HEALTH, "gpu_count", "8", "4", REBOOT), Finding(HEALTH, "pci_gpus", "8", "16", REBOOT),
                    Finding(HEALTH, "product", "NVIDIA A100", "NVIDIA H100", INVESTIGATE, gpu=0),
                    Finding(BROKEN, "persistenced", "inactive", "active", RELOAD_OR_REBOOT),
                    Finding(BROKEN, "fabricmanager", "inactive", "active", RELOAD_OR_REBOOT),
                    Finding(DRIFT, "driver", "550.54.15", "580.65.06", RECONVERGE),
                    Finding(DRIFT, "mig", "on", "off", RECONVERGE, gpu=1),
                    Finding(DRIFT, "ecc_mode", "on, pending off", "on", RECONVERGE, gpu=1),
                    Finding(DRIFT, "compute_mode", "prohibited", "default", RECONVERGE, gpu=1),
                    Finding(DRIFT, "power_limit", "not supported", "700 W", RECONVERGE, gpu=1),
                    Finding(PROBE, "dcgm_diag", "timed out", "answer", INVESTIGATE),
                    Finding(HEALTH, "a_component_nobody_listed", "x", "y", INVESTIGATE)):
        assert budget.applies(_verdict(finding)), finding


def test_intrinsic_events_are_acute_and_escape_the_budget():
    for finding in (Finding(HEALTH, "xid", "79", "none", REBOOT, gpu=3),
                    Finding(HEALTH, "gpu", "lost", "present", REBOOT, gpu=2),
                    Finding(HEALTH, "ecc", "3 uncorrected", "<= 0", RESET_GPU, gpu=0),
                    Finding(HEALTH, "row_remap", "failure", "none", RMA_ACTION, gpu=0),
                    Finding(HEALTH, "nvlink", "2 of 18 down", "<= 0 down", RESET_GPU, gpu=0),
                    Finding(HEALTH, "dcgm_diag", "memory fail", "pass (r2)", INVESTIGATE),
                    Finding(BROKEN, "module", "loaded 550", "on-disk 580", RELOAD_OR_REBOOT),
                    Finding(BROKEN, "nvml", "driver/library version mismatch", "nvml ok", RELOAD_OR_REBOOT)):
        assert not budget.applies(_verdict(finding)), finding
        # With a budgeted finding beside it, the acute one still decides.
        both = _verdict(Finding(DRIFT, "driver", "550.54.15", "580.65.06", RECONVERGE), finding)
        assert not budget.applies(both) and both.findings[0] == finding


def test_a_full_share_switches_the_budget_off():
    assert budget.switched_on(0.1) and budget.switched_on(0.0)
    assert not budget.switched_on(1.0)


def test_counted_only_our_drains_for_budgeted_findings():
    assert budget.counted(node("a", reason="gpugate: health gpu_count=8 (want 4)", when=1), TAG)
    assert budget.counted(node("a", reason="gpugate: broken persistenced=inactive (want active)", when=1), TAG)
    assert not budget.counted(node("a", reason="gpugate: broken module=loaded 550 (want on-disk 580)", when=1), TAG)
    assert not budget.counted(node("a", reason="gpugate: rma xid:gpu3=79 (want none)", when=1), TAG)
    assert budget.counted(node("a", reason=DRIFT_REASON, when=1), TAG)
    assert budget.counted(node("a", reason="gpugate: drift sweep=converge batch 1 attempt 1 (want verified)",
                               when=1), TAG)
    assert not budget.counted(node("a", reason="gpugate: health xid:gpu3=79 (want none)", when=1), TAG)
    assert not budget.counted(node("a", reason="admin: drift of the rack, ticket 42", when=1), TAG)
    assert not budget.counted(node("a", reason=DRIFT_REASON, when=1, drain=False, base="DOWN"), TAG)
    assert not budget.counted(node("a"), TAG)


def test_admit_refuses_once_the_partition_share_is_drained():
    states = fleet(*[node("n%02d" % i) for i in range(10)])
    states["n01"] = node("n01", reason=DRIFT_REASON, when=100)
    ok, why = budget.admit("n05", states, TAG, 0.2)  # allowance 2, one used
    assert ok and why == ""
    states["n02"] = node("n02", reason=DRIFT_REASON, when=101)
    ok, why = budget.admit("n05", states, TAG, 0.2)
    assert not ok
    assert why == ("drain budget of partition gpu spent: 2 of 2 nodes (20% of 10) drained for budgeted findings: "
                   "n01, n02")


def test_acute_and_foreign_drains_do_not_use_the_budget():
    states = fleet(*[node("n%02d" % i) for i in range(10)])
    states["n01"] = node("n01", reason="gpugate: health gpu:gpu0=lost (want present)", when=100)
    states["n02"] = node("n02", reason="admin: fan swap", when=100)
    assert budget.admit("n05", states, TAG, 0.1) == (True, "")


def test_every_partition_of_the_node_must_have_room():
    states = fleet(node("a1", ("a",)), node("a2", ("a",), reason=DRIFT_REASON, when=5),
                   node("x", ("a", "b")), node("b1", ("b",)), node("b2", ("b",)))
    ok, why = budget.admit("x", states, TAG, 0.1)
    assert not ok and "partition a " in why
    assert budget.admit("b1", states, TAG, 0.1) == (True, "")


def test_keep_ranks_oldest_reason_first_then_name():
    states = fleet(*[node("n%02d" % i) for i in range(10)])
    states["n07"] = node("n07", reason=DRIFT_REASON, when=100)
    states["n03"] = node("n03", reason=DRIFT_REASON, when=101)
    states["n02"] = node("n02", reason=DRIFT_REASON, when=101)
    assert budget.keep("n07", states, TAG, 0.2) == (True, "")
    assert budget.keep("n02", states, TAG, 0.2) == (True, "")
    ok, why = budget.keep("n03", states, TAG, 0.2)
    # What was counted, said as it is: never "3 of 2" (issue 25).
    assert not ok and why == ("drain budget of partition gpu spent: 2 of 2 nodes (20% of 10) drained for budgeted "
                              "findings: n07, n02; this node drained after them and gives its drain back")
    states["n09"] = node("n09", reason=DRIFT_REASON, when=102)
    ok, why = budget.admit("n05", states, TAG, 0.2)
    assert not ok and why.endswith("n07, n02; 2 more drained after them give their drains back: n03, n09")


def test_unknown_reason_time_ranks_last():
    states = fleet(node("a", reason=DRIFT_REASON, when=None), node("b", reason=DRIFT_REASON, when=500),
                   *[node("n%d" % i) for i in range(8)])
    assert budget.keep("b", states, TAG, 0.1)[0]
    assert not budget.keep("a", states, TAG, 0.1)[0]


def test_a_node_slurm_does_not_list_is_never_drained_by_default():
    ok, why = budget.admit("ghost", {}, TAG, 0.1)
    assert not ok and "does not list" in why
    assert budget.keep("ghost", {}, TAG, 0.1) == (True, "")  # nothing of ours to give back


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
        reason = {"drift": DRIFT_REASON, "health": "gpugate: health xid:gpu1=79 (want none)",
                  "admin": "admin: bad PSU"}.get(kind, "")
        nodes[name] = node(name, parts, reason, draw(st.integers(0, 50)) if reason else None)
        if kind == "candidate":
            candidates.append(name)
    share = draw(st.floats(0.0, 0.99))
    return nodes, candidates, share


def _drain(states, name, when):
    old = states[name]
    states[name] = node(name, old.partitions, DRIFT_REASON, when)


def _budgeted_counts(states, share):
    return {p: len(u.drained) for p, u in budget.usage(states, TAG, share).items()}


def _allowances(states, share):
    return {p: u.allowance for p, u in budget.usage(states, TAG, share).items()}


@settings(max_examples=150, deadline=None)
@given(fleets())
def test_all_nodes_at_once_never_leave_a_partition_over_its_budget(case):
    """The worst case: every unfit node reads the same view, all drain in the
    same second, then each re-reads and keeps or gives back its drain."""
    states, candidates, share = case
    before = _budgeted_counts(states, share)
    admitted = [n for n in candidates if budget.admit(n, states, TAG, share)[0]]
    for name in admitted:
        _drain(states, name, 1000)
    released = [n for n in admitted if not budget.keep(n, states, TAG, share)[0]]
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
            assert budget.keep(name, states, TAG, share)[0]


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
        admitted = [n for n in candidates if budget.admit(n, states, TAG, share)[0]]
        for name in admitted:
            _drain(states, name, 1000)
        for name in admitted:
            if not budget.keep(name, states, TAG, share)[0]:
                states[name] = node(name, ("a",))
    else:
        for when, name in enumerate(candidates, start=1000):
            if budget.admit(name, states, TAG, share)[0]:
                _drain(states, name, when)
                assert budget.keep(name, states, TAG, share)[0]
    expected = pre if pre >= allowance else min(allowance, pre + len(candidates))
    assert _budgeted_counts(states, share).get("a", 0) == expected


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.none(), st.integers(0, 16)), st.one_of(st.none(), st.integers(0, 16)),
       st.one_of(st.none(), st.integers(0, 16)), st.one_of(st.none(), st.integers(0, 16)))
def test_gpus_lost_only_below_the_nodes_own_high_water_mark(high, expected, nvml_count, pci):
    from types import SimpleNamespace

    from gpugate.judges import lost

    nvml = None if nvml_count is None else SimpleNamespace(gpu_count=nvml_count)
    facts = SimpleNamespace(nvml=nvml, pci_gpus=pci)
    seen = [c for c in (nvml_count, pci) if c is not None]
    found = lost.judge(high, expected, facts)
    should = bool(seen) and high is not None and min(seen) < high and min(seen) != expected
    assert bool(found) == should
    assert all(f.acute and f.component == "gpus_lost" for f in found)
    new = lost.next_high(high, expected, facts)
    if seen and min(seen) == expected:
        assert new == expected  # the baseline's count is the node's normal again
    elif seen:
        assert new == max(seen + ([high] if high is not None else []))
    else:
        assert new == high
