"""No new way for a job's user to take capacity (docs/explanation/reliability.md, "Can a
job's user cause it?"): what a user can cause is never acute, its drains
are bounded (the drain budget; a preflight's pins besides by
``[preflight] pins_per_hour``), and it is never a step towards rma on its
own (the sweep's repeat-offender rule counts only what stands beside it).
Pure functions here; the prolog's part through real Slurm as uid 65534:
tests/test_slurm_preflight_user.py."""

import os

from hypothesis import example, given, settings, strategies as st

from gpugate.budget import rules as budget
from gpugate.budget import pins as budget_pins
from gpugate.model import reason as reasons
from gpugate.model.facts import ProbeFailure
from gpugate.model.findings import ACUTE, HEALTH, INVESTIGATE, USER_CAUSED, Finding, is_acute
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


def _alone(env):
    from gpugate.preflight.select import exclusive

    return exclusive(env)


def test_a_node_the_job_has_alone_with_room_is_fit():
    assert judge(_alone({"SLURM_JOB_OVERSUBSCRIBE": "NO"}), {4242}, "4242", _free()) == ""  # 23.02-25.11 --exclusive
    assert judge(_alone({"SLURM_JOB_EXCLUSIVE": "NODE", "SLURM_JOB_OVERSUBSCRIBE": "NO"}), {4242}, "4242",
                 _free()) == ""  # 26.05 --exclusive
    assert judge(_alone({}), set(), "4242", _free()) == ""  # 22.05: slurmd says nothing; the process table does


def test_a_full_dev_shm_or_tmp_is_the_environment_not_the_node():
    alone = _alone({"SLURM_JOB_OVERSUBSCRIBE": "NO"})
    assert judge(alone, {4242}, "4242", _free(shm=12)) == \
        "/dev/shm has 12 MiB free (want 1024: [preflight] shm_free_mb)"
    assert judge(alone, set(), "4242", _free(tmp=0)) == "/tmp has 0 MiB free (want 256: [preflight] tmp_free_mb)"
    unread = ProbeFailure("environment", "error", "/tmp: Permission denied")
    assert judge(alone, set(), "4242", [("/tmp", unread, 256)]).startswith("/tmp cannot be read: ")


def test_another_job_on_the_node_or_a_shared_allocation_is_unfit():
    """The user's own CPU-only job beside the preflight (``--exclusive=user``
    lets it in): Slurm's own view, not GPU counts, in each release's words."""
    for env, said in (({"SLURM_JOB_OVERSUBSCRIBE": "USER"}, "SLURM_JOB_OVERSUBSCRIBE=USER"),
                      ({"SLURM_JOB_OVERSUBSCRIBE": "OK"}, "SLURM_JOB_OVERSUBSCRIBE=OK"),
                      # 26.05: OVERSUBSCRIBE=NO for any job that shares no CPUs; EXCLUSIVE says who has the node.
                      ({"SLURM_JOB_EXCLUSIVE": "NO", "SLURM_JOB_OVERSUBSCRIBE": "NO"}, "SLURM_JOB_EXCLUSIVE=NO"),
                      ({"SLURM_JOB_EXCLUSIVE": "USER", "SLURM_JOB_OVERSUBSCRIBE": "NO"}, "SLURM_JOB_EXCLUSIVE=USER")):
        assert judge(_alone(env), {4242}, "4242", _free()) == (
            "the node is not the job's alone (%s; submit with --exclusive)" % said), env
    assert judge(_alone({}), {4242, 4300}, "4242", _free()) == "job 4300 runs on the node too"
    assert judge(_alone({"SLURM_JOB_OVERSUBSCRIBE": "NO"}), {1, 2, 4242}, "4242", _free()) == \
        "jobs 1,2 run on the node too"
    broken = ProbeFailure("processes", "error", "/proc: gone")
    assert judge(_alone({"SLURM_JOB_OVERSUBSCRIBE": "NO"}), broken, "4242", _free()).startswith(
        "the jobs on the node cannot be told")


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
    held = budget_pins.pins_held(states, TAG, 1600.0, 2)
    assert set(held) == {"a", "c"}
    assert held["a"].startswith("preflight allowance of partition gpu spent: 2 nodes drained for a preflight pin")
    # An hour later d no longer counts; 0 an hour holds every pin.
    assert set(budget_pins.pins_held(states, TAG, 1000.0 + 3601, 2)) == {"a"}
    assert set(budget_pins.pins_held(states, TAG, 1600.0, 0)) == {"a", "b", "c"}


def test_a_pin_beside_a_drift_or_another_partition_s_pin_is_not_held_for_it():
    """p1's hour is spent (old); a pin in p2 is not held for it, and a pin
    beside a finding a user cannot cause drains on that one's account."""
    mixed = reasons.render(TAG, HEALTH, [
        Finding(HEALTH, "preflight_across", "busbw=17.3GB/s pairs=gpu01,gpu02", ">= 50", INVESTIGATE),
        Finding(HEALTH, "gpu_count", "7", "8", INVESTIGATE)])
    assert budget_pins.pin_only(PIN, TAG) and not budget_pins.pin_only(mixed, TAG)
    states = {s.name: s for s in (_node("old", ("p1",), reason=PIN, when=1000),
                                  _published("mixed", mixed, 10, ("p1",)), _published("pin", PIN, 11, ("p1",)),
                                  _published("other", PIN, 10, ("p2",)), _published("drift", DRIFT, 5, ("p1",)))}
    held = budget_pins.pins_held(states, TAG, 1500.0, 1)
    assert set(held) == {"pin"} and held["pin"].startswith("preflight allowance of partition p1 spent: 1 node")


def test_a_pin_the_sweep_took_or_an_admin_resumed_still_counts_for_the_hour():
    """The sweep rewrites a pinned node's reason and a RESUME clears it:
    the keeper's own record counts the pin for the hour all the same."""
    states = {s.name: s for s in (_node("a"), _published("b", PIN, 10))}
    record = [{"node": "a", "at": 1000.0, "partitions": ["gpu"]}]
    assert set(budget_pins.pins_held(states, TAG, 1500.0, 1, drained_pins=record)) == {"b"}
    assert budget_pins.pins_held(states, TAG, 1000.0 + 3601, 1, drained_pins=record) == {}
    # A record that cannot be read holds every pin, and says why.
    assert budget_pins.pins_held(states, TAG, 1500.0, 5, drained_pins=None)["b"].startswith(
        "the keeper's record of the pins it drained")


def test_the_keeper_s_record_of_pins_is_read_written_and_refused_when_garbled(tmp_path):
    from gpugate.budget import keeper_pins

    status = str(tmp_path / "budget-keeper.json")
    assert keeper_pins.load(status) == []
    entries = keeper_pins.noted([], ["a", "b"], {"a": PIN, "b": DRIFT}, {"a": ("gpu",), "b": ("gpu",)}, TAG, 5000.0)
    assert entries == [{"node": "a", "at": 5000.0, "partitions": ["gpu"]}]  # only the pin
    keeper_pins.save(status, entries)
    assert keeper_pins.load(status) == entries
    assert keeper_pins.noted(entries, [], {}, {}, TAG, 5000.0 + 3601) == []  # past the hour: dropped
    (tmp_path / keeper_pins.FILE).write_text('{"pins": [{"node": 1}]}')
    assert keeper_pins.load(status) is None


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
@example(4, 0.1, 1, [("publish", 1, 0), ("publish", 0, 0), ("keeper", 0, 0), ("resume", 1, 0), ("keeper", 0, 0)])
@example(4, 0.5, 1, [("publish", 1, 0), ("publish", 0, 0), ("keeper", 0, 0), ("sweep", 1, 0), ("keeper", 0, 0)])
@given(st.integers(4, 12), st.sampled_from([0.1, 0.25, 0.5]), st.integers(0, 3),
       st.lists(st.tuples(st.sampled_from(["publish", "keeper", "sweep", "resume", "wait"]), st.integers(0, 11),
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
            record = [{"node": n, "at": t, "partitions": ["gpu"]} for n, t in pin_drains]
            waiting = budget_pins.pins_held(states, TAG, now, per_hour, drained_pins=record)
            plan = budget.plan({n: (s if n not in waiting else _node(n, s.partitions)) for n, s in states.items()},
                               TAG, share)
            for drained, why in plan.drain:
                states[drained] = _node(drained, reason=why, when=int(now))
                if "preflight_across" in why:
                    pin_drains.append((drained, now))
        elif action == "sweep" and state.drain:  # the sweep takes it: its work reason replaces the pin
            states[name] = _node(name, reason="gpugate: health sweep=reboot (want verified)", when=int(now))
        elif action == "resume" and state.drain:
            comps = hist.components(reasons.parse(state.reason, TAG))
            history[name].append(hist.Event(name, hist.RESUMED, now, comps))
            states[name] = _node(name)
        now += 400.0
        drained = [s for s in states.values() if s.drain]
        assert len(drained) <= allowance
        assert all(sum(1 for _, t in pin_drains if at - budget_pins.PIN_WINDOW < t <= at) <= per_hour
                   for _, at in pin_drains)
        for n in names:
            current = hist.components(reasons.parse(states[n].reason, TAG)) if states[n].drain else frozenset()
            assert hist.repeat_of(current, history[n], now, 1, 7 * 86400) is None
            assert not hist.ladder_spent(current, history[n], now, 7 * 86400)


def test_a_user_caused_finding_is_never_acute_through_the_verdict():
    from gpugate.model.verdict import decide

    for reason in USER_REASONS:
        parsed = reasons.parse(reason, TAG)
        assert not reasons.acute(parsed), reason
    verdict = decide([Finding(HEALTH, "preflight_across", "busbw=17GB/s pairs=a,b", ">= 50", INVESTIGATE)], TAG)
    assert budget.applies(verdict)


def test_a_proof_across_nodes_with_the_budget_off_is_refused():
    """Its pins are budgeted: with max_share = 1 they would drain themselves without bound."""
    import pytest

    from gpugate.model.config import parse_settings
    from gpugate.errors import ConfigError

    multi = {"allreduce_multi": ["/opt/gpugate/allreduce-rank", "{rank}"]}
    with pytest.raises(ConfigError, match="needs the drain budget on"):
        parse_settings({"preflight": multi, "drain_budget": {"max_share": 1.0}}, "(test)")
    parse_settings({"preflight": multi, "drain_budget": {"max_share": 0.5}}, "(test)")
    parse_settings({"preflight": {"partitions": ["gpu"]}, "drain_budget": {"max_share": 1.0}}, "(test)")


def test_a_slurmstepd_whose_job_cannot_be_told_leaves_the_node_unknown(tmp_path):
    """The environment check reads Slurm's own view (root's slurmstepds in
    the process table); one whose cgroup cannot be read is unknown, never
    "no other job here"."""
    from gpugate.probes.owners import running_jobs

    proc = tmp_path / "proc"
    uid = os.getuid()
    for pid, cgroup in ((3000, "0::/system.slice/slurmstepd.scope/job_4242/step_extern/slurm\n"), (3001, None)):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "comm").write_text("slurmstepd\n")
        (proc / str(pid) / "cmdline").write_text("slurmstepd: [%d.extern]\x00" % (4242 if cgroup else 4300))
        (proc / str(pid) / "status").write_text("Name:\tslurmstepd\nPPid:\t1\nUid:\t%d\t%d\t%d\t%d\n" % ((uid,) * 4))
        if cgroup:
            (proc / str(pid) / "cgroup").write_text(cgroup)
        else:
            (proc / str(pid) / "cgroup").mkdir()  # unreadable as a file: EISDIR
    found = running_jobs(str(proc))
    assert isinstance(found, ProbeFailure), found
    assert judge((True, "SLURM_JOB_OVERSUBSCRIBE=NO"), found, "4242", _free()).startswith(
        "the jobs on the node cannot be told")
    (proc / "3001" / "cgroup").rmdir()
    (proc / "3001" / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_4300/step_0/slurm\n")
    assert running_jobs(str(proc)) == {4242, 4300}
