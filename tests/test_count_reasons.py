"""A reason changes only when the finding does (issue 34): the findings
that count events (amdgpu's errors, pages, ring timeouts and resets on one
GPU; the jobs of xid_repeat) keep the count in their detail.  Before, each
new event rewrote the node's drain reason or its published comment, and a
new comment sent the node to the back of the budget keeper's oldest-first
queue (its first-published time started again)."""

from gpugate.model.reason import render
from gpugate.slurm import pending
from test_amdkernlog import TIMEOUT, UE, judge
from test_apprepeat import _replay

KEY = b"k" * 32
T0, T1 = 1_764_000_000, 1_764_000_900


def _published_since(first: str, then: str) -> int:
    """The first-published time of ``then`` published over ``first``."""
    comment = pending.publish("", first, T0, KEY, "gpu01")
    return pending.read(pending.publish(comment, then, T1, KEY, "gpu01")).since


def test_an_amdgpu_repeat_keeps_its_reason_and_its_place_as_timeouts_add_up():
    three = judge([TIMEOUT % "gfx_0.0.0"] * 3)
    five = judge([TIMEOUT % "gfx_0.0.0"] * 5)
    assert [f.observed for f in three] == [f.observed for f in five] == ["ring_timeout >=3"]
    assert five[0].detail.startswith("5 in the window: ")  # the count: in the detail
    first, then = render("gpugate:", "health", three), render("gpugate:", "health", five)
    assert first == then == "gpugate: health amdgpu_repeat:gpu3=ring_timeout >=3 (want < 3 in 86400s)"
    assert _published_since(first, then) == T0


def test_an_amdgpu_event_keeps_its_reason_as_errors_add_up():
    one, two = judge([UE % 1]), judge([UE % 1, UE % 2])
    assert render("gpugate:", "health", one) == render("gpugate:", "health", two) == \
        "gpugate: health amdgpu_event:gpu3=ue umc (want none)"
    assert two[0].detail.startswith("2 errors: 0000:5f:00: ")
    page = "amdgpu 0000:5f:00.0: amdgpu: Saved bad pages %d reaches threshold value 128"
    assert [f.observed for f in judge([page % 130])] == [f.observed for f in judge([page % 130, page % 131])] == [
        "bad_page_threshold"]


def test_an_xid_repeat_keeps_its_reason_and_its_place_as_jobs_and_xids_add_up():
    seen, _ = _replay([("101", [31]), ("102", [31]), ("103", [31]), ("104", [13]), ("105", [43, 31])])
    reasons = [render("gpugate:", "health", s) for s in seen[2:]]
    assert reasons == ["gpugate: health xid_repeat=xids in >=3 jobs (want < 3 jobs within 24h)"] * 3
    assert seen[2][0].detail.startswith("xid 31 in 3 jobs on GPU 0000:3a:00: jobs 101, 102, 103 of users")
    assert seen[4][0].detail.startswith("xid 13+31+43 in 5 jobs on GPU 0000:3a:00: ")
    assert _published_since(reasons[0], reasons[2]) == T0


def test_non_fatal_sxids_keep_their_drain_reason_as_they_add_up():
    """An NVSwitch's non-fatal SXids at the rate: 'x10', then 'x11', ... was
    a new drain reason written at each health check."""
    from test_xid_policy import POLICY as XID_POLICY
    from test_xid_policy import judge as judge_xids

    line = "nvidia-nvswitch2: SXid (PCI:0000:86:00.0): 12028, Non-fatal, Link 46 egress non-posted PRIV error"
    most = XID_POLICY.xid_nonfatal_max
    at, more = judge_xids([line] * most), judge_xids([line] * (most + 3))
    assert render("gpugate:", "health", at) == render("gpugate:", "health", more)
    assert at[0].observed == "nvswitch2 12028 non-fatal >=%d" % most
    assert more[0].detail.startswith("%d non-fatal: " % (most + 3))
