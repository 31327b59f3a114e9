"""scripts/isolated, which every --release run of CI runs in: a loopback of
its own, and a run killed with SIGKILL leaves no process and no mount."""

import os
import shutil
import signal
import subprocess
import time

import pytest

from conftest import ROOT

ISOLATED = os.path.join(ROOT, "scripts", "isolated")
MARK = "4242.7171"  # the sleeps' argument, to find them in /proc


def _needs_namespaces():
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("ip"):
        pytest.skip("needs root, unshare and ip (util-linux, iproute2): CI's machine has them")


def _sleepers():
    found = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as handle:
                if handle.read().split(b"\0")[:2] == [b"sleep", MARK.encode()]:
                    found.append(int(pid))
        except OSError:
            continue
    return found


def _mounted(path):
    with open("/proc/self/mountinfo") as handle:
        return any(line.split()[4] == path for line in handle)


def test_a_run_has_its_own_loopback_and_exits_with_its_commands_status():
    _needs_namespaces()
    done = subprocess.run(["bash", ISOLATED, "sh", "-c", "ip -o link show; exit 7"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 7, done.stderr
    links = [line.split(":")[1].strip() for line in done.stdout.splitlines()]
    assert links == ["lo"], done.stdout  # no interface of this machine's
    assert "UP" in done.stdout.split("lo:")[1]


def test_a_run_killed_with_sigkill_leaves_no_process_and_no_mount(tmp_path):
    _needs_namespaces()
    target = tmp_path / "mnt"
    target.mkdir()
    script = ("mount -t tmpfs gpugate-isolated-test %s && setsid sleep %s & sleep %s & "
              "touch %s/started; wait" % (target, MARK, MARK, tmp_path))
    proc = subprocess.Popen(["bash", ISOLATED, "sh", "-c", script], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not ((tmp_path / "started").exists() and len(_sleepers()) == 2) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_sleepers()) == 2, "the run did not start its two sleeps"
        assert not _mounted(str(target))  # its mount is in its own namespace only
        proc.send_signal(signal.SIGKILL)  # unshare itself: no trap runs anywhere
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _sleepers() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _sleepers() == [], "a process of the killed run outlived it"
        assert not _mounted(str(target))
    finally:
        for pid in _sleepers():
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
