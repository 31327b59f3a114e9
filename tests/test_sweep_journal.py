"""The sweep journal and how a recorded step maps to the next one: nothing
moves from a failure or an escalation straight to RESUME."""

import pytest

from gpugate.errors import ConfigError
from gpugate.sweep import journal as jr
from gpugate.sweep.engine import Sweeper


def test_enrol_record_in_flight_and_terminal(tmp_path):
    j = jr.Journal(str(tmp_path / "sweep.db"))
    j.start_run(["test"])
    j.enrol("gpu01", "reconverge", 1, "gpugate: drift driver=1 (want 2)")
    j.enrol("gpu02", "reboot", 1, "gpugate: health xid:gpu3=79 (want none)")
    assert set(j.in_flight()) == {"gpu01", "gpu02"}
    j.record("gpu01", "verify", jr.STARTED)
    j.record("gpu02", "escalate", jr.DONE, detail="rma")
    assert set(j.in_flight()) == {"gpu01"}
    rec = j.nodes()["gpu01"]
    assert (rec.step, rec.status, rec.attempt, rec.reservation) == ("verify", "started", 1, "gpugate_sweep_r1_b1")
    assert [e[2:4] for e in j.events("gpu01")] == [("planned", "done"), ("verify", "started")]
    j.close()
    # Reopened (a new sweeper after a crash): the same state.
    j = jr.Journal(str(tmp_path / "sweep.db"))
    assert set(j.in_flight()) == {"gpu01"}
    j.close()


def test_a_journal_of_another_format_is_refused(tmp_path):
    import sqlite3

    path = tmp_path / "old.db"
    db = sqlite3.connect(str(path))
    db.execute("CREATE TABLE nodes (node TEXT)")
    db.commit()
    db.close()
    with pytest.raises(ConfigError, match="another gpugate version"):
        jr.Journal(str(path))


def rec(step, status, attempt=1, remedy="reconverge"):
    return jr.NodeRecord("gpu01", 1, remedy, 1, attempt, step, status, "", 0.0, "", "r")


@pytest.mark.parametrize("record,expected", [
    (rec("planned", jr.DONE), "wait_drained"),
    (rec("wait_drained", jr.DONE), "converge"),
    (rec("converge", jr.STARTED), "converge"),  # interrupted: redo it
    (rec("converge", jr.DONE), "reboot"),
    (rec("reboot", jr.DONE), "wait_up"),
    (rec("wait_up", jr.DONE), "verify"),
    (rec("verify", jr.DONE), "smoke"),
    (rec("smoke", jr.STARTED), "smoke"),  # interrupted: redo it (a job left behind is cancelled first)
    (rec("smoke", jr.DONE), "resume"),
    (rec("smoke", jr.FAILED), "failed"),  # never straight to resume
    (rec("verify", jr.FAILED), "failed"),  # never straight to resume
    (rec("converge", jr.FAILED), "failed"),
    (rec("wait_up", jr.FAILED), "failed"),
    (rec("escalate", jr.STARTED), "escalate"),
    (rec("converge", jr.STARTED, attempt=2), "converge"),
    (rec("rollback", jr.STARTED, attempt=3), "rollback"),
    (rec("rollback", jr.DONE, attempt=3), "reboot"),
    (rec("planned", jr.DONE, remedy="reboot"), "wait_drained"),
    (rec("wait_drained", jr.DONE, remedy="reboot"), "reboot"),
    (rec("planned", jr.DONE, remedy="rollout"), "drain"),
])
def test_next_step(record, expected):
    sweeper = Sweeper.__new__(Sweeper)  # _next_step reads nothing but the record
    assert sweeper._next_step(record) == expected


def test_metrics_say_when_the_circuit_breaker_stopped_the_latest_sweep(tmp_path):
    from types import SimpleNamespace

    from gpugate.fleet.metrics import fleet_families

    def samples(last_run):
        families = fleet_families(SimpleNamespace(nodes={}), {}, None, None, None, last_run, now=5.0)
        return {s[0]: s[2] for f in families for s in f[3]}

    j = jr.Journal(str(tmp_path / "sweep.db"))
    assert "gpugate_sweep_stopped" not in samples((j.runs(1) or [None])[0])  # never swept
    j.start_run(["sweep", "--apply"])
    j.end_run("stopped")  # as sweep.run.apply records a circuit-breaker stop
    m = samples(j.runs(1)[0])
    assert m["gpugate_sweep_stopped"] == 1 and m["gpugate_sweep_last_run_timestamp_seconds"] > 0
    j.start_run(["sweep", "--apply"])
    assert samples(j.runs(1)[0])["gpugate_sweep_stopped"] == 0  # a new run is under way
    j.end_run("ok")
    assert samples(j.runs(1)[0])["gpugate_sweep_stopped"] == 0
    assert samples(None)["gpugate_metrics_timestamp_seconds"] == 5.0
    j.close()
