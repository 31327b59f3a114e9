"""Issue 24, items 3, 4, 7 (temporary files) and 5 (every file read has a
byte cap): root never writes through a name someone else chose, the
Prometheus textfile and smoke_output_dir pass the trust walk or are refused
with the fix named, a smoke proof is the job's own file or no proof, and
nothing gpugate reads can block it or grow without bound.  The user side
runs as uid 65534 through setpriv."""

import errno
import os
import shutil
import stat
import subprocess
import tempfile
import time
import types

import pytest

from conftest import DEMO_BASELINE, gpugate_cmd
from gpugate.safety import safeio
from gpugate.errors import ConfigError
from gpugate.safety.trust import Untrusted
from test_node_side import entry, metrics
from test_sweep_engine import DRIFT, FakeSlurm, events, make

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"),
                                reason="needs root and setpriv (util-linux)")
HEALTHY = os.path.join(os.path.dirname(__file__), os.pardir, "gpugate", "data", "smoke", "healthy.txt")
FIX = r"chown root .*chmod go-w"


@pytest.fixture
def top():
    """A directory any user can reach (0755, as /var/lib is), out of pytest's 0700 tmp."""
    path = tempfile.mkdtemp(prefix="gpugate-safeio-", dir="/tmp")
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def nobody_dir(top, name="user", mode=0o755):
    path = os.path.join(top, name)
    os.mkdir(path, mode)
    os.chmod(path, mode)
    os.chown(path, 65534, 65534)
    return path


def as_nobody(*argv):
    subprocess.run(NOBODY + list(argv), check=True, timeout=30)


def victim(top):
    """A root-only file a user would love root to overwrite."""
    path = os.path.join(top, "shadow")
    with open(path, "w") as handle:
        handle.write("root:secret\n")
    os.chmod(path, 0o600)
    return path


# ------------------------------------------------------------------ writes
def test_a_symlink_planted_at_the_old_temp_name_or_the_final_name_is_never_followed(top):
    """Before: gpugate.prom.tmp.<pid> opened with a plain open() wrote through a
    user's symlink into a root-only file.  Now the temporary name is random
    and created O_EXCL|O_NOFOLLOW, and the rename replaces a link at the final
    name instead of following it."""
    shadow = victim(top)
    user = nobody_dir(top)
    target = os.path.join(user, "gpugate.json")
    pid = os.getpid()
    for guess in range(pid - 20, pid + 20):  # every pid a user could guess
        as_nobody("ln", "-s", shadow, "%s.tmp.%d" % (target, guess))
    as_nobody("ln", "-s", shadow, target)
    from gpugate.safety.state import write_json

    write_json(target, {"fit": True})
    assert open(shadow).read() == "root:secret\n"
    st = os.lstat(target)
    assert stat.S_ISREG(st.st_mode) and st.st_uid == 0  # the link itself was replaced
    assert [n for n in os.listdir(user) if ".tmp" in n and not os.path.islink(os.path.join(user, n))] == []


def test_the_temp_name_is_random_and_a_planted_one_fails_the_create(top, monkeypatch):
    names = {safeio.temp_name("gpugate.prom") for _ in range(50)}
    assert len(names) == 50 and not any(str(os.getpid()) in n.split(".") for n in names)
    assert all(n.endswith(".tmp") for n in names)  # node_exporter reads *.prom only
    shadow = victim(top)
    user = nobody_dir(top)
    as_nobody("ln", "-s", shadow, os.path.join(user, ".x.guessed.tmp"))
    monkeypatch.setattr(safeio, "temp_name", lambda name: ".x.guessed.tmp")  # a lucky guess, every try
    with pytest.raises(FileExistsError):
        safeio.write_atomic(os.path.join(user, "x"), b"data")
    assert open(shadow).read() == "root:secret\n"
    assert not os.path.exists(os.path.join(user, "x"))


def test_a_failed_write_leaves_no_temporary_file(top, monkeypatch):
    def broken(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", broken)
    with pytest.raises(OSError):
        safeio.write_atomic(os.path.join(top, "state.json"), b"{}")
    monkeypatch.undo()
    assert os.listdir(top) == []


# ---------------------------------------------------------- the textfile
@pytest.fixture
def node(fleet, tmp_path, top):
    def make_node(textfile_dir):
        config = tmp_path / "gpugate.toml"
        config.write_text('baseline = "%s"\nstate_dir = "%s/state/{node}"\nlog = "file"\n'
                          '[healthcheck]\nboot_grace_seconds = 0\nprometheus_textfile = "%s/gpugate.prom"\n'
                          '[drain_budget]\njitter_seconds = 0\n'
                          '[sim]\nfleet = "%s"\n[slurm]\nbin_dir = "%s/no-slurm-here"\n'
                          % (DEMO_BASELINE, tmp_path, textfile_dir, fleet, tmp_path))
        return {"config": str(config), "state": str(tmp_path / "state" / "gpu01"), "fleet": fleet}
    return make_node


def healthcheck(env):
    out = subprocess.run([entry("healthcheck"), "--config", env["config"]], env={"SLURMD_NODENAME": "gpu01"},
                         capture_output=True, text=True, timeout=120)
    import json

    with open(os.path.join(env["state"], "gpugate.log")) as handle:
        return out, json.loads(handle.readlines()[-1])


@pytest.mark.parametrize("owner,mode", [(65534, 0o755), (0, 0o777)], ids=["owned-by-nobody", "mode-0777"])
def test_a_textfile_directory_others_can_write_is_refused_and_the_verdict_stands(node, top, owner, mode):
    textfile_dir = os.path.join(top, "textfile")
    os.mkdir(textfile_dir)
    os.chmod(textfile_dir, mode)
    os.chown(textfile_dir, owner, owner)
    shadow = victim(top)
    if owner:  # the user plants the old temporary names and the final one
        for name in ["gpugate.prom"] + ["gpugate.prom.tmp.%d" % p for p in range(300, 330)]:
            as_nobody("ln", "-s", shadow, os.path.join(textfile_dir, name))
    env = node(textfile_dir)
    gpugate_cmd("sim", "set", env["fleet"], "gpu01", "driver=550.54.15", check=True)
    out, log = healthcheck(env)
    assert out.returncode == 1  # still judged unfit (no Slurm here to drain it): the metrics change nothing
    assert log["verdict"] == "unfit" and "driver=550.54.15" in log["reason"]
    assert "prometheus_textfile" in log["metrics_error"]
    assert ("owned by uid 65534" if owner else "mode 0777") in log["metrics_error"]
    assert __import__("re").search(FIX, log["metrics_error"])
    assert open(shadow).read() == "root:secret\n"
    assert all(os.path.islink(os.path.join(textfile_dir, n)) for n in os.listdir(textfile_dir))  # nothing written


def test_the_textfile_is_written_0644_whatever_the_umask(node, top):
    textfile_dir = os.path.join(top, "textfile")
    os.mkdir(textfile_dir, 0o755)
    env = node(textfile_dir)
    old = os.umask(0o077)
    try:
        out, log = healthcheck(env)
    finally:
        os.umask(old)
    prom = os.path.join(textfile_dir, "gpugate.prom")
    assert out.returncode == 0 and "metrics_error" not in log
    assert stat.S_IMODE(os.stat(prom).st_mode) == 0o644  # node_exporter, not root, reads it
    assert metrics(prom)[("gpugate_node_fit", ())] == 1
    assert os.listdir(textfile_dir) == ["gpugate.prom"]


# ------------------------------------------------------------ the smoke proof
class SmokeSlurm(FakeSlurm):
    """FakeSlurm that runs a smoke job: ``job(path)`` does what the job's
    slurmstepd and command would do to the --output file."""

    def __init__(self, job, **kwargs):
        super().__init__(**kwargs)
        self.job, self.submitted, self.next_id = job, [], 1

    def undrain(self, names):
        for name in self._names(names):
            self._set(name, flags=set(self.states[name].flags) - {"DRAIN"}, reason="")

    def cancel_named(self, name, reservation):
        pass

    def cancel_job_ids(self, jobs):
        pass

    def submit_job(self, spec):
        job = str(self.next_id)
        self.next_id += 1
        self.submitted.append(spec)
        self.job(spec["output"])
        return job

    def job_states(self, jobs):
        from gpugate.slurm.jobs import JobState

        return {j: JobState(j, "COMPLETED", 0) for j in jobs}


def write_output(text):
    def job(path):  # slurmstepd: open(O_CREAT|O_TRUNC) as the job's user (root), then the command writes
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, text.encode())
        os.close(fd)
    return job


def sweep_with_smoke(tmp_path, outdir, job):
    slurm = SmokeSlurm(job, count=4, drained=("gpu001",), reboot_polls=1)
    sweeper, journal, _ = make(tmp_path, slurm, smoke=["/opt/nccl-tests/all_reduce_perf", "-g", "{gpus}"],
                               smoke_output_dir=outdir, pairs=False)
    sweeper.baseline.expect_for = lambda node: types.SimpleNamespace(gpus=4, product="demo")
    sweeper.baseline.smoke_min_busbw, sweeper.baseline.smoke_min_pair_busbw = {}, {}
    return slurm, sweeper, journal


def test_a_healthy_smoke_job_writes_the_file_the_sweeper_made_and_the_node_resumes(tmp_path, top):
    outdir = os.path.join(top, "smoke")
    slurm, sweeper, journal = sweep_with_smoke(tmp_path, outdir, write_output(open(HEALTHY).read()))
    report = sweeper.run()
    assert report.outcomes["gpu001"].result == "resumed", events(journal, "gpu001")
    assert stat.S_IMODE(os.stat(outdir).st_mode) == 0o755  # made by root
    made = slurm.submitted[0]["output"]
    assert os.path.basename(made).startswith("gpugate-smoke-gpu001-") and not made.endswith("-1.out")
    assert os.listdir(outdir) == ["gpugate-smoke-gpu001-1.out"]  # named after its job once judged
    st = os.stat(os.path.join(outdir, "gpugate-smoke-gpu001-1.out"))
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o600


def test_a_smoke_output_dir_a_user_can_write_is_refused_and_no_node_resumes(tmp_path, top):
    """Before: a user planted gpugate-smoke-<node>-<next job>.out with made-up
    nccl-tests output and the node was resumed on it."""
    outdir = nobody_dir(top, "smoke")
    # The user's copy of a passing table, from a place the user can read
    # (the checkout may sit under a 0700 directory, as mktemp -d makes).
    readable = os.path.join(top, "healthy.out")
    shutil.copyfile(HEALTHY, readable)
    os.chmod(readable, 0o644)
    as_nobody("cp", readable, os.path.join(outdir, "gpugate-smoke-gpu001-1.out"))
    slurm, sweeper, journal = sweep_with_smoke(tmp_path, outdir, write_output(""))
    report = sweeper.run()
    assert report.outcomes["gpu001"].result != "resumed" and not slurm.resumed
    assert "smoke_output_dir" in report.stopped and "owned by uid 65534" in report.stopped
    assert __import__("re").search(FIX, report.stopped)
    assert not slurm.submitted  # refused before any job, before any drain was lifted
    assert slurm.states["gpu001"].reason == DRIFT or "gpugate" in slurm.states["gpu001"].reason


def test_a_file_that_was_there_before_the_job_is_never_the_proof(tmp_path, top):
    """The output names are the sweeper's own (O_EXCL, random): an old file at
    the name the job id would give, with a passing table, is not read; a job
    that never opened its output proves nothing."""
    outdir = os.path.join(top, "smoke")
    os.mkdir(outdir, 0o755)
    with open(os.path.join(outdir, "gpugate-smoke-gpu001-1.out"), "w") as handle:
        handle.write(open(HEALTHY).read())
    slurm, sweeper, journal = sweep_with_smoke(tmp_path, outdir, lambda path: None)
    report = sweeper.run()
    assert report.outcomes["gpu001"].result != "resumed" and not slurm.resumed
    assert any("never opened its output" in str(e) for e in journal.events("gpu001"))


@pytest.mark.parametrize("swap", ["fifo", "dev-zero", "another-file"])
def test_a_swapped_output_is_refused_at_once_and_proves_nothing(tmp_path, top, swap):
    """A FIFO at the output name used to block the sweeper in open() while it
    held its lock and reservation; a symlink to /dev/zero read without bound."""
    healthy = open(HEALTHY).read()

    def job(path):
        os.unlink(path)
        if swap == "fifo":
            os.mkfifo(path, 0o600)
        elif swap == "dev-zero":
            os.symlink("/dev/zero", path)
        else:
            write_output(healthy)(path)  # a new inode with a passing table

    outdir = os.path.join(top, "smoke")
    slurm, sweeper, journal = sweep_with_smoke(tmp_path, outdir, job)
    started = time.monotonic()
    report = sweeper.run()
    assert time.monotonic() - started < 30
    assert report.outcomes["gpu001"].result != "resumed" and not slurm.resumed
    want = {"fifo": "FIFO", "dev-zero": "symbolic link", "another-file": "not the file the sweeper created"}[swap]
    assert "smoke_output_dir" in report.stopped and want in report.stopped, report.stopped


def test_run_smoke_by_hand_refuses_an_untrusted_directory(top):
    from gpugate.sweep.slurm_smoke import run_smoke

    outdir = nobody_dir(top, "smoke", 0o755)
    slurm = SmokeSlurm(write_output(""), count=1)
    slurm.res["r"] = "gpu001"
    with pytest.raises(Untrusted, match=FIX):
        run_smoke(slurm, {"smoke_output_dir": outdir}, None, ["gpu001"], "r")
    assert not slurm.submitted


# ------------------------------------------------------------ bounded reads
def run_bounded(code, timeout=10):
    """Run code in a child: a read that blocks is a timeout, not a hung suite."""
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    return out.stdout.strip() + out.stderr.strip()[-300:]


def test_a_fifo_or_a_device_is_refused_without_blocking(top):
    fifo = os.path.join(top, "fifo")
    os.mkfifo(fifo, 0o644)
    link = os.path.join(top, "zero")
    os.symlink("/dev/zero", link)
    code = ("from gpugate.safety import safeio\nfor p, follow in ((%r, True), (%r, True), (%r, False)):\n"
            "    try:\n        safeio.read_capped(p, 1 << 20, follow=follow); print('read', p)\n"
            "    except OSError as exc:\n        print(exc.strerror)\n" % (fifo, link, link))
    said = run_bounded(code).splitlines()
    assert said == ["is not a regular file (a FIFO); refused unread",
                    "is not a regular file (a device); refused unread", "is a symbolic link; refused unread"]


def test_a_probe_file_that_is_a_fifo_is_a_finding_not_a_hang(top):
    from gpugate.probes.files import read_text

    os.makedirs(os.path.join(top, "proc", "sys", "kernel"))
    os.mkfifo(os.path.join(top, "proc", "sys", "kernel", "osrelease"))
    code = ("from gpugate.probes.files import read_text\nprint(read_text(%r, '/proc/sys/kernel/osrelease', 'kernel'))"
            % top)
    assert "not a regular file" in run_bounded(code)
    with open(os.path.join(top, "big"), "wb") as handle:
        handle.truncate((1 << 20) + 1)
    failure = read_text(top, "/big", "image")
    assert failure.kind == "error" and "cap of 1048576 bytes" in failure.detail


def test_an_oversized_config_or_baseline_is_refused_not_parsed(tmp_path):
    from gpugate.model.schema import load_toml

    big = tmp_path / "baseline.toml"
    with open(big, "wb") as handle:
        handle.truncate(2 << 30)  # 2 GB (sparse): refused by its size, before a byte is read
    os.utime(str(big), (1, 1))
    started = time.monotonic()
    with pytest.raises(ConfigError, match="cap of 4194304 bytes"):
        load_toml(str(big), "baseline")
    assert time.monotonic() - started < 5
    almost = tmp_path / "gpugate.toml"
    almost.write_text("# padding\n" * ((safeio.CONFIG_CAP // 10) + 1))
    os.utime(str(almost), (1, 1))
    with pytest.raises(ConfigError, match="cannot read gpugate configuration: larger than gpugate's cap"):
        load_toml(str(almost), "gpugate configuration")


def test_state_over_its_cap_is_no_state(tmp_path):
    from gpugate.safety.state import read_json

    path = tmp_path / "last-healthcheck.json"
    path.write_text('{"fit": true, "pad": "%s"}' % ("x" * safeio.STATE_CAP))
    assert read_json(str(path)) is None
    path.write_text('{"fit": true}')
    assert read_json(str(path)) == {"fit": True}


def test_the_log_line_is_appended_below_the_state_directory_never_through_a_link(tmp_path):
    """Issue 24 review (nice-to-have a): node/logline.py appended with
    open(path, "a") and rotated with os.replace by path: a symlink named
    gpugate.log (or .1) had root append to, or rename, whatever it named."""
    from gpugate.node import logline

    state = tmp_path / "state"
    state.mkdir()
    victim = tmp_path / "root-only"
    victim.write_text("precious\n")
    (state / "gpugate.log").symlink_to(victim)
    assert not logline._append(str(state / "gpugate.log"), '{"verdict":"fit"}')  # refused: syslog takes it
    assert victim.read_text() == "precious\n"
    os.unlink(str(state / "gpugate.log"))
    os.mkfifo(str(state / "gpugate.log"))
    assert not logline._append(str(state / "gpugate.log"), '{"verdict":"fit"}')  # no hang, nothing written
    os.unlink(str(state / "gpugate.log"))
    assert logline._append(str(state / "gpugate.log"), '{"verdict":"fit"}')
    assert logline._append(str(state / "gpugate.log"), '{"verdict":"unfit"}')
    assert (state / "gpugate.log").read_text() == '{"verdict":"fit"}\n{"verdict":"unfit"}\n'
    assert stat.S_IMODE(os.stat(str(state / "gpugate.log")).st_mode) & 0o077 == 0
    with open(str(state / "gpugate.log"), "a") as handle:
        handle.write("x" * (logline._ROTATE_BYTES + 1))
    assert logline._append(str(state / "gpugate.log"), '{"verdict":"fit"}')  # rotated inside the directory
    assert (state / "gpugate.log").read_text() == '{"verdict":"fit"}\n'
    assert (state / "gpugate.log.1").stat().st_size > logline._ROTATE_BYTES


def test_the_drain_marker_is_made_below_the_state_directory_never_through_a_link(tmp_path):
    """Issue 24 review (nice-to-have a): node/act.py made its marker with
    os.makedirs and open(path, "w"): through a symlink planted as the
    marker, root truncated the file it named."""
    from gpugate.node import act

    state = tmp_path / "state"
    state.mkdir()
    victim = tmp_path / "root-only"
    victim.write_text("precious\n")
    marker = state / "drained-by-gpugate"
    marker.symlink_to(victim)
    act._set_marker(str(marker), True)
    assert victim.read_text() == "precious\n"  # before: truncated
    act._set_marker(str(marker), False)  # the name goes, not what it named
    assert not os.path.lexists(str(marker)) and victim.read_text() == "precious\n"
    act._set_marker(str(tmp_path / "new" / "m"), True)  # the state directory made on the way
    assert os.path.isfile(str(tmp_path / "new" / "m"))
    act._set_marker(str(tmp_path / "new" / "m"), False)
    act._set_marker(str(tmp_path / "gone" / "m"), False)  # nothing to remove: nothing made
    assert not os.path.exists(str(tmp_path / "new" / "m")) and not os.path.exists(str(tmp_path / "gone"))
