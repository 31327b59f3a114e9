"""The sweep's journal (sqlite in the state directory).

Every step of every node is recorded before it is taken ("started") and
after ("done" / "failed"), in its own committed transaction, so a sweeper
killed at any point is taken up by the next one from the recorded step.
The history table keeps, per node, when the sweep returned it to service and
for what (sweep/history.py: repeat offenders).  The rollouts table keeps
which nodes each rollout ([previous] -> [pin], by its reason) took, for the
timer's once-per-rollout canary (sweep/timed_rollout.py): a node's row in
`nodes` is replaced when it is enrolled again, that record never is.
"""

import json
import os
import sqlite3
import stat
import time
from typing import Dict, List, Optional, Tuple

from gpugate.errors import ConfigError
from gpugate.sweep.history import ESCALATED, FORGIVEN, REDRAINED, RESUMED, Event
from gpugate.schedulers.reservations import PREFIX as RESERVATION_PREFIX
from gpugate.core.record import dataclass

SCHEMA_VERSION = 2
# Formats this version reads; the tables it adds are created on open (v1 had no history; a v2
# journal of an older gpugate has no rollouts table: made on open and filled from `nodes`, and
# an older gpugate that opens this one leaves the table alone, so the format stays 2).
_READS = (1, 2)
SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY, started REAL, ended REAL, pid INTEGER, argv TEXT, outcome TEXT);
CREATE TABLE IF NOT EXISTS nodes (
    node TEXT PRIMARY KEY, run INTEGER, remedy TEXT, batch INTEGER, attempt INTEGER,
    step TEXT, status TEXT, reason TEXT, updated REAL, detail TEXT, reservation TEXT);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY, run INTEGER, node TEXT, step TEXT, status TEXT, attempt INTEGER,
    at REAL, detail TEXT);
CREATE TABLE IF NOT EXISTS history (
    id INTEGER PRIMARY KEY, node TEXT, kind TEXT, at REAL, components TEXT, run INTEGER, detail TEXT);
CREATE INDEX IF NOT EXISTS history_node ON history (node, at);
CREATE TABLE IF NOT EXISTS rollouts (
    rollout TEXT, node TEXT, run INTEGER, at REAL, PRIMARY KEY (rollout, node));
"""
STARTED, DONE, FAILED = "started", "done", "failed"
# A node whose last step is one of these is finished (not in flight).
TERMINAL = {("resume", DONE), ("escalate", DONE), ("left", DONE), ("deferred", DONE), ("halted", DONE)}


@dataclass(frozen=True)
class NodeRecord:
    node: str
    run: int
    remedy: str
    batch: int
    attempt: int
    step: str
    status: str
    reason: str
    updated: float
    detail: str
    reservation: str

    @property
    def finished(self) -> bool:
        return (self.step, self.status) in TERMINAL


def _private(path: str) -> None:
    """sweep.db, -wal and -shm root's to read too (0600): check_state
    refuses what others can write, but a user who can read them can open the
    -shm and hold a read lock on byte 120 (WAL_WRITE_LOCK), and every insert
    of root's fails "database is locked".  chmod revokes no descriptor a
    user already holds, so when any of them was open to others the -shm is
    made anew: unlinked before the first connection, SQLite rebuilds it from
    the -wal (kept: it holds committed steps; SQLite takes no lock in it).
    A user's old descriptor then names a file nobody uses.  (A connection of
    an older gpugate still open at that moment would keep the old -shm: the
    first open of this version is the time to have no sweep running.)"""
    try:  # made 0600 whatever the umask: SQLite gives the -wal and -shm the mode of the database
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        pass
    else:
        os.fchmod(fd, 0o600)
        os.close(fd)
    exposed = False
    for suffix in ("", "-wal", "-shm"):
        try:
            st = os.lstat(path + suffix)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_mode & 0o077:
            fd = os.open(path + suffix, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                os.fchmod(fd, 0o600)
            finally:
                os.close(fd)
            exposed = True
    if exposed:
        try:
            os.unlink(path + "-shm")
        except FileNotFoundError:
            pass


def _reservation_ids(name: str) -> Tuple[Optional[int], Optional[int]]:
    head, _, batch = name.partition("_b")
    from gpugate.schedulers.reservations import PREFIX

    run = head[len(PREFIX):] if head.startswith(PREFIX) else ""
    if not (run.isdigit() and batch.isdigit() and run.isascii() and batch.isascii()) or run[0] == "0":
        return None, None
    return int(run), int(batch)


class Journal:
    def __init__(self, path: str):
        from gpugate.model.config import check_state

        # The sweep resumes nodes on what this says: root's alone, like gpugate.toml.
        check_state(os.path.dirname(os.path.abspath(path)), files=(os.path.abspath(path),))
        from gpugate.safety.safeio import makedirs

        makedirs(os.path.dirname(os.path.abspath(path)), 0o700)  # root's alone, whatever the umask
        _private(path)
        self.path = path
        self.db = sqlite3.connect(path, timeout=10, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")  # a recorded step survives a power cut
        version = self.db.execute("PRAGMA user_version").fetchone()[0]
        tables = {r[0] for r in self.db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if tables and version not in _READS:
            self.db.close()
            raise ConfigError("%s: a sweep journal of another gpugate version (format %d, this one reads %d); "
                              "finish or move it away" % (path, version, SCHEMA_VERSION))
        self.db.executescript(SCHEMA)
        if tables and "rollouts" not in tables:  # the rollouts an older gpugate took, as far as `nodes` holds them
            with self.db:
                self.db.execute("INSERT OR IGNORE INTO rollouts SELECT reason, node, run, updated FROM nodes "
                                "WHERE remedy = 'rollout'")
        self.db.execute("PRAGMA user_version = %d" % SCHEMA_VERSION)
        self.run_id: Optional[int] = None

    def close(self) -> None:
        self.db.close()

    def start_run(self, argv: List[str]) -> int:
        cur = self.db.execute("INSERT INTO runs (started, pid, argv) VALUES (?, ?, ?)",
                              (time.time(), os.getpid(), json.dumps(argv)))
        self.run_id = cur.lastrowid
        return self.run_id

    def end_run(self, outcome: str) -> None:
        self.db.execute("UPDATE runs SET ended = ?, outcome = ? WHERE id = ?", (time.time(), outcome, self.run_id))

    def enrol(self, node: str, remedy: str, batch: int, reason: str, rollout: str = "") -> None:
        """A node enters the sweep's hands (replacing any finished record);
        ``rollout``: the rollout that takes it (its reason), kept for good."""
        with self.db:
            self.db.execute("INSERT OR REPLACE INTO nodes VALUES (?, ?, ?, ?, 1, 'planned', ?, ?, ?, '', ?)",
                            (node, self.run_id, remedy, batch, DONE, reason, time.time(),
                             "%s%d_b%d" % (RESERVATION_PREFIX, self.run_id, batch)))
            if rollout:
                self.db.execute("INSERT OR IGNORE INTO rollouts VALUES (?, ?, ?, ?)",
                                (rollout, node, self.run_id, time.time()))
            self._event(node, "planned", DONE, 1, remedy)

    def rollout_taken(self, rollout: str) -> List[str]:
        """The nodes this rollout (its reason: [previous] -> [pin]) ever took,
        whatever they were enrolled for since (a rollback, a later Xid)."""
        return sorted(r[0] for r in self.db.execute(
            "SELECT node FROM rollouts WHERE rollout = ? UNION "
            "SELECT node FROM nodes WHERE remedy = 'rollout' AND reason = ?", (rollout, rollout)))

    def record(self, node: str, step: str, status: str, attempt: Optional[int] = None, detail: str = "") -> None:
        with self.db:
            if attempt is None:
                row = self.db.execute("SELECT attempt FROM nodes WHERE node = ?", (node,)).fetchone()
                attempt = row[0] if row else 1
            self.db.execute("UPDATE nodes SET step = ?, status = ?, attempt = ?, updated = ?, detail = ?, run = ? "
                            "WHERE node = ?", (step, status, attempt, time.time(), detail[:500], self.run_id, node))
            self._event(node, step, status, attempt, detail)

    def stage(self, node: str, step: str, status: str, detail: str = "") -> None:
        """One proof's result (a DCGM level, the smoke job), as an event only:
        the node's step stays what the engine recorded."""
        with self.db:
            row = self.db.execute("SELECT attempt FROM nodes WHERE node = ?", (node,)).fetchone()
            self._event(node, step, status, row[0] if row else 1, detail)

    def proofs(self, node: str) -> List[tuple]:
        """(step, status, at, detail) of the proofs of this node's current attempt, in order."""
        rec = self.db.execute("SELECT run, attempt FROM nodes WHERE node = ?", (node,)).fetchone()
        if rec is None:
            return []
        return self.db.execute("SELECT step, status, at, detail FROM events WHERE node = ? AND attempt = ? AND "
                               "(step LIKE 'diag r%' OR step LIKE 'smoke %') AND status != 'started' AND "
                               "id > (SELECT coalesce(max(id), 0) FROM events WHERE node = ? AND step = 'planned') "
                               "ORDER BY id", (node, rec[1], node)).fetchall()

    def _event(self, node, step, status, attempt, detail) -> None:
        self.db.execute("INSERT INTO events (run, node, step, status, attempt, at, detail) VALUES (?, ?, ?, ?, ?, ?, ?)",
                        (self.run_id, node, step, status, attempt, time.time(), detail[:500]))

    def resumed(self, node: str, components, detail: str = "", at: Optional[float] = None, rung: str = "") -> None:
        """RESUME done and, in the same transaction, the history row (a crash
        cannot leave one without the other)."""
        with self.db:
            self.db.execute("UPDATE nodes SET step = 'resume', status = ?, updated = ?, detail = ?, run = ? "
                            "WHERE node = ?", (DONE, time.time(), detail[:500], self.run_id, node))
            row = self.db.execute("SELECT attempt FROM nodes WHERE node = ?", (node,)).fetchone()
            self._event(node, "resume", DONE, row[0] if row else 1, detail)
            if components:
                self._history(node, RESUMED, time.time() if at is None else at, components,
                              "rung=%s" % rung if rung else "")

    def rerung(self, node: str, remedy: str, step: str, attempt: int, detail: str) -> None:
        """The ladder's next rung (a failed GPU reset falls to the reboot):
        the node's remedy changes with the step it restarts from."""
        with self.db:
            self.db.execute("UPDATE nodes SET remedy = ?, step = ?, status = ?, attempt = ?, updated = ?, detail = ?, "
                            "run = ? WHERE node = ?", (remedy, step, STARTED, attempt, time.time(), detail[:500],
                                                       self.run_id, node))
            self._event(node, step, STARTED, attempt, detail)

    def evidence(self, node: str) -> List[tuple]:
        """(attempt, at, detail) of the evidence bundles of the node's current enrolment, newest last."""
        return self.db.execute("SELECT attempt, at, detail FROM events WHERE node = ? AND step = 'evidence' AND "
                               "status = 'done' AND id > (SELECT coalesce(max(id), 0) FROM events WHERE node = ? "
                               "AND step = 'planned') ORDER BY id", (node, node)).fetchall()

    def evidence_id(self, node: str) -> str:
        """The newest bundle kept for the node's current enrolment, or ""."""
        for _, _, detail in reversed(self.evidence(node)):
            for word in detail.replace(";", " ").split():
                if word.startswith("id="):
                    return word[3:]
        return ""

    def note(self, node: str, kind: str, components=(), at: Optional[float] = None, detail: str = "") -> None:
        """A history row: redrained, escalated or forgiven."""
        assert kind in (REDRAINED, ESCALATED, FORGIVEN)
        with self.db:
            self._history(node, kind, time.time() if at is None else at, components, detail)

    def _history(self, node, kind, at, components, detail) -> None:
        self.db.execute("INSERT INTO history (node, kind, at, components, run, detail) VALUES (?, ?, ?, ?, ?, ?)",
                        (node, kind, float(at), ",".join(sorted(components)), self.run_id, detail[:500]))

    def history(self) -> Dict[str, Tuple[Event, ...]]:
        """node -> its history, oldest first."""
        out: Dict[str, List[Event]] = {}
        for node, kind, at, comps, detail in self.db.execute(
                "SELECT node, kind, at, components, detail FROM history ORDER BY at, id"):
            out.setdefault(node, []).append(Event(node, kind, at, frozenset(c for c in comps.split(",") if c),
                                                  detail or ""))
        return {n: tuple(e) for n, e in out.items()}

    def nodes(self) -> Dict[str, NodeRecord]:
        rows = self.db.execute("SELECT node, run, remedy, batch, attempt, step, status, reason, updated, detail, "
                               "reservation FROM nodes").fetchall()
        return {r[0]: NodeRecord(*r) for r in rows}

    def in_flight(self) -> Dict[str, NodeRecord]:
        return {n: r for n, r in self.nodes().items() if not r.finished}

    def events(self, node: Optional[str] = None) -> List[tuple]:
        if node:
            return self.db.execute("SELECT run, node, step, status, attempt, at, detail FROM events WHERE node = ? "
                                   "ORDER BY id", (node,)).fetchall()
        return self.db.execute("SELECT run, node, step, status, attempt, at, detail FROM events ORDER BY id").fetchall()

    def owns(self, reservation: str) -> bool:
        """Is this a batch reservation a sweep of this journal made (enrol's
        name, gpugate_sweep_r<run>_b<batch>, of a run recorded here)?  Any
        other, an admin's included, is never the sweep's to delete."""
        run, _ = _reservation_ids(reservation)
        return run is not None and self.db.execute("SELECT 1 FROM runs WHERE id = ?", (run,)).fetchone() is not None

    def runs(self, limit: int = 10) -> List[tuple]:
        return self.db.execute("SELECT id, started, ended, pid, outcome FROM runs ORDER BY id DESC LIMIT ?",
                               (limit,)).fetchall()
