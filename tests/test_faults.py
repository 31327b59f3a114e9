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
