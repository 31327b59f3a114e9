"""The node agent's side of a Pod's preflight on Kubernetes, its pure parts
(gpugate.node.kube_preflight, gpugate.node.kube_preflight_run): which
requests it takes, which Pods it serves, on which GPUs, and the meeting's
id.  The whole path runs on the real control plane in
tests/test_kube_preflight_gang.py."""

import json
import socket
import threading

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from gpugate.node import kube_preflight as kp
from gpugate.node import kube_preflight_run as run

UID = "0b5e3c52-4a8e-4d4a-9a57-0d1b7c3c2a11"


def pod(node="gpu01", uid=UID, phase="Pending", gpus="8", init=True, terminated=None, deleting=False, claims=False):
    spec = {"nodeName": node, "containers": [{"name": "train", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}
    if init:
        spec["initContainers"] = [{"name": kp.CONTAINER, "image": "gpugate"}]
    if claims:
        spec["resourceClaims"] = [{"name": "gpus", "resourceClaimName": "c"}]
        spec["containers"][0]["resources"] = {}
    meta = {"name": "p", "namespace": "ml", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-05T00:00:00Z"
    status = {"phase": phase}
    if terminated is not None:
        status["initContainerStatuses"] = [{"name": kp.CONTAINER, "state": {"terminated": {"exitCode": terminated}}}]
    return {"metadata": meta, "spec": spec, "status": status}


def test_a_request_names_a_pod_and_nothing_else_is_taken():
    line = json.dumps({"namespace": "ml", "pod": "train-0-abc", "uid": UID}).encode()
    assert kp.parse_request(line) == ("ml", "train-0-abc", UID)
    for bad in (b"", b"not json", b"[]", b'{"namespace": "ml", "pod": "x"}',
                json.dumps({"namespace": "ML", "pod": "x", "uid": UID}).encode(),
                json.dumps({"namespace": "ml", "pod": "../nodes/x", "uid": UID}).encode(),
                json.dumps({"namespace": "ml", "pod": "x", "uid": "1; rm"}).encode(),
                json.dumps({"namespace": 1, "pod": "x", "uid": UID}).encode(), b"\xff\xfe"):
        with pytest.raises(kp.Refused):
            kp.parse_request(bad)


@given(st.binary(max_size=300))
@hsettings(max_examples=300, deadline=None)
def test_any_bytes_are_a_request_or_refused(data):
    try:
        namespace, name, uid = kp.parse_request(data)
    except kp.Refused:
        return
    assert kp._NAME.match(namespace) and kp._NAME.match(name) and kp._UID.match(uid)
    assert "/" not in namespace + name + uid


def test_only_a_pending_pod_bound_here_with_the_init_container_is_served():
    assert kp.check_pod(pod(), UID, "gpu01") == ""
    assert "not bound to this node" in kp.check_pod(pod(node="gpu02"), UID, "gpu01")
    assert "not bound to this node" in kp.check_pod(pod(node=None), UID, "gpu01")
    assert "recreated" in kp.check_pod(pod(uid="other"), UID, "gpu01")
    assert "no gpugate-preflight" in kp.check_pod(pod(init=False), UID, "gpu01")
    assert "past its preflight" in kp.check_pod(pod(phase="Running"), UID, "gpu01")
    assert "ended" in kp.check_pod(pod(terminated=0), UID, "gpu01")
    assert "deleted" in kp.check_pod(pod(deleting=True), UID, "gpu01")


def test_the_proof_runs_on_the_whole_node_only():
    assert run.pod_gpus(pod(gpus="8"), 8, "nvidia.com/gpu") == (list(range(8)), "")
    gpus, why = run.pod_gpus(pod(gpus="4"), 8, "nvidia.com/gpu")
    assert gpus == [] and "4 of the node's 8" in why
    gpus, why = run.pod_gpus(pod(gpus="8"), 8, "amd.com/gpu")
    assert gpus == [] and "0 of the node's 8" in why
    gpus, why = run.pod_gpus(pod(gpus="eight"), 8, "nvidia.com/gpu")
    assert gpus == [] and "not a count" in why
    assert run.pod_gpus(pod(claims=True), 8, "nvidia.com/gpu") == ([], run.CLAIMED)  # its claims decide
    assert run.pod_gpus(pod(), None, "nvidia.com/gpu")[0] == []


@given(st.lists(st.text(alphabet="0123456789abcdef-", min_size=1, max_size=36), min_size=1, max_size=8, unique=True),
       st.randoms())
def test_the_meeting_is_the_gang_and_exactly_its_pods(uids, rnd):
    class Gang:
        key = "volcano/ml/pg/uid-1"

    pods = [{"metadata": {"uid": u}} for u in uids]
    shuffled = list(pods)
    rnd.shuffle(shuffled)
    job = run.gang_job(Gang, pods)
    assert job == run.gang_job(Gang, shuffled) and job.startswith("kube-")
    assert run.gang_job(Gang, pods + [{"metadata": {"uid": "new"}}]) != job  # a recreated Pod: a new meeting

    class Other:
        key = "volcano/ml/pg/uid-2"

    assert run.gang_job(Other, pods) != job


def test_a_gang_has_started_once_a_peer_is_past_its_preflight():
    assert run.started_already(pod(phase="Running"), kp.CONTAINER)
    assert run.started_already(pod(terminated=0), kp.CONTAINER)
    assert not run.started_already(pod(terminated=1), kp.CONTAINER)  # its preflight failed: not started
    assert not run.started_already(pod(), kp.CONTAINER)


def _pair():
    a, b = socket.socketpair()
    return a, b


def test_a_request_line_is_capped_and_timed():
    a, b = _pair()
    b.sendall(b'{"namespace": "ml"}\nrest')
    assert kp._read_line(a) == b'{"namespace": "ml"}'
    a.close(), b.close()
    a, b = _pair()
    threading.Thread(target=lambda: b.sendall(b"x" * (kp.REQUEST_CAP + 10)), daemon=True).start()
    with pytest.raises(kp.Refused, match="over"):
        kp._read_line(a)
    a.close(), b.close()
    a, b = _pair()
    b.close()
    with pytest.raises(kp.Refused, match="closed"):
        kp._read_line(a)
    a.close()


def test_a_silent_connection_is_dropped_after_its_seconds(monkeypatch):
    monkeypatch.setattr(kp, "REQUEST_SECONDS", 0.3)
    a, b = _pair()
    with pytest.raises(kp.Refused, match="no request line"):
        kp._read_line(a)
    a.close(), b.close()


def _slice():
    import os

    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures",
                           "dra-resourceslice-nvidia-h100x8.json")) as handle:
        return json.load(handle)


def test_claims_cover_the_node_only_when_every_gpu_it_publishes_is_allocated():
    item = _slice()
    spec = item["spec"]
    every = {(spec["driver"], spec["pool"]["name"], d["name"]) for d in spec["devices"]}
    assert run.claimed_share([item], every) == (8, 8)
    some = set(sorted(every)[:5])
    assert run.claimed_share([item], some) == (5, 8)
    assert run.claimed_share([item], set()) == (0, 8)
    # A device of another pool (another node's) or another driver covers nothing here.
    other = {("gpu.nvidia.com", "elsewhere", d) for _, _, d in every} | {("gpu.amd.com", p, d) for _, p, d in every}
    assert run.claimed_share([item], other) == (0, 8)
    assert run.claimed_share([], every) == (0, 0)


@given(st.sets(st.integers(0, 7)))
def test_the_share_is_the_distinct_gpus_allocated(picked):
    item = _slice()
    spec = item["spec"]
    names = sorted(d["name"] for d in spec["devices"])
    covered, published = run.claimed_share([item], {(spec["driver"], spec["pool"]["name"], names[i]) for i in picked})
    assert (covered, published) == (len(picked), 8)
