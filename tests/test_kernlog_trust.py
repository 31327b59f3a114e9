"""Issue 24, items 1 and 6: kernel-log events come only from the kernel, and
records lost before gpugate read them are said, never silence (issue 33: a
metric and a log field where jobs run, a finding only in the sweep's
verification; tests/test_kmsg_follow.py).

A job's user can make the kernel log text of their choosing at kernel facility
(a mount option tmpfs refuses, the path of a file exec'd with no argv), and
user space's records reach /dev/kmsg too (journald's ForwardToKMsg, at LOG_USER:
the kernel gives every record written to /dev/kmsg a user-space facility).
They must not drain a node; a flood that overwrote the ring must be said."""

import errno
import json
import os
import shutil
import stat
import subprocess
import time

import pytest

from gpugate.model.baseline import load_baseline
from gpugate.judges import xids
from gpugate.parsers import kernlog
from gpugate.probes import kernlog as probe
from gpugate.model.reason import render

from conftest import DEMO_BASELINE, gpugate_cmd
from test_node_side import node_env, run_entry  # noqa: F401 - node_env is a fixture

XID = "NVRM: Xid (PCI:0000:18:00): 79"
FORGED = [  # what the kernel logged for a user, uid 65534, in the reproduction
    "3,346,364223532,-;tmpfs: Unknown parameter '%s'" % XID,
    "4,347,364223600,-;process 'sh' launched '/tmp/x/%s' with NULL argv: empty string added" % XID,
    "14,348,364223700,-;" + XID + ", pid=1, name=python3, GPU has fallen off the bus.",  # LOG_USER
    "30,349,364223800,-;nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 48",  # LOG_DAEMON
]


def test_user_text_in_kernel_records_and_user_space_records_are_not_events():
    assert kernlog.parse_kmsg("\n".join(FORGED) + "\n", 1.7e9) == ()
    # ...while the driver's own record, at kernel facility, is one.
    (event,) = kernlog.parse_kmsg("\n".join(FORGED + ["4,350,364223900,-;" + XID + ", pid=1, x"]), 1.7e9)
    assert (event.xid, event.seq) == (79, 350)


def test_the_split_fallen_off_bus_tail_must_be_the_drivers_own_record():
    head = "4,10,1,-;NVRM: The NVIDIA GPU 0000:18:00.0"
    middle = "4,11,2,-;NVRM: (PCI ID: 10de:20b0) installed in this system has"
    tail = "NVRM: fallen off the bus and is not responding to commands."
    assert kernlog.parse_kmsg("\n".join([head, middle, "3,12,3,-;tmpfs: Unknown parameter '%s'" % tail]), None) == ()
    assert kernlog.parse_kmsg("\n".join([head, middle, "14,12,3,-;" + tail]), None) == ()
    (event,) = kernlog.parse_kmsg("\n".join([head, middle, "4,12,3,-;" + tail]), None)
    assert (event.kind, event.pci_bus_id) == ("fallen_off_bus", "0000:18:00")


@pytest.mark.parametrize("line", [
    "[ 8123.123456] tmpfs: Unknown parameter '%s'" % XID,
    "Mar 02 10:15:03 gpu01 kernel: process 'sh' launched '/tmp/x/%s' with NULL argv" % XID,
    "Mar 02 10:15:03 gpu01 myjob[4242]: %s, pid=1" % XID,  # another identifier: user space's
    "user  :warn  : [ 8123.123456] %s, pid=1" % XID,  # dmesg --decode: a user-space facility
    "<14>[ 8123.123456] %s, pid=1" % XID,  # dmesg --raw: LOG_USER
])
def test_dmesg_and_journal_lines_of_users_are_not_events(line):
    assert kernlog.parse_dmesg(line) == ()


# ------------------------------------------------------------ lost records
def _ring(first, last):
    return "".join("6,%d,%d,-;line %d\n" % (seq, seq * 1000, seq) for seq in range(first, last + 1))


def test_a_ring_whose_oldest_record_is_past_the_cursor_lost_records():
    assert probe.lost_records(_ring(3842, 4000), 1000, False) == {"records": 2841, "first": 1001, "last": 3841}
    assert probe.lost_records(_ring(900, 4000), 1000, False) is None  # the ring still holds the cursor
    assert probe.lost_records(_ring(1001, 4000), 1000, False) is None  # the very next record
    # No cursor (the first run of a boot): a ring that wrapped before it is not counted (module docstring).
    assert probe.lost_records(_ring(3842, 4000), -1, False) is None
    lost = probe.lost_records(_ring(3842, 4000), 1000, False)
    for mode in ("healthcheck", "prolog", "epilog"):  # where a job's user runs: never a finding (issue 33)
        assert xids.lost_finding(_facts(mode, lost)) == []
    (finding,) = xids.lost_finding(_facts("verify", lost))  # the sweep's verification, no follower read them
    assert (finding.cls, finding.component) == ("probe", "kernel_log")
    assert render("gpugate:", "probe", [finding]) == \
        "gpugate: probe kernel_log=lost 2841 records seq 1001-3841 (want none lost)"
    assert xids.lost_finding(_facts("verify", lost, {"follower": "following", "covered": True})) == []


def _facts(mode, lost, cover=None):
    from types import SimpleNamespace

    return SimpleNamespace(mode=mode, kernel_log_lost=lost, kernel_log_follower=cover)


class _FakeKmsg:
    """os.read of /dev/kmsg: one record a read, EPIPE where records were overwritten."""

    def __init__(self, reads):
        self.reads = list(reads)

    def __call__(self, fd, size):
        item = self.reads.pop(0) if self.reads else BlockingIOError(errno.EAGAIN, "again")
        if isinstance(item, Exception):
            raise item
        return item.encode()


def test_epipe_while_reading_is_lost_records(tmp_path, monkeypatch):
    path = tmp_path / "kmsg"
    path.write_text("")
    monkeypatch.setattr(stat, "S_ISCHR", lambda mode: True)
    monkeypatch.setattr(os, "read", _FakeKmsg(["6,10,1,-;a\n", OSError(errno.EPIPE, "Broken pipe"), "6,40,2,-;b\n"]))
    text, overwritten = probe.read_kmsg(str(path))
    assert overwritten and probe.last_seq(text) == 40
    assert probe.lost_records(text, 9, overwritten) == {"records": 29, "first": 11, "last": 39}
    assert probe.lost_records(text, -1, overwritten) == {"records": 29, "first": 11, "last": 39}
    # EPIPE on the very first read of a boot's first run: lost, without a count.
    monkeypatch.setattr(os, "read", _FakeKmsg([OSError(errno.EPIPE, "Broken pipe"), "6,40,2,-;b\n"]))
    text, overwritten = probe.read_kmsg(str(path))
    assert probe.lost_records(text, -1, overwritten) == {"records": None, "first": None, "last": None}
    (finding,) = xids.lost_finding(_facts("verify", probe.lost_records(text, -1, overwritten)))
    assert finding.observed == "lost records while reading"


def test_a_flood_on_a_simulated_node_is_said_but_no_finding(fleet, settings_for):
    from gpugate.node.check import run_check

    settings, baseline = settings_for(fleet), load_baseline(DEMO_BASELINE)
    gpugate_cmd("sim", "set", fleet, "gpu01", "gpu.3.xid=79", check=True)
    first = run_check(settings, baseline, "gpu01", "healthcheck").facts
    cursor = first.kernel_log_seq
    assert cursor == 1000 and first.kernel_log_lost is None
    # The Xid is seen, then a user's flood pushes a second one out of the ring.
    gpugate_cmd("sim", "set", fleet, "gpu01", "gpu.2.xid=79", "kmsg.flood=3000", check=True)
    result = run_check(settings, baseline, "gpu01", "healthcheck", xid_after=cursor)
    assert result.facts.kernel_log_lost == {"records": 2001, "first": 1001, "last": 3001}
    # No finding (issue 33): the Xid the ring lost is the follower's to keep (tests/test_kmsg_follow.py).
    assert result.verdict.fit and result.facts.kernel_log_follower["covered"] is False
    # The next run, from the cursor this one stored: nothing lost, nothing to say.
    again = run_check(settings, baseline, "gpu01", "healthcheck", xid_after=result.facts.kernel_log_seq)
    assert again.facts.kernel_log_lost is None and again.verdict.fit


# ------------------------------------------------- the real entry points
def _log(env):
    return [json.loads(line) for line in open(os.path.join(env["state"], "gpu01", "gpugate.log"))]


def test_forged_records_on_a_simulated_node_drain_nothing_and_a_real_xid_still_does(node_env):  # noqa: F811
    assert run_entry("healthcheck", node_env).returncode == 0
    assert run_entry("prolog", node_env, extra_env={"SLURM_JOB_ID": "5"}).returncode == 0
    gpugate_cmd("sim", "set", node_env["fleet"], "gpu01", "kmsg=tmpfs: Unknown parameter '%s'" % XID,
                "kmsg=process 'sh' launched '/tmp/x/%s' with NULL argv: empty string added" % XID,
                "kmsg.user=%s, pid=1, name=python3, GPU has fallen off the bus." % XID, check=True)
    result = run_entry("epilog", node_env, extra_env={"SLURM_JOB_ID": "5"})
    assert result.returncode == 0, (result.stderr, _log(node_env)[-1])
    assert _log(node_env)[-1]["verdict"] == "fit"
    assert run_entry("healthcheck", node_env).returncode == 0 and _log(node_env)[-1]["verdict"] == "fit"
    # The demo's injection writes the driver's record at kernel facility: it drains.
    gpugate_cmd("sim", "set", node_env["fleet"], "gpu01", "gpu.3.xid=79", check=True)
    assert run_entry("healthcheck", node_env).returncode == 1  # unfit; Slurm is absent here
    assert _log(node_env)[-1]["reason"] == "gpugate: health xid:gpu3=79 (want none)"


# ------------------------------------- the real kernel, as an unprivileged user
def _read_real_kmsg():
    text, _ = probe.read_kmsg("/dev/kmsg")
    return text if isinstance(text, str) else ""


def root_and_real_kmsg_or_skip():
    """Root (to drop to uid 65534) and a readable /dev/kmsg, or skip saying why."""
    if os.geteuid() != 0:
        pytest.skip("needs root (to drop to uid 65534, and to read /dev/kmsg)")
    try:
        if not stat.S_ISCHR(os.stat("/dev/kmsg").st_mode) or not os.access("/dev/kmsg", os.R_OK):
            pytest.skip("no readable /dev/kmsg here (a chroot without /dev?)")
    except OSError:
        pytest.skip("no /dev/kmsg here (a chroot without /dev?)")


def test_an_unprivileged_users_mount_option_in_the_real_kernel_log_is_not_an_event():
    """Runs as uid 65534 in a user namespace of its own, as the issue's user did;
    skipped where the kernel or the container does not let it."""
    import tempfile

    if not all(shutil.which(tool) for tool in ("setpriv", "unshare")):
        pytest.skip("needs util-linux's setpriv and unshare")
    root_and_real_kmsg_or_skip()
    # tmpfs splits its options at commas: this run's own Xid text has none.
    marker = "%s run%d" % (XID, time.monotonic_ns())
    assert kernlog.parse_xid_message(marker) is not None  # the user's text is an Xid at the start of a message
    target = tempfile.mkdtemp(dir="/tmp")  # a directory uid 65534 can reach
    try:
        os.chmod(target, 0o777)
        subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "unshare", "-Urm",
                        "mount", "-t", "tmpfs", "-o", marker, "none", target], capture_output=True, timeout=30)
    finally:
        os.rmdir(target)
    records = [line for line in _read_real_kmsg().splitlines() if marker in line]
    if not records:
        pytest.skip("the kernel here logged no record for the refused mount (no user namespaces?)")
    pri, _, _, message = kernlog.kmsg_record(records[-1])
    assert kernlog.kernel_facility(pri) and message.startswith("tmpfs: ")  # the kernel's, with the user's text
    assert kernlog.parse_kmsg("\n".join(records), None) == ()
