"""Fault matrix, node side without Slurm: bad and changing configuration,
state directory faults, clock jumps.  docs/reliability.md lists each row and
the test that shows it."""

import os
import threading
import time

import pytest

from gpugate import schema
from gpugate.baseline import load_baseline
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
    assert all("being rewritten" in e for e in errors), errors


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
    text = ('baseline = "%s"\nstate_dir = "%s/state/{node}"\nlog = "file"\ncheck_ownership = true\n'
            '[healthcheck]\nboot_grace_seconds = 0\n[sim]\nfleet = "%s"\n[slurm]\nbin_dir = "%s/no-slurm"\n'
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
    assert result.returncode == 2
    assert "must be owned by root and not writable by group or others" in result.stderr
    assert target in result.stderr and "chmod go-w %s" % target in result.stderr
    assert "Traceback" not in result.stderr
    # The prolog logs the same error and lets the job run (exit 0).
    prolog = _entry("prolog", config)
    assert prolog.returncode == 0 and "chmod go-w" in prolog.stderr
    os.chmod(target, 0o755 if what == "state" else 0o644)
    os.chown(target, 65534, -1)  # nobody
    result = _entry("healthcheck", config)
    assert result.returncode == 2 and "owned by root" in result.stderr
