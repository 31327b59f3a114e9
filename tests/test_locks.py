"""Issue 24, items 2 and 7: locks only root can take, a stuck lock reported
instead of a quiet skip, and nothing created writable by others whatever
the umask.  The user side runs as uid 65534 through setpriv, with the
entry points run as slurmd runs them."""

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import DEMO_BASELINE, ROOT, gpugate_cmd, sim_config
from test_node_side import entry, metrics

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("flock"),
                                reason="needs root, setpriv and flock (util-linux)")


@pytest.fixture
def open_node(fleet, tmp_path):
    """A node whose state directory any user can reach (0755 all the way,
    as /var/lib/gpugate is): only the locks' own modes keep a user out."""
    top = tempfile.mkdtemp(prefix="gpugate-locks-", dir="/tmp")
    os.chmod(top, 0o755)
    config = tmp_path / "gpugate.toml"
    prom = os.path.join(top, "prom", "gpugate.prom")
    os.mkdir(os.path.dirname(prom), 0o755)
    config.write_text('baseline = "%s"\nstate_dir = "%s/var/state/{node}"\nlog = "file"\n'
                      '[healthcheck]\nboot_grace_seconds = 0\nprometheus_textfile = "%s"\n'
                      '[sim]\nfleet = "%s"\n[slurm]\nbin_dir = "%s/no-slurm-here"\n'
                      % (DEMO_BASELINE, top, prom, fleet, tmp_path))
    yield {"config": str(config), "prom": prom, "top": top, "state": os.path.join(top, "var", "state", "gpu01")}
    shutil.rmtree(top, ignore_errors=True)


def run_entry(mode, env, umask=None):
    return subprocess.run([entry(mode), "--config", env["config"]], env={"SLURMD_NODENAME": "gpu01"},
                          capture_output=True, text=True, timeout=120,
                          preexec_fn=None if umask is None else (lambda: os.umask(umask)))


def last_log(env):
    with open(os.path.join(env["state"], "gpugate.log")) as handle:
        return json.loads(handle.read().splitlines()[-1])


def hold_as_nobody(path):
    """A user's `flock -n PATH sleep`, once it holds the lock (or failed)."""
    proc = subprocess.Popen(NOBODY + ["flock", "-n", path, "-c", "echo held; exec sleep 60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline().strip()
    return proc, first == "held"


def stop(proc):
    proc.kill()
    proc.wait(timeout=10)


def mode_of(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_user_cannot_take_the_health_check_lock_so_gating_stays_on(open_node):
    assert run_entry("healthcheck", open_node).returncode == 0
    locks = os.path.join(open_node["state"], "locks")
    lock = os.path.join(locks, "healthcheck.lock")
    assert (mode_of(locks), mode_of(lock)) == (0o700, 0o600)
    assert os.stat(lock).st_uid == 0 and os.stat(locks).st_uid == 0
    proc, held = hold_as_nobody(lock)
    try:
        assert not held
        assert "Permission denied" in proc.stderr.read()
        # Before the fix the user held it, and this run logged "skipped", exit 0.
        result = run_entry("healthcheck", open_node)
        assert result.returncode == 0, result.stderr
        assert last_log(open_node)["verdict"] == "fit"
    finally:
        stop(proc)
    for name in ("act.lock", "healthcheck.lock"):  # the act lock: the same helper
        from gpugate.node.act import _act_lock

        with _act_lock(open_node["state"], 0.1):
            pass
        proc, held = hold_as_nobody(os.path.join(locks, name))
        stop(proc)
        assert not held and mode_of(os.path.join(locks, name)) == 0o600


def test_a_lock_a_user_opened_before_the_upgrade_locks_nothing(open_node):
    """The old layout: 0644 locks in a 0755 directory, which a user opened
    and flocked before gpugate was upgraded.  chmod would leave the user's
    descriptor, and their flock, in place: the file is replaced by a fresh
    inode instead, and the directory made 0700."""
    locks = os.path.join(open_node["state"], "locks")
    os.makedirs(locks, 0o755)
    os.chmod(locks, 0o755)
    old_path = os.path.join(open_node["state"], "healthcheck.lock")  # where the old gpugate kept it
    for path in (os.path.join(locks, "healthcheck.lock"), old_path):
        with open(path, "w"):
            pass
        os.chmod(path, 0o644)
    old_inode = os.stat(os.path.join(locks, "healthcheck.lock")).st_ino
    users = [hold_as_nobody(p) for p in (os.path.join(locks, "healthcheck.lock"), old_path)]
    try:
        assert all(held for _, held in users)
        result = run_entry("healthcheck", open_node)
        assert result.returncode == 0, result.stderr
        record = last_log(open_node)
        assert record["verdict"] == "fit" and "state_error" not in record
        lock = os.path.join(locks, "healthcheck.lock")
        assert (mode_of(locks), mode_of(lock), os.stat(lock).st_uid) == (0o700, 0o600, 0)
        assert os.stat(lock).st_ino != old_inode
        assert not [n for n in os.listdir(locks) if n.startswith(".")]  # no temporary name left behind
    finally:
        for proc, _ in users:
            stop(proc)


def test_a_lock_directory_or_file_someone_else_owns_is_refused_or_replaced(tmp_path):
    from gpugate.safety.lock import LockRefused, RunLock, lock_path

    state = str(tmp_path / "state")
    path = lock_path(state, "healthcheck")
    os.makedirs(os.path.dirname(path))
    os.chown(os.path.dirname(path), 65534, 65534)
    with pytest.raises(LockRefused, match=r"owned by uid 65534.*chown 0 .*chmod 700"):
        RunLock(path).acquire()
    os.chown(os.path.dirname(path), 0, 0)
    os.symlink("/etc/passwd", path)  # planted while the directory was someone else's
    before = os.stat("/etc/passwd")
    lock = RunLock(path)
    assert lock.acquire()
    lock.release()
    assert not os.path.islink(path) and mode_of(path) == 0o600
    after = os.stat("/etc/passwd")
    assert (after.st_mode, after.st_mtime_ns, after.st_size) == (before.st_mode, before.st_mtime_ns, before.st_size)
    os.unlink(path)
    os.rmdir(os.path.dirname(path))
    os.symlink(str(tmp_path), os.path.dirname(path))
    with pytest.raises(LockRefused, match="not a directory"):
        RunLock(path).acquire()


def test_a_health_check_lock_held_past_the_whole_budget_is_reported(open_node):
    from gpugate.safety.lock import RunLock, lock_path

    assert run_entry("healthcheck", open_node).returncode == 0
    assert metrics(open_node["prom"])[("gpugate_lock_stuck_seconds", (("lock", "healthcheck"),))] == 0
    lock = RunLock(lock_path(open_node["state"], "healthcheck"))
    assert lock.acquire()
    try:
        # Held now: a run still within its budget: skipped, exit 0, as before.
        result = run_entry("healthcheck", open_node)
        record = last_log(open_node)
        assert (result.returncode, record["verdict"], record["lock_holder"]) == (0, "skipped", os.getpid())
        # Held for 1000 s (the budget is 45 s): only root can write the holder's record.
        os.pwrite(lock.fd, b"%d %.3f\n" % (os.getpid(), time.time() - 1000), 0)
        result = run_entry("healthcheck", open_node)
        record = last_log(open_node)
        assert result.returncode == 2
        assert record["verdict"] == "error"
        assert record["lock_stuck"]["pid"] == os.getpid() and 990 <= record["lock_stuck"]["seconds"] < 1100
        assert re.search(r"pid %d, for \d+s" % os.getpid(), record["error"]) and "whole budget" in record["error"]
        assert "health check lock held by" in result.stderr
        m = metrics(open_node["prom"])
        assert 990 <= m[("gpugate_lock_stuck_seconds", (("lock", "healthcheck"),))] < 1100
        assert m[("gpugate_node_fit", ())] == 1  # the rest as the last check left it
        assert mode_of(open_node["prom"]) == 0o644
    finally:
        lock.release()
    assert run_entry("healthcheck", open_node).returncode == 0
    assert last_log(open_node)["verdict"] == "fit"
    assert metrics(open_node["prom"])[("gpugate_lock_stuck_seconds", (("lock", "healthcheck"),))] == 0


def test_a_sweep_finding_an_old_holder_names_its_pid_and_age(fleet, tmp_path):
    from gpugate.model.config import load_settings
    from gpugate.sweep import run

    settings = load_settings(sim_config(tmp_path, fleet))
    held = run.lock(settings)
    assert run.lock_path(settings) == str(tmp_path / "locks" / "sweep.lock")
    assert (mode_of(str(tmp_path / "locks")), mode_of(run.lock_path(settings))) == (0o700, 0o600)
    try:
        with pytest.raises(run.SweepBusy) as busy:
            run.lock(settings)
        assert re.search(r"pid %d, for \d+s" % os.getpid(), str(busy.value)) and "stuck" not in str(busy.value)
        os.pwrite(held.fd, b"%d %.3f\n" % (os.getpid(), time.time() - 86400), 0)
        with pytest.raises(run.SweepBusy) as busy:
            run.lock(settings)
        assert re.search(r"pid %d, for 86\d\d\ds" % os.getpid(), str(busy.value))
        assert "longer than one batch's time limits" in str(busy.value)
    finally:
        held.release()
    run.lock(settings).release()
    proc, user_held = hold_as_nobody(run.lock_path(settings))
    stop(proc)
    assert not user_held


def test_a_stuck_sweep_lock_is_shown_by_sweep_status(fleet, tmp_path):
    """Issue 24 review: a sweeper holding its lock past one batch's time
    limits was said only to the next sweeper (SweepBusy); `gpugate sweep
    status` says it too (text and --json), and nothing while within bound."""
    from gpugate.model.config import load_settings
    from gpugate.sweep import run
    from gpugate.sweep.journal import Journal

    config = sim_config(tmp_path, fleet)
    settings = load_settings(config)
    Journal(settings.sweep["journal"]).close()
    held = run.lock(settings)
    try:
        out = gpugate_cmd("sweep", "status", "--config", config, check=True).stdout
        assert "STUCK" not in out
        assert json.loads(gpugate_cmd("sweep", "status", "--json", "--config", config, check=True).stdout)[
            "lock_stuck"] is None
        os.pwrite(held.fd, b"%d %.3f\n" % (os.getpid(), time.time() - 86400), 0)
        out = gpugate_cmd("sweep", "status", "--config", config, check=True).stdout
        assert re.search(r"SWEEP LOCK STUCK: pid %d has held .*sweep\.lock for 86\d\d\ds" % os.getpid(), out), out
        stuck = json.loads(gpugate_cmd("sweep", "status", "--json", "--config", config, check=True).stdout)[
            "lock_stuck"]
        assert stuck["pid"] == os.getpid() and stuck["seconds"] >= 86390 and stuck["lock"] == "sweep"
        assert stuck["bound"] == round(run.batch_bound(settings))
    finally:
        held.release()
    assert "STUCK" not in gpugate_cmd("sweep", "status", "--config", config, check=True).stdout


def _created(top):
    """Every directory and file below top, with its mode."""
    out = {}
    for where, dirs, files in os.walk(top):
        for name in dirs + files:
            path = os.path.join(where, name)
            out[path] = mode_of(path)
    return out


def test_entry_points_under_umask_000_create_nothing_others_can_write(fleet, tmp_path):
    from gpugate.node import lastgood

    top = str(tmp_path / "fresh")  # nothing exists yet: the state directory's parents are made too
    os.mkdir(top, 0o755)
    prom = os.path.join(top, "prom")  # made by gpugate too: node_exporter must reach it
    config = tmp_path / "gpugate.toml"
    config.write_text('baseline = "%s"\nstate_dir = "%s/var/lib/gpugate/{node}"\nlog = "file"\n'
                      '[healthcheck]\nboot_grace_seconds = 0\nprometheus_textfile = "%s/gpugate.prom"\n'
                      '[sim]\nfleet = "%s"\n[slurm]\nbin_dir = "%s/no-slurm-here"\n'
                      % (DEMO_BASELINE, top, prom, fleet, tmp_path))
    env = {"config": str(config)}
    kept = lastgood.directory(str(config), "gpu01")  # fixed place: /var/lib/gpugate/last-good/NODE-KEY
    shutil.rmtree(kept, ignore_errors=True)
    try:
        for mode in ("healthcheck", "prolog", "epilog"):
            result = run_entry(mode, env, umask=0)
            assert result.returncode == 0, (mode, result.stderr)
        created = _created(top)
        state = os.path.join(top, "var", "lib", "gpugate", "gpu01")
        assert os.path.join(state, "last-healthcheck.json") in created and os.path.join(state, "gpugate.log") in created
        loose = {p: "%04o" % m for p, m in created.items() if m & 0o022}
        assert not loose, loose  # before: the state directory's parents 0777, files 0666
        for path in (os.path.join(top, "var"), os.path.join(top, "var", "lib"), state):
            assert created[path] == 0o755, path  # made by gpugate: the mode it says, not the umask's
        assert created[os.path.join(state, "locks")] == 0o700
        assert {created[os.path.join(state, "locks", n)] for n in os.listdir(os.path.join(state, "locks"))} == {0o600}
        assert created[os.path.join(prom, "gpugate.prom")] == 0o644  # node_exporter (not root) reads it
        assert created[prom] == 0o755  # not the umask's 0700
        assert mode_of(kept) == 0o700 and {mode_of(os.path.join(kept, n)) for n in os.listdir(kept)} == {0o600}
        assert not mode_of(os.path.dirname(kept)) & 0o022
    finally:
        shutil.rmtree(kept, ignore_errors=True)


def test_the_prolog_sets_its_umask_before_its_nvml_reader_forks():
    """The entry script sets it first: the reader forks before gpugate.node.entry loads."""
    with open(os.path.join(ROOT, "prolog", "gpugate-prolog")) as handle:
        text = handle.read()
    assert text.index("os.umask(0o077)") < text.index("start_reader()")


def test_the_sweep_under_umask_000_makes_its_journal_and_lock_root_only(fleet, tmp_path):
    top = tmp_path / "controller"
    os.mkdir(str(top), 0o755)
    journal_dir = top / "var" / "lib" / "gpugate"
    path = sim_config(tmp_path, fleet, '[slurm]\nbin_dir = "%s/no-slurm-here"\n' % tmp_path)
    with open(path) as handle:
        text = handle.read().replace('journal = "%s/sweep.db"' % tmp_path, 'journal = "%s/sweep.db"' % journal_dir)
    with open(path, "w") as handle:
        handle.write(text)
    result = subprocess.run([sys.executable, "-m", "gpugate", "sweep", "--apply", "--config", path],
                            capture_output=True, text=True, timeout=120, preexec_fn=lambda: os.umask(0))
    assert result.returncode != 0  # no Slurm here: it stops, having made its journal and taken its lock
    created = _created(str(top))
    assert str(journal_dir / "locks" / "sweep.lock") in created, (result.stderr, sorted(created))
    loose = {p: "%04o" % m for p, m in created.items() if m & 0o022}
    assert not loose, loose
    assert created[str(journal_dir / "locks")] == 0o700 and created[str(journal_dir / "locks" / "sweep.lock")] == 0o600
    assert gpugate_cmd("--version").returncode == 0


def test_a_stuck_health_check_lock_reaches_facts_the_audit_and_status(fleet, tmp_path):
    """`gpugate status` reads Slurm, the journal and the latest audit, not a
    node's files: `gpugate facts` says whether the node's lock is stuck
    (reading /proc/locks, taking no lock), the audit keeps it, status shows it."""
    from gpugate.model.config import load_settings
    from gpugate.fleet.status import locks_stuck, render_text, summarize
    from gpugate.sweep.snapshot import take
    from gpugate.safety.lock import RunLock, lock_path

    path = sim_config(tmp_path, fleet)
    with open(path) as handle:
        text = handle.read()
    with open(path, "w") as handle:
        handle.write('state_dir = "%s/state/{node}"\n' % tmp_path + text)
    settings = load_settings(path)
    lock = RunLock(lock_path(settings.state_dir("gpu02"), "healthcheck"))
    assert lock.acquire()
    try:
        out = json.loads(gpugate_cmd("facts", "--json", "--config", path, "--node", "gpu02", check=True).stdout)
        assert out["lock_stuck"] is None  # held just now: a check within its budget
        os.pwrite(lock.fd, b"%d %.3f\n" % (os.getpid(), time.time() - 4000), 0)
        audit = gpugate_cmd("audit", "--config", path, "-w", "gpu[01-02]", "--json")
        assert audit.returncode == 0, audit.stderr
    finally:
        lock.release()
    with open(str(tmp_path / "audit.json")) as handle:
        kept = json.load(handle)
    assert list(kept["locks_stuck"]) == ["gpu02"]
    assert kept["locks_stuck"]["gpu02"]["pid"] == os.getpid() and kept["locks_stuck"]["gpu02"]["seconds"] >= 3990
    summary = summarize(take({}, "gpugate", time.time()), {}, time.time())
    summary["locks_stuck"] = locks_stuck(kept, time.time())
    shown = render_text(summary)
    assert "HEALTH CHECK LOCK STUCK on 1 nodes" in shown and "gpu02: pid %d, for 1h06m" % os.getpid() in shown
    # Released (the holder ended): facts say nothing, although the record is old.
    out = json.loads(gpugate_cmd("facts", "--json", "--config", path, "--node", "gpu02", check=True).stdout)
    assert out["lock_stuck"] is None


def test_an_act_lock_held_past_its_bound_is_reported_by_the_health_check(open_node):
    """Issue 24 review: not only the health check's lock.  The act lock
    (health check, prolog and epilog drain and resume under it) held past
    the longest of their budgets plus slurmd's margin: no run can drain or
    resume the node.  The health check still judges, and says so in its log
    line (lock_stuck) and gpugate_lock_stuck_seconds{lock="act"}; `gpugate
    facts` too (the audit and `gpugate status` read it)."""
    from gpugate.model.config import load_settings
    from gpugate.node.locks import act_bound
    from gpugate.safety.lock import RunLock, lock_path

    assert run_entry("healthcheck", open_node).returncode == 0
    assert metrics(open_node["prom"])[("gpugate_lock_stuck_seconds", (("lock", "act"),))] == 0
    lock = RunLock(lock_path(open_node["state"], "act"))
    assert lock.acquire()
    try:
        assert run_entry("healthcheck", open_node).returncode == 0
        assert "lock_stuck" not in last_log(open_node)  # held just now: within its bound
        assert act_bound(load_settings(open_node["config"])) < 1000
        os.pwrite(lock.fd, b"%d %.3f\n" % (os.getpid(), time.time() - 1000), 0)
        result = run_entry("healthcheck", open_node)
        record = last_log(open_node)
        assert result.returncode == 0 and record["verdict"] == "fit"  # judged all the same
        assert record["lock_stuck"]["lock"] == "act" and record["lock_stuck"]["pid"] == os.getpid()
        assert 990 <= record["lock_stuck"]["seconds"] < 1100
        m = metrics(open_node["prom"])
        assert 990 <= m[("gpugate_lock_stuck_seconds", (("lock", "act"),))] < 1100
        assert m[("gpugate_lock_stuck_seconds", (("lock", "healthcheck"),))] == 0
        out = json.loads(gpugate_cmd("facts", "--json", "--config", open_node["config"], "--node", "gpu01",
                                     "--max-age", "0", check=True).stdout)
        assert out["lock_stuck"]["lock"] == "act"
    finally:
        lock.release()
    assert run_entry("healthcheck", open_node).returncode == 0
    assert "lock_stuck" not in last_log(open_node)
    assert metrics(open_node["prom"])[("gpugate_lock_stuck_seconds", (("lock", "act"),))] == 0
