"""The drain-budget keeper (gpugate.keeper.run, `gpugate budget`, issue 26):
nodes publish budgeted findings on their own Slurm record; one keeper
drains them within each partition's budget, oldest first, and two keepers
deciding at once give back exactly the excess.  Pure rule and the run
against an in-memory Slurm; the real cluster is tests/test_slurm_budget.py."""

import json
import os
import time

import pytest
from hypothesis import given, settings, strategies as st

from gpugate.budget import rules as budget
from gpugate.keeper import run as keeper
from gpugate.keeper import view as keeper_view
from gpugate.model.config import parse_settings
from gpugate.core.record import replace
from gpugate.slurm import pending
from gpugate.slurm.nodestate import NodeState
from gpugate.slurm.base import NodeUpdates

TAG = "gpugate:"
DRIFT = "gpugate: drift driver=550.54.15 (want 580.95.05)"
XID = "gpugate: health xid:gpu1=79 (want none)"
KEY = b"0123456789abcdef0123456789abcdef"  # keeper_settings' drain budget key


def node(name, parts=("a",), reason="", when=None, drain=None, published=None, since=100, comment="", seen=None):
    """A node's record; ``published``: signed by the node itself (pending.publish
    with the key), first at ``since``, last at ``seen`` (default: since)."""
    flags = frozenset({"DRAIN"}) if (reason if drain is None else drain) else frozenset()
    if published:
        comment = pending.publish(comment, published, since, KEY, name)
        if seen is not None:
            comment = pending.publish(comment, published, seen, KEY, name, since=since)  # its record's time
    return NodeState(name, "IDLE", flags, reason, when, "root" if reason else "", tuple(sorted(parts)), comment)


def fleet(*nodes):
    return {n.name: n for n in nodes}


def test_published_nodes_drain_oldest_first_up_to_the_allowance():
    states = fleet(*[node("gpu%02d" % i, published=DRIFT, since=200 - i) for i in range(1, 11)])
    plan = budget.plan(states, TAG, 0.2)  # 2 of 10
    assert plan.drain == (("gpu10", DRIFT), ("gpu09", DRIFT))
    assert sorted(plan.held) == ["gpu%02d" % i for i in range(1, 9)]
    assert "drain budget of partition a spent: 2 of 2 nodes (20% of 10)" in plan.held["gpu01"]


def test_only_gpugates_budgeted_published_reasons_are_drained_and_never_over_a_reason():
    states = fleet(
        node("gpu01", published=DRIFT, comment="rack 3"),                # admin text around it: fine
        node("gpu02", published=XID),                                     # acute: the node drains it itself
        node("gpu03", comment="[gpugate-pending @1] admin: x [/gpugate-pending]"),  # not our tag
        node("gpu04", published=DRIFT, reason="Not responding", drain=False),  # DOWN with Slurm's reason
        node("gpu05", published=DRIFT, reason="admin: PSU"),              # drained by an admin: not counted
        node("gpu06", parts=(), published=DRIFT),
    )
    plan = budget.plan(states, TAG, 0.5)
    assert plan.drain == (("gpu01", DRIFT),)
    assert set(plan.held) == {"gpu04", "gpu06"}
    assert "not gpugate's" in plan.held["gpu04"] and "no partition" in plan.held["gpu06"]


def test_a_node_in_two_partitions_needs_room_in_both():
    states = fleet(node("n1", ("a", "b"), published=DRIFT, since=1), node("n2", ("b",), DRIFT, 5),
                   node("n3", ("a",), published=DRIFT, since=2), node("n4", ("a",)), node("n5", ("b",)))
    plan = budget.plan(states, TAG, 0.1)  # one per partition; b's is spent by n2
    assert plan.drain == (("n3", DRIFT),) and set(plan.held) == {"n1"}


PARTS = ("a", "b", "c")


@st.composite
def fleets(draw):
    nodes = {}
    for i in range(draw(st.integers(1, 30))):
        name = "n%02d" % i
        parts = draw(st.sets(st.sampled_from(PARTS), min_size=1, max_size=2))
        kind = draw(st.sampled_from(["idle", "published", "published", "drift", "health", "admin"]))
        reason = {"drift": DRIFT, "health": XID, "admin": "admin: PSU"}.get(kind, "")
        nodes[name] = node(name, parts, reason, draw(st.integers(0, 50)) if reason else None,
                           published=DRIFT if kind == "published" else None, since=draw(st.integers(0, 99)))
    return nodes, draw(st.floats(0.0, 0.99))


def _drained(states, names, when):
    for name in names:
        states[name] = replace(states[name], flags=states[name].flags | {"DRAIN"}, reason=DRIFT, reason_time=when)


def _counts(states, share):
    return {p: (len(u.drained), u.allowance) for p, u in budget.usage(states, TAG, share).items()}


@settings(max_examples=200, deadline=None)
@given(fleets(), st.data())
def test_two_keepers_on_different_views_never_leave_a_partition_over_its_budget(case, data):
    """Keeper A decides on one view, keeper B on a later one in which some
    published nodes have not yet been seen by A (or A's drains not yet by
    B); both drain in the same second; each re-reads and gives back what
    budget.over names.  No partition ends over its allowance (or over what
    it held before: a lowered share is not a race), and the two give back
    the same nodes."""
    states, share = case
    before = _counts(states, share)
    names = sorted(states)
    hidden = set(data.draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names))))
    view_a = {n: (replace(s, comment="") if n in hidden else s) for n, s in states.items()}
    plan_a, plan_b = budget.plan(view_a, TAG, share), budget.plan(states, TAG, share)
    _drained(states, [n for n, _ in plan_a.drain], 1000)
    _drained(states, [n for n, _ in plan_b.drain], 1000 + data.draw(st.integers(0, 1)))
    back = budget.over(states, TAG, share, 999)
    assert back == budget.over(dict(states), TAG, share, 999)
    for name in back:
        states[name] = replace(states[name], flags=states[name].flags - {"DRAIN"})
    for part, (count, allowance) in _counts(states, share).items():
        assert count <= max(allowance, before.get(part, (0, 0))[0])
    assert set(back) <= {n for n, _ in plan_a.drain} | {n for n, _ in plan_b.drain}


@settings(max_examples=150, deadline=None)
@given(fleets())
def test_one_keeper_fills_each_budget_and_gives_nothing_back(case):
    states, share = case
    plan = budget.plan(states, TAG, share)
    _drained(states, [n for n, _ in plan.drain], 1000)
    assert budget.over(states, TAG, share, 999) == ()
    uses = budget.usage(states, TAG, share)
    for name in plan.held:  # held for a reason: a full partition, a reason of someone else's, no partition
        st_ = states[name]
        assert st_.reason or not st_.partitions or any(
            len(uses[p].drained) >= uses[p].allowance for p in st_.partitions)


# ------------------------------------------------------------ the run itself
class MemorySlurm(NodeUpdates):  # the scheduler interface's defaults (report_verdict, lead)
    """An in-memory slurmctld: reads, drains and undrains, counted."""

    name = "memory"
    node_read = "libslurm"  # how own_record read (gpugate.slurm.commands)

    def __init__(self, states, clock):
        self.states, self.clock = dict(states), clock
        self.calls = []

    def nodes(self, names=None, lean=False):
        assert lean and names is None  # the keeper reads the fleet lean, a node by own_record
        self.calls.append(("read", names))
        return dict(self.states)

    def own_record(self, name):
        self.calls.append(("read", name))
        return replace(self.states[name], partitions=()) if name in self.states else None

    def drain(self, names, reason):
        from gpugate.core.names import parse_hostlist

        self.calls.append(("drain", names))
        for name in parse_hostlist(names):
            self.states[name] = replace(self.states[name], flags=self.states[name].flags | {"DRAIN"},
                                        reason=reason, reason_time=int(self.clock()))

    def undrain(self, names):
        from gpugate.core.names import parse_hostlist

        self.calls.append(("undrain", names))
        for name in parse_hostlist(names):
            self.states[name] = replace(self.states[name], flags=self.states[name].flags - {"DRAIN"})

    def close(self):
        pass


@pytest.fixture
def keeper_settings(tmp_path):
    key = tmp_path / "drain-budget.key"
    key.write_bytes(KEY + b"\n")
    key.chmod(0o600)
    base = parse_settings({"drain_budget": {"max_share": 0.25, "key_file": str(key)}}, "(test)")
    return replace(base, sweep=dict(base.sweep, journal=str(tmp_path / "sweep.db")))


def test_one_run_reads_the_fleet_once_drains_in_one_update_and_records_it(keeper_settings):
    now = [1000.0]
    states = fleet(*[node("gpu%02d" % i, published=DRIFT, since=i) for i in range(1, 9)])
    slurm = MemorySlurm(states, lambda: now[0])
    figures = keeper.run_once(keeper_settings, slurm, clock=lambda: now[0], sleep=lambda s: None)
    assert figures["drained"] == ["gpu01", "gpu02"] and figures["held"] == 6
    assert [c for c in slurm.calls if c[0] != "read" or c[1] is None] == [
        ("read", None), ("drain", "gpu[01-02]"), ("read", None)]  # + one single read per drained node
    assert sorted(c[1] for c in slurm.calls if c[0] == "read" and c[1]) == ["gpu01", "gpu02"]
    assert figures["partitions"]["a"] == {"size": 8, "allowance": 2, "drained": 2, "held": 6}
    # The next run: the budget is spent, one fleet read and nothing else.
    slurm.calls = []
    figures = keeper.run_once(keeper_settings, slurm, clock=lambda: now[0], sleep=lambda s: None)
    assert slurm.calls == [("read", None)] and figures["drained"] == [] and figures["held"] == 6


def test_a_mirror_that_fails_after_the_drain_does_not_stop_the_run(keeper_settings):
    """Slurm on Kubernetes (gpugate.kube.paired): the drain landed in Slurm,
    its Node's hold did not.  The run counts the drain, goes on to settle
    and re-read (the give-back of a concurrent keeper's excess needs it),
    and says what was not mirrored."""
    from gpugate.errors import MirrorError

    states = fleet(*[node("gpu%02d" % i, published=DRIFT, since=i) for i in range(1, 9)])
    slurm = MemorySlurm(states, lambda: 1000)
    real = slurm.drain

    def half(names, reason):
        real(names, reason)
        raise MirrorError("Slurm drained %s; its Kubernetes Node not yet" % names)
    slurm.drain = half
    figures = keeper.run_once(keeper_settings, slurm, clock=lambda: 1000, sleep=lambda s: None)
    assert figures["drained"] == ["gpu01", "gpu02"] and "gpu[01-02]" in figures["mirror_errors"][0]
    assert slurm.calls[-1] == ("read", None)  # the settle's re-read still ran


def test_the_run_re_reads_each_node_before_it_writes(keeper_settings):
    """A node an admin drained, or that cleared its finding, between the
    fleet read and the write is left alone."""
    states = fleet(*[node("gpu%02d" % i, published=DRIFT, since=i) for i in range(1, 9)])
    slurm = MemorySlurm(states, lambda: 1000)
    real = slurm.own_record

    def racing(name):
        if name == "gpu01":
            slurm.states["gpu01"] = node("gpu01", reason="admin: cable", published=DRIFT, since=1)
        if name == "gpu02":
            slurm.states["gpu02"] = node("gpu02")
        return real(name)
    slurm.own_record = racing
    figures = keeper.run_once(keeper_settings, slurm, clock=lambda: 1000, sleep=lambda s: None)
    assert figures["drained"] == [] and set(figures["skipped"]) == {"gpu01", "gpu02"}
    assert slurm.states["gpu01"].reason == "admin: cable"


def test_a_concurrent_keepers_excess_is_given_back(keeper_settings):
    """Another keeper drained gpu05 and gpu06 (newer, in the same run's
    window) after this keeper read the fleet: the re-read after writing
    sees four drains for an allowance of two and gives back the newest."""
    states = fleet(*[node("gpu%02d" % i, published=DRIFT, since=i) for i in range(1, 9)])
    slurm = MemorySlurm(states, lambda: 1000)
    real_drain = slurm.drain

    def drain(names, reason):
        real_drain(names, reason)
        for other in ("gpu05", "gpu06"):
            slurm.states[other] = replace(slurm.states[other], flags=frozenset({"DRAIN"}), reason=DRIFT,
                                          reason_time=1001)
    slurm.drain = drain
    figures = keeper.run_once(keeper_settings, slurm, clock=lambda: 1000, sleep=lambda s: None)
    assert figures["drained"] == ["gpu01", "gpu02"] and figures["given_back"] == ["gpu05", "gpu06"]
    assert sorted(n for n, s in slurm.states.items() if s.drain) == ["gpu01", "gpu02"]
    assert figures["partitions"]["a"]["drained"] == 2


def test_record_keeps_the_last_good_run_through_failures_and_metrics_export_it(keeper_settings):
    from gpugate.errors import SlurmError
    from gpugate.fleet.metrics import keeper_families
    from gpugate.core.promtext import render

    def failing(settings, deadline=None):
        raise SlurmError("sinfo: Unable to contact slurm controller")
    assert render(keeper_families(None, 2000.0)).count("gpugate_budget_keeper_last_run_timestamp_seconds 0") == 1
    slurm = MemorySlurm(fleet(node("gpu01", published=DRIFT, since=int(time.time())), node("gpu02")), lambda: 1000)
    good = keeper.run(keeper_settings, connect=lambda settings, deadline=None: slurm)
    assert good["ok"] and good["drained"] == ["gpu01"] and good["last_ok"] == good["at"]
    bad = keeper.run(keeper_settings, connect=failing)
    assert not bad["ok"] and "Unable to contact" in bad["error"] and bad["last_ok"] == good["at"]
    text = render(keeper_families(keeper.read_status(keeper_settings), 2000.0))
    assert "gpugate_budget_keeper_last_run_timestamp_seconds %s" % good["at"] in text
    assert "gpugate_budget_keeper_last_error 1" in text
    with open(keeper.status_path(keeper_settings)) as handle:
        assert json.load(handle)["error"].startswith("sinfo")


def test_a_second_run_on_the_same_host_waits_its_turn(keeper_settings):
    with keeper._host_lock(keeper_settings):
        status = keeper.run(keeper_settings, connect=lambda settings, deadline=None: 1 / 0)
    assert not status["ok"] and "another gpugate budget run holds" in status["error"] and "pid %d" % os.getpid() in status["error"]
    assert os.path.exists(keeper.status_path(keeper_settings))


def test_a_draining_runs_re_read_serves_the_next_run_once(keeper_settings):
    """A run that drains reads the fleet twice (before and after writing);
    the next run decides on that re-read (no fleet read), the one after
    reads again: at most two full reads in a wrong pin's first minute."""
    states = fleet(*[node("gpu%02d" % i, published=DRIFT, since=i, seen=int(time.time())) for i in range(1, 9)])
    slurm = MemorySlurm(states, time.time)
    connect = lambda settings, deadline=None: slurm  # noqa: E731
    reads = []
    for _ in range(3):
        slurm.calls = []
        status = keeper.run(keeper_settings, connect=connect)
        assert status["ok"], status
        reads.append(sum(1 for c in slurm.calls if c == ("read", None)))
    assert reads == [2, 0, 1]
    assert not os.path.exists(os.path.join(os.path.dirname(keeper.status_path(keeper_settings)), keeper_view.VIEW_FILE))
    # A stale view is not used.
    keeper.save_view(keeper_settings, time.time() - keeper_view.CACHE_SECONDS - 1, slurm.states)
    assert keeper.take_view(keeper_settings, time.time()) is None


def test_no_node_side_path_reads_the_fleet():
    """Issue 26, item 4: the health check, prolog and epilog (gpugate.node)
    read only their own node, in one RPC (issue 34): no `.nodes(...)` call
    there at all, only `own_record(node)`, and nothing there reaches the
    fleet-wide budget rule (admit/keep/plan).
    The real-cluster counterpart, by slurmctld's own counts and the Slurm
    call log: tests/test_slurm_budget.py, tests/test_slurm_scale.py."""
    import ast
    import glob

    from conftest import ROOT

    checked = 0
    for path in sorted(glob.glob(os.path.join(ROOT, "gpugate", "node", "*.py"))):
        with open(path) as handle:
            tree = ast.parse(handle.read())
        for call in ast.walk(tree):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
                assert call.func.attr != "nodes", "%s:%d reads nodes with more than one RPC" % (path, call.lineno)
                if call.func.attr == "own_record":
                    checked += 1
                    assert len(call.args) == 1 and not call.keywords
                assert call.func.attr not in ("admit", "keep", "plan", "fleet_usage"), (
                    "%s:%d decides the fleet's budget on a node" % (path, call.lineno))
    assert checked >= 2  # act.py and xidhistory.py read their own node


def test_pyslurm_clears_a_comment_through_scontrol():
    """pyslurm sends an empty comment as NULL ("no change" to slurmctld):
    clearing gpugate's part goes through scontrol instead; a comment with
    text goes through the worker."""
    from gpugate.slurm.pyslurm_backend import PyslurmSlurm

    backend = PyslurmSlurm("/usr/bin", {"PATH": "/usr/bin"}, 5.0)
    sent = []
    backend._call = lambda op, *args, **kw: sent.append(("worker", op) + args)
    backend.tools.set_comment = lambda name, comment: sent.append(("scontrol", name, comment))
    backend.set_comment("gpu01", "rack 3")
    backend.set_comment("gpu01", "")
    assert sent == [("worker", "set_comment", "gpu01", "rack 3"), ("scontrol", "gpu01", "")]
