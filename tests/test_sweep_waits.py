"""The sweep's one wait (gpugate/sweep/waits.py): a read the scheduler does
not answer settles nothing and is made again until the wait's deadline; at
the deadline a wait whose last read failed raises, never "late"."""

import types
from unittest import mock

import pytest
from hypothesis import given, settings, strategies as st

from gpugate.errors import ConfigError, SlurmError
from gpugate.kube.client import KubeError
from gpugate.sweep import waits

NODES = ["gpu%02d" % i for i in range(1, 7)]


class Clock:
    """The wait's monotonic clock: moved by its sleeps and by each read's cost."""

    def __init__(self):
        self.now = 1000.0
        self.sleeps = []

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        assert seconds > 0
        self.sleeps.append(seconds)
        self.now += seconds


def scripted(clock, script):
    """A read that plays `script`: ("fail", cost) raises SlurmError after
    `cost` seconds; ("ok", k) answers and lets settle() take the k lowest
    of the nodes still awaited.  Past the script's end: ("ok", 0)."""
    calls = []

    def read(waiting):
        step = script[len(calls)] if len(calls) < len(script) else ("ok", 0)
        calls.append((clock.now, step, sorted(waiting)))
        if step[0] == "fail":
            clock.now += step[1]
            raise SlurmError("scontrol timed out after %gs" % step[1])
        return {name: step[1] for name in waiting}

    def settle(states, waiting):
        take = states[min(waiting)] if waiting else 0
        return sorted(waiting)[:take]
    return read, settle, calls


def run(script, timeout, interval, nodes=NODES):
    clock = Clock()
    read, settle, calls = scripted(clock, script)
    notes = []
    with mock.patch.object(waits, "time", types.SimpleNamespace(monotonic=clock.monotonic)):
        try:
            late = waits.poll_until(nodes, read, settle, timeout, interval, clock.sleep, note=notes.append)
            raised = None
        except SlurmError as exc:
            late, raised = None, exc
    return clock, calls, notes, late, raised


def test_reads_that_fail_for_a_while_are_ridden_out():
    clock, calls, notes, late, raised = run([("ok", 1), ("fail", 10), ("fail", 10), ("ok", 5)], 90, 0.5)
    assert raised is None and late == set()
    assert len(calls) == 4 and [c[2] for c in calls[1:]] == [NODES[1:]] * 3  # nothing settled by a failure
    assert len(notes) == 1 and "no answer (scontrol timed out after 10s)" in notes[0]


def test_at_the_deadline_a_wait_whose_last_read_failed_raises_never_late():
    clock, calls, notes, late, raised = run([("ok", 2)] + [("fail", 10)] * 20, 30, 0.5)
    assert late is None and "timed out" in str(raised)
    assert clock.now >= 1030 and all(step == ("fail", 10) for _, step, _ in calls[1:])


def test_a_wait_whose_last_read_answered_returns_the_late_nodes():
    clock, calls, notes, late, raised = run([("fail", 10), ("ok", 1)], 15, 1.0)
    assert raised is None and late == set(NODES[1:]) and clock.now >= 1015


@pytest.mark.parametrize("error", [ConfigError("bad"), KubeError("forbidden", 403, "Forbidden"),
                                   KubeError("gone", 404, "NotFound")])
def test_an_answer_that_refuses_is_raised_at_once(error):
    assert not error.ask_again
    reads = []

    def read(waiting):
        reads.append(1)
        raise error
    with pytest.raises(type(error)):
        waits.poll_until(NODES, read, lambda states, waiting: [], 60, 0.01, lambda s: None)
    assert len(reads) == 1


@pytest.mark.parametrize("status", [0, 429, 500, 503])
def test_an_api_server_that_does_not_answer_is_waited_for(status):
    assert KubeError("", status).ask_again and SlurmError("").ask_again
    answers = iter([KubeError("no answer", status)])

    def read(waiting):
        for exc in answers:
            raise exc
        return {name: True for name in waiting}
    assert waits.poll_until(NODES, read, lambda states, waiting: list(waiting), 60, 0.01, lambda s: None) == set()


steps = st.one_of(st.tuples(st.just("fail"), st.sampled_from([0.0, 0.2, 5.0, 10.0])),
                  st.tuples(st.just("ok"), st.integers(0, 3)))


@settings(max_examples=300, deadline=None)
@given(script=st.lists(steps, max_size=40), timeout=st.floats(0, 60), interval=st.sampled_from([0.5, 1.0, 7.0]))
def test_a_failed_read_never_settles_and_the_wait_ends_only_at_its_deadline(script, timeout, interval):
    clock, calls, notes, late, raised = run(script, timeout, interval)
    deadline = 1000.0 + timeout
    outcomes = [step for _, step, _ in calls]
    # What was settled was settled by answers alone.
    settled = set(NODES) - (late if late is not None else set(calls[-1][2]) if calls else set())
    assert len(settled) <= sum(step[1] for step in outcomes if step[0] == "ok")
    for (_, step, before), after in zip(calls, [c[2] for c in calls[1:]]):
        if step[0] == "fail":
            assert after == before
    if raised is not None:
        assert outcomes[-1][0] == "fail" and clock.now >= deadline  # unanswered to the end: an error
    elif late:
        assert outcomes[-1][0] == "ok" and clock.now >= deadline  # answered, some not back: late
    # Every stretch of failures is told once, when it starts.
    starts = sum(1 for i, step in enumerate(outcomes) if step[0] == "fail" and (i == 0 or outcomes[i - 1][0] != "fail"))
    assert len(notes) == starts
    assert all(0 < s <= interval for s in clock.sleeps)
