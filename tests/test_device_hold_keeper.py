"""The keeper holds a budgeted one-GPU finding (an application-Xid repeat
on one GPU, xid_repeat) as a DeviceTaintRule where [kubernetes]
device_holds is on and the server serves them, else the Node; and the
Node's record says which GPUs of how many, the budget's share
(gpugate.kube.gpushare).  Over FakeAPI (tests/test_device_holds.py); the
same on the real API server: tests/test_kube_device_holds.py."""

import json

from test_device_holds import FakeAPI, finding, gpu3, kube_nodes

from gpugate.budget import rules as budget
from gpugate.kube import gpushare
from gpugate.kube import nodeview as nv
from gpugate.model.findings import HEALTH, REBOOT, RESET_GPU, Finding
from gpugate.slurm import pending

XID = "gpugate health xid_repeat:gpu3=13 x3 by 3 users (want none)"
RULE = "gpugate.node01.gpu.nvidia.com.gpu-3"


def published(api, backend, findings, reason=XID):
    """The agent's side: the offer made, then the span published (gpugate.node.hold)."""
    gpus = {i: {"pci": "0000:%02x:00.0" % (16 + i)} for i in range(8)}
    gpus.update(gpu3(api))
    backend.offer_devices("node01", findings, gpus)
    backend.set_comment("node01", pending.publish("", reason, 900))


def test_the_keeper_holds_a_published_gpu_finding_alone_and_counts_its_share():
    api = FakeAPI()
    agent = kube_nodes(api)
    published(api, agent, [finding("xid_repeat", 3, RESET_GPU)])
    text = api.node["metadata"]["annotations"][nv.PENDING]
    assert text.startswith("[gpugate-pending @900") and gpushare.OPEN in text
    waiting = nv.state_of(api.node, offers=True)
    assert budget.share_of(waiting) == 0.125 and pending.read(waiting.comment).reason == XID

    keeper = kube_nodes(api, no_execute=True)
    assert keeper.nodes("node01")["node01"].comment == waiting.comment  # (the offer is no part of it)
    keeper.drain("node01", XID)
    assert list(api.rules) == [RULE]
    # An application Xid: a job's user can cause it, so NoSchedule even where the site asked NoExecute.
    assert api.rules[RULE]["spec"]["taint"]["effect"] == "NoSchedule"
    assert not nv.our_taints(api.node) and not api.node["spec"].get("unschedulable")
    record = nv.owned(api.node)
    assert (record["gpus"], record["of"], record["devices"]) == ([3], 8, [RULE])
    held = nv.state_of(api.node)
    assert held.drain and held.reason == XID and budget.share_of(held) == 0.125
    assert budget.counted(held, "gpugate")


def test_without_an_offer_or_where_not_served_the_keeper_holds_the_node():
    for case in ("no offer", "not served", "node-wide", "off", "another reason"):
        api = FakeAPI(served=case != "not served")
        agent = kube_nodes(api, device_holds=case != "off")
        findings = [finding("xid_repeat", 3, RESET_GPU)]
        if case == "node-wide":
            findings.append(Finding(HEALTH, "driver", "550", "580", REBOOT))
        if case != "no offer":
            published(api, agent, findings)
        else:
            agent.set_comment("node01", pending.publish("", XID, 900))
        keeper = kube_nodes(api, device_holds=case != "off")
        keeper.drain("node01", XID if case != "another reason" else XID.replace("x3", "x4"))
        assert api.rules == {}, case
        assert [t["effect"] for t in nv.our_taints(api.node)] == ["NoSchedule"], case
        assert budget.share_of(nv.state_of(api.node)) == 1, case
        if case in ("no offer", "node-wide", "off"):  # no offer was published
            assert gpushare.OPEN not in api.node["metadata"]["annotations"][nv.PENDING], case


def test_the_offer_goes_with_the_published_span():
    api = FakeAPI()
    agent = kube_nodes(api)
    published(api, agent, [finding("xid_repeat", 3, RESET_GPU)])
    comment = nv.state_of(api.node).comment
    agent.set_comment("node01", pending.clear(comment))
    assert nv.PENDING not in api.node["metadata"]["annotations"]


def test_the_agents_failed_device_hold_is_not_tried_again_by_its_drain():
    api = FakeAPI(served=False)
    agent = kube_nodes(api)
    published(api, agent, [finding("xid_repeat", 3, RESET_GPU)])
    assert agent.hold_devices("node01", XID, [finding("xid_repeat", 3, RESET_GPU)], gpu3(api))
    gets = len(api.calls)
    agent.drain("node01", XID)
    assert [c for c in api.calls[gets:] if c[0] == "GET" and "resource.k8s.io" in c[1]] == []
    assert nv.our_taints(api.node)


def test_a_records_share_is_kept_when_the_reason_is_written_again():
    api = FakeAPI()
    backend = kube_nodes(api)
    backend.hold_devices("node01", XID, [finding("xid_repeat", 3, RESET_GPU)], gpu3(api))
    rma = "gpugate rma xid_repeat:gpu3=13 x3 by 3 users (want none)"
    backend.drain("node01", rma)
    record = json.loads(api.node["metadata"]["annotations"][nv.OWNED])
    assert record["reason"] == rma and (record["gpus"], record["of"]) == ([3], 8)
    assert "{" not in api.node["metadata"]["annotations"][nv.OWNED][1:-1]  # node-fields-policy reads it flat
