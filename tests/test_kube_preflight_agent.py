"""The node agent's side of a Pod's preflight on Kubernetes, its pure parts
(gpugate.node.kube_preflight, _pod, _run): which
requests it takes, which Pods it serves, on which GPUs, and the meeting's
id.  The whole path runs on the real control plane in
tests/test_kube_preflight_gang.py."""

import json
import socket
import threading
import time

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from gpugate.node import kube_preflight as kp
from gpugate.node import kube_preflight_pod as kpod
from gpugate.node import kube_preflight_run as run

UID = "0b5e3c52-4a8e-4d4a-9a57-0d1b7c3c2a11"


def pod(node="gpu01", uid=UID, phase="Pending", gpus="8", init=True, terminated=None, deleting=False, claims=False,
        running=False, before=()):
    spec = {"nodeName": node, "containers": [{"name": "train", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}
    if init:
        spec["initContainers"] = [{"name": n} for n in before] + [{"name": kp.CONTAINER, "image": "gpugate"}]
    if claims:
        spec["resourceClaims"] = [{"name": "gpus", "resourceClaimName": "c"}]
        spec["containers"][0]["resources"] = {}
    meta = {"name": "p", "namespace": "ml", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-05T00:00:00Z"
    status = {"phase": phase}
    if terminated is not None:
        status["initContainerStatuses"] = [{"name": kp.CONTAINER, "state": {"terminated": {"exitCode": terminated}}}]
    elif running:
        status["initContainerStatuses"] = [{"name": kp.CONTAINER, "state": {"running": {"startedAt": "x"}}}]
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


def test_only_a_pending_pod_bound_here_with_the_init_container_first_is_served():
    assert kpod.check_pod(pod(), UID, "gpu01") == ""
    assert "not bound to this node" in kpod.check_pod(pod(node="gpu02"), UID, "gpu01")
    assert "not bound to this node" in kpod.check_pod(pod(node=None), UID, "gpu01")
    assert "recreated" in kpod.check_pod(pod(uid="other"), UID, "gpu01")
    assert "first init container" in kpod.check_pod(pod(init=False), UID, "gpu01")
    # A container of the Pod's own before it (a native sidecar) could load the GPUs during the proof.
    assert "first init container" in kpod.check_pod(pod(before=("sidecar",)), UID, "gpu01")
    assert "past its preflight" in kpod.check_pod(pod(phase="Running"), UID, "gpu01")
    assert "ended" in kpod.check_pod(pod(terminated=0), UID, "gpu01")
    assert "deleted" in kpod.check_pod(pod(deleting=True), UID, "gpu01")


def test_a_users_own_gpugate_preflight_that_could_load_the_gpus_is_not_served():
    """A user may name their own init container gpugate-preflight: one that could
    reach the GPUs would have its load read as the node's fault."""
    from gpugate.node.kube_preflight_call import init_container

    ours = init_container("registry.example.com/gpugate:1", "gpugate-preflight.gpugate.svc:9412")
    assert kpod.gpu_reach(ours) == ""  # the chart's own container is served
    served = pod()
    served["spec"]["initContainers"] = [ours]
    assert kpod.check_pod(served, UID, "gpu01") == ""
    for change, why in (({"resources": {"limits": {"nvidia.com/gpu": "8"}}}, "limits nvidia.com/gpu"),
                        ({"resources": {"requests": {"amd.com/gpu": "1"}}}, "requests amd.com/gpu"),
                        ({"resources": {"claims": [{"name": "gpus"}]}}, "resource claims"),
                        ({"volumeMounts": [{"name": "dev", "mountPath": "/dev"}]}, "volumes"),
                        ({"securityContext": {"privileged": True}}, "privilege"),
                        ({"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}, "privilege"),
                        ({"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}, "its environment"),
                        ({"envFrom": [{"configMapRef": {"name": "x"}}]}, "its environment")):
        theirs = dict(ours, **change)
        assert kpod.gpu_reach(theirs) == why, change
        user = pod()
        user["spec"]["initContainers"] = [theirs]
        assert "could reach the GPUs" in kpod.check_pod(user, UID, "gpu01")


def test_a_pod_is_served_once_the_kubelet_reports_its_preflight_running():
    class Client:
        def __init__(self, answers):
            self.answers = list(answers)

        def get(self, path):
            assert path == "/api/v1/namespaces/ml/pods/p"
            return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]

    waited = []
    got, why = kpod.admitted(Client([pod(running=True)]), pod(), UID, "gpu01", seconds=5, sleep=waited.append)
    assert why == "" and kpod.in_preflight(got) and waited == [0.5]
    # A Pod bound by hand that the kubelet refused never runs its preflight: not served.
    got, why = kpod.admitted(Client([pod()]), pod(), UID, "gpu01", seconds=0.01, sleep=lambda s: None)
    assert "has not reported" in why
    assert kpod.admitted(Client([]), pod(node="gpu02"), UID, "gpu01")[1].startswith("the Pod is not bound")


def test_the_proof_runs_on_the_whole_node_only():
    assert kpod.pod_gpus(pod(gpus="8"), 8, "nvidia.com/gpu", "8") == (list(range(8)), "")
    gpus, why = kpod.pod_gpus(pod(gpus="4"), 8, "nvidia.com/gpu", "8")
    assert gpus == [] and "4 of the node's 8" in why
    gpus, why = kpod.pod_gpus(pod(gpus="8"), 8, "amd.com/gpu", "8")
    assert gpus == [] and "0 of the node's 8" in why
    gpus, why = kpod.pod_gpus(pod(gpus="eight"), 8, "nvidia.com/gpu", "8")
    assert gpus == [] and "not a count" in why
    assert kpod.pod_gpus(pod(claims=True), 8, "nvidia.com/gpu", "0") == ([], kpod.CLAIMED)  # its claims decide
    assert kpod.pod_gpus(pod(), None, "nvidia.com/gpu", "8")[0] == []
    # Time-slicing or MPS: the Node offers each GPU several times; 8 asked are shares of GPUs others use.
    gpus, why = kpod.pod_gpus(pod(gpus="8"), 8, "nvidia.com/gpu", "32")
    assert gpus == [] and "shared" in why
    assert kpod.pod_gpus(pod(gpus="8"), 8, "nvidia.com/gpu", None)[0] == []


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
    assert kpod.claimed_share([item], every) == (8, 8, "")
    some = set(sorted(every)[:5])
    assert kpod.claimed_share([item], some) == (5, 8, "")
    assert kpod.claimed_share([item], set()) == (0, 8, "")
    # A device of another pool (another node's) or another driver covers nothing here.
    other = {("gpu.nvidia.com", "elsewhere", d) for _, _, d in every} | {("gpu.amd.com", p, d) for _, p, d in every}
    assert kpod.claimed_share([item], other) == (0, 8, "")
    assert kpod.claimed_share([], every) == (0, 0, "")


def test_a_mig_device_is_never_counted_as_its_gpu():
    item = _slice()
    spec = item["spec"]
    mig = dict(spec["devices"][0], name="gpu-0-mig-1g10gb-0")
    mig["attributes"] = dict(mig["attributes"], parentUUID=mig["attributes"]["uuid"])
    spec["devices"].append(mig)
    covered, published, why = kpod.claimed_share([item], {(spec["driver"], spec["pool"]["name"], mig["name"])})
    assert covered == 0 and published == 8 and "a part of a GPU" in why


def _claim(reserved=(UID,), **result):
    return {"metadata": {"name": "c"}, "status": {
        "reservedFor": [{"resource": "pods", "name": "p", "uid": u} for u in reserved],
        "allocation": {"devices": {"results": [dict({"driver": "gpu.nvidia.com", "pool": "n", "device": "gpu-0",
                                                     "request": "gpus"}, **result)]}}}}


def test_a_claim_counts_only_where_it_is_this_pods_alone_and_not_shared():
    assert kpod.claim_devices(_claim(), UID) == ({("gpu.nvidia.com", "n", "gpu-0")}, "")
    assert "not reserved for this Pod alone" in kpod.claim_devices(_claim(reserved=(UID, "other")), UID)[1]
    assert "not reserved for this Pod alone" in kpod.claim_devices(_claim(reserved=()), UID)[1]
    assert "shared" in kpod.claim_devices(_claim(adminAccess=True), UID)[1]
    assert "shared" in kpod.claim_devices(_claim(shareID="0b5e"), UID)[1]


@given(st.sets(st.integers(0, 7)))
def test_the_share_is_the_distinct_gpus_allocated(picked):
    item = _slice()
    spec = item["spec"]
    names = sorted(d["name"] for d in spec["devices"])
    covered, published, why = kpod.claimed_share([item], {(spec["driver"], spec["pool"]["name"], names[i])
                                                          for i in picked})
    assert (covered, published, why) == (len(picked), 8, "")


def test_a_port_taken_leaves_the_agent_checking_with_the_preflight_off(capsys, tmp_path):
    """The agent's health checks gate the node whether or not the port can be served."""
    from types import SimpleNamespace

    taken = socket.socket(socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET)
    taken.bind(("::" if socket.has_ipv6 else "0.0.0.0", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    cfg = {"kube_port": port, "timeout_seconds": 30, "across_seconds": 60}
    settings = SimpleNamespace(preflight=cfg, log="file", state_dir=lambda node: str(tmp_path))
    try:
        assert kp.serve(settings, "gpu01", lambda deadline: None) is None
        assert "cannot be served" in capsys.readouterr().err
    finally:
        taken.close()
    server = kp.serve(settings, "gpu01", lambda deadline: None)  # free again: served
    try:
        assert server is not None
        with socket.create_connection(("127.0.0.1", port), timeout=5) as peer:
            peer.sendall(b"not json\n")
            answer = json.loads(peer.makefile().readline())
        assert answer["verdict"] == "undecided" and answer["why"] == kp.NOT_SERVED
        log = tmp_path / "gpugate.log"
        for _ in range(50):  # the line is written once the answer has gone
            if log.exists() and log.read_text():
                break
            time.sleep(0.1)
        record = json.loads(log.read_text().splitlines()[-1])
        assert record["mode"] == "kube-preflight" and record["verdict"] == "undecided"
        assert "not a JSON line" in record["why"]  # the reason for the log, not for the peer
    finally:
        server.close()
