"""gpugate.kube.gpus (the GPUs a Node offers, read after a reboot) and
smokepod.site_wait (why a smoke Pod not started is the site's): pure."""

from hypothesis import given, settings, strategies as st

from gpugate.kube import gpus as gp
from gpugate.kube import smokepod as sp


def node(capacity=None, allocatable=None):
    status = {}
    if capacity is not None:
        status["capacity"] = capacity
    if allocatable is not None:
        status["allocatable"] = allocatable
    return {"status": status}


def test_counts_read_as_a_kubelet_writes_them():
    n = node({"nvidia.com/gpu": "8", "cpu": "64"}, {"nvidia.com/gpu": "0"})
    assert gp.count(n, "nvidia.com/gpu", "capacity") == 8 and gp.count(n, "nvidia.com/gpu") == 0
    assert gp.count(n, "amd.com/gpu") == 0  # absent: none offered
    assert gp.count(node(allocatable={"nvidia.com/gpu": "500m"}), "nvidia.com/gpu") is None  # not a count read
    assert gp.count({"status": {"allocatable": ["x"]}}, "nvidia.com/gpu") == 0
    assert gp.before_reboot(n, "nvidia.com/gpu") == 8


def test_what_the_sweep_waits_for_after_a_reboot():
    zeroed = node({"nvidia.com/gpu": "0"}, {"nvidia.com/gpu": "0"})  # a kubelet just started
    assert gp.expected(8, zeroed, "nvidia.com/gpu", None) == 8  # the count before the reboot
    assert gp.expected(0, node({"nvidia.com/gpu": "4"}), "nvidia.com/gpu", 8) == 4  # its capacity now
    assert gp.expected(0, zeroed, "nvidia.com/gpu", 8) == 8  # neither known: the baseline's
    assert gp.expected(0, zeroed, "nvidia.com/gpu", None) == 0  # nothing to wait for
    assert gp.word("boot_id=abc gpus=8 (rebooted before)", "gpus") == "8"
    assert gp.word("boot_id=abc", "gpus") == ""


@settings(deadline=None)  # a busy shared machine: the first example's imports are slow
@given(st.dictionaries(st.sampled_from(["nvidia.com/gpu", "amd.com/gpu", "cpu"]),
                       st.one_of(st.text(max_size=8), st.integers(), st.none(), st.lists(st.integers())),
                       max_size=3),
       st.integers(min_value=0, max_value=10 ** 6), st.one_of(st.none(), st.integers(min_value=0, max_value=64)))
def test_any_status_reads_as_a_count_or_none_and_the_wait_is_never_below_what_was_offered(table, before, base):
    n = {"status": {"capacity": table, "allocatable": table}}
    got = gp.count(n, "nvidia.com/gpu")
    value = table.get("nvidia.com/gpu")
    assert got is None or (isinstance(got, int) and got >= 0)
    if got is not None and value is not None:
        assert str(got) == value.lstrip("0") or (got == 0 and set(value) == {"0"})
    want = gp.expected(before, n, "nvidia.com/gpu", base)
    assert want >= before and want >= (gp.count(n, "nvidia.com/gpu", "capacity") or 0)


def pod(phase="Pending", conditions=(), waiting=None, running=False):
    status = {"phase": phase, "conditions": list(conditions)}
    if waiting is not None:
        status["containerStatuses"] = [{"state": {"waiting": waiting}}]
    if running:
        status["containerStatuses"] = [{"state": {"running": {"startedAt": "2026-12-05T00:00:00Z"}}}]
    return {"status": status}


def test_a_pod_not_started_is_the_site_s_and_says_why():
    assert sp.site_wait(pod(waiting={"reason": "ContainerCreating"}), 60) == (
        "the site's: image not pulled in 60 s (ContainerCreating)")
    assert sp.site_wait(pod(waiting={"reason": "ImagePullBackOff", "message": "Back-off pulling image \"x\""}), 61) == (
        "the site's: image not pulled in 61 s (ImagePullBackOff: Back-off pulling image \"x\")")
    unscheduled = pod(conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                   "message": "0/3 nodes are available"}])
    assert sp.site_wait(unscheduled, 60) == "the site's: not scheduled in 60 s (Unschedulable: 0/3 nodes are available)"
    assert sp.site_wait(pod(), 60) == "the site's: not started in 60 s (Pending)"
    assert sp.site_wait(pod(phase="Running", running=True), 60) == ""  # started: what it does is the node's
    # At the deadline, could_not_run says the same; before it, nothing yet.
    assert sp.could_not_run(pod(waiting={"reason": "ErrImagePull"}), late=True, waited=60).startswith(
        "the site's: image not pulled in 60 s (ErrImagePull")
    assert sp.could_not_run(pod(waiting={"reason": "ErrImagePull"})) == ""
