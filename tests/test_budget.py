"""The fleet drain budget (gpugate.budget.rules): the pure rule (allowance, what
counts, the ranking, the keeper's plan and what it says of a held node).
The keeper's runs and two keepers racing: test_keeper.py."""

from hypothesis import given, settings, strategies as st

from gpugate.budget import rules as budget
from gpugate.model import reason as reasons
from gpugate.model.findings import BROKEN, DRIFT, HEALTH, INVESTIGATE, PROBE, REBOOT, RECONVERGE, RELOAD_OR_REBOOT, RESET_GPU, RMA_ACTION, Finding
from gpugate.model.verdict import decide
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


def published_node(name, parts=("gpu",), since=100, reason=DRIFT_REASON):
    """A node in service that published a budgeted finding for the keeper."""
    from gpugate.slurm import pending

    return NodeState(name, "IDLE", frozenset(), "", None, "", tuple(sorted(parts)),
                     pending.publish("", reason, since))


def test_a_held_node_is_told_what_was_counted_never_more_than_the_allowance():
    """Issue 25, item 7: the held node's reason said "3 of 2 nodes drained".
    It names the nodes that hold the budget, at most the allowance of them,
    and says apart any drained beyond it (a share lowered since)."""
    states = fleet(*[node("n%02d" % i) for i in range(10)])
    states["n07"] = node("n07", reason=DRIFT_REASON, when=100)
    states["n02"] = node("n02", reason=DRIFT_REASON, when=101)
    states["n05"] = published_node("n05")
    plan = budget.plan(states, TAG, 0.2)
    assert plan.drain == () and plan.held["n05"] == (
        "drain budget of partition gpu spent: 2 of 2 nodes (20% of 10) drained for budgeted findings: n07, n02")
    states["n03"] = node("n03", reason=DRIFT_REASON, when=102)
    plan = budget.plan(states, TAG, 0.2)
    assert plan.held["n05"].endswith("n07, n02; 1 more drained beyond it: n03")


def test_this_runs_own_drains_fill_the_budget_and_are_named():
    states = fleet(*[node("n%02d" % i) for i in range(9)], published_node("p1", since=10),
                   published_node("p2", since=20), published_node("p3", since=30))
    plan = budget.plan(states, TAG, 0.2)  # 12 nodes: allowance 2
    assert [n for n, _ in plan.drain] == ["p1", "p2"]
    assert plan.held["p3"] == ("drain budget of partition gpu spent: 2 of 2 nodes (20% of 12) drained for "
                               "budgeted findings: p1, p2")


def test_acute_and_foreign_drains_do_not_use_the_budget():
    states = fleet(*[node("n%02d" % i) for i in range(10)])
    states["n01"] = node("n01", reason="gpugate: health gpu:gpu0=lost (want present)", when=100)
    states["n02"] = node("n02", reason="admin: fan swap", when=100)
    assert budget.usage(states, TAG, 0.1)["gpu"].drained == ()
    states["n05"] = published_node("n05")
    assert [n for n, _ in budget.plan(states, TAG, 0.1).drain] == ["n05"]


def test_every_partition_of_the_node_must_have_room():
    states = fleet(node("a1", ("a",)), node("a2", ("a",), reason=DRIFT_REASON, when=5),
                   published_node("x", ("a", "b")), published_node("b1", ("b",), since=200), node("b2", ("b",)))
    plan = budget.plan(states, TAG, 0.1)
    assert "partition a " in plan.held["x"]
    assert [n for n, _ in plan.drain] == ["b1"]


def test_the_ranking_is_oldest_reason_first_then_name_and_an_unknown_time_last():
    states = fleet(*[node("n%02d" % i) for i in range(10)])
    states["n07"] = node("n07", reason=DRIFT_REASON, when=100)
    states["n03"] = node("n03", reason=DRIFT_REASON, when=101)
    states["n02"] = node("n02", reason=DRIFT_REASON, when=101)
    states["n09"] = node("n09", reason=DRIFT_REASON, when=None)
    assert budget.usage(states, TAG, 0.2)["gpu"].drained == ("n07", "n02", "n03", "n09")


def test_a_node_in_no_partition_is_never_drained():
    states = fleet(published_node("ghost", parts=()), *[node("n%d" % i) for i in range(4)])
    plan = budget.plan(states, TAG, 0.5)
    assert plan.drain == () and "in no partition" in plan.held["ghost"]


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


def test_an_rma_of_budgeted_cause_is_counted_and_an_acute_one_is_not():
    """Issue 33, item 2: an rma holds a node for good, so the one a budgeted
    finding caused takes a place in the budget (before, no rma was counted,
    and each keeper + sweep cycle took another node).  The sweep's marked
    reason says so; an unmarked one (acute, or an older release's) counts
    unless a finding it shows is acute in some class."""
    def counted(reason):
        return budget.counted(node("a", reason=reason, when=1), TAG)
    marked = reasons.render(TAG, "rma", [
        budget.escalation_mark([Finding(HEALTH, "xid_repeat", "xid 31 in 3 jobs", "< 3 jobs", "", gpu=2)]),
        Finding("rma", "xid_repeat", "xid 31 in 3 jobs", "< 3 jobs within 24h", "", gpu=2)])
    assert marked.startswith("gpugate: rma budgeted=health xid_repeat (want counted); xid_repeat:gpu2=")
    assert counted(marked)
    assert counted("gpugate: rma xid_repeat:gpu2=xid 31 in 3 jobs (want < 3 jobs within 24h)")  # older release
    assert counted("gpugate: rma repeat=driver 3x in 7d (want under 3); driver=550.54.15 (want 580.65.06)")
    assert counted("gpugate: rma verify=failed (want pass)")  # unknown: stricter, never looser
    assert counted("gpugate: rma smoke=all_reduce busbw=23.4GB/s (want >= 350)")
    assert not counted("gpugate: rma xid:gpu3=79 (want none)")
    assert not counted("gpugate: rma repeat=xid 3x in 7d (want under 3); xid:gpu3=79 (want none)")
    assert not counted("gpugate: rma repeat=reset then reboot in 7d (want a rung that holds); ecc:gpu2=4 (want 0)")
    assert not counted("gpugate: rma row_remap:gpu1=failure (want none); evidence=gpu01-20261127T120000Z-a2")
    assert not counted("admin: rma gpu3, ticket 42")  # not ours: never counted, never touched
    # An acute finding among an escalation's gets no mark: it goes outside the budget.
    assert budget.escalation_mark([Finding(DRIFT, "driver", "1", "2", ""), Finding(HEALTH, "xid", "79", "none", "")]) \
        is None
    # A deferred escalation keeps its class and reads as budgeted, whatever follows the sweep's note.
    assert counted("gpugate: health sweep=rma deferred (want room in budget and floor); dcgm_diag=timed out (want x)")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sets(st.sampled_from("abc"), min_size=1, max_size=3), st.sampled_from(["in", "drained",
                                                                                                   "published"])),
                min_size=1, max_size=30),
       st.sampled_from([0.05, 0.1, 0.25, 0.5, 0.9]))
def test_all_nodes_at_once_never_leave_a_partition_over_its_budget(layout, share):
    """Every unfit node decides at the same moment (the keeper's one plan
    over the fleet), any partition layout, any share: no partition ends
    over its allowance from new drains, and every drain it makes ranks
    within every partition of its node."""
    states = {}
    for i, (parts, kind) in enumerate(layout):
        name = "n%02d" % i
        if kind == "drained":
            states[name] = node(name, tuple(parts), reason=DRIFT_REASON, when=100 + i)
        elif kind == "published":
            states[name] = published_node(name, tuple(parts), since=1000 + i)
        else:
            states[name] = node(name, tuple(parts))
    before = budget.usage(states, TAG, share)
    plan = budget.plan(states, TAG, share)
    after = dict(states)
    for name, why in plan.drain:
        after[name] = node(name, states[name].partitions, reason=why, when=2000)
    for part, use in budget.usage(after, TAG, share).items():
        assert len(use.drained) <= max(use.allowance, len(before[part].drained)), (part, use)
        new = [n for n in use.drained if n not in before[part].drained]
        assert all(use.drained.index(n) < use.allowance for n in new), (part, use)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40), st.integers(0, 10), st.integers(0, 40), st.sampled_from([0.05, 0.1, 0.25, 0.5]),
       st.booleans())
def test_one_partition_fills_its_budget_exactly(healthy, drained, unfit, share, one_by_one):
    """One partition, its unfit nodes deciding together or one by one:
    exactly min(allowance, drained + unfit) end drained (never fewer: a
    budget with room drains)."""
    states = {}
    for i in range(healthy):
        states["h%02d" % i] = node("h%02d" % i)
    for i in range(drained):
        states["d%02d" % i] = node("d%02d" % i, reason=DRIFT_REASON, when=10 + i)
    for i in range(unfit):
        states["u%02d" % i] = published_node("u%02d" % i, since=100 + i)
    allowance = budget.allowance(len(states), share)
    rounds = unfit if one_by_one else 1
    for _ in range(max(1, rounds)):
        plan = budget.plan(states, TAG, share)
        for name, why in plan.drain[:1] if one_by_one else plan.drain:
            states[name] = node(name, reason=why, when=5000)
    assert len(budget.usage(states, TAG, share)["gpu"].drained) == max(drained, min(allowance, drained + unfit))
