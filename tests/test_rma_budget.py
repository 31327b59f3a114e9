"""RMA never bypasses the budget (issue 33, item 2).

The attack: three 5-second jobs of uid 65534 on gpu01 (an application Xid
31 each) made a budgeted ``xid_repeat``; the keeper drained it within the
budget, the sweep escalated it to rma, and an rma was counted by nothing:
the budget was free again, and gpu02 and gpu03 followed, 3 of 4 nodes in
rma with a budget of 1 and a floor of 50%.  (What the node publishes from
those jobs is tests/test_apprepeat.py's; here the published finding stands
for it, and the controller's side runs: the keeper's decision, the real
sweep engine on a stand-in Slurm, and the pure planner.)"""

from hypothesis import assume, event, given, settings, strategies as st

from gpugate.budget import rules as budget
from gpugate.model import reason as reasons
from gpugate.model.findings import Finding
from gpugate.core.record import replace
from gpugate.slurm import pending
from gpugate.slurm.nodestate import NodeState
from gpugate.sweep import escalation as esc
from gpugate.sweep import history as hist
from gpugate.sweep.plan import ESCALATE, Options, floor_count, plan
from gpugate.sweep.snapshot import take
from test_sweep_engine import DAY, DRIFT, FitTransport, converge_failing_on, make
from test_sweep_engine import FakeSlurm as _FakeSlurm

TAG = "gpugate:"
XID_REPEAT = reasons.render(TAG, "health", [Finding("health", "xid_repeat", "xid 31 in 3 jobs",
                                                    "< 3 jobs within 24h", "", gpu=2)])
PRODUCT = reasons.render(TAG, "health", [Finding("health", "product", "NVIDIA A100", "NVIDIA H100", "", gpu=0)])
ROW_REMAP = reasons.render(TAG, "health", [Finding("health", "row_remap", "failure", "none", "", gpu=1)])


class FakeSlurm(_FakeSlurm):
    def reserve(self, name, names, *minutes):  # whichever form the sweep's reservation takes
        self.res[name] = names


class UnfitFor(FitTransport):
    """Verification after every repair finds the finding again on these nodes."""

    def __init__(self, *bad):
        super().__init__()
        self.bad = set(bad)

    def check(self, nodes, args, timeout):
        answers = super().check(nodes, args, timeout)
        for n in set(nodes) & self.bad:
            f = Finding("health", "xid_repeat", "xid 31 in 3 jobs", "< 3 jobs within 24h", "", gpu=2)
            answers[n] = {"node": n, "fit": False, "reason": XID_REPEAT, "findings": [f.to_json()], "pending": []}
        return answers

    def run(self, nodes, args, timeout):  # the reset rung, where [sweep] reset is on: it fails
        return {n: {"ok": False, "error": "reset refused"} for n in nodes}


def _keeper(slurm, share):
    """The keeper's decision (gpugate.budget.rules.plan) written as the keeper writes it."""
    for name, reason in budget.plan(slurm.states, TAG, share).drain:
        slurm.drain(name, reason)


def test_three_jobs_xid_repeat_on_three_nodes_leave_one_node_in_rma_not_three(tmp_path):
    """The attack as found, on 4 nodes, max_share 0.25 (a budget of 1),
    floor 50%: before, gpu001, gpu002 and gpu003 all ended in rma."""
    slurm = FakeSlurm(count=4, reboot_polls=1)
    for target in ("gpu001", "gpu002", "gpu003"):
        slurm.set_comment(target, pending.publish("", XID_REPEAT, 100))
        _keeper(slurm, 0.25)
        sweeper, journal, _ = make(tmp_path, slurm, floor=0.5)
        sweeper.transport = UnfitFor("gpu001", "gpu002", "gpu003")
        sweeper.options = replace(sweeper.options, budget_share=0.25)
        sweeper.run()
        journal.close()
    rma = sorted(n for n, s in slurm.states.items() if s.reason.startswith("gpugate: rma"))
    assert rma == ["gpu001"], {n: s.reason for n, s in slurm.states.items()}
    assert slurm.states["gpu001"].reason.startswith("gpugate: rma budgeted=health xid_repeat (want counted)")
    # It holds the budget's one place: the others stay published and in service, held.
    assert budget.counted(slurm.states["gpu001"], TAG)
    assert budget.plan(slurm.states, TAG, 0.25).held.keys() == {"gpu002", "gpu003"}
    assert all(slurm.states[n].in_service for n in ("gpu002", "gpu003", "gpu004"))


def test_an_escalation_with_no_room_is_deferred_and_escalated_once_there_is_room(tmp_path):
    """gpu001 is in rma for a budgeted cause (an older release's reason,
    unmarked); gpu003's converge fails twice: its rma would be the
    partition's second with a budget of 1, so it is deferred, visible in
    the reason, the journal and the report, counted by the budget; once an
    admin took gpu001 back, the next sweep escalates it."""
    slurm = FakeSlurm(count=4, drained=("gpu003",), reboot_polls=1)
    slurm.drain("gpu001", "gpugate: rma xid_repeat:gpu2=xid 31 in 3 jobs (want < 3 jobs within 24h)")
    sweeper, journal, _ = make(tmp_path, slurm, converge=converge_failing_on("gpu003"))
    sweeper.options = replace(sweeper.options, budget_share=0.25)
    report = sweeper.run()
    assert report.outcomes["gpu003"].result == "deferred"
    assert "drain budget of partition gpu: 1 of 1 node(s) already in rma" in report.outcomes["gpu003"].detail
    reason = slurm.states["gpu003"].reason
    assert reason.startswith("gpugate: drift sweep=rma deferred (want room in budget and floor); "
                             "driver=550.54.15 (want 580.65.06)"), reason
    assert budget.counted(slurm.states["gpu003"], TAG) and slurm.states["gpu003"].drain
    assert journal.nodes()["gpu003"].step == "deferred" and journal.nodes()["gpu003"].finished
    # `gpugate status` shows it, and what holds the budget.
    from gpugate.fleet.status import render_text, summarize

    text = render_text(summarize(take(slurm.states, TAG, 10 * DAY), journal.nodes(), 10 * DAY, states=slurm.states,
                                 budget=budget.usage(slurm.states, TAG, 0.25)))
    assert "deferred done (attempt 2): escalation deferred: drain budget of partition gpu" in text, text
    # `gpugate metrics`: the deferred node, and the two holding the budget of one.
    from gpugate.fleet.metrics import fleet_families
    from gpugate.core.promtext import render

    text = render(fleet_families(take(slurm.states, TAG, 10 * DAY), journal.nodes(), None, None,
                                 budget.usage(slurm.states, TAG, 0.25)))
    assert 'gpugate_sweep_nodes{result="deferred"} 1' in text
    assert 'gpugate_drain_budget_used_nodes{partition="gpu"} 2' in text
    # The next sweep does not converge it again: it waits, and says why.
    again = plan(take(slurm.states, TAG, 10 * DAY), replace(sweeper.options, history=journal.history()))
    assert not again.decisions["gpu003"].included
    assert again.decisions["gpu003"].why.startswith("escalation deferred: drain budget of partition gpu")
    journal.close()
    slurm.resume("gpu001")  # the admin replaced its GPU
    sweeper, journal, _ = make(tmp_path, slurm)
    sweeper.options = replace(sweeper.options, budget_share=0.25)
    report = sweeper.run()
    assert report.outcomes["gpu003"].result == "escalated"
    assert slurm.states["gpu003"].reason.startswith(
        "gpugate: rma budgeted=drift driver (want counted); driver=550.54.15 (want 580.65.06)")
    assert not any(e[2] == "converge" for e in journal.events("gpu003") if e[0] == journal.run_id)


def test_an_acute_finding_escalates_at_once_with_the_budget_spent_and_the_floor_reached(tmp_path):
    slurm = FakeSlurm(count=4, drained=("gpu002",), reason=ROW_REMAP)
    slurm.drain("gpu001", "gpugate: rma xid_repeat:gpu2=xid 31 in 3 jobs (want < 3 jobs within 24h)")
    slurm.drain("gpu003", "rack maintenance")
    sweeper, journal, _ = make(tmp_path, slurm, floor=0.75)
    sweeper.options = replace(sweeper.options, budget_share=0.25)
    report = sweeper.run()
    assert report.outcomes["gpu002"].result == "escalated"
    assert slurm.states["gpu002"].reason.startswith("gpugate: rma row_remap:gpu1=failure")
    assert not budget.counted(slurm.states["gpu002"], TAG)


def test_a_budgeted_escalation_below_the_floor_is_deferred_by_the_plan_and_recorded(tmp_path):
    """The budget off (max_share 1): the floor still holds.  4 nodes,
    floor 3, one out for an admin: a budgeted rma (a product a nodeset
    names: no automatic remedy) would leave 2 that can come back.  The plan
    defers it, and --apply records it (reason, journal), once."""
    slurm = FakeSlurm(count=4, drained=("gpu002",), reason=PRODUCT)
    slurm.drain("gpu003", "rack maintenance")
    sweeper, journal, _ = make(tmp_path, slurm, floor=3.0)
    snap = take(slurm.states, TAG, 10 * DAY)
    decided = plan(snap, sweeper.options)
    assert (decided.decisions["gpu002"].remedy, decided.decisions["gpu002"].included) == (ESCALATE, False)
    from gpugate.cli.sweep_render import plan_text

    assert "gpu002     deferred  escalation deferred: partition gpu at its floor: 3 of 4" in plan_text(
        decided, sweeper.settings, snap)
    assert decided.decisions["gpu002"].why.startswith("escalation deferred: partition gpu at its floor")
    assert not decided.batches
    report = sweeper.run()
    assert report.outcomes["gpu002"].result == "deferred"
    assert esc.deferred(reasons.parse(slurm.states["gpu002"].reason, TAG))
    assert journal.nodes()["gpu002"].detail.startswith("escalation deferred: partition gpu at its floor")
    reason = slurm.states["gpu002"].reason
    journal.close()
    sweeper, journal, _ = make(tmp_path, slurm, floor=3.0)
    assert sweeper.run().outcomes == {} and slurm.states["gpu002"].reason == reason  # not written again
    slurm.resume("gpu003")  # maintenance done: room above the floor
    journal.close()
    sweeper, journal, _ = make(tmp_path, slurm, floor=3.0)
    assert sweeper.run().outcomes["gpu002"].result == "escalated"
    assert slurm.states["gpu002"].reason.startswith("gpugate: rma budgeted=health product (want counted); "
                                                    "product:gpu0=NVIDIA A100")


# ------------------------------------------------------------------------
# The property: sequences of keeper and sweep runs on the pure functions.
# ------------------------------------------------------------------------

BUDGETED = [
    XID_REPEAT,
    DRIFT,
    reasons.render(TAG, "health", [Finding("health", "gpu_count", "7", "8", "")]),
    reasons.render(TAG, "broken", [Finding("broken", "fabricmanager", "inactive", "active", "")]),
    PRODUCT,  # no automatic remedy: the plan escalates it
]
ACUTE = [ROW_REMAP, reasons.render(TAG, "health", [Finding("health", "xid", "79", "none", "", gpu=3)])]
SMOKE = Finding("rma", "smoke", "all_reduce busbw=23.4GB/s", ">= 350", "rma")
XID79 = Finding("health", "xid", "79", "none", "", gpu=3)


class Model:
    """A fleet as Slurm holds it, moved by the keeper's decision and the
    sweep's plan; a repair's outcome and what verification finds are drawn."""

    def __init__(self, count, second, share, floor):
        self.t = 1000
        self.share, self.floor = share, floor
        self.states = {}
        for i in range(count):
            parts = ("a", "b") if i < second else ("a",)
            name = "n%02d" % i
            self.states[name] = NodeState(name, "IDLE", frozenset(), "", None, "", parts, "")
        self.history = {}

    def set(self, name, drain, reason="", comment=None):
        s = self.states[name]
        self.t += 1
        self.states[name] = replace(s, flags=frozenset({"DRAIN"}) if drain else frozenset(), reason=reason,
                                    reason_time=self.t if reason else None,
                                    comment=s.comment if comment is None else comment)

    def options(self):
        return Options(floor=self.floor, budget_share=self.share, history=self.history, repeat_limit=2,
                       repeat_window=30 * DAY)

    def snap(self):
        return take(self.states, TAG, float(self.t))

    def keeper(self):
        for name, reason in budget.plan(self.states, TAG, self.share).drain:
            self.set(name, True, reason)

    def escalate(self, found):
        """What engine._escalate does with nodes and their findings (name -> found)."""
        items = []
        for name, seen in found.items():
            ours = reasons.parse(self.states[name].reason, TAG)
            items.append((name, ours, seen or esc.cause(ours) or list(ours.findings), self.states[name].partitions))
        decided, before = esc.decide(self.gate, items), self.budgeted_rma()
        for name, ours, seen, _ in items:
            mark, held = decided[name]
            acute = any(f.acute for f in seen) and not esc.deferred(ours)
            assert not acute or (mark is None and held is None), "an acute finding escalates at once"
            event("rma, acute" if acute else "rma deferred" if held is not None else "rma of budgeted cause")
            if held is not None:
                self.set(name, True, esc.deferred_reason(TAG, ours.cls, seen))
                continue
            findings = ([mark] if mark else []) + [replace(f, cls="rma") for f in seen]
            self.set(name, True, reasons.render(TAG, "rma", findings))
        self.check(before)

    def check(self, before):
        """Where these escalations added an rma of budgeted cause: within the
        budget, and the floor still able to return to service."""
        after, snap = self.budgeted_rma(), self.snap()
        for part, size in self.members().items():
            if after.get(part, 0) > before.get(part, 0):
                if self.share < 1:
                    assert after[part] <= budget.allowance(size, self.share)
                out = sum(1 for v in snap.nodes.values() if part in v.partitions and (
                    v.out_for_others or (v.ours is not None and v.ours.cls == "rma")))
                assert size - out >= floor_count(size, self.floor)

    def gate(self):
        snap, o = self.snap(), self.options()
        return esc.Gate(snap.nodes.values(), o.budget_share,
                        {p: floor_count(len(m), o.floor) for p, m in snap.partition_members().items()})

    def sweep(self, draw, found_from):
        handled = frozenset()
        while True:
            decided = plan(self.snap(), replace(self.options(), exclude=handled))
            if not decided.batches:
                return
            batch = decided.batches[0]
            handled |= frozenset(batch.nodes)
            if batch.remedy == ESCALATE:
                self.escalate({name: [] for name in batch.nodes})
                continue
            for name in batch.nodes:
                ours = reasons.parse(self.states[name].reason, TAG)
                if draw(st.booleans()):  # repaired, verified, resumed; its published part cleared
                    comps = hist.components(ours)
                    self.history[name] = self.history.get(name, ()) + (hist.Event(name, hist.RESUMED, self.t, comps),)
                    self.set(name, False, "", comment="")
                else:  # every rung failed: what the last verification found
                    self.escalate({name: draw(st.sampled_from(found_from(ours)))})

    def budgeted_rma(self):
        out = {}
        for s in self.states.values():
            ours = reasons.parse(s.reason, TAG) if s.drain else None
            if ours is not None and ours.cls == "rma" and budget.rma_budgeted(ours):
                for p in s.partitions:
                    out[p] = out.get(p, 0) + 1
        return out

    def members(self):
        out = {}
        for s in self.states.values():
            for p in s.partitions:
                out[p] = out.get(p, 0) + 1
        return out


@settings(max_examples=150, deadline=None)
@given(st.integers(2, 10), st.integers(0, 10), st.floats(0.05, 0.6), st.floats(0, 0.95), st.data())
def test_no_sequence_of_budgeted_findings_takes_a_partition_below_its_floor(count, second, share, floor, data):
    """Only budgeted findings (what a job user or a wrong file can cause),
    published anywhere at any time, keeper and sweep runs in any order,
    any repair outcome: in every partition, the nodes in service never fall
    below the floor, nor the nodes out (drained, deferred, rma) above the
    budget (a sane configuration: the budget fits above the floor)."""
    model = Model(count, min(second, count), share, floor)
    members = model.members()
    assume(all(budget.allowance(m, share) <= m - floor_count(m, floor) for m in members.values()))

    def found_from(ours):  # budgeted only: the finding again, a failed smoke job, nothing
        return [[f for f in ours.findings if f.component != "sweep"], [SMOKE], []]
    for _ in range(data.draw(st.integers(1, 25))):
        step = data.draw(st.sampled_from(["publish", "publish", "keeper", "sweep"]))
        if step == "publish":
            name = data.draw(st.sampled_from(sorted(model.states)))
            if not model.states[name].drain:
                model.set(name, False, "", comment=pending.publish("", data.draw(st.sampled_from(BUDGETED)), model.t))
        elif step == "keeper":
            model.keeper()
        else:
            model.sweep(data.draw, found_from)
        for part, size in members.items():
            in_service = sum(1 for s in model.states.values() if part in s.partitions and not s.drain)
            assert in_service >= floor_count(size, floor), (part, {n: s.reason for n, s in model.states.items()})
            assert size - in_service <= budget.allowance(size, share)


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 10), st.integers(0, 10), st.floats(0.05, 1.0), st.floats(0, 0.95), st.data())
def test_a_budgeted_rma_never_goes_past_the_budget_or_the_floor_and_an_acute_one_always_goes(
        count, second, share, floor, data):
    """Any configuration (the budget off included), admins' drains, acute
    findings beside the budgeted ones: escalations that add an rma of
    budgeted cause to a partition leave it within its budget and with the
    floor able to return to service; an escalation for an acute finding is
    never deferred."""
    model = Model(count, min(second, count), share, floor)

    def found_from(ours):
        return [[f for f in ours.findings if f.component != "sweep"], [SMOKE], [], [XID79]]
    for _ in range(data.draw(st.integers(1, 40))):
        step = data.draw(st.sampled_from(["publish", "publish", "keeper", "sweep", "acute", "admin", "fixed"]))
        name = data.draw(st.sampled_from(sorted(model.states)))
        state = model.states[name]
        if step == "publish" and not state.drain:
            model.set(name, False, "", comment=pending.publish("", data.draw(st.sampled_from(BUDGETED)), model.t))
        elif step == "acute" and not state.drain:
            model.set(name, True, data.draw(st.sampled_from(ACUTE)))
        elif step == "admin" and not state.drain:
            model.set(name, True, "rack maintenance")
        elif step == "fixed" and state.drain:  # an admin resumes a node (an rma repaired, maintenance done)
            model.set(name, False, "", comment="")
        elif step == "keeper":
            model.keeper()
        elif step == "sweep":
            model.sweep(data.draw, found_from)  # Model.escalate checks each escalation


_TEXT = st.text(st.characters(min_codepoint=0, max_codepoint=0x2FF), max_size=90)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["health", "broken", "drift", "probe", "rollout", "rma"]),
       st.lists(st.builds(Finding, st.sampled_from(["health", "drift", "probe", "rma"]),
                          st.sampled_from(["xid", "dcgm_diag", "smoke", "driver", "sweep", "budgeted", "x y;z"]),
                          _TEXT, _TEXT, st.just(""), st.one_of(st.none(), st.integers(-2, 2000))), max_size=12))
def test_a_deferred_reason_is_ours_one_line_budgeted_and_asked_again(cls, found):
    """Any findings, any class: the deferred reason is one ASCII line of at
    most 255 bytes, gpugate's, read back as deferred (the sweep asks again),
    counted by the budget, never acute, never sweep-owned by anyone else."""
    text = esc.deferred_reason(TAG, cls, found)
    assert len(text.encode()) <= 255 and text.isascii() and "\n" not in text
    ours = reasons.parse(text, TAG)
    assert ours is not None and esc.deferred(ours) and not reasons.acute(ours)
    assert budget.counted(NodeState("n", "IDLE", frozenset({"DRAIN"}), text, 1, "root", ("p",)), TAG)
    shown = [f for f in ours.findings if f.component != "sweep"]
    assert len(shown) + ours.more == len([f for f in found if f.component not in ("sweep", "budgeted")])


def test_the_sweep_reads_the_budget_share_from_gpugate_toml():
    """`gpugate sweep` gates escalations with [drain_budget] max_share (1,
    the budget off, leaves the floor alone)."""
    import types

    from gpugate.model.config import parse_settings
    from gpugate.sweep import run as sweep_run

    baseline = types.SimpleNamespace(health=types.SimpleNamespace(xid_actions={}))
    for share in (0.25, 1.0):
        settings = parse_settings({"drain_budget": {"max_share": share}}, "gpugate.toml")
        assert sweep_run.options(settings, baseline).budget_share == share
