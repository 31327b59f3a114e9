"""One GPU held instead of its Node ([kubernetes] device_holds), the pure
parts: which findings are one GPU's and with which DeviceTaintRule effect
(gpugate.kube.devicehold, property tests), how a GPU is found in the
ResourceSlices a DRA driver publishes (gpugate.kube.dra.locate, on a slice
in NVIDIA's driver's shape, tests/fixtures), the rules' names and
ownership, and the Node's record of a device hold (gpugate.kube.nodeview).
The same against real API servers: tests/test_kube_device_holds.py."""

import copy
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpugate.kube import devicehold as dh
from gpugate.kube import dra
from gpugate.kube import nodeview as nv
from gpugate.model.findings import (ACTIONS, HEALTH, PROBE, REBOOT, RESET_GPU, RMA_ACTION, USER_CAUSED, Finding)

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures",
                       "dra-resourceslice-nvidia-h100x8.json")
OWN = sorted(dh.GPU_OWN)
ELSE = ["driver", "fallen_off_bus", "sxid", "fabric", "nvml", "module", "gpu_count", "imex_domain", "clocks",
        "preflight_across", "nvlink", "vbios"]


def nvidia_slice():
    with open(FIXTURE) as handle:
        return json.load(handle)


def finding(component, gpu=3, action=RESET_GPU, observed="failure", cls=HEALTH):
    return Finding(cls, component, observed, "none", action, gpu=gpu)


gpu_findings = st.builds(
    lambda component, gpu, action, cls: finding(component, gpu, action, cls=cls),
    st.sampled_from(OWN), st.integers(0, 7), st.sampled_from([RESET_GPU, RMA_ACTION, "investigate"]),
    st.sampled_from([HEALTH, PROBE]))
any_findings = st.builds(
    lambda component, gpu, action: finding(component, gpu, action),
    st.sampled_from(OWN + ELSE + ["xid"]), st.one_of(st.none(), st.integers(0, 7)), st.sampled_from(ACTIONS))


@settings(max_examples=300, deadline=None)
@given(st.lists(gpu_findings, min_size=1, max_size=6), st.booleans())
def test_a_verdict_of_gpu_findings_holds_exactly_their_gpus(findings, no_execute):
    held, why = dh.plan(findings, no_execute)
    assert why == ""
    assert set(held) == {f.gpu for f in findings}
    for gpu, effect in held.items():
        mine = [f for f in findings if f.gpu == gpu]
        # The strongest effect of its findings, and each finding's effect as decided alone.
        assert effect == max((dh.effect(f, no_execute) for f in mine), key=dh._STRENGTH.__getitem__)


@settings(max_examples=300, deadline=None)
@given(st.lists(any_findings, min_size=1, max_size=6), st.booleans())
def test_one_finding_that_is_not_one_gpus_holds_the_node(findings, no_execute):
    held, why = dh.plan(findings, no_execute)
    node_wide = [f for f in findings if dh.granular(f)]
    assert bool(node_wide) == bool(why)
    if node_wide:
        assert held == {}
    for f in findings:
        if f.gpu is None or f.action == REBOOT or f.component in ELSE:
            assert dh.granular(f), f


@settings(max_examples=300, deadline=None)
@given(any_findings, st.booleans())
def test_no_execute_only_where_acute_asked_and_never_for_what_a_user_can_cause(f, no_execute):
    effect = dh.effect(f, no_execute)
    assert effect in ("None", "NoSchedule", "NoExecute")
    if effect == "NoExecute":
        assert no_execute and f.acute and f.component not in USER_CAUSED
    if f.component in USER_CAUSED:
        assert effect != "NoExecute"


def test_the_findings_the_issue_names():
    assert dh.plan([finding("row_remap", 3, RMA_ACTION)], False) == ({3: "NoSchedule"}, "")
    assert dh.plan([finding("row_remap", 3, RMA_ACTION)], True) == ({3: "NoExecute"}, "")
    # An application-Xid repeat is the users' to cause: NoSchedule, even where the site asks NoExecute.
    assert dh.plan([finding("xid_repeat", 5, observed="xids 13,43 x3")], True) == ({5: "NoSchedule"}, "")
    assert dh.plan([finding("dcgm_diag", 1, "investigate", observed="memory fail")], False) == ({1: "NoSchedule"}, "")
    assert dh.plan([finding("ecc", 2), finding("xid", 2, observed="48")], True) == ({2: "NoExecute"}, "")
    assert dh.plan([finding("pcie_width", 6, observed="x8")], True) == ({6: "None"}, "")
    # Node-wide: a GPU off the bus, an NVLink Xid, the driver's recovery asking a reboot, no GPU named.
    for f in (finding("xid", 1, REBOOT, observed="79"), finding("xid", 1, observed="74"),
              finding("recovery", 1, REBOOT), finding("ecc", None)):
        held, why = dh.plan([finding("row_remap", 3, RMA_ACTION), f], True)
        assert held == {} and why, f


def test_a_gpu_is_found_by_its_uuid_or_pci_address_never_by_its_index():
    item = nvidia_slice()
    dev = item["spec"]["devices"][5]
    uuid, address = dev["attributes"]["uuid"]["string"], dev["attributes"]["pcieBusID"]["string"]
    where = [("gpu.nvidia.com", "gpu-node-01", "gpu-5")]
    assert dra.locate([item], {"uuid": uuid}) == (where, "")
    # NVML's form of the address (an 8-digit domain, upper case) is the same address.
    assert dra.locate([item], {"pci": "00000000:%s" % address.split(":", 1)[1].upper()}) == (where, "")
    assert dra.locate([item], {"uuid": uuid, "pci": address}) == (where, "")
    found, why = dra.locate([item], {"uuid": "GPU-00000000-0000-0000-0000-000000000000"})
    assert found == [] and "no ResourceSlice" in why
    found, why = dra.locate([item], {})
    assert found == [] and "no UUID" in why
    other = item["spec"]["devices"][2]["attributes"]["pcieBusID"]["string"]
    found, why = dra.locate([item], {"uuid": uuid, "pci": other})
    assert found == [] and "different devices" in why


def test_amd_and_mig_forms():
    amd = nvidia_slice()
    amd["spec"]["driver"] = "gpu.amd.com"
    for i, dev in enumerate(amd["spec"]["devices"]):
        address = dev["attributes"]["pcieBusID"]["string"]
        dev["name"] = "gpu-%d-%d" % (i + 1, 128 + i)
        dev["attributes"] = {"type": {"string": "amdgpu"}, "resource.kubernetes.io/pciBusID": {"string": address}}
    assert dra.locate([amd], {"pci": "0000:3a:00.0"}) == ([("gpu.amd.com", "gpu-node-01", "gpu-3-130")], "")
    # A MIG device of the GPU (parentUUID) is held with it.
    mig = nvidia_slice()
    parent = copy.deepcopy(mig["spec"]["devices"][0])
    child = {"name": "gpu-0-mig-9-0-4", "attributes": {"type": {"string": "mig"},
                                                       "uuid": {"string": "MIG-1"},
                                                       "parentUUID": parent["attributes"]["uuid"]}}
    mig["spec"]["devices"].append(child)
    found, why = dra.locate([mig], {"uuid": parent["attributes"]["uuid"]["string"]})
    assert why == "" and [d for _, _, d in found] == ["gpu-0", "gpu-0-mig-9-0-4"]


def test_a_rule_is_named_the_same_every_run_and_gpugate_knows_its_own():
    body = dra.rule("node01", 3, ("gpu.nvidia.com", "node01", "gpu-3"), "NoSchedule", "health", "gpugate health x")
    assert body["metadata"]["name"] == "gpugate.node01.gpu.nvidia.com.gpu-3"
    assert body["spec"] == {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": "node01", "device": "gpu-3"},
                            "taint": {"key": "gpugate.io/unfit", "value": "health", "effect": "NoSchedule"}}
    assert dra.ours(body, "node01") and not dra.ours(body, "node02")
    foreign = copy.deepcopy(body)
    del foreign["metadata"]["labels"]["app.kubernetes.io/managed-by"]
    assert not dra.ours(foreign, "node01")
    long_node = "n" * 250
    name = dra.rule_name(long_node, "gpu.nvidia.com", "gpu-3")
    assert len(name) <= 253 and name == dra.rule_name(long_node, "gpu.nvidia.com", "gpu-3")
    assert name != dra.rule_name(long_node, "gpu.nvidia.com", "gpu-4")


def test_the_node_records_a_device_hold_and_reads_as_held():
    node = {"metadata": {"name": "node01", "resourceVersion": "7", "annotations": {}}, "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    reason = "gpugate health row_remap:gpu3=failure (want none)"
    patch = nv.device_patch(node, reason, ["gpugate.node01.gpu.nvidia.com.gpu-3"], 100)
    assert "spec" not in patch  # no taint, no cordon: the other GPUs keep serving
    node["metadata"]["annotations"] = patch["metadata"]["annotations"]
    state = nv.state_of(node)
    assert state.reason == reason and "DRAIN" in state.flags
    assert nv.devices_held(node) == ["gpugate.node01.gpu.nvidia.com.gpu-3"]
    lifted = nv.undrain_patch(node)
    assert lifted["metadata"]["annotations"] == {nv.OWNED: None} and "spec" not in lifted
    # The record stays within what node-fields-policy.yaml reads (no nested object).
    text = patch["metadata"]["annotations"][nv.OWNED]
    assert "{" not in text[1:-1] and json.loads(text)["cordon"] is False


@pytest.mark.parametrize("text,want", [("00000000:18:00.0", "0000:18:00.0"), ("0000:DB:00.0", "0000:db:00.0"),
                                       ("0000:38:00", "0000:38:00.0"), ("", ""), (None, ""), ("pci0000:15", "")])
def test_pci_addresses_read_as_one_form(text, want):
    assert dra.pci(text) == want


class FakeAPI:
    """The calls gpugate.kube.dra and KubeNodes make, over dicts: a Node,
    ResourceSlices, DeviceTaintRules; ``served``: the group lists the kind;
    ``refuse``: rule names whose create is refused (403)."""

    def __init__(self, served=True, refuse=()):
        self.node = {"kind": "Node", "metadata": {"name": "node01", "uid": "u1", "resourceVersion": "1",
                                                  "annotations": {}}, "spec": {}, "status": {}}
        item = nvidia_slice()
        item["spec"].update(nodeName="node01", pool={"name": "node01", "generation": 1, "resourceSliceCount": 1})
        self.slices, self.rules, self.served, self.refuse, self.calls = [item], {}, served, set(refuse), []
        self.requests = 0

    def get(self, path):
        from gpugate.kube.client import KubeError

        self.calls.append(("GET", path))
        if path == dra.API:
            if not self.served:
                raise KubeError("404", 404, "NotFound")
            return {"resources": [{"name": "resourceslices"}, {"name": "devicetaintrules"}]}
        if path.startswith(dra.RULES + "/"):
            return copy.deepcopy(self.rules[path.rsplit("/", 1)[1]])
        return copy.deepcopy(self.node)

    def list_pages(self, path, **query):
        self.calls.append(("LIST", path))
        return iter(copy.deepcopy(self.slices if path == dra.SLICES else list(self.rules.values())))

    def create(self, path, body):
        from gpugate.kube.client import KubeError

        name = body["metadata"]["name"]
        self.calls.append(("POST", name))
        if name in self.refuse:
            raise KubeError("403 Forbidden: by policy", 403, "Forbidden")
        if name in self.rules:
            raise KubeError("409 AlreadyExists", 409, "AlreadyExists")
        self.rules[name] = dict(copy.deepcopy(body), metadata=dict(body["metadata"], uid="r-" + name,
                                                                  resourceVersion="1"))
        return self.rules[name]

    def replace(self, path, body):
        self.calls.append(("PUT", body["metadata"]["name"]))
        self.rules[body["metadata"]["name"]] = copy.deepcopy(body)
        return body

    def request(self, method, path, body=None, *args, **kwargs):
        self.calls.append((method, path.rsplit("/", 1)[1]))
        self.rules.pop(path.rsplit("/", 1)[1], None)
        return {}

    def patch(self, path, patch, kind="merge"):
        self.calls.append(("PATCH", path))
        annotations = self.node["metadata"]["annotations"]
        for key, value in patch["metadata"].get("annotations", {}).items():
            if value is None:
                annotations.pop(key, None)
            else:
                annotations[key] = value
        if "spec" in patch:
            self.node["spec"].update(patch["spec"])
        self.node["metadata"]["resourceVersion"] = str(int(self.node["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(self.node)

    def close(self):
        pass


REMAP = "gpugate health row_remap:gpu3=failure (want none)"


def kube_nodes(api, **kube):
    from gpugate.kube.nodes import KubeNodes

    return KubeNodes(api, dict({"device_holds": True}, **kube), "gpugate", clock=lambda: 1000.0)


def gpu3(api):
    dev = api.slices[0]["spec"]["devices"][3]
    return {3: {"uuid": dev["attributes"]["uuid"]["string"]}}


def test_hold_devices_holds_the_gpu_and_its_lift_deletes_the_rule():
    api = FakeAPI()
    backend = kube_nodes(api)
    assert backend.hold_devices("node01", REMAP, [finding("row_remap", 3, RMA_ACTION)], gpu3(api)) == ""
    assert list(api.rules) == ["gpugate.node01.gpu.nvidia.com.gpu-3"]
    assert backend.scope["node01"] == "held: gpu3 node01/gpu-3 NoSchedule, not the Node"
    assert nv.devices_held(api.node) == ["gpugate.node01.gpu.nvidia.com.gpu-3"] and not nv.our_taints(api.node)
    # The next run's hold: the rule as the server keeps it (its timeAdded) is not written again.
    api.rules["gpugate.node01.gpu.nvidia.com.gpu-3"]["spec"]["taint"]["timeAdded"] = "2026-12-05T07:00:00Z"
    assert backend.hold_devices("node01", REMAP, [finding("row_remap", 3, RMA_ACTION)], gpu3(api)) == ""
    assert "PUT" not in [call[0] for call in api.calls]
    # A new effect is (the site asked NoExecute since).
    assert kube_nodes(api, no_execute=True).hold_devices(
        "node01", REMAP, [finding("row_remap", 3, RMA_ACTION)], gpu3(api)) == ""
    assert api.rules["gpugate.node01.gpu.nvidia.com.gpu-3"]["spec"]["taint"]["effect"] == "NoExecute"
    backend.undrain("node01")
    assert api.rules == {} and nv.owned(api.node) == {}


@pytest.mark.parametrize("case,want", [
    ("node-wide", "fallen_off_bus names no GPU"),
    ("more in the reason", "the reason names more than this run's findings"),
    ("not served", dra.NOT_SERVED),
    ("gpu unknown", "gpu3: gpugate read no UUID nor PCI address for it"),
    ("refused", "the GPUs could not be held alone: 403 Forbidden: by policy"),
    ("foreign rule", "the GPUs could not be held alone: DeviceTaintRule gpugate.node01.gpu.nvidia.com.gpu-3 was not "
                     "written by gpugate: left alone"),
])
def test_hold_devices_says_why_the_node_is_held_and_leaves_nothing_half_written(case, want):
    api = FakeAPI(served=case != "not served", refuse=["gpugate.node01.gpu.nvidia.com.gpu-5"])
    findings, reason, gpus = [finding("row_remap", 3, RMA_ACTION)], REMAP, gpu3(api)
    if case == "node-wide":
        findings.append(Finding(HEALTH, "fallen_off_bus", "0000:18:00", "on the bus", REBOOT))
    if case == "more in the reason":
        reason = REMAP + "; ecc:gpu1=2 (want 0)"
    if case == "gpu unknown":
        gpus = {}
    if case == "refused":  # gpu3 written, gpu5 refused: gpu3's rule is deleted again
        findings.append(finding("ecc", 5))
        gpus[5] = {"uuid": api.slices[0]["spec"]["devices"][5]["attributes"]["uuid"]["string"]}
        reason = REMAP + "; ecc:gpu5=failure (want none)"
    if case == "foreign rule":
        theirs = dra.rule("node01", 3, ("gpu.nvidia.com", "node01", "gpu-3"), "None", "health", "x")
        del theirs["metadata"]["labels"]["app.kubernetes.io/managed-by"]
        api.rules[theirs["metadata"]["name"]] = theirs
    backend = kube_nodes(api)
    why = backend.hold_devices("node01", reason, findings, gpus)
    assert why.startswith(want), why
    assert backend.scope["node01"] == "the Node is held: " + why
    assert nv.owned(api.node) == {}  # the Node untouched here: the caller holds it
    if case == "foreign rule":
        assert list(api.rules) == ["gpugate.node01.gpu.nvidia.com.gpu-3"] and "PUT" not in [c[0] for c in api.calls]
        assert not dra.ours(api.rules["gpugate.node01.gpu.nvidia.com.gpu-3"], "node01")
    else:
        assert api.rules == {}
    if case in ("node-wide", "more in the reason"):
        assert api.calls == []  # decided before any request


def test_hold_devices_is_off_unless_asked():
    api = FakeAPI()
    backend = kube_nodes(api, device_holds=False)
    assert "off" in backend.hold_devices("node01", REMAP, [finding("row_remap", 3, RMA_ACTION)], gpu3(api))
    assert api.calls == [] and backend.scope == {}


def test_a_device_hold_survives_the_node_object_as_a_node_hold():
    """gpugate.kube.survive remembers a device hold as any hold; a Node
    registered anew without it is held again (as a Node: the safe side)."""
    from gpugate.kube import survive

    api = FakeAPI()
    kube_nodes(api).hold_devices("node01", REMAP, [finding("row_remap", 3, RMA_ACTION)], gpu3(api))
    action, reason = survive.decide(None, api.node, "gpugate")
    assert (action, reason) == (survive.REMEMBER, REMAP)
    record = {"reason": reason, "uid": "u1"}
    assert survive.decide(record, api.node, "gpugate") == (survive.NOTHING, REMAP)
    anew = {"metadata": {"name": "node01", "uid": "u2", "resourceVersion": "9"}, "spec": {}, "status": {}}
    assert survive.decide(record, anew, "gpugate") == (survive.RESTORE, REMAP)


def test_a_device_hold_stays_one_for_its_gpus_own_findings_only():
    """KubeNodes.drain on a node whose GPUs are held alone: the sweep's
    escalation of the same GPU's finding keeps the device hold (the reason
    written, the rule kept); its work reason, or another GPU, holds the Node."""
    api = FakeAPI()
    backend = kube_nodes(api)
    backend.hold_devices("node01", REMAP, [finding("row_remap", 3, RMA_ACTION)], gpu3(api))
    rma = "gpugate rma row_remap:gpu3=failure (want none); evidence=node01-20261205T070000Z-a1"
    backend.drain("node01", rma)
    assert nv.owned(api.node)["reason"] == rma and nv.devices_held(api.node) == list(api.rules)
    assert not nv.our_taints(api.node) and not api.node["spec"].get("unschedulable")
    assert backend.scope["node01"] == "still held: gpu3, not the Node"
    for reason in ("gpugate health sweep=reset (want fit); row_remap:gpu3=failure (want none)",
                   "gpugate health ecc:gpu5=2 (want 0)"):
        api.node["metadata"]["annotations"][nv.OWNED] = json.dumps(
            {"reason": rma, "at": 1, "effects": [], "cordon": False, "devices": list(api.rules)})
        api.node["spec"] = {}
        backend._seen.pop("node01", None)
        backend.drain("node01", reason)
        assert [t["effect"] for t in nv.our_taints(api.node)] == ["NoSchedule"], reason
        assert nv.device_rules(api.node) == list(api.rules)  # still named: lifted with the Node


def test_gpu_identities_are_what_the_node_read_of_its_gpus():
    """NVML's UUID and bus id, amdgpu's PCI address; a value NVML could not
    read is left out (never a guess), and a run that read no GPU has none."""
    from types import SimpleNamespace as NS

    from gpugate.model.facts import ProbeFailure
    from gpugate.node.act import gpu_identities

    failed = ProbeFailure("nvml", "error", "GPU is lost")
    nvml = NS(gpus=(NS(index=0, uuid="GPU-a", pci_bus_id="00000000:18:00.0"),
                    NS(index=1, uuid=failed, pci_bus_id="00000000:2A:00.0")))
    assert gpu_identities(NS(nvml=nvml, amd=None)) == {0: {"uuid": "GPU-a", "pci": "00000000:18:00.0"},
                                                       1: {"pci": "00000000:2A:00.0"}}
    amd = NS(gpus=(NS(index=0, bdf="0000:1b:00.0"),))
    assert gpu_identities(NS(nvml=None, amd=amd)) == {0: {"pci": "0000:1b:00.0"}}
    assert gpu_identities(NS(nvml=failed, amd=None)) == {} and gpu_identities(None) == {}
