"""The culprit search across a job's nodes (gpugate.preflight.culprit):
halving, then pairs with proven nodes.  Properties over a model fleet in
which a group fails when it holds a bad node (or at random, for the safety
rules), checked against every run the search asked for."""

import math

from hypothesis import given, settings, strategies as st

from gpugate.preflight.culprit import CULPRIT, FAIL, GOOD, PASS, UNDECIDED, UNKNOWN, GroupRun, search


def _names(n):
    return ["gpu%03d" % i for i in range(1, n + 1)]


def _runner(bad, calls, outcome_of=None):
    def run_groups(groups):
        seen = [n for g in groups for n in g]
        assert len(seen) == len(set(seen)), "a node in two runs at once: %r" % groups
        assert all(len(g) >= 2 for g in groups), "a collective of one node: %r" % groups
        calls.append(list(groups))
        out = []
        for g in groups:
            outcome = outcome_of(g) if outcome_of else (FAIL if set(g) & bad else PASS)
            out.append(GroupRun(tuple(g), outcome, "busbw=1GB/s" if outcome == FAIL else "", ">= 40", "busbw"))
        return out
    return run_groups


def test_a_healthy_job_costs_one_run():
    calls = []
    found = search(_names(8), _runner(set(), calls))
    assert found.rounds == 1 and len(calls) == 1 and set(found.verdicts.values()) == {GOOD}
    assert found.culprits == [] and found.why == ""


@given(st.integers(4, 300), st.data())
@settings(max_examples=150, deadline=None)
def test_one_bad_node_is_found_in_log2_rounds(n, data):
    nodes = _names(n)
    bad = data.draw(st.sampled_from(nodes))
    calls = []
    found = search(nodes, _runner({bad}, calls))
    assert found.culprits == [bad]
    assert all(found.verdicts[x] == GOOD for x in nodes if x != bad)  # the rest proven, none left unknown
    assert found.rounds <= math.ceil(math.log2(n)) + 3
    first, second = found.first_strike[bad], found.pinned_by[bad]
    assert first.outcome == second.outcome == FAIL
    # Two proven partners, the second hosting the run (its first node: the collective's rendezvous).
    assert first.nodes[0] == bad and second.nodes[1] == bad and first.nodes[1] != second.nodes[0]
    assert found.verdicts[first.nodes[1]] == GOOD and found.verdicts[second.nodes[0]] == GOOD


@given(st.integers(2, 120), st.data())
@settings(max_examples=150, deadline=None)
def test_a_good_node_is_never_pinned(n, data):
    nodes = _names(n)
    bad = set(data.draw(st.lists(st.sampled_from(nodes), max_size=n, unique=True)))
    found = search(nodes, _runner(bad, []))
    assert set(found.culprits) <= bad
    assert len(found.culprits) <= max(1, n // 4)
    if len(bad) > max(1, n // 4):
        assert found.culprits == []  # that many at once is the fabric or the floor: none pinned, and it says so
        assert found.why


@given(st.integers(2, 40), st.data())
@settings(max_examples=150, deadline=None)
def test_a_culprit_always_failed_with_a_partner_proven_in_a_passing_run(n, data):
    """Whatever the runs answer (a flaky fabric: any outcome for any run)."""
    nodes = _names(n)
    outcomes = data.draw(st.lists(st.sampled_from([PASS, FAIL, UNDECIDED]), min_size=1, max_size=400))
    it = iter(outcomes * 50)
    found = search(nodes, _runner(set(), [], lambda g: next(it)), max_rounds=20)
    passed = {x for r in found.runs if r.outcome == PASS for x in r.nodes}
    for culprit in found.culprits:
        first, second = found.first_strike[culprit], found.pinned_by[culprit]
        assert first.outcome == second.outcome == FAIL and len(first.nodes) == len(second.nodes) == 2
        assert first.nodes[0] == culprit == second.nodes[1] and first.nodes[1] != second.nodes[0]
        assert first.nodes[1] in passed and second.nodes[0] in passed and culprit not in passed
    for node, verdict in found.verdicts.items():
        assert verdict in (GOOD, CULPRIT, UNKNOWN)
        assert verdict != GOOD or node in passed


def test_a_first_run_that_cannot_decide_pins_nothing_and_says_why():
    found = search(_names(8), lambda groups: [GroupRun(tuple(g), UNDECIDED, "cannot run: no such file") for g in groups])
    assert found.rounds == 1 and found.culprits == [] and set(found.verdicts.values()) == {UNKNOWN}
    assert "could not decide: cannot run: no such file" in found.why


def test_two_nodes_cannot_be_told_apart():
    found = search(_names(2), _runner({"gpu001"}, []))
    assert found.culprits == [] and found.why.startswith("no node proven good")
    assert found.verdicts == {"gpu001": UNKNOWN, "gpu002": UNKNOWN}


def test_three_nodes_with_the_bad_one_alone_are_told_apart():
    calls = []
    found = search(_names(3), _runner({"gpu001"}, calls))
    assert found.culprits == ["gpu001"] and calls[1] == [("gpu002", "gpu003")]
    assert calls[2:] == [[("gpu001", "gpu002")], [("gpu003", "gpu001")]]  # two proven partners, one after the other


def test_a_failure_that_follows_no_node_pins_none():
    # The whole job fails, every half and pair passes: the path between, not a node.
    calls = []
    nodes = _names(8)
    found = search(nodes, _runner(set(), calls, lambda g: FAIL if len(g) == 8 else PASS))
    assert found.culprits == [] and found.why == "no node pinned: the failure followed no single node"
    assert all(found.verdicts[x] == GOOD for x in nodes)


def test_a_wrong_answer_count_is_an_error_not_a_verdict():
    import pytest

    with pytest.raises(ValueError):
        search(_names(4), lambda groups: [])
