"""Issue 44, item 7: the kernel-log follower cannot stay down.

A write error of its journal (a full disk) frees its own journal parts and
it goes on, counted; a garbled heartbeat is skipped; its systemd unit
restarts it however often it stops (no start limit); killed ten times in
a row it is back and following."""

import errno
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import given, settings, strategies as st

from gpugate.node import kmsgfollow
from gpugate.node.kmsgfollow import Follower
from gpugate.probes import gpujournal
from gpugate.probes.files import boot_id
from gpugate.sim import fleet as simfleet
from gpugate.sim import keys as simkeys
from gpugate.sim.kmsg import write_ring

from conftest import ROOT
from test_node_side import node_env  # noqa: F401 - a fixture

UNIT = os.path.join(ROOT, "slurm_conf", "gpugate-kmsg-follow.service")
BOOT = "0b6f3a52-1f6e-4c1b-9d7e-5a1f0c2d3e4f"
XID = "NVRM: Xid (PCI:0000:%02x:00): %d, pid=1, name=python3, GPU has fallen off the bus."


def _record(seq, xid=79, bus=0x18):
    return "4,%d,%d,-;%s" % (seq, seq * 1000, XID % (bus, xid))


def _unit(path=UNIT):
    """{section: {key: value}} of a systemd unit (the last assignment wins, as in systemd)."""
    out, section = {}, None
    for line in open(path):
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = out.setdefault(line.strip("[]"), {})
        else:
            key, _, value = line.partition("=")
            section[key.strip()] = value.strip()
    return out


def test_the_unit_restarts_it_however_often_it_stops():
    unit = _unit()
    assert unit["Service"]["Restart"] == "always"
    # systemd reads the start limit in [Unit] (in [Service] it is ignored, with a warning).
    assert unit["Unit"]["StartLimitIntervalSec"] == "0"
    assert "StartLimitIntervalSec" not in unit["Service"] and "StartLimitBurst" not in unit["Service"]


class _Disk:
    """os.write at the file boundary, answering ENOSPC while ``full``."""

    def __init__(self):
        self.full, self.real = False, os.write

    def __call__(self, fd, data):
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.real(fd, data)


def test_a_write_error_frees_its_own_journal_and_it_goes_on(tmp_path, monkeypatch):
    """ENOSPC injected at the write boundary (every write: the journal's and
    the heartbeat's): no exception, the application's part goes, never the
    driver's (the Xid 79 kept in it stays), what it could not keep is
    counted and read as a window it lost."""
    state = str(tmp_path / "state")
    disk = _Disk()
    follower = Follower(state, BOOT, 1.0)
    follower.feed([_record(10, 13), _record(11, 79)])  # one application fault, one Xid 79
    monkeypatch.setattr(kmsgfollow.os, "write", disk)  # os.write of every module
    disk.full = True
    follower.feed([_record(12, 119)])  # no room at all: dropped, counted, a window lost
    follower.heartbeat(2.0)  # cannot be written either: counted, no exception
    disk.full = False
    follower.feed([_record(13, 94), _record(14, 79, 0x3a)])
    follower.heartbeat(3.0)
    monkeypatch.undo()
    beat = gpujournal.read_heartbeat(state)
    assert beat["write_errors"] >= 2 and beat["dropped_records"] == 1
    assert beat["write_error"]["error"].startswith("ENOSPC")
    assert [12, 12] in beat["lost"] and [10, 10] in beat["lost"]  # the new record, the application's part
    assert not any(a <= 11 <= b for a, b in beat["lost"])  # the driver's part was never given up
    kept = gpujournal.read_events(state, BOOT)
    assert sorted(kept) == [11, 13, 14]  # the kept Xid 79 still there; written again once the disk had room
    # The checks: a ring that lost seq 12 is not "covered" by the journal.
    cover = gpujournal.coverage(beat, BOOT, {"records": 1, "first": 12, "last": 12}, 3.5, 60)
    assert cover["covered"] is False and cover["follower_write_errors"] == beat["write_errors"]
    # Restarted: the counts go on from the heartbeat (a counter per boot).
    again = Follower(state, BOOT, 4.0)
    assert (again.write_errors, again.dropped_records) == (beat["write_errors"], 1)


def test_a_disk_a_job_keeps_full_never_costs_a_kept_driver_record(tmp_path, monkeypatch):
    """A job that keeps the root file system full (its /tmp on /): the
    follower frees the application's parts only; the Xids kept in the
    driver's parts (current and .1: an Xid 79 the ring already lost) stay,
    and the new records are dropped, counted, a window lost."""
    monkeypatch.setattr(gpujournal, "MAX_FILE", 1024)  # a few entries a part: one rotation below
    state = str(tmp_path / "state")
    follower = Follower(state, BOOT, 1.0)
    follower.feed([_record(seq, 79, 0x18 + seq) for seq in range(1, 11)] + [_record(11, 13)])
    directory = gpujournal.directory(state)
    assert os.path.exists(os.path.join(directory, gpujournal.EVENTS + ".1"))
    before = gpujournal.read_events(state, BOOT)
    driver = sorted(s for s in before if s != 11)
    assert driver == list(range(1, 11)), before
    disk = _Disk()
    monkeypatch.setattr(kmsgfollow.os, "write", disk)
    disk.full = True
    for seq in range(12, 40):  # the disk stays full: Xid after Xid is refused
        follower.feed([_record(seq, 119)])
    follower.heartbeat(2.0)
    disk.full = False
    follower.heartbeat(3.0)
    kept = gpujournal.read_events(state, BOOT)
    assert sorted(s for s in kept if s != 11) == driver  # every kept driver record still there
    assert 11 not in kept  # the application's part made what room it could
    beat = gpujournal.read_heartbeat(state)
    assert beat["dropped_records"] == 28 and [12, 12] in beat["lost"] and [39, 39] in beat["lost"]
    assert not any(a <= seq <= b for a, b in beat["lost"] for seq in driver), beat["lost"]
    # The driver's parts refuse to be dropped, whoever asks.
    assert follower.writer.drop(True, BOOT) == (False, None) and follower.writer.drop(False, BOOT) == (False, None)
    assert sorted(s for s in gpujournal.read_events(state, BOOT)) == driver


def test_the_driver_s_part_is_preallocated_to_its_bound_when_opened(tmp_path, monkeypatch):
    """Its appends then need no block of the file system; the zeros past its
    entries are no entry; a restart appends after the entries; where the
    file system cannot preallocate, it goes on as before, silently."""
    state = str(tmp_path / "state")
    follower = Follower(state, BOOT, 1.0)
    path = os.path.join(gpujournal.directory(state), gpujournal.EVENTS)
    st = os.stat(path)
    assert st.st_size == gpujournal.MAX_FILE and st.st_blocks * 512 >= gpujournal.MAX_FILE
    follower.feed([_record(1), _record(2, 13)])
    follower.close(2.0)
    assert not os.path.exists(path + ".1") and os.path.getsize(path) == gpujournal.MAX_FILE
    app = os.path.join(gpujournal.directory(state), gpujournal.APP_EVENTS)
    assert os.path.getsize(app) == len(gpujournal.entry(BOOT, _record(2, 13)))  # the application's: not
    again = Follower(state, BOOT, 3.0)  # restarted: after the entries, never after the zeros
    again.feed([_record(3)])
    again.close(4.0)
    assert sorted(gpujournal.read_events(state, BOOT)) == [1, 2, 3]
    with open(path, "rb") as handle:
        data = handle.read()
    assert data.rstrip(b"\0") == gpujournal.entry(BOOT, _record(1)) + gpujournal.entry(BOOT, _record(3))

    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(gpujournal.os, "posix_fallocate", unsupported)
    other = str(tmp_path / "other")
    writer = gpujournal.Writer(other)
    writer.append(BOOT, [_record(5)])
    writer.close()
    plain = os.path.join(gpujournal.directory(other), gpujournal.EVENTS)
    assert os.path.getsize(plain) == len(gpujournal.entry(BOOT, _record(5)))
    assert list(gpujournal.read_events(other, BOOT)) == [5]


def test_a_torn_line_a_killed_run_left_costs_no_later_entry(tmp_path):
    writer = gpujournal.Writer(str(tmp_path))
    writer.append(BOOT, [_record(1)])
    writer.close()
    path = os.path.join(gpujournal.directory(str(tmp_path)), gpujournal.EVENTS)
    with open(path, "ab") as handle:
        handle.write(gpujournal.entry(BOOT, _record(2))[:40])  # SIGKILL mid-write
    writer = gpujournal.Writer(str(tmp_path))
    writer.append(BOOT, [_record(3)])
    writer.close()
    assert sorted(gpujournal.read_events(str(tmp_path), BOOT)) == [1, 3]


garbled = st.one_of(
    st.none(), st.integers(), st.text(max_size=5), st.lists(st.integers(), max_size=3), st.booleans(),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2), st.floats(allow_nan=True),
    st.lists(st.lists(st.one_of(st.integers(), st.text(max_size=2)), max_size=3), max_size=3))


@settings(max_examples=200, deadline=None)
@given(st.fixed_dictionaries({}, optional={k: garbled for k in (
    "seq", "from_seq", "lost", "lost_records", "write_errors", "dropped_records", "write_error")}))
def test_a_garbled_heartbeat_is_skipped(fields):
    resumed = kmsgfollow._resume(dict(fields, boot_id=BOOT), BOOT)
    seq, from_seq, lost, lost_records, write_errors, dropped, _ = resumed
    assert isinstance(seq, int) and seq >= -1 and (from_seq is None or isinstance(from_seq, int))
    assert all(len(w) == 2 and all(isinstance(x, int) for x in w) for w in lost)
    assert all(isinstance(n, int) and n >= 0 for n in (lost_records, write_errors, dropped))


def _start(env, node="gpu01", seconds=120):
    return subprocess.Popen([sys.executable, "-m", "gpugate", "kmsg-follow", "--config", env["config"],
                             "--node", node, "--seconds", str(seconds)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)


def _beat(env, node="gpu01"):
    return gpujournal.read_heartbeat(os.path.join(env["state"], node)) or {}


def _wait(predicate, what, timeout=60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("not within %ss: %s" % (timeout, what))


def _xid(env, gpu, xid, node="gpu01", times=1):
    """The simulated kernel prints an Xid into the node's /dev/kmsg ring
    (``times`` records); the last record's seq."""
    model = simfleet.load(env["fleet"], node)
    for _ in range(times):
        simkeys.apply(model, "gpu.%d.xid" % gpu, str(xid))
    write_ring(env["fleet"], node, model)
    simfleet.save(env["fleet"], node, model)
    return model["kmsg"][-1]["seq"]


def _journaled(env, seq, node="gpu01"):
    boot = boot_id(os.path.join(env["fleet"], node, "root"))
    return seq in gpujournal.read_events(os.path.join(env["state"], node), boot)


def _stop(proc):
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


def _garble(env, node="gpu01"):
    path = os.path.join(env["state"], node, gpujournal.DIR, gpujournal.HEARTBEAT)
    beat = json.load(open(path))
    beat.update(seq="x", lost=[[1]], lost_records=-5)
    with open(path, "w") as handle:
        json.dump(beat, handle)


def test_killed_ten_times_in_a_row_it_is_back_and_following(node_env):  # noqa: F811
    """A supervisor that does what the unit asks of systemd: Restart=always,
    no start limit (StartLimitIntervalSec=0), RestartSec scaled down 10x.
    SIGKILL ten times in a row, at start-up and while it follows (its
    heartbeat garbled once meanwhile); then an Xid printed after the tenth
    kill is in its journal."""
    unit = _unit()
    assert unit["Service"]["Restart"] == "always" and unit["Unit"]["StartLimitIntervalSec"] == "0"
    pause = float(unit["Service"]["RestartSec"]) / 10
    proc, pids = _start(node_env), []
    try:
        for kill in range(10):
            if kill % 2:  # at start-up, before it follows
                time.sleep(0.05 * kill)
            else:  # while it follows: its own heartbeat of this run is there
                _wait(lambda: _beat(node_env).get("pid") == proc.pid and _beat(node_env).get("running"),
                      "run %d follows" % kill)
            if kill == 4:
                _garble(node_env)
            pids.append(proc.pid)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            assert proc.returncode == -signal.SIGKILL
            time.sleep(pause)
            proc = _start(node_env)  # Restart=always
        _wait(lambda: _beat(node_env).get("pid") == proc.pid, "back after the tenth kill")
        seq = _xid(node_env, 3, 79)
        _wait(lambda: _journaled(node_env, seq), "the Xid printed after the tenth kill is journaled")
        assert proc.poll() is None  # still following
    finally:
        if proc.poll() is None:
            _stop(proc)
    assert len(set(pids)) == 10


def _root_tmpfs_or_skip(path, size):
    if os.geteuid() != 0:
        pytest.skip("a real full file system needs root (a tmpfs mount); the injected ENOSPC test covers the rest")
    os.makedirs(path, mode=0o700)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%s,mode=0700" % size, "gpugate-test", path],
                            capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        pytest.skip("cannot mount a tmpfs here: %s" % result.stderr.strip())


def _fill(path):
    """Write until the file system is full (to its last byte)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for size in (65536, 4096, 512, 64, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)


def test_a_full_file_system_costs_the_journal_never_the_follower(node_env):  # noqa: F811
    """The real thing: the node's state directory on a 256 KiB tmpfs that a
    file fills to the last block while `gpugate kmsg-follow` runs, and 40
    Xid 119 records (~6 KiB: more than any page's rest) arrive.  It keeps
    running; each of them is journaled (its own parts made room) or dropped
    and read as a window it lost; once room is back an Xid is journaled."""
    state = os.path.join(node_env["state"], "gpu01")
    _root_tmpfs_or_skip(state, "256k")
    proc = None
    try:
        proc = _start(node_env)
        _wait(lambda: _beat(node_env).get("pid") == proc.pid, "it follows")
        _xid(node_env, 0, 13, times=8)  # application faults: a part to give up first
        first = _xid(node_env, 2, 79)
        _wait(lambda: _journaled(node_env, first), "the first Xid is journaled")
        filler = os.path.join(state, "filler")
        _fill(filler)
        last = _xid(node_env, 5, 119, times=40)
        time.sleep(1.5)
        assert proc.poll() is None, proc.communicate(timeout=10)[1]  # still there
        os.unlink(filler)
        after = _xid(node_env, 6, 79)
        _wait(lambda: _journaled(node_env, after), "an Xid after room came back is journaled")
        assert proc.poll() is None
        _stop(proc)  # its last heartbeat says what the full disk cost
        beat = _beat(node_env)
        assert beat["write_errors"] >= 1 and beat["write_error"]["error"].startswith("ENOSPC"), beat
        boot = boot_id(os.path.join(node_env["fleet"], "gpu01", "root"))
        kept = gpujournal.read_events(state, boot)
        for seq in range(last - 39, last + 1):
            assert seq in kept or any(a <= seq <= b for a, b in beat["lost"]), (seq, beat)
    finally:
        if proc is not None and proc.poll() is None:
            _stop(proc)
        subprocess.run(["umount", state], capture_output=True, timeout=30)


def test_on_a_real_full_file_system_the_preallocated_driver_part_still_takes_xids(tmp_path):
    """A 1 MiB tmpfs a file fills to its last byte after the follower
    started: the driver's part, preallocated at the start, takes every Xid
    (no write error, none dropped), and nothing of it was deleted."""
    state = str(tmp_path / "state")
    _root_tmpfs_or_skip(state, "1m")
    follower = None
    try:
        follower = Follower(state, BOOT, 1.0)
        follower.feed([_record(1), _record(2, 13)])
        _fill(os.path.join(state, "filler"))
        follower.feed([_record(seq, 119, 0x18 + seq % 8) for seq in range(3, 600)])
        assert (follower.write_errors, follower.dropped_records) == (0, 0)
        kept = gpujournal.read_events(state, BOOT)
        assert {1, 2} <= set(kept) and set(range(3, 600)) <= set(kept)
    finally:
        if follower is not None:  # its open parts would keep the tmpfs busy
            follower.writer.close()
            follower.app_writer.close()
        subprocess.run(["umount", state], capture_output=True, timeout=30)
