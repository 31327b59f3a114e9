"""The sweep engine against a stand-in Slurm (no cluster): what it reads
while it waits, a converge that fails for one host, repeat offenders."""

import os
import sys
import types

import pytest

from gpugate.model import reason as reasons
from gpugate.model.config import _SWEEP
from gpugate.model.findings import Finding
from gpugate.slurm.nodestate import NodeState
from gpugate.sweep import history as hist
from gpugate.sweep import journal as jr
from gpugate.sweep import run as sweep_run
from gpugate.sweep.engine import Sweeper
from gpugate.sweep.plan import Options

TAG = "gpugate:"
DRIFT = reasons.render(TAG, "drift", [Finding("drift", "driver", "550.54.15", "580.65.06", "")])
XID = reasons.render(TAG, "health", [Finding("health", "xid", "79", "none", "", gpu=2)])
BASELINE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpugate", "data",
                        "demo-baseline.toml")
DAY = 86400.0


class FakeSlurm:
    """Slurm as the sweep sees it: a reboot takes `reboot_polls` reads of
    the node to complete; every nodes() call is logged with what it named."""

    def __init__(self, count=100, drained=(), reason=DRIFT, reboot_polls=3):
        self.states = {}
        for i in range(1, count + 1):
            name = "gpu%03d" % i
            self.states[name] = self._state(name, "IDLE", {"DRAIN"} if name in drained else set(),
                                            reason if name in drained else "")
        self.reads, self.rebooting, self.reboot_polls, self.resumed, self.res = [], {}, reboot_polls, [], {}

    @staticmethod
    def _state(name, base, flags, reason, comment=""):
        return NodeState(name=name, state=base, flags=frozenset(flags), reason=reason, reason_time=int(10 * DAY - 600),
                         reason_user="root", partitions=("gpu",), comment=comment)

    def _set(self, name, base=None, flags=None, reason=None):
        st = self.states[name]
        self.states[name] = self._state(name, base or st.state, st.flags if flags is None else flags,
                                        st.reason if reason is None else reason, st.comment)

    def set_comment(self, name, comment):
        st = self.states[name]
        self.states[name] = self._state(name, st.state, st.flags, st.reason, comment)

    def nodes(self, names=None):
        from ClusterShell.NodeSet import NodeSet

        wanted = set(NodeSet(names)) if names else None
        self.reads.append(wanted)
        for name in list(self.rebooting):
            if wanted is None or name in wanted:
                self.rebooting[name] -= 1
                if self.rebooting[name] <= 0:  # slurmd registered: 22.05 clears the drain
                    del self.rebooting[name]
                    self._set(name, "IDLE", set(), self.states[name].reason + " : reboot complete")
        return {n: s for n, s in self.states.items() if wanted is None or n in wanted}

    def own_record(self, name):
        """One node's record, the backends' single-node read (no reboot progress)."""
        return self.states.get(name)

    def _names(self, hostlist):
        from ClusterShell.NodeSet import NodeSet

        return list(NodeSet(hostlist))

    def drain(self, names, reason):
        for name in self._names(names):
            self._set(name, flags=set(self.states[name].flags) | {"DRAIN"}, reason=reason)

    def resume(self, names):
        for name in self._names(names):
            self.resumed.append(name)
            self._set(name, "IDLE", set(), "")

    def reboot(self, names, reason, next_state=None):
        for name in self._names(names):
            self.rebooting[name] = self.reboot_polls
            self._set(name, "DOWN", {"REBOOT_ISSUED"}, reason)

    def reservations(self):
        return dict(self.res)

    def reserve(self, name, names, minutes=None):
        self.res[name] = names
        self.minutes = minutes

    def unreserve(self, name):
        self.res.pop(name, None)

    def cancel_jobs(self, names):
        pass


class FitTransport:
    def __init__(self):
        self.checked = []

    def check(self, nodes, args, timeout):
        self.checked += list(nodes)
        return {n: {"node": n, "fit": True, "pending": []} for n in nodes}


def converge_failing_on(*bad):
    """A converge command that fails whenever its hostlist holds a bad node."""
    code = ("import sys; from ClusterShell.NodeSet import NodeSet; "
            "sys.exit(1 if set(NodeSet(sys.argv[1])) & set(%r) else 0)" % (list(bad),))
    return [sys.executable, "-c", code, "{nodes}"]


def make(tmp_path, slurm, clock=lambda: 10 * DAY, **sweep):
    cfg = dict(_SWEEP.check({}, "sweep"), poll_seconds=7.0, floor=0.0, converge=converge_failing_on(),
               rollback=[], journal=str(tmp_path / "state" / "sweep.db"),
               smoke=[])  # the smoke job needs a real slurmd: tests/test_slurm_smoke.py
    cfg.update(sweep)
    settings = types.SimpleNamespace(sweep=cfg, reason_tag=TAG, baseline=BASELINE)
    baseline = types.SimpleNamespace(previous=None, rollout_in_progress=False, pin={},
                                     health=types.SimpleNamespace(xid_actions={}))
    journal = jr.Journal(cfg["journal"])
    journal.start_run(["test"])
    sleeps = []
    opts = sweep_run.options(settings, baseline)
    sweeper = Sweeper(settings, baseline, slurm, FitTransport(), journal, opts, sleep=sleeps.append, clock=clock)
    return sweeper, journal, sleeps


def events(journal, node):
    return [(e[2], e[3], e[4]) for e in journal.events(node)]


def test_waits_read_only_the_nodes_in_flight_at_poll_seconds(tmp_path):
    slurm = FakeSlurm(count=100, drained=("gpu007", "gpu042"))
    sweeper, journal, sleeps = make(tmp_path, slurm)
    report = sweeper.run()
    assert {n: o.result for n, o in report.outcomes.items()} == {"gpu007": "resumed", "gpu042": "resumed"}
    whole = [r for r in slurm.reads if r is None]
    named = [r for r in slurm.reads if r is not None]
    # The fleet is read only to plan (the batch, then "nothing left"); every
    # other read names the batch's nodes and nothing else.
    assert len(whole) == 2
    assert named and all(r <= {"gpu007", "gpu042"} for r in named)
    # Every wait sleeps poll_seconds (7), never the old one-second cap.
    assert sleeps and set(sleeps) == {7.0}
    assert len(sleeps) == 3 - 1  # the reboot took three reads: two sleeps


class BusySlurm(FakeSlurm):
    """slurmctld busy while the batch reboots: each read of a node in its
    reboot goes unanswered (the rig's scontrol timing out) `silent` times;
    silent=None: never answered again once the reboot is issued."""

    def __init__(self, silent, **kwargs):
        super().__init__(**kwargs)
        self.silent, self.unanswered = silent, 0

    def nodes(self, names=None):
        from gpugate.errors import SlurmError

        if names and self.rebooting and (self.silent is None or self.unanswered < self.silent):
            self.unanswered += 1
            raise SlurmError("`scontrol show node --json %s` timed out after 10s" % names)
        return super().nodes(names)


def test_a_reboot_wait_rides_out_a_slurmctld_that_does_not_answer_for_a_while(tmp_path):
    slurm = BusySlurm(silent=4, count=8, drained=("gpu002", "gpu005"))
    said = []
    sweeper, journal, sleeps = make(tmp_path, slurm)
    sweeper.say = said.append
    report = sweeper.run()
    assert not report.stopped
    assert {n: o.result for n, o in report.outcomes.items()} == {"gpu002": "resumed", "gpu005": "resumed"}
    assert slurm.unanswered == 4 and slurm.resumed == ["gpu002", "gpu005"]
    assert len([line for line in said if "no answer (`scontrol show node" in line]) == 1  # told once


def test_a_reboot_wait_never_answered_stops_the_sweep_with_the_nodes_held_not_failed(tmp_path):
    from gpugate.errors import SlurmError

    slurm = BusySlurm(silent=None, count=8, drained=("gpu002", "gpu005"))
    sweeper, journal, sleeps = make(tmp_path, slurm, reboot_timeout=0.3)  # sleeps are not slept: real 0.3 s
    with pytest.raises(SlurmError, match="timed out"):
        sweeper.run()
    rows = journal.nodes()
    for name in ("gpu002", "gpu005"):
        # Still in the reboot wait, as the journal says: the next sweep takes it
        # up there; nothing counted it as "did not come back", nothing escalated.
        assert (rows[name].step, rows[name].status) == ("wait_up", jr.STARTED)
        assert rows[name].attempt == 1
        assert reasons.parse(slurm.states[name].reason, TAG) is not None
    assert slurm.resumed == []


def test_a_resumed_node_s_published_finding_is_cleared(tmp_path):
    """Issue 26: a node published its drift for the budget keeper, which
    drained it; the sweep verifies and resumes it.  Its published part is
    cleared at once (the admin's text kept): the keeper must not drain it
    again for the old finding before its next health check."""
    from gpugate.slurm import pending

    slurm = FakeSlurm(count=4, drained=("gpu002",))
    slurm.set_comment("gpu002", pending.publish("rack 3", DRIFT, 100))
    slurm.set_comment("gpu003", pending.publish("", DRIFT, 100))  # held, not swept: untouched
    sweeper, journal, sleeps = make(tmp_path, slurm)
    report = sweeper.run()
    assert report.outcomes["gpu002"].result == "resumed"
    assert slurm.states["gpu002"].comment == "rack 3"
    assert pending.read(slurm.states["gpu003"].comment) is not None


def test_a_converge_failing_for_one_host_fails_only_that_host(tmp_path):
    drained = ("gpu001", "gpu002", "gpu003", "gpu004")
    slurm = FakeSlurm(count=8, drained=drained, reboot_polls=1)
    sweeper, journal, _ = make(tmp_path, slurm, converge=converge_failing_on("gpu003"))
    report = sweeper.run()
    assert not report.stopped
    results = {n: (o.result, o.attempts) for n, o in report.outcomes.items()}
    assert results == {"gpu001": ("resumed", 1), "gpu002": ("resumed", 1), "gpu003": ("escalated", 2),
                       "gpu004": ("resumed", 1)}
    assert sorted(slurm.resumed) == ["gpu001", "gpu002", "gpu004"]
    # Drift is budgeted: the rma says so, and counts against the drain budget (issue 33).
    assert slurm.states["gpu003"].reason.startswith("gpugate: rma budgeted=drift driver (want counted); "
                                                    "driver=550.54.15")
    steps = events(journal, "gpu003")
    assert ("converge", "failed", 1) in steps and ("converge", "failed", 2) in steps
    assert steps[-1] == ("escalate", "done", 2)
    assert ("converge", "done", 1) in events(journal, "gpu001")
    assert not slurm.res  # the reservation went with the batch


def test_a_converge_failing_for_every_node_stops_and_escalates_none(tmp_path):
    slurm = FakeSlurm(count=8, drained=("gpu001", "gpu002", "gpu003"))
    sweeper, journal, _ = make(tmp_path, slurm, converge=converge_failing_on("gpu001", "gpu002", "gpu003"))
    report = sweeper.run()
    assert "for each node on its own" in report.stopped
    assert all(o.result == "halted" for o in report.outcomes.values())
    assert all(slurm.states[n].reason == DRIFT for n in ("gpu001", "gpu002", "gpu003"))
    assert not slurm.resumed


def test_the_circuit_breaker_still_stops_when_several_hosts_fail(tmp_path):
    slurm = FakeSlurm(count=8, drained=("gpu001", "gpu002", "gpu003", "gpu004"))
    sweeper, journal, _ = make(tmp_path, slurm, converge=converge_failing_on("gpu001", "gpu004"),
                               circuit_breaker=2)
    report = sweeper.run()
    assert report.stopped.startswith("circuit breaker: 2 node(s)")
    assert not slurm.resumed and len(report.batches) == 1
    assert all(slurm.states[n].reason.startswith("gpugate: drift") for n in ("gpu001", "gpu004"))


def test_a_sweeper_killed_during_the_per_node_retry_is_taken_up(tmp_path):
    """The journal as a kill -9 leaves it mid-way through the per-node
    retries: gpu001 converged alone, gpu002 started, gpu003 failed."""
    slurm = FakeSlurm(count=8, drained=("gpu001", "gpu002", "gpu003"), reboot_polls=1)
    sweeper, journal, _ = make(tmp_path, slurm, converge=converge_failing_on("gpu003"))
    for name in ("gpu001", "gpu002", "gpu003"):
        journal.enrol(name, "reconverge", 1, DRIFT)
        journal.record(name, "wait_drained", jr.DONE)
    journal.record("gpu001", "converge", jr.DONE, detail="converged on its own after the batch failed")
    journal.record("gpu002", "converge", jr.STARTED, detail="per node, the batch failed: x")
    journal.record("gpu003", "converge", jr.FAILED, detail="exit 1")
    report = sweeper.run()
    assert {n: o.result for n, o in report.outcomes.items()} == {
        "gpu001": "resumed", "gpu002": "resumed", "gpu003": "escalated"}
    assert sorted(slurm.resumed) == ["gpu001", "gpu002"]


def _resumes(journal, node, times, components=("driver",)):
    for at in times:
        journal.db.execute("INSERT INTO history (node, kind, at, components, run, detail) VALUES (?, ?, ?, ?, 0, '')",
                           (node, hist.RESUMED, at, ",".join(components)))


def test_a_repeat_offender_is_escalated_not_reconverged_and_forgive_hands_it_back(tmp_path):
    now = 10 * DAY
    slurm = FakeSlurm(count=8, drained=("gpu002", "gpu005"))
    sweeper, journal, _ = make(tmp_path, slurm, clock=lambda: now, converge=converge_failing_on("gpu999"))
    _resumes(journal, "gpu002", [now - 6 * DAY, now - 3 * DAY, now - DAY])  # three times in 7 days
    _resumes(journal, "gpu005", [now - 9 * DAY, now - 3 * DAY, now - DAY])  # one of them too long ago
    report = sweeper.run()
    assert report.outcomes["gpu002"].result == "escalated"
    assert "repeat offender" in report.outcomes["gpu002"].detail
    reason = slurm.states["gpu002"].reason
    assert reason.startswith("gpugate: rma budgeted=drift driver (want counted); repeat=driver 3x in 7d "
                             "(want under 3)"), reason
    assert report.outcomes["gpu005"].result == "resumed"
    assert "gpu002" not in slurm.resumed
    assert not any(step == "converge" for step, _, _ in events(journal, "gpu002"))
    kinds = [e.kind for e in journal.history()["gpu002"]]
    assert kinds[-1] == hist.ESCALATED
    assert [e.kind for e in journal.history()["gpu005"]][-2:] == [hist.REDRAINED, hist.RESUMED]
    # A later sweep leaves it alone: rma is never resumed automatically.
    again, journal2, _ = make(tmp_path, slurm, clock=lambda: now + 60)
    assert again.run().outcomes == {}
    journal2.close()
    # One command clears it, and hands the node back to the sweep with its old reason.
    lines = sweep_run.forgive(again.settings, slurm, journal, ["gpu002"])
    assert "drained again" in lines[0] and slurm.states["gpu002"].reason == DRIFT
    third, journal3, _ = make(tmp_path, slurm, clock=lambda: now + 120)
    assert third.run().outcomes["gpu002"].result == "resumed"
    journal3.close()
    journal.close()


def test_repeats_count_only_the_same_component(tmp_path):
    now = 10 * DAY
    slurm = FakeSlurm(count=4, drained=("gpu001",), reason=XID)
    sweeper, journal, _ = make(tmp_path, slurm, clock=lambda: now)
    _resumes(journal, "gpu001", [now - 3 * DAY, now - 2 * DAY, now - DAY])  # for the driver, not an Xid
    assert sweeper.run().outcomes["gpu001"].result == "resumed"
    assert [e.components for e in journal.history()["gpu001"] if e.kind == hist.RESUMED][-1] == {"xid"}
    journal.close()


def test_repeat_limit_0_switches_it_off(tmp_path):
    now = 10 * DAY
    slurm = FakeSlurm(count=4, drained=("gpu001",))
    sweeper, journal, _ = make(tmp_path, slurm, clock=lambda: now, repeat_limit=0)
    _resumes(journal, "gpu001", [now - 3 * DAY, now - 2 * DAY, now - DAY, now - 60])
    assert sweeper.run().outcomes["gpu001"].result == "resumed"
    journal.close()


def test_a_version_1_journal_is_upgraded_in_place(tmp_path):
    import sqlite3

    path = str(tmp_path / "v1.db")
    db = sqlite3.connect(path)
    db.executescript(jr.SCHEMA.split("CREATE TABLE IF NOT EXISTS history")[0])
    db.execute("INSERT INTO nodes VALUES ('gpu01', 1, 'reboot', 1, 1, 'resume', 'done', '', 0, '', 'r')")
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    journal = jr.Journal(path)
    assert set(journal.nodes()) == {"gpu01"} and journal.history() == {}
    journal.note("gpu01", hist.FORGIVEN)
    assert journal.db.execute("PRAGMA user_version").fetchone()[0] == jr.SCHEMA_VERSION
    journal.close()


@pytest.mark.parametrize("bad", [0, 3])
def test_sweep_options_carry_the_repeat_knobs(tmp_path, bad):
    slurm = FakeSlurm(count=2)
    sweeper, journal, _ = make(tmp_path, slurm, repeat_limit=bad, repeat_window=3600)
    assert (sweeper.options.repeat_limit, sweeper.options.repeat_window) == (bad, 3600.0)
    journal.close()
