"""The sweep planner: a pure function, property-tested."""

from hypothesis import event, given, settings, strategies as st

from gpugate.model import reason as reasons
from gpugate.model.findings import Finding
from gpugate.slurm.nodestate import NodeState
from gpugate.sweep.plan import ESCALATE, Options, floor_count, plan, remedy_for
from gpugate.core.record import replace
from gpugate.sweep.snapshot import take

TAG = "gpugate:"
REASONS = [
    reasons.render(TAG, "drift", [Finding("drift", "driver", "550.54.15", "580.65.06", "")]),
    reasons.render(TAG, "broken", [Finding("broken", "module", "loaded 1", "on-disk 2", "")]),
    reasons.render(TAG, "health", [Finding("health", "xid", "79", "none", "", gpu=3)]),
    reasons.render(TAG, "health", [Finding("health", "row_remap", "failure", "none", "", gpu=1)]),
    reasons.render(TAG, "probe", [Finding("probe", "dcgm", "timeout", "answer", "")]),
    reasons.render(TAG, "rma", [Finding("rma", "xid", "79", "none", "")]),
    "rack maintenance", "Prolog error", "",
]


@st.composite
def fleets(draw):
    count = draw(st.integers(1, 40))
    parts = draw(st.lists(st.sampled_from(["gpu", "debug", "big"]), min_size=1, max_size=3, unique=True))
    states = {}
    for i in range(count):
        name = "n%03d" % i
        kind = draw(st.sampled_from(["idle", "alloc", "drained", "draining", "down"]))
        reason = draw(st.sampled_from(REASONS)) if kind in ("drained", "draining", "down") else ""
        base = {"idle": "IDLE", "alloc": "ALLOCATED", "drained": "IDLE", "draining": "MIXED", "down": "DOWN"}[kind]
        flags = frozenset({"DRAIN"}) if kind in ("drained", "draining") else frozenset()
        member = tuple(sorted(draw(st.lists(st.sampled_from(parts), min_size=1, max_size=len(parts), unique=True))))
        states[name] = NodeState(name=name, state=base, flags=flags, reason=reason,
                                 reason_time=draw(st.one_of(st.none(), st.integers(1, 10**6))),
                                 reason_user="root", partitions=member)
    return take(states, TAG, 0.0)


options_st = st.builds(
    Options,
    max_batch=st.integers(1, 10),
    floor=st.one_of(st.floats(0, 0.99), st.integers(0, 20).map(float)),
    in_flight=st.just(frozenset()),
    escalate_xids=st.sampled_from([frozenset(), frozenset({79})]),
)


@settings(max_examples=200, deadline=None)
@given(fleets(), options_st)
def test_plan_invariants(snap, options):
    result = plan(snap, options)
    seen = set()
    for batch in result.batches:
        assert batch.nodes, "no empty batch"
        for name in batch.nodes:
            assert name not in seen, "a node in two batches"
            seen.add(name)
            view = snap.nodes[name]
            ours = reasons.parse(view.reason, TAG)
            assert view.drain and ours is not None, "only gpugate's drains are acted on"
            assert ours.cls not in ("probe", "rma")
            assert result.decisions[name].included
        if batch.remedy == ESCALATE:
            continue
        assert len(batch.nodes) <= options.max_batch
        # Each batch alone fits every partition's budget.
        for part, fig in result.partitions.items():
            in_part = sum(1 for n in batch.nodes if part in snap.nodes[n].partitions)
            assert in_part <= fig.budget
            assert fig.budget == max(fig.members - fig.floor - fig.out_other - fig.in_flight, 0)
    for name, view in snap.nodes.items():
        if view.drain:
            assert name in result.decisions and result.decisions[name].why
        if view.drain and reasons.parse(view.reason, TAG) is None:
            assert not result.decisions[name].included


@settings(max_examples=200, deadline=None)
@given(fleets(), options_st)
def test_oldest_drain_first_within_a_remedy(snap, options):
    """Within one partition, a later batch of a remedy never holds a node
    drained before one of an earlier batch of that remedy."""
    result = plan(snap, options)

    def age(name):
        t = snap.nodes[name].reason_time
        return (t is None, t or 0)
    batches = [b for b in result.batches if b.remedy != ESCALATE]
    for i, earlier in enumerate(batches):
        for later in batches[i + 1:]:
            if later.remedy != earlier.remedy:
                continue
            for a in earlier.nodes:
                for b in later.nodes:
                    if snap.nodes[a].partitions == snap.nodes[b].partitions and len(snap.nodes[a].partitions) == 1:
                        assert age(a) <= age(b), (a, b)


def _state(name, drain=True, reason="", part="gpu", base="IDLE", t=1):
    return NodeState(name=name, state=base, flags=frozenset({"DRAIN"}) if drain else frozenset(),
                     reason=reason, reason_time=t, reason_user="root", partitions=(part,))


def test_six_of_eight_drifted_floor_half_gives_four_then_two():
    drift = REASONS[0]
    states = {"gpu%02d" % i: _state("gpu%02d" % i, reason=drift, t=i) for i in range(1, 7)}
    states.update({"gpu07": _state("gpu07", drain=False), "gpu08": _state("gpu08", drain=False)})
    result = plan(take(states, TAG, 0), Options(max_batch=8, floor=0.5))
    assert [b.nodes for b in result.batches] == [("gpu01", "gpu02", "gpu03", "gpu04"), ("gpu05", "gpu06")]
    fig = result.partitions["gpu"]
    assert (fig.members, fig.floor, fig.budget, fig.pending) == (8, 4, 4, 6)


def test_admin_drains_count_against_the_floor_and_are_never_planned():
    states = {"a1": _state("a1", reason="rack maintenance"), "a2": _state("a2", reason="rack maintenance"),
              "g1": _state("g1", reason=REASONS[0]), "g2": _state("g2", reason=REASONS[0]),
              "i1": _state("i1", drain=False), "i2": _state("i2", drain=False)}
    result = plan(take(states, TAG, 0), Options(max_batch=8, floor=3))
    # 6 members, floor 3, 2 out for others: 1 at a time.
    assert [b.nodes for b in result.batches] == [("g1",), ("g2",)]
    assert not result.decisions["a1"].included and "someone else" in result.decisions["a1"].why


def test_floor_reached_says_why():
    states = {"g1": _state("g1", reason=REASONS[0]), "a1": _state("a1", reason="Kill task failed")}
    result = plan(take(states, TAG, 0), Options(floor=1))
    assert result.batches == ()
    assert "at its floor" in result.decisions["g1"].why


def test_remedies_by_class_and_finding():
    opts = Options(escalate_xids=frozenset({48}))
    parse = lambda text: reasons.parse(text, TAG)  # noqa: E731
    assert remedy_for(parse(REASONS[0]), opts)[0] == "reconverge"
    assert remedy_for(parse(REASONS[1]), opts)[0] == "reboot"
    assert remedy_for(parse(REASONS[2]), opts)[0] == "reboot"
    assert remedy_for(parse(REASONS[3]), opts)[0] == "escalate"
    assert remedy_for(parse(REASONS[4]), opts)[0] is None
    assert remedy_for(parse(REASONS[5]), opts)[0] is None
    xid48 = reasons.render(TAG, "health", [Finding("health", "xid", "48", "none", "")])
    assert remedy_for(parse(xid48), opts)[0] == "escalate"
    # An Xid the policy escalates, kept in the reason behind another finding (slurm.ownership).
    behind = reasons.render(TAG, "health", [Finding("health", "ecc", "2", "0", "", gpu=3),
                                            Finding("health", "xid", "48", "none", "", gpu=3)])
    assert not behind.startswith(TAG + " health xid") and remedy_for(parse(behind), opts)[0] == "escalate"
    # What no repair brings back, behind a kept Xid the reboot would clear.
    remap = reasons.render(TAG, "health", [Finding("health", "xid", "63", "none", "", gpu=0),
                                           Finding("health", "row_remap", "failure", "none", "", gpu=3)])
    assert remap.startswith(TAG + " health xid") and remedy_for(parse(remap), opts)[0] == "escalate"
    # A reboot resets the NVSwitches and brings a GPU back on the bus.
    for finding in (Finding("health", "sxid", "nvswitch1 20034 fatal", "none", ""),
                    Finding("health", "fallen_off_bus", "0000:18:00", "on the bus", "", gpu=5)):
        assert remedy_for(parse(reasons.render(TAG, "health", [finding])), opts)[0] == "reboot"


def test_rollout_takes_in_service_nodes_canary_first():
    states = {"n%d" % i: _state("n%d" % i, drain=False, t=i) for i in range(1, 9)}
    result = plan(take(states, TAG, 0), Options(max_batch=8, floor=0.75, rollout=frozenset(states), canary=1))
    sizes = [len(b.nodes) for b in result.batches]
    assert sizes[0] == 1 and result.batches[0].canary and all(s <= 2 for s in sizes)
    assert sum(sizes) == 8


def test_floor_count():
    assert floor_count(8, 0.5) == 4 and floor_count(8, 0.75) == 6 and floor_count(3, 0.5) == 2
    assert floor_count(8, 3) == 3 and floor_count(2, 5) == 2 and floor_count(8, 0) == 0


# ------------------------------------------------------------ repeat offenders
from gpugate.sweep import history as hist  # noqa: E402

COMPONENTS = ["driver", "xid", "ecc", "module"]
DAY = 86400.0


@st.composite
def histories(draw):
    events = []
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from([hist.RESUMED, hist.RESUMED, hist.REDRAINED, hist.ESCALATED, hist.FORGIVEN]))
        comps = frozenset(draw(st.lists(st.sampled_from(COMPONENTS), max_size=2)))
        events.append(hist.Event("n", kind, draw(st.floats(0, 20 * DAY)), comps))
    return tuple(events)


@settings(max_examples=300, deadline=None)
@given(histories(), st.lists(st.sampled_from(COMPONENTS), min_size=1, max_size=3), st.integers(0, 5),
       st.floats(DAY, 14 * DAY))
def test_repeat_rule_counts_returns_for_the_same_component_within_the_window_since_forgiven(
        events, current, limit, window):
    now = 20 * DAY
    found = hist.repeat_of(current, events, now, limit, window)
    # Since the last forgive in time; at the same instant the journal's order
    # decides (a return recorded after a forgive of the same second counts).
    order = sorted(range(len(events)), key=lambda i: events[i].at)
    cleared = max([k for k, i in enumerate(order) if events[i].kind == hist.FORGIVEN], default=-1)
    after = [events[i] for i in order[cleared + 1:]]

    def count(c):
        return sum(1 for e in after if e.kind == hist.RESUMED and c in e.components and e.at >= now - window)
    if limit == 0:
        assert found is None
    elif found is None:
        assert all(count(c) < limit for c in current)
    else:
        assert found.component in current and found.count == count(found.component) >= limit
        assert found.count == max(count(c) for c in current)
    # Forgiving now clears it, whatever came before.
    assert hist.repeat_of(current, events + (hist.Event("n", hist.FORGIVEN, now),), now, limit, window) is None


@settings(max_examples=100, deadline=None)
@given(fleets(), options_st, st.data(), st.integers(1, 4))
def test_repeat_offenders_are_escalated_and_never_put_in_a_work_batch(snap, options, data, limit):
    from gpugate.core.record import replace

    # Each node's history: some returns to service for what it is drained for now, and noise.
    # The fleet is seen at 0: its history lies in the 20 days before.
    history = {}
    for name, view in snap.nodes.items():
        comps = hist.components(view.ours)
        noise = data.draw(histories())
        back = [hist.Event(name, hist.RESUMED, -data.draw(st.floats(0, 10 * DAY)), comps)
                for _ in range(data.draw(st.integers(0, 4)))] if comps else []
        history[name] = tuple(replace(e, node=name, at=e.at - 20 * DAY) for e in noise) + tuple(back)
    with_history = replace(options, history=history, repeat_limit=limit, repeat_window=7 * DAY)
    result = plan(snap, with_history)
    without = plan(snap, options)
    for name, d in result.decisions.items():
        view = snap.nodes[name]
        repeat = hist.repeat_of(hist.components(view.ours), history.get(name, ()), snap.taken_at, limit, 7 * DAY)
        if without.decisions[name].remedy in ("reconverge", "reboot") and repeat is not None and not d.included:
            # No room for one more rma of budgeted cause (the floor: no budget share here): deferred.
            assert d.remedy == ESCALATE and d.why.startswith("escalation deferred: partition")
            assert not any(name in b.nodes for b in result.batches)
        elif without.decisions[name].remedy in ("reconverge", "reboot") and repeat is not None:
            assert d.remedy == ESCALATE and d.included and d.repeat == repeat and "repeat offender" in d.why
            assert not any(name in b.nodes for b in result.batches if b.remedy != ESCALATE)
            event("a repeat offender escalated")
        elif d.repeat is None:
            # Everything else is decided as without the history (batches may shift: repeats take no capacity).
            assert (d.included, d.remedy) == (without.decisions[name].included, without.decisions[name].remedy)


ECC6 = reasons.render(TAG, "health", [Finding("health", "ecc", "4 uncorrected", "<= 0", "", gpu=6)])


def _as_applied(snap, options):
    """What `gpugate sweep --apply` runs (engine.Sweeper.run): the first
    batch of a fresh plan, then a new plan without the nodes it handled."""
    out, handled = [], frozenset()
    while True:
        batches = plan(snap, replace(options, exclude=handled)).batches
        if not batches:
            return out
        out.append((batches[0].remedy, batches[0].nodes))
        handled |= frozenset(batches[0].nodes)


def test_the_plan_numbers_batches_as_the_apply_runs_them_demo():
    """The demo: two drifted, two to reboot, drained first; gpu01 drained
    for ECC last (floor 4 of 8: budget 4).  The plan said batch 2 reboot,
    batch 3 reset; --apply ran batch 2 reset, batch 3 reboot."""
    states = {"gpu02": _state("gpu02", reason=REASONS[0], t=1), "gpu03": _state("gpu03", reason=REASONS[0], t=1),
              "gpu05": _state("gpu05", reason=REASONS[2], t=2), "gpu07": _state("gpu07", reason=REASONS[1], t=2),
              "gpu01": _state("gpu01", reason=ECC6, t=3)}
    states.update({n: _state(n, drain=False) for n in ("gpu04", "gpu06", "gpu08")})
    snap, options = take(states, TAG, 0), Options(max_batch=8, floor=0.5, reset=True)
    result = plan(snap, options)
    assert [(b.index, b.remedy, b.nodes) for b in result.batches] == [
        (1, "reconverge", ("gpu02", "gpu03")), (2, "reset", ("gpu01",)), (3, "reboot", ("gpu05", "gpu07"))]
    assert [(b.remedy, b.nodes) for b in result.batches] == _as_applied(snap, options)
    assert result.decisions["gpu01"].batch == 2 and result.decisions["gpu05"].batch == 3


@settings(max_examples=200, deadline=None)
@given(fleets(), options_st)
def test_the_plan_is_what_the_apply_runs_batch_by_batch(snap, options):
    result = plan(snap, options)
    assert [b.index for b in result.batches] == list(range(1, len(result.batches) + 1))
    assert [(b.remedy, b.nodes) for b in result.batches] == _as_applied(snap, options)


PRODUCT = reasons.render(TAG, "health", [Finding("health", "product", "NVIDIA A100", "NVIDIA H100", "", gpu=0)])
OLD_RMA = "gpugate: rma xid_repeat:gpu2=xid 31 in 3 jobs (want < 3 jobs within 24h)"


def test_an_escalation_of_budgeted_cause_waits_for_room_and_an_acute_one_never_waits():
    """Issue 33, item 2.  8 nodes, max_share 0.25 (2), floor 4: one rma of
    budgeted cause already; two budgeted escalations (oldest first) and one
    acute.  The acute goes; the older budgeted one takes the last place of
    the budget; the newer one waits and says why.  Then with two admin
    drains the acute one takes the floor's last room first: both wait."""
    states = {"g1": _state("g1", reason=OLD_RMA, t=1), "g2": _state("g2", reason=PRODUCT, t=2),
              "g3": _state("g3", reason=PRODUCT, t=3), "g4": _state("g4", reason=REASONS[3], t=4)}
    states.update({n: _state(n, drain=False) for n in ("i1", "i2", "i3", "i4")})
    options = Options(floor=4, budget_share=0.25)
    result = plan(take(states, TAG, 0), options)
    assert [(b.remedy, b.nodes) for b in result.batches] == [(ESCALATE, ("g2", "g4"))]
    assert result.decisions["g3"].why == (
        "escalation deferred: drain budget of partition gpu: 2 of 2 node(s) already in rma for budgeted "
        "findings (g1, g2)")
    assert result.decisions["g3"].remedy == ESCALATE and not result.decisions["g3"].included
    states.update({n: _state(n, reason="rack maintenance") for n in ("i1", "i2")})
    result = plan(take(states, TAG, 0), options)
    assert [(b.remedy, b.nodes) for b in result.batches] == [(ESCALATE, ("g4",))]
    assert result.decisions["g2"].why.startswith("escalation deferred: partition gpu at its floor: 4 of 8")
    # The budget off (max_share 1): the floor alone.
    states.update({n: _state(n, drain=False) for n in ("i1", "i2")})
    result = plan(take(states, TAG, 0), replace(options, budget_share=1.0))
    assert [(b.remedy, b.nodes) for b in result.batches] == [(ESCALATE, ("g2", "g3", "g4"))]
