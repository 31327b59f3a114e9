"""Fault matrix, node side without Slurm: bad and changing configuration,
state directory faults, clock jumps.  docs/explanation/reliability.md lists each row and
the test that shows it."""

import os
import threading
import time

import pytest

from gpugate.model import schema
from gpugate.model.baseline import load_baseline
from gpugate.errors import ConfigError

from conftest import DEMO_BASELINE


def _text(path):
    with open(path) as handle:
        return handle.read()


def _valid_prefix(text):
    """A prefix of ``text`` that is itself a valid baseline but not the whole
    (what a reader sees of a file rewritten in place, between two writes)."""
    cut = text.index("[pin.vbios]")
    return text[:cut]


def test_a_valid_prefix_would_be_a_different_baseline(tmp_path):
    """The hazard is real: half of the demo baseline loads, with no VBIOS pin."""
    path = tmp_path / "half.toml"
    path.write_text(_valid_prefix(_text(DEMO_BASELINE)))
    half = load_baseline(str(path))
    assert not half.pin.vbios and load_baseline(DEMO_BASELINE).pin.vbios


def test_baseline_rewritten_in_place_while_read_is_whole_or_an_error(tmp_path):
    whole = _text(DEMO_BASELINE)
    other = whole.replace('name = "demo-h100-r580"', 'name = "other-h100-r580"')
    path = str(tmp_path / "baseline.toml")
    with open(path, "w") as handle:
        handle.write(whole)
    os.utime(path, (time.time() - 10, time.time() - 10))
    stop = threading.Event()

    def writer():
        # An in-place rewrite (truncate, write half, pause, write the rest),
        # then a quiet moment, over and over: git checkout and cp do this.
        texts = [other, whole]
        while not stop.is_set():
            text = texts[0]
            texts.reverse()
            with open(path, "w") as handle:
                handle.write(_valid_prefix(text))
                handle.flush()
                time.sleep(0.15)
                handle.write(text[len(_valid_prefix(text)):])
            time.sleep(0.6)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    seen, errors = [], []
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                baseline = load_baseline(path)
            except ConfigError as exc:
                errors.append(str(exc))
                continue
            seen.append((baseline.name, bool(baseline.pin.vbios)))
    finally:
        stop.set()
        thread.join(5)
    # Every baseline read is one of the two whole files, never the half.
    assert seen and all(vbios for _, vbios in seen), seen
    assert {name for name, _ in seen} <= {"demo-h100-r580", "other-h100-r580"}
    # An error is safe (gpugate changes nothing): mostly "being rewritten"; a writer
    # stalled past SETTLE_SECONDS mid-write on a loaded machine can leave a
    # half that does not validate, which is refused as such, naming the file.
    assert all(e.startswith(path + ":") for e in errors), errors


def test_a_file_that_keeps_changing_is_an_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.setattr(schema, "SETTLE_LIMIT", 0.5)
    path = str(tmp_path / "baseline.toml")
    with open(path, "w") as handle:
        handle.write(_text(DEMO_BASELINE))
    stop = threading.Event()

    def toucher():
        while not stop.is_set():
            os.utime(path)
            time.sleep(0.02)

    thread = threading.Thread(target=toucher, daemon=True)
    thread.start()
    try:
        with pytest.raises(ConfigError, match="being rewritten") as info:
            load_baseline(path)
    finally:
        stop.set()
        thread.join(5)
    assert path in str(info.value) and "rename it into place" in str(info.value)


def test_a_file_from_the_future_is_read_once_it_holds_still(tmp_path):
    """mtime ahead of the clock (cp -p from a skewed host, a clock stepped
    back): read after one settle interval, not refused forever."""
    path = str(tmp_path / "baseline.toml")
    with open(path, "w") as handle:
        handle.write(_text(DEMO_BASELINE))
    os.utime(path, (time.time() + 3600, time.time() + 3600))
    started = time.monotonic()
    assert load_baseline(path).name == "demo-h100-r580"
    assert time.monotonic() - started < schema.SETTLE_LIMIT


# ------------------------------------------------------ ownership of files
def _node_config(tmp_path, fleet, **over):
    text = ('baseline = "%s"\nstate_dir = "%s/state/{node}"\nlog = "file"\n'
            '[healthcheck]\nboot_grace_seconds = 0\n[sim]\nfleet = "%s"\n[slurm]\nbin_dir = "%s/no-slurm"\n'
            # No Slurm to spread a drift out for: no jitter before the (failing) read.
            '[drain_budget]\njitter_seconds = 0\n'
            % (over.get("baseline", DEMO_BASELINE), tmp_path, fleet, tmp_path))
    path = tmp_path / "gpugate.toml"
    path.write_text(text)
    path.chmod(0o644)
    return str(path)


def _entry(mode, config, node="gpu01"):
    import subprocess
    import sysconfig

    return subprocess.run([os.path.join(sysconfig.get_path("scripts"), "gpugate-" + mode), "--config", config],
                          env={"SLURMD_NODENAME": node}, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("what", ["config", "baseline", "state"])
def test_files_others_could_write_are_refused_with_the_fix(fleet, tmp_path, what):
    baseline = tmp_path / "baseline.toml"
    baseline.write_text(_text(DEMO_BASELINE))
    baseline.chmod(0o644)
    config = _node_config(tmp_path, fleet, baseline=str(baseline))
    state = tmp_path / "state" / "gpu01"
    state.mkdir(parents=True)
    target = {"config": config, "baseline": str(baseline), "state": str(state)}[what]
    assert _entry("healthcheck", config).returncode == 0  # secure: accepted
    os.chmod(target, 0o777 if what == "state" else 0o666)
    result = _entry("healthcheck", config)
    # A file refused: judged with its last good copy (fit: 0); the state
    # directory has no copy to fall back to: nothing is done (2).
    assert result.returncode == (2 if what == "state" else 0)
    assert "must be owned by root and not writable by group or others" in result.stderr
    assert target in result.stderr and "chmod go-w %s" % target in result.stderr
    assert "Traceback" not in result.stderr
    # The prolog logs the same error and lets the job run (exit 0).
    prolog = _entry("prolog", config)
    assert prolog.returncode == 0 and "chmod go-w" in prolog.stderr
    os.chmod(target, 0o755 if what == "state" else 0o644)
    os.chown(target, 65534, -1)  # nobody
    result = _entry("healthcheck", config)
    assert result.returncode == (2 if what == "state" else 0) and "owned by root" in result.stderr


# ------------------------------------------- probes failing in odd ways
def _check(fleet, mode="healthcheck", node="gpu01"):
    import json

    from conftest import gpugate_cmd

    result = gpugate_cmd("check", "--sim", fleet, "--node", node, "--baseline", DEMO_BASELINE,
                         "--mode", mode, "--json")
    assert result.returncode in (0, 1), result.stderr
    assert "Traceback" not in result.stderr
    return json.loads(result.stdout)


def _sim(*args):
    from conftest import gpugate_cmd

    result = gpugate_cmd("sim", *args)
    assert result.returncode == 0, result.stderr


def _components(data):
    return {(f["component"], f["gpu"], f["observed"]) for f in data["findings"]}


@pytest.mark.parametrize("code, cls", [(15, "health"), (999, "probe")])
def test_nvml_failing_mid_run_on_one_gpu(fleet, code, cls):
    """GPU 3 answers the first calls, then one call fails: GPU_IS_LOST is the
    GPU gone (health); an unknown error is "could not tell" (probe) for that
    GPU's field alone, the other seven GPUs are still judged."""
    _sim("set", fleet, "gpu01", "gpu.3.nvml_error.nvmlDeviceGetRemappedRows=%d" % code)
    data = _check(fleet)
    assert not data["fit"] and data["class"] == cls
    assert {f["gpu"] for f in data["findings"]} == {3}
    assert all(g.get("index") is not None for g in data["facts"]["nvml"]["gpus"])


@pytest.mark.parametrize("stdout, code", [
    ("not json at all {", 0),       # garbage, success exit
    ("", 255),                       # dcgmi's generic failure
    ('{"DCGM Diagnostic": ', 226),   # "a test failed", but unreadable
    ("\x00\xff garbage", 205),
])
def test_dcgmi_diag_garbage_or_failure_exit_is_never_a_pass(fleet, tmp_path, stdout, code):
    out = tmp_path / "out"
    out.write_bytes(stdout.encode("latin-1"))
    _sim("replay", fleet, "gpu01", "--stdout-file", str(out), "--exit-code", str(code),
         "--", "dcgmi", "diag", "-r", "1", "-j")  # verify's first level
    data = _check(fleet, "verify")
    assert not data["fit"] and data["class"] == "probe"
    assert [f["component"] for f in data["findings"]] == ["dcgm_diag"]


@pytest.mark.parametrize("stdout, code", [("garbage", 0), ("", 255), ("{}", 0)])
def test_dcgmi_health_garbage_is_probe(fleet, tmp_path, stdout, code):
    out = tmp_path / "out"
    out.write_text(stdout)
    _sim("replay", fleet, "gpu01", "--stdout-file", str(out), "--exit-code", str(code),
         "--", "dcgmi", "health", "-c", "-j")
    data = _check(fleet)
    assert data["class"] == "probe" and [f["component"] for f in data["findings"]] == ["dcgm_health"]


@pytest.mark.parametrize("how", ["missing", "directory", "unreadable"])
def test_kernel_log_unreadable_is_probe_not_a_silent_pass(fleet, how):
    kmsg = os.path.join(fleet, "gpu01", "root", "dev", "kmsg")
    os.unlink(kmsg)
    if how == "directory":
        os.mkdir(kmsg)
    elif how == "unreadable":
        os.symlink("/proc/self/mem", kmsg)  # opens, then EIO on read
    data = _check(fleet)
    assert data["class"] == "probe"
    assert [f["component"] for f in data["findings"]] == ["xid"]


# ------------------------------------------------ state directory faults
@pytest.fixture
def small_tmpfs(tmp_path):
    """A 256 KiB file system for the state directory, unmounted afterwards."""
    import subprocess

    mnt = tmp_path / "state"
    mnt.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0755", "tmpfs", str(mnt)],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, "mounting a tmpfs needs root: %s" % result.stderr
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def _fill(directory):
    with open(os.path.join(str(directory), "filler"), "wb") as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError:
            pass


def _last(state):
    import json

    with open(os.path.join(str(state), "gpu01", "last-healthcheck.json")) as handle:
        return json.load(handle)


def test_state_directory_full_the_check_still_judges_and_no_stale_fit_stays(fleet, tmp_path, small_tmpfs):
    config = _node_config(tmp_path, fleet)
    first = _entry("healthcheck", config)
    assert first.returncode == 0, first.stderr
    assert _last(small_tmpfs)["fit"] is True
    _fill(small_tmpfs)
    # Acute (Xid 79): no drain budget to read before refusing the job.
    _sim("set", fleet, "gpu01", "gpu.3.xid=79")
    result = _entry("healthcheck", config)
    assert result.returncode == 1 and "Traceback" not in result.stderr  # unfit, judged
    # The old "fit" record is gone: the prolog cannot reuse it.
    assert not os.path.exists(os.path.join(str(small_tmpfs), "gpu01", "last-healthcheck.json"))
    prolog = _entry("prolog", config)
    assert prolog.returncode == 1 and "Traceback" not in prolog.stderr  # still refuses the job


def test_state_directory_read_only_the_check_still_judges(fleet, tmp_path, small_tmpfs):
    import subprocess

    config = _node_config(tmp_path, fleet)
    subprocess.run(["mount", "-o", "remount,ro", str(small_tmpfs)], check=True, timeout=30)
    _sim("set", fleet, "gpu01", "gpu.3.xid=79")
    result = _entry("healthcheck", config)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert _entry("prolog", config).returncode == 1
    assert _entry("epilog", config, ).returncode in (0, 1)


# ----------------------------------------------------------- clock jumps
def test_a_verdict_from_the_future_is_not_reused(fleet, tmp_path):
    """The clock stepped back an hour after a fit health check: the prolog
    must judge afresh, not trust a record "younger than 15 minutes" for an hour."""
    import json

    config = _node_config(tmp_path, fleet)
    assert _entry("healthcheck", config).returncode == 0
    path = os.path.join(str(tmp_path), "state", "gpu01", "last-healthcheck.json")
    with open(path) as handle:
        last = json.load(handle)
    last["at"] = time.time() + 3600
    with open(path, "w") as handle:
        json.dump(last, handle)
    _entry("prolog", config)
    with open(os.path.join(str(tmp_path), "state", "gpu01", "gpugate.log")) as handle:
        record = json.loads(handle.read().splitlines()[-1])
    assert record["mode"] == "prolog" and record["reused"] is False


def test_boot_time_in_the_future_is_no_boot_grace(fleet, tmp_path):
    """A clock stepped back makes "seconds since boot" negative: that must
    not read as "just booted" and hide findings behind the boot grace."""
    import json

    config = tmp_path / "gpugate.toml"
    _node_config(tmp_path, fleet)
    config.write_text(config.read_text().replace("boot_grace_seconds = 0", "boot_grace_seconds = 300"))
    stat = os.path.join(fleet, "gpu01", "root", "proc", "stat")
    with open(stat) as handle:
        text = handle.read()
    future = int(time.time()) + 3600
    with open(stat, "w") as handle:
        handle.write("\n".join("btime %d" % future if line.startswith("btime") else line
                               for line in text.splitlines()) + "\n")
    os.unlink(os.path.join(fleet, "gpu01", "bin", "dcgmi"))  # a probe finding: what the grace hides
    assert _entry("healthcheck", str(config)).returncode == 1
    with open(os.path.join(str(tmp_path), "state", "gpu01", "gpugate.log")) as handle:
        record = json.loads(handle.read().splitlines()[-1])
    assert record["verdict"] == "unfit" and not record.get("boot_grace")


# ------------------------------------------------- unusual node names
from hypothesis import given, settings as hsettings, strategies as hst  # noqa: E402

from gpugate.core.names import check_node_name, is_node_name  # noqa: E402


@hsettings(max_examples=500, deadline=None)
@given(hst.one_of(hst.text(max_size=80), hst.from_regex(r"[a-z0-9._\-/$;'\"` ]{1,20}", fullmatch=True)))
def test_a_node_name_is_safe_in_paths_and_argv_or_refused(name):
    try:
        checked = check_node_name(name)
    except ConfigError as exc:
        assert "not a plain host name" in str(exc)
        assert not is_node_name(name)
        return
    assert checked == name and name.isascii() and name.isprintable()
    assert not name.startswith(("-", ".")) and "/" not in name and ".." not in name
    assert not any(c in name for c in " $;'\"`[],|*@!&^")


@pytest.mark.parametrize("name", ["../../etc", "-oProxyCommand=x", "gpu 01", "gpu01;rm", "gpu[01-02]"])
def test_an_unsafe_slurmd_nodename_is_refused_and_nothing_is_written(fleet, tmp_path, name):
    config = _node_config(tmp_path, fleet)
    before = set(os.listdir(str(tmp_path)))
    for mode in ("healthcheck", "prolog"):
        result = _entry(mode, config, node=name)
        assert result.returncode == (2 if mode == "healthcheck" else 0)
        assert "not a plain host name" in result.stderr and "Traceback" not in result.stderr
    assert set(os.listdir(str(tmp_path))) == before  # no state dir made, nothing outside


def test_the_sweep_plans_around_an_unsafe_name_and_never_expands_it():
    from gpugate.slurm.nodestate import NodeState
    from gpugate.sweep.plan import Options, plan
    from gpugate.sweep.snapshot import take
    from gpugate.node.transport import expand

    reason = "gpugate: drift driver=550.54.15 (want 580.65.06)"
    states = {n: NodeState(n, "IDLE", frozenset({"DRAIN"}), reason, 100, "root", ("gpu",))
              for n in ("gpu01", "-oProxyCommand=x")}
    states.update({"gpu%02d" % i: NodeState("gpu%02d" % i, "IDLE", frozenset(), "", None, "", ("gpu",))
                   for i in range(2, 10)})
    result = plan(take(states, "gpugate:", 1000.0), Options())
    planned = {n for b in result.batches for n in b.nodes}
    assert "gpu01" in planned and "-oProxyCommand=x" not in planned
    assert "unsafe" in result.decisions["-oProxyCommand=x"].why
    with pytest.raises(ConfigError, match="not a plain host name"):
        expand(["ansible-playbook", "--limit", "{nodes}"], ["gpu01", "-oProxyCommand=x"])


# --------------------------------------------------- more clock steps
def test_xid_window_is_unmoved_by_a_clock_step():
    """/proc/stat's btime moves with the wall clock, so a step moves boot
    time and "now" together: the same Xids are fresh before and after."""
    from gpugate.probes.kernlog import fresh_xids

    text = "\n".join("4,%d,%d,-;NVRM: Xid (PCI:0000:1b:00): 79, pid=1, GPU has fallen off the bus." % (
        seq, usec) for seq, usec in ((10, 5_000_000), (11, 3_000_000_000)))
    boot, now = 1_700_000_000.0, 1_700_000_000.0 + 3_100
    for step in (0.0, -86400.0, 86400.0 * 30):
        seen = fresh_xids(text, boot + step, -1, 600.0, now + step, {"0000:1b:00": 2})
        assert [(e.seq, e.gpu) for e in seen] == [(11, 2)]


def test_a_published_hold_asks_nothing_until_the_findings_change(tmp_path):
    """A node that published its findings (for the budget keeper) asks the
    controller nothing while they stay the same, whenever they were first
    published, until its proof needs signing again (issue 33, item 6: once
    every REFRESH_SECONDS, or when the clock stepped back past it, or for a
    record of a gpugate before proofs); new findings or a damaged record
    make it read and publish again."""
    import json
    from gpugate.core.record import replace

    from gpugate.model.config import parse_settings
    from gpugate.node import hold
    from gpugate.model.verdict import decide
    from gpugate.model.findings import Finding

    settings = replace(parse_settings({}, "(test)"), state_dir_template=str(tmp_path / "{node}"))
    verdict = decide([Finding("drift", "driver", "550.54.15", "580.65.06", "reconverge")], "gpugate:")
    (tmp_path / "gpu01").mkdir()
    path = tmp_path / "gpu01" / hold.PUBLISHED
    from gpugate.slurm.pending import REFRESH_SECONDS

    for since in (time.time() - 10, time.time() + 3600, time.time() - 86400 * 30, "yesterday"):
        path.write_text(json.dumps({"since": since, "seen": time.time() - 10, "reason": verdict.reason}))
        assert "budget keeper" in hold.held_recently(settings, "gpu01", verdict)
    for seen in (time.time() - REFRESH_SECONDS - 1, time.time() + 3600, None):
        path.write_text(json.dumps({"since": time.time() - 10, "seen": seen, "reason": verdict.reason}))
        assert hold.held_recently(settings, "gpu01", verdict) is None  # sign it again
    path.write_text("{not json")
    assert hold.held_recently(settings, "gpu01", verdict) is None  # damaged: read and publish again
    other = decide([Finding("drift", "kernel", "6.1.0-26-amd64", "6.1.0-27-amd64", "reconverge")], "gpugate:")
    path.write_text(json.dumps({"since": time.time(), "seen": time.time(), "reason": verdict.reason}))
    assert hold.held_recently(settings, "gpu01", other) is None  # findings changed: read again


def test_sweep_deadlines_use_the_monotonic_clock():
    """A wall-clock step during a sweep must not cut short or stretch its
    waits: every deadline in the sweep is taken from time.monotonic(), in its
    one deadline-poll helper (sweep/waits.py), which every wait goes through."""
    import ast
    import inspect

    from gpugate.sweep import engine
    from gpugate.sweep import steps
    from gpugate.sweep import waits

    deadlines = []
    for module in (engine, steps, waits):
        tree = ast.parse(inspect.getsource(module))
        deadlines += [node for node in ast.walk(tree) if isinstance(node, ast.Assign)
                      and any(isinstance(t, ast.Name) and "deadline" in t.id for t in node.targets)]
        assert "time.time()" not in inspect.getsource(module)  # the wall clock only through Sweeper.clock
    assert deadlines
    for node in deadlines:
        assert "time.monotonic()" in ast.unparse(node.value)
    assert "deadline" not in inspect.getsource(engine) + inspect.getsource(steps)  # no hand-written loop
    source = inspect.getsource(steps)
    # The sweep's waits: jobs to end, slurmd to register, the node back in service.
    assert source.count("self._wait(nodes, settle,") == 3 and "poll_until(" in source


def test_budgeted_finding_with_slurm_unreachable_lets_the_job_run(fleet, tmp_path):
    """A drift (what a bad baseline push causes everywhere) cannot be weighed
    against the drain budget while Slurm does not answer: the prolog neither
    drains nor exits non-zero (slurmd would drain 'Prolog error' outside the
    budget); an acute finding still refuses the job."""
    import json

    config = _node_config(tmp_path, fleet, ownership="false")
    _sim("set", fleet, "gpu01", "driver=550.54.15")
    prolog = _entry("prolog", config)
    assert prolog.returncode == 0, prolog.stderr
    with open(os.path.join(str(tmp_path), "state", "gpu01", "gpugate.log")) as handle:
        line = json.loads(handle.read().splitlines()[-1])
    assert line["verdict"] == "unfit" and line["action"] == "held" and "not published yet" in line["why"]
    assert _entry("epilog", config).returncode == 0
    _sim("set", fleet, "gpu01", "gpu.3.xid=79")
    assert _entry("prolog", config).returncode == 1


def test_a_gpu_the_node_showed_before_and_lost_is_acute(fleet, tmp_path):
    """gpus=7 on an 8-GPU node: the count the baseline expects is budgeted,
    but fewer GPUs than this node itself showed is a lost GPU (acute), in
    the health check and in the prolog."""
    import json

    from gpugate.model.findings import is_acute

    config = _node_config(tmp_path, fleet, ownership="false")
    assert _entry("healthcheck", config).returncode == 0
    _sim("set", fleet, "gpu01", "gpus=7")
    assert _entry("healthcheck", config).returncode == 1
    assert _entry("prolog", config).returncode == 1  # acute: refused without reading the budget
    with open(os.path.join(str(tmp_path), "state", "gpu01", "gpugate.log")) as handle:
        health, prolog = [json.loads(line) for line in handle.read().splitlines()[-2:]]
    for record in (health, prolog):
        assert record["reason"].startswith("gpugate: health gpus_lost=7 (want 8 as before)"), record
    assert is_acute("health", "gpus_lost")
    # A node that never showed 8 (first run on 7): only the budgeted count finding.
    os.unlink(os.path.join(str(tmp_path), "state", "gpu01", "last-healthcheck.json"))
    assert _entry("healthcheck", config).returncode == 1
    with open(os.path.join(str(tmp_path), "state", "gpu01", "gpugate.log")) as handle:
        record = json.loads(handle.read().splitlines()[-1])
    assert "gpus_lost" not in record["reason"] and "gpu_count=7 (want 8)" in record["reason"]
