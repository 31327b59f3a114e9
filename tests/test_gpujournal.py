"""The GPU event journal and its follower (issue 33, item 3), as properties:
what the parsers read as a GPU event is always kept, a user's record never;
a torn or foreign line never reads as another record; ring and journal merge
by seq; the follower counts exactly the records it did not read."""

import errno
import os
import stat

from hypothesis import given, settings, strategies as st

from gpugate.node import kmsgfollow
from gpugate.node.kmsgfollow import Follower
from gpugate.parsers.kernlog import parse_kmsg
from gpugate.probes import gpujournal

from test_kernlog_trust import _FakeKmsg

BOOT = "0b6f3a52-1f6e-4c1b-9d7e-5a1f0c2d3e4f"
GPU_MESSAGES = [
    "NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=python3, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:3a:00): 119, pid=4242, name=python3, Timeout after 6s of waiting for RPC response",
    "NVRM: GPU 0000:29:00.0: GPU has fallen off the bus.",
    "NVRM: The NVIDIA GPU 0000:18:00.0", "NVRM: fallen off the bus and is not responding to commands.",
    "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up",
    "amdgpu 0000:0c:00.0: amdgpu: GPU reset begin!",
]
messages = st.one_of(st.sampled_from(GPU_MESSAGES),
                     st.sampled_from(GPU_MESSAGES).map(lambda m: "tmpfs: Unknown parameter '%s'" % m),
                     st.text(alphabet=st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)),
                              max_size=80))
pris = st.integers(min_value=0, max_value=191)


def _record(pri, seq, message):
    return "%d,%d,%d,-;%s" % (pri, seq, seq * 1000, message)


@given(pris, st.integers(min_value=0, max_value=2 ** 40), messages)
def test_every_record_the_parsers_read_as_an_event_is_kept_and_no_users_record(pri, seq, message):
    record = _record(pri, seq, message)
    if parse_kmsg(record + "\n", None):
        assert gpujournal.is_gpu_record(record)
    if pri >> 3 != 0:  # LOG_USER and the rest: user space's (/dev/kmsg writes)
        assert not gpujournal.is_gpu_record(record)
    if message.startswith("tmpfs: "):  # the kernel's, with a user's text: never a GPU record
        assert not gpujournal.is_gpu_record(record)


@given(pris, st.integers(min_value=0, max_value=2 ** 40), messages, st.data())
def test_a_torn_or_foreign_line_never_reads_as_another_record(pri, seq, message, data):
    record = _record(pri, seq, message)
    line = gpujournal.entry(BOOT, record)
    assert gpujournal.parse_entries(line, BOOT) == {seq: record}
    assert gpujournal.parse_entries(line, BOOT.replace("0", "1")) == {}  # another boot's
    cut = data.draw(st.integers(min_value=0, max_value=len(line) - 1))
    assert gpujournal.parse_entries(line[:cut], BOOT) == {}  # torn by a crash: nothing, never "Xid 7"
    flipped = bytearray(line)
    at = data.draw(st.integers(min_value=len(BOOT) + 10, max_value=len(line) - 2))
    flipped[at] ^= 0x01
    assert gpujournal.parse_entries(bytes(flipped), BOOT) == {}  # a bit flipped: CRC-32 catches every one


@given(st.sets(st.integers(min_value=0, max_value=300)), st.sets(st.integers(min_value=0, max_value=300)))
def test_ring_and_journal_merge_by_seq(ring, journal):
    ring_text = "".join(_record(4, s, "ring %d" % s) + "\n" for s in sorted(ring))
    events = {s: _record(4, s, "journal %d" % s) for s in journal}
    merged = gpujournal.merge(ring_text, events)
    seqs = [int(line.split(",")[1]) for line in merged.splitlines()]
    assert seqs == sorted(ring | journal)
    assert all(("ring" in line) == (int(line.split(",")[1]) in ring) for line in merged.splitlines())


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(min_value=1, max_value=50), st.booleans()), min_size=1, max_size=60))
def test_the_follower_counts_exactly_what_it_did_not_read(tmp_path_factory, steps):
    state = str(tmp_path_factory.mktemp("state"))
    follower = Follower(state, BOOT, 1.0)
    seq, records, gaps, gpu = 100, [], 0, 0
    for step, is_gpu in steps:
        gaps += step - 1
        seq += step
        gpu += is_gpu
        records.append(_record(4, seq, GPU_MESSAGES[0] if is_gpu else "tmpfs: Unknown parameter 'x'"))
    follower.feed(records[:1])
    follower.feed(records)  # read again (a simulated ring): counted once
    follower.heartbeat(2.0)
    beat = gpujournal.read_heartbeat(state)
    assert beat["lost_records"] == gaps - (steps[0][0] - 1)  # before the first record: not the follower's
    assert beat["kept"] == gpu and beat["from_seq"] == 100 + steps[0][0]
    assert sum(b - a + 1 for a, b in beat["lost"]) == beat["lost_records"]
    assert sorted(gpujournal.read_events(state, BOOT)) == [int(r.split(",")[1]) for r in records
                                                           if GPU_MESSAGES[0] in r]


def test_the_journal_rotates_within_twice_its_bound_and_keeps_the_newest(tmp_path, monkeypatch):
    monkeypatch.setattr(gpujournal, "MAX_FILE", 4096)
    writer = gpujournal.Writer(str(tmp_path))
    for seq in range(300):
        writer.append(BOOT, [_record(4, seq, GPU_MESSAGES[0])])
    writer.close()
    directory = gpujournal.directory(str(tmp_path))
    assert sorted(os.listdir(directory)) == [gpujournal.EVENTS, gpujournal.EVENTS + ".1"]
    assert all(os.path.getsize(os.path.join(directory, n)) <= 4096 for n in os.listdir(directory))
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.join(directory, gpujournal.EVENTS)).st_mode) == 0o600
    kept = gpujournal.read_events(str(tmp_path), BOOT)
    assert max(kept) == 299 and len(kept) == len(range(min(kept), 300))  # the newest, without a hole
    writer = gpujournal.Writer(str(tmp_path))  # a burst of 200 in one batch: no part over its bound
    writer.append(BOOT, [_record(4, seq, GPU_MESSAGES[0]) for seq in range(300, 500)])
    writer.close()
    assert all(os.path.getsize(os.path.join(directory, n)) <= 4096 for n in os.listdir(directory))
    kept = gpujournal.read_events(str(tmp_path), BOOT)
    assert max(kept) == 499 and len(kept) == len(range(min(kept), 500)) > 20


def test_a_journal_someone_else_could_write_is_not_read(tmp_path):
    writer = gpujournal.Writer(str(tmp_path))
    writer.append(BOOT, [_record(4, 7, GPU_MESSAGES[0])])
    writer.close()
    path = os.path.join(gpujournal.directory(str(tmp_path)), gpujournal.EVENTS)
    assert list(gpujournal.read_events(str(tmp_path), BOOT)) == [7]
    os.chmod(path, 0o622)
    assert gpujournal.read_events(str(tmp_path), BOOT) == {}


def test_epipe_is_a_window_the_follower_lost_and_it_goes_on(tmp_path, monkeypatch):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    fake = _FakeKmsg(["6,10,1,-;a\n SUBSYSTEM=pci\n", "4,11,2,-;%s\n" % GPU_MESSAGES[0],
                      OSError(errno.EPIPE, "Broken pipe"), "6,40,3,-;b\n", "4,41,4,-;%s\n" % GPU_MESSAGES[5]])
    monkeypatch.setattr(stat, "S_ISCHR", lambda mode: True)
    monkeypatch.setattr(kmsgfollow.os, "read", fake)
    follower = Follower(str(tmp_path / "state"), BOOT, 1.0)
    kmsgfollow.follow(str(kmsg), follower, lambda: not fake.reads, heartbeat=0.01)
    monkeypatch.undo()  # os.read is the fake's for every module
    beat = gpujournal.read_heartbeat(str(tmp_path / "state"))
    assert (beat["lost"], beat["lost_records"], beat["from_seq"], beat["seq"]) == ([[12, 39]], 28, 10, 41)
    assert beat["running"] is False  # it said so when it stopped
    assert sorted(gpujournal.read_events(str(tmp_path / "state"), BOOT)) == [11, 41]
    # Restarted: the ring no longer holds 42-59: a window lost between its runs.
    again = Follower(str(tmp_path / "state"), BOOT, 2.0)
    again.feed(["6,60,5,-;c"])
    assert again.lost[-1] == [42, 59] and again.lost_records == 28 + 18 and again.from_seq == 10


def test_coverage_says_when_xids_may_be_missed():
    lost = {"records": 10, "first": 101, "last": 110}
    beat = {"boot_id": BOOT, "at": 1000.0, "running": True, "seq": 200, "from_seq": 5, "lost": [], "lost_records": 0}
    cover = gpujournal.coverage
    assert cover(beat, BOOT, lost, 1010.0, 60) == {"follower": "following", "follower_lost_records": 0, "covered": True}
    assert cover(beat, BOOT, None, 1010.0, 60) == {"follower": "following", "follower_lost_records": 0}
    assert cover(None, BOOT, lost, 1010.0, 60)["covered"] is False
    assert cover(dict(beat, boot_id="old"), BOOT, lost, 1010.0, 60)["follower"] == "absent"
    assert cover(dict(beat, from_seq=105), BOOT, lost, 1010.0, 60)["covered"] is False
    assert cover(dict(beat, lost=[[110, 120]]), BOOT, lost, 1010.0, 60)["covered"] is False
    assert cover(dict(beat, lost=[[111, 120]]), BOOT, lost, 1010.0, 60)["covered"] is True
    down = cover(dict(beat, seq=105), BOOT, lost, 2000.0, 60)  # stopped at 105, before the window ended
    assert (down["follower"], down["covered"]) == ("down", False)
    assert cover(beat, BOOT, lost, 2000.0, 60)["covered"] is True  # down since, but it read past 110
    assert cover(beat, BOOT, {"records": None, "first": None, "last": None}, 1010.0, 60)["covered"] is False
    assert cover(dict(beat, from_seq=None), BOOT, None, 1010.0, 60)["follower"] == "following"  # read nothing yet
    assert cover(dict(beat, from_seq=None), BOOT, lost, 1010.0, 60)["covered"] is False
    assert cover(dict(beat, seq="x"), BOOT, lost, 1010.0, 60)["follower"] == "absent"  # garbled: no follower


XID_13 = ("NVRM: Xid (PCI:0000:3a:00): 13, pid=4242, name=python3, Graphics SM Warp Exception on "
          "(GPC 0, TPC 0, SM 0): Out Of Range Address")
VM_FAULT = "amdgpu 0000:0c:00.0: amdgpu: [gfxhub] page fault (src_id:0 ring:24 vmid:3 pasid:32770)"


def test_a_users_application_fault_storm_never_rotates_out_an_xid_79(tmp_path):
    """A job's user makes the driver print application Xids at will (a
    faulting kernel: an Xid 13 record per faulting SM, Xid 31, 43), amdgpu VM
    faults, and NVRM records that are no event: none of them may push the
    Xid 79 out of the journal (it rotates at 2 x MAX_FILE)."""
    state = str(tmp_path)
    follower = Follower(state, BOOT, 1.0)
    follower.feed([_record(4, 10, GPU_MESSAGES[0])])
    seq = 11
    for message in (VM_FAULT, XID_13, "NVRM: API mismatch: the client has the version 1.2.3, but"):
        follower.feed([_record(4, s, message) for s in range(seq, seq + 8000)])
        seq += 8000
    follower.close(2.0)
    kept = gpujournal.read_events(state, BOOT)
    assert 10 in kept  # the Xid 79
    assert any(XID_13 in r for r in kept.values())  # the newest application faults: the epilog's to count
    assert gpujournal.classify(_record(4, 1, VM_FAULT)) == gpujournal.APP
    assert not any("API mismatch" in r for r in kept.values())  # no event: not kept at all
    directory = gpujournal.directory(state)
    assert sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory)
               if n != gpujournal.HEARTBEAT) <= 2 * gpujournal.MAX_FILE + 2 * gpujournal.MAX_APP_FILE
