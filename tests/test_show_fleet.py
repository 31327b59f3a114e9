"""The keeper's read of `scontrol show node` (issue 48,
gpugate.slurm.nodestate.show_fleet) reads what the node records say, or
refuses: fleets are generated and printed as each release's sprint prints
them (gpugate.testbed.show_node_text, on records recorded from the real
release), and the read is compared with what was printed: the records of
the nodes that decide, the partitions' sizes, and the keeper's decision
on it against the straightforward path's on the truth
(tests/test_keeper_lean.py's reference).  Values an admin wrote with line
breaks (a comment forging a State line, a reason of two lines) are
refused, never read wrong; so are a node printed twice and a reason time
not in epoch seconds.  The real release's whole text is read in
tests/test_slurm_node_read.py.  No timing here: bench/bench_budget.py."""

import json
import os

import pytest
from hypothesis import given, settings, strategies as st

from conftest import ROOT
from test_keeper_lean import KEY, NOW, TAG, _span, reference_decide

from gpugate.errors import ParseError
from gpugate.keeper import run as keeper
from gpugate.budget import proofs as keeper_proofs
from gpugate.slurm.nodestate import NodeState
from gpugate.slurm.nodestate.lean import Fleet, deciding, of_states
from gpugate.slurm.nodestate.record import _parse_state, _without_stale_reason
from gpugate.slurm.nodestate import show_fleet
from gpugate.slurm.nodestate.show_fleet import read_show_text
from gpugate.slurm.nodestate.show_text import parse_show_node
from gpugate.testbed.show_node_text import RELEASES, Records

STATES = ["IDLE", "IDLE", "MIXED", "ALLOCATED", "IDLE+DRAIN", "ALLOCATED+DRAIN", "DOWN+DRAIN",
          "DOWN+NOT_RESPONDING", "IDLE+DRAIN+REBOOT_REQUESTED", "MIXED+COMPLETING"]
PARTS = ("gpu", "pool0", "pool1", "debug")
REASONS = ["gpugate: drift driver=550.54.15 (want 580.95.05)", "admin: PSU [ticket 4]",
           "gpugate: health preflight_across=pinned (want none)", "Not responding"]


@st.composite
def fleets(draw):
    """(release, the nodes as printed, the truth: name -> NodeState)."""
    release = draw(st.sampled_from(RELEASES))
    names = ["gpu%02d" % i for i in range(draw(st.integers(1, 20)))]
    nodes, truth = [], {}
    for name in names:
        state = draw(st.sampled_from(STATES))
        base, flags = _parse_state(state, None, "test")
        parts = tuple(sorted(set(draw(st.lists(st.sampled_from(PARTS), max_size=3)))))
        reason, when = "", None
        if "DRAIN" in flags or base == "DOWN" or draw(st.booleans()):
            reason = draw(st.sampled_from(REASONS))
            when = NOW - draw(st.integers(0, 99)) if draw(st.booleans()) or "DRAIN" in flags else None
        pieces = [_span(draw, name, names) for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2])))]
        admin = draw(st.sampled_from(["", "", "rack 3, row \"B\"", "[gpugate-pending @12] not closed"]))
        pieces += [admin] if admin else []
        comment = " ".join(draw(st.permutations(pieces))) if pieces else draw(st.sampled_from([None, ""]))
        node = dict(name=name, state=state, partitions=parts, reason=reason, reason_time=when, comment=comment)
        nodes.append(node)
        record = NodeState(name, base, flags, reason, when, "root" if when is not None else "", parts,
                           comment or "")
        truth[name] = _without_stale_reason(record)
    return release, nodes, truth


def _read(release, nodes):
    text = "".join(Records(release).record(**node) for node in nodes)
    try:
        return read_show_text(text)
    except ParseError as exc:
        return exc


@settings(max_examples=200, deadline=None)
@given(fleets(), st.sampled_from([0.1, 0.25, 0.5]), st.integers(0, 3))
def test_the_read_holds_what_the_records_say_and_the_keeper_decides_alike(case, share, per_hour):
    release, nodes, truth = case
    fleet = _read(release, nodes)
    assert isinstance(fleet, Fleet), fleet
    assert fleet.states == {n: s for n, s in truth.items() if deciding(s)}
    assert fleet.sizes == of_states(truth).sizes and fleet.nodes == len(truth)
    mine, unverified, memory, waiting, plan = reference_decide(truth, share, per_hour, {}, NOW)
    got = keeper.decide(fleet, keeper_proofs.Proofs(KEY), TAG, share, per_hour, {}, lambda: NOW)
    assert (got.plan.drain, got.plan.held, got.plan.uses) == (plan.drain, plan.held, plan.uses)
    assert got.unverified == unverified and got.waiting == waiting


def _odd(draw, nodes, truth):
    """One node's values made as an admin could write them (with line
    breaks, a time as a date) or printed twice; the truth made to say it."""
    at = draw(st.integers(0, len(nodes) - 1))
    node = dict(nodes[at])
    kind = draw(st.sampled_from(["comment forges a state", "comment on two lines", "reason on two lines",
                                 "node twice", "reason time as a date", "comment forges a reason",
                                 "comment forges partitions", "a job's label forges", "features forge a state",
                                 "extra forges a reason", "a span after the comment's cut"]))
    if kind == "a job's label forges" and node["partitions"]:  # a job ran here: its MCS label is the node's
        node["mcs_label"] = "x" + draw(st.sampled_from([
            "\n   Partitions=tiny ", "\n   Reason=admin: forged [root@5]", "\n   State=IDLE+DRAIN x",
            "\n   CurrentWatts=0 AveWatts=0\n   Comment=" + _span(draw, node["name"], [node["name"]]),
            "\n\nNodeName=zz CoresPerSocket=1 \n   State=IDLE ThreadsPerCore=1\n   Partitions=gpu \n"
            "   CurrentWatts=0 AveWatts=0"]))
    elif kind == "features forge a state":  # an admin's
        node["features"] = "a\n   State=IDLE ThreadsPerCore=1"
    elif kind == "extra forges a reason":
        node["extra"] = "x\n   Reason=admin: forged [root@1]"
    elif kind == "a span after the comment's cut":
        node["comment"] = "rack 3\n   Extra=" + _span(draw, node["name"], [node["name"]])
    elif kind == "comment forges a state":
        node["comment"] = (node["comment"] or "") + "\n   State=IDLE+DRAIN ThreadsPerCore=1"
    elif kind == "comment on two lines":
        node["comment"] = (node["comment"] or "rack 3") + "\nrow B"
    elif kind == "reason on two lines":
        node["reason"] = (node["reason"] or "admin: PSU") + "\nswapped"
    elif kind == "node twice":
        nodes.insert(at, dict(node))
    elif kind == "reason time as a date":
        node["reason"], node["reason_time"] = (node["reason"] or "admin: PSU") + " [root@2026-12-05T12:00:00]", None
    elif kind == "comment forges a reason":
        node["reason"], node["reason_time"] = "", None
        node["comment"] = (node["comment"] or "x") + "\n   Reason=admin: forged [root@1]"
    else:
        node["comment"] = (node["comment"] or "x") + "\n   Partitions=forged "
    nodes[at + (kind == "node twice")] = node
    was = truth[node["name"]]
    truth[node["name"]] = _without_stale_reason(NodeState(
        was.name, *_parse_state(node["state"], None, "test"), node["reason"], node["reason_time"],
        "root" if node["reason_time"] is not None else "", was.partitions, node["comment"] or ""))
    return kind, node


def _must_refuse(kind, node):
    """What the read must refuse whichever node it is: a second State,
    Partitions or power line, a record cut short, a node twice."""
    label = node.get("mcs_label") or ""
    return kind in ("node twice", "features forge a state") or (
        kind == "a job's label forges" and any(k in label for k in ("Partitions=", "State=", "CurrentWatts=")))


@settings(max_examples=300, deadline=None)
@given(fleets(), st.data())
def test_a_value_with_a_line_break_is_refused_or_read_as_it_is(case, data):
    """A text with a value an admin or a job's user wrote with line breaks
    (a comment, reason, features, Extra; a job's MCS label, which Slurm
    copies onto its node): refused (the keeper reads the fleet the full
    way), or read as exactly what the records say of the nodes that
    decide and of every partition's size: a State, Partitions, power,
    Reason or Comment line a value made is never read, a value cut at its
    line break never decides.  A second State, Partitions or power line,
    a record cut in two, a node printed twice: always refused."""
    release, nodes, truth = case
    kind, node = _odd(data.draw, nodes, truth)
    fleet = _read(release, nodes)
    if _must_refuse(kind, node):
        assert isinstance(fleet, ParseError), (kind, node)
    elif not isinstance(fleet, ParseError):
        assert fleet.states == {n: s for n, s in truth.items() if deciding(s)}, kind
        assert fleet.sizes == of_states(truth).sizes and fleet.nodes == len(truth)


@settings(max_examples=150, deadline=None)
@given(fleets(), st.data())
def test_the_read_in_one_step_and_record_by_record_agree(case, data):
    """The two ways the read goes (show_fleet's module doc): a text of
    records all as sprint prints them is read in one step (_at_once); with
    one value over two lines in it, record by record.  Each text read
    both ways gives the same fleet, or both refuse it; the one-step way
    takes every text with no value over two lines."""
    release, nodes, truth = case
    if data.draw(st.booleans()):
        _odd(data.draw, nodes, truth)
    text = "".join(Records(release).record(**node) for node in nodes)
    if all("\n" not in str(v) for node in nodes for v in node.values()):
        assert show_fleet._at_once(text) is not None, "a text with no value over two lines is read in one step"
    saved = show_fleet._at_once
    show_fleet._at_once = lambda text: None
    try:
        apart = _read(release, nodes)
    finally:
        show_fleet._at_once = saved
    together = _read(release, nodes)
    if isinstance(together, ParseError) or isinstance(apart, ParseError):
        assert type(together) is type(apart), (together, apart)
    else:
        assert (together.states, together.sizes, together.nodes) == (apart.states, apart.sizes, apart.nodes)


@pytest.mark.parametrize("release", RELEASES)
def test_each_release_s_real_records_read_as_the_one_node_reader_reads_them(release):
    """The records recorded from the real release (idle, drained by
    gpugate and by an admin, down, a reboot asked with a job running),
    printed one after the other as `scontrol show node` prints them: the
    nodes that decide, as the strict one-node reader reads each.  The two
    an admin wrote with line breaks are refused."""
    with open(os.path.join(ROOT, "tests", "fixtures", "slurm", release, "libslurm-show-node.json")) as handle:
        recorded = json.load(handle)
    plain = {k: v for k, v in recorded.items() if k.startswith("gpu")}
    fleet = read_show_text("".join(v["text"] for v in plain.values()))
    one = {n: parse_show_node(v["text"], v["oneline"], n) for n, v in plain.items()}
    assert fleet.states == {n: s for n, s in one.items() if deciding(s)} and fleet.states
    assert fleet.nodes == len(plain) and fleet.sizes == {}  # one node's read carries no Partitions line
    for odd in ("comment with a line break", "reason of two lines"):
        text = recorded[odd]["text"]
        with pytest.raises(ParseError):
            read_show_text(text if "DRAIN" in text else text.replace("State=IDLE ", "State=IDLE+DRAIN ", 1))


@pytest.mark.parametrize("text", ["No nodes in the system\n"])
def test_no_nodes_is_an_empty_fleet(text):
    fleet = read_show_text(text)
    assert (fleet.states, fleet.sizes, fleet.nodes) == ({}, {}, 0)


@pytest.mark.parametrize("text", ["", "\n", "garbage", '{"nodes": [{"name": 7}', "NodeName=gpu01 Arch=x86_64\n\n",
                                  "NodeName=bad,name CoresPerSocket=1 \n   State=IDLE ThreadsPerCore=1\n\n",
                                  "NodeName=gpu01 CoresPerSocket=1 \n   State=SLEEPY ThreadsPerCore=1\n\n", b"bytes"])
def test_garbage_is_refused(text):
    with pytest.raises(ParseError):
        read_show_text(text)
