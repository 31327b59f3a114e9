"""No new way for a job's user to take capacity (docs/reliability.md, "Can a
job's user cause it?"): what a user can cause is never acute, its drains
are bounded (the drain budget; a preflight's pins besides by
``[preflight] pins_per_hour``), and it is never a step towards rma on its
own (the sweep's repeat-offender rule counts only what stands beside it).
Pure functions here; the prolog's part through real Slurm as uid 65534:
tests/test_slurm_preflight_user.py."""

from hypothesis import given, settings, strategies as st

from gpugate import budget
from gpugate import reason as reasons
from gpugate.facts import ProbeFailure
from gpugate.findings import ACUTE, HEALTH, INVESTIGATE, USER_CAUSED, Finding, is_acute
from gpugate.preflight.environment import judge
from gpugate.slurm import pending
from gpugate.slurm.nodestate import NodeState
from gpugate.sweep import history as hist

TAG = "gpugate:"
MIB = 1 << 20
PIN = "gpugate: health preflight_across=busbw=17.3GB/s pairs=gpu01,gpu02 (want >= 50)"
APP = "gpugate: health xid_repeat=gpu2:13x3 (want < 3 jobs)"
DRIFT = "gpugate: drift driver=550.54.15 (want 550.90.07)"


def test_nothing_a_job_s_user_can_cause_is_acute():
    for component in USER_CAUSED:
        for cls in ACUTE:
            assert not is_acute(cls, component), (cls, component)


# ---------------------------------------------------------------- environment

def _free(shm=4096, tmp=4096):
    return [("/dev/shm", shm * MIB, 1024), ("/tmp", tmp * MIB, 256)]


def test_a_node_the_job_has_alone_with_room_is_fit():
    assert judge("NO", {4242}, "4242", _free()) == ""
    assert judge(None, set(), "4242", _free()) == ""  # 22.05: slurmd sets no SLURM_JOB_OVERSUBSCRIBE


def test_a_full_dev_shm_or_tmp_is_the_environment_not_the_node():
    assert judge("NO", {4242}, "4242", _free(shm=12)) == \
        "/dev/shm has 12 MiB free (want 1024: [preflight] shm_free_mb)"
    assert judge("NO", set(), "4242", _free(tmp=0)) == "/tmp has 0 MiB free (want 256: [preflight] tmp_free_mb)"
    unread = ProbeFailure("environment", "error", "/tmp: Permission denied")
    assert judge("NO", set(), "4242", [("/tmp", unread, 256)]).startswith("/tmp cannot be read: ")


def test_another_job_on_the_node_or_a_shared_allocation_is_unfit():
    """The user's own CPU-only job beside the preflight (``--exclusive=user``
    lets it in): Slurm's own view, not GPU counts."""
    assert judge("USER", {4242}, "4242", _free()).startswith("the node is not the job's alone "
                                                            "(SLURM_JOB_OVERSUBSCRIBE=USER")
    assert judge("OK", {4242}, "4242", _free()).startswith("the node is not the job's alone")
    assert judge(None, {4242, 4300}, "4242", _free()) == "job 4300 runs on the node too"
    assert judge("NO", {1, 2, 4242}, "4242", _free()) == "jobs 1,2 run on the node too"
    broken = ProbeFailure("processes", "error", "/proc: gone")
    assert judge("NO", broken, "4242", _free()).startswith("the jobs on the node cannot be told")


# ---------------------------------------------------------------- the keeper's preflight allowance

def _node(name, parts=("gpu",), reason="", when=None, comment=""):
    flags = frozenset({"DRAIN"}) if reason else frozenset()
    return NodeState(name, "IDLE", flags, reason, when, "root" if reason else "", tuple(sorted(parts)), comment)


def _published(name, reason, since, parts=("gpu",)):
    return _node(name, parts, comment=pending.publish("", reason, since))


def test_pins_beyond_the_hour_s_allowance_wait_oldest_first():
    states = {s.name: s for s in (_published("a", PIN, 30), _published("b", PIN, 10), _published("c", PIN, 20),
                                  _node("d", reason=PIN, when=1000))}
    # d was drained for a pin 600 s ago: with 2 an hour, one more (the oldest published: b).
    held = budget.pins_held(states, TAG, 1600.0, 2)
    assert set(held) == {"a", "c"}
    assert held["a"].startswith("preflight allowance of partition gpu spent: 2 nodes drained for a preflight pin")
    # An hour later d no longer counts; 0 an hour holds every pin.
    assert set(budget.pins_held(states, TAG, 1000.0 + 3601, 2)) == {"a"}
    assert set(budget.pins_held(states, TAG, 1600.0, 0)) == {"a", "b", "c"}


def test_a_pin_beside_a_drift_or_another_partition_s_pin_is_not_held_for_it():
    states = {s.name: s for s in (_node("old", ("p1",), reason=PIN, when=1000),
                                  _published("mixed", PIN.replace(" (want", " (want") + "; " + "driver=1 (want 2)",
                                             10, ("p1",)),
                                  _published("other", PIN, 10, ("p2",)), _published("drift", DRIFT, 5, ("p1",)))}
    held = budget.pins_held(states, TAG, 1500.0, 1)
    assert "other" not in held and "drift" not in held


# ---------------------------------------------------------------- never a step towards rma on its own

def test_returns_to_service_for_a_pin_or_an_application_s_xids_make_no_repeat_offender():
    events = [hist.Event("gpu03", hist.RESUMED, t, hist.components(reasons.parse(r, TAG)))
              for t, r in ((100, PIN), (200, PIN), (300, APP), (400, PIN))]
    assert all(e.components == frozenset() for e in events)
    assert hist.repeat_of(hist.components(reasons.parse(PIN, TAG)), events, 500, 3, 7 * 86400) is None
    assert not hist.ladder_spent({"preflight_across"}, events, 500, 7 * 86400)
    # Hardware evidence beside the pin counts as before.
    ecc = "gpugate: health ecc=gpu1:3 uncorrected (want <= 0); preflight_across=busbw=17GB/s pairs=a,b (want >= 50)"
    assert hist.components(reasons.parse(ecc, TAG)) == frozenset({"ecc"})


# ---------------------------------------------------------------- the property

USER_REASONS = (PIN, APP, "gpugate: health preflight_busbw=22.9GB/s (want >= 350)",
                "gpugate: health clocks=gpu0:hw_slowdown 40% (want <= 10%)")


@settings(max_examples=150, deadline=None)
@given(st.integers(4, 12), st.sampled_from([0.1, 0.25, 0.5]), st.integers(0, 3),
       st.lists(st.tuples(st.sampled_from(["publish", "keeper", "resume", "wait"]), st.integers(0, 11),
                          st.integers(0, len(USER_REASONS) - 1)), max_size=60))
def test_no_sequence_of_user_caused_findings_drains_past_the_budget_or_reaches_rma(size, share, per_hour, steps):
    """A job's user publishes what they can cause on any node (a pin, their
    Xids, a slowed run), again and again; the keeper runs; the sweep
    returns nodes.  At every step: no partition holds more drained than its
    budget allows, no more pins drained in any hour than the allowance, and
    no node is ever a repeat offender (rma)."""
    names = ["n%02d" % i for i in range(size)]
    states = {n: _node(n) for n in names}
    history = {n: [] for n in names}
    now, since, pin_drains = 10_000.0, 1, []
    allowance = budget.allowance(size, share)
    for action, index, which in steps:
        name = names[index % size]
        state = states[name]
        if action == "publish" and not state.drain:
            since += 1
            states[name] = _node(name, comment=pending.publish("", USER_REASONS[which], since))
        elif action == "keeper":
            waiting = budget.pins_held(states, TAG, now, per_hour)
            plan = budget.plan({n: (s if n not in waiting else _node(n, s.partitions)) for n, s in states.items()},
                               TAG, share)
            for drained, why in plan.drain:
                states[drained] = _node(drained, reason=why, when=int(now))
                if "preflight_across" in why:
                    pin_drains.append(now)
        elif action == "resume" and state.drain:
            comps = hist.components(reasons.parse(state.reason, TAG))
            history[name].append(hist.Event(name, hist.RESUMED, now, comps))
            states[name] = _node(name)
        now += 400.0
        drained = [s for s in states.values() if s.drain]
        assert len(drained) <= allowance
        assert all(sum(1 for t in pin_drains if t > at - budget.PIN_WINDOW and t <= at) <= per_hour
                   for at in pin_drains)
        for n in names:
            current = hist.components(reasons.parse(states[n].reason, TAG)) if states[n].drain else frozenset()
            assert hist.repeat_of(current, history[n], now, 1, 7 * 86400) is None
            assert not hist.ladder_spent(current, history[n], now, 7 * 86400)


def test_a_user_caused_finding_is_never_acute_through_the_verdict():
    from gpugate.verdict import decide

    for reason in USER_REASONS:
        parsed = reasons.parse(reason, TAG)
        assert not reasons.acute(parsed), reason
    verdict = decide([Finding(HEALTH, "preflight_across", "busbw=17GB/s pairs=a,b", ">= 50", INVESTIGATE)], TAG)
    assert budget.applies(verdict)
