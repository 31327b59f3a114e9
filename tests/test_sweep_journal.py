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


ROLLOUT = "gpugate: rollout driver=570.1 (want 580.1)"


def test_the_nodes_a_rollout_took_are_kept_when_they_are_enrolled_again(tmp_path):
    j = jr.Journal(str(tmp_path / "sweep.db"))
    j.start_run(["test"])
    j.enrol("gpu01", "rollout", 1, ROLLOUT, rollout=ROLLOUT)
    j.enrol("gpu02", "reboot", 2, "gpugate: health xid:gpu3=79 (want none)")
    assert j.rollout_taken(ROLLOUT) == ["gpu01"]
    j.enrol("gpu01", "reconverge", 3, "gpugate: drift driver=570.1 (want 580.1)")  # deferred, taken up later
    assert j.nodes()["gpu01"].remedy == "reconverge" and j.rollout_taken(ROLLOUT) == ["gpu01"]
    assert j.rollout_taken("gpugate: rollout driver=580.1 (want 590.1)") == []  # another rollout: its own
    j.close()


def test_a_journal_of_an_older_gpugate_gains_the_rollouts_table_from_its_nodes(tmp_path):
    import sqlite3

    path = str(tmp_path / "v2.db")
    db = sqlite3.connect(path)
    db.executescript(jr.SCHEMA.split("CREATE TABLE IF NOT EXISTS rollouts")[0])
    db.execute("INSERT INTO nodes VALUES ('gpu01', 1, 'rollout', 1, 3, 'resume', 'done', ?, 0, '', 'r')", (ROLLOUT,))
    db.execute("INSERT INTO nodes VALUES ('gpu02', 1, 'reboot', 2, 1, 'resume', 'done', 'x', 0, '', 'r')")
    db.execute("PRAGMA user_version = 2")
    db.commit()
    db.close()
    j = jr.Journal(path)
    j.start_run(["test"])
    j.enrol("gpu01", "reboot", 1, "gpugate: health xid:gpu3=79 (want none)")
    assert j.rollout_taken(ROLLOUT) == ["gpu01"]
    assert j.db.execute("PRAGMA user_version").fetchone()[0] == 2  # an older gpugate still reads it
    j.close()
    j = jr.Journal(path)  # opened again: nothing more to fill
    assert j.rollout_taken(ROLLOUT) == ["gpu01"]
    j.close()


def rec(step, status, attempt=1, remedy="reconverge"):
    return jr.NodeRecord("gpu01", 1, remedy, 1, attempt, step, status, "", 0.0, "", "r")


@pytest.mark.parametrize("record,expected", [
    (rec("planned", jr.DONE), "wait_drained"),
    (rec("wait_drained", jr.DONE), "evidence"),  # a bundle before anything is lost
    (rec("evidence", jr.STARTED), "evidence"),  # interrupted: collect again
    (rec("evidence", jr.DONE), "converge"),
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
    (rec("wait_drained", jr.DONE, remedy="reboot"), "evidence"),
    (rec("evidence", jr.DONE, remedy="reboot"), "reboot"),
    (rec("evidence", jr.DONE, remedy="reset"), "reset"),  # the reset rung: no reboot, no wait_up
    (rec("reset", jr.STARTED, remedy="reset"), "reset"),  # a kill -9 during the reset: reset again
    (rec("reset", jr.DONE, remedy="reset"), "verify"),
    (rec("reset", jr.FAILED, remedy="reset"), "failed"),  # the reboot rung next (engine._attempt_failed)
    (rec("evidence", jr.STARTED, attempt=2, remedy="reboot"), "evidence"),  # after a failed reset
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


NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
# A user's read locks: one byte of sweep.db's SHARED range (0x40000002: root's
# last close cannot take EXCLUSIVE, so SQLite leaves the -shm in place) and
# byte 120 of the -shm (WAL_WRITE_LOCK), held open until killed.
_LOCK_SHM = ("import fcntl, os, sys, time\n"
             "db = os.open(sys.argv[1][:-len('-shm')], os.O_RDONLY)\n"
             "fcntl.lockf(db, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, 0x40000002)\n"
             "fd = os.open(sys.argv[1], os.O_RDONLY)\n"
             "fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, 120)\n"
             "print('held', flush=True)\n"
             "time.sleep(60)\n")


def _nobody_python():
    """An interpreter uid 65534 can run (this one may live under /root)."""
    import os
    import shutil
    import subprocess
    import sys

    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv (util-linux)")
    for python in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(python) and subprocess.run(NOBODY + [python, "-c", "pass"],
                                                     capture_output=True, timeout=30).returncode == 0:
            return python
    pytest.skip("no interpreter uid 65534 can run")


def test_a_user_cannot_lock_the_journal_so_every_sweep_stops(tmp_path):
    """Issue 24 review: a WAL journal left 0644 (an older gpugate, umask 022)
    let uid 65534 open sweep.db-shm and hold a read lock on byte 120: root's
    insert failed "database is locked", every sweep stopped.  On open the
    files become 0600 and, since chmod revokes no descriptor a user already
    holds, the -wal and -shm are made anew; the directory gpugate creates is
    0700."""
    import os
    import shutil
    import tempfile

    python = _nobody_python()
    top = tempfile.mkdtemp(prefix="gpugate-journal-", dir="/tmp")  # reachable by any user, as /var/lib is
    os.chmod(top, 0o755)
    try:
        _lock_the_journal_as_a_user(python, os.path.join(top, "sweep.db"))
    finally:
        shutil.rmtree(top, ignore_errors=True)


def _lock_the_journal_as_a_user(python, path):
    import os
    import stat
    import subprocess

    first = jr.Journal(path)  # a sweep running, its files as an older gpugate under umask 022 left them
    first.start_run(["before"])
    first.db.execute("CREATE TABLE t (x)")
    first.db.execute("INSERT INTO t VALUES (1)")
    for suffix in ("", "-wal", "-shm"):
        os.chmod(path + suffix, 0o644)
    user = subprocess.Popen(NOBODY + [python, "-c", _LOCK_SHM, path + "-shm"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert user.stdout.readline().strip() == "held", user.stderr.read()
        first.close()
        assert os.path.exists(path + "-shm")  # the user's lock on sweep.db kept it
        j = jr.Journal(path)
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(path + suffix):
                assert stat.S_IMODE(os.stat(path + suffix).st_mode) == 0o600, suffix
        j.db.execute("PRAGMA busy_timeout = 500")
        j.start_run(["test"])  # before: sqlite3.OperationalError: locking protocol (or database is locked)
        j.enrol("gpu01", "reboot", 1, "gpugate: health xid:gpu3=79 (want none)")
        assert set(j.in_flight()) == {"gpu01"}
        assert j.db.execute("SELECT x FROM t").fetchall() == [(1,)]  # nothing lost
        j.close()
    finally:
        user.kill()
        user.wait(timeout=10)
    again = subprocess.run(NOBODY + [python, "-c", _LOCK_SHM, path + "-shm"], capture_output=True,
                           text=True, timeout=30)
    assert again.returncode != 0 and "held" not in again.stdout


def test_the_journal_directory_gpugate_creates_is_root_s_alone(tmp_path):
    import os
    import stat

    path = tmp_path / "new" / "sweep.db"
    jr.Journal(str(path)).close()
    assert stat.S_IMODE(os.stat(str(path.parent)).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(str(path)).st_mode) & 0o077 == 0
