"""Least privilege, shown by refusals (issue 45, items 1 and 2), on a real
kube-apiserver with deploy/kubernetes applied: each gpugate identity (the
node agent with a token naming its node, the same ServiceAccount with a
token naming none, the keeper, the sweep) tries each write that is not
gpugate's and is refused with the admission policy's own words; the writes
gpugate makes (gpugate.kube.nodes, the Node channel) still pass; the list
of what each may write in docs/explanation/kubernetes.md is the policies' list; and the
manifests installed in another namespace enforce all the same."""

import os
import re
import time

import pytest
import yaml

from gpugate.kube import nodeview as nv
from gpugate.kube.client import KubeClient, KubeError, node_path
from test_kube_agent import _require_kube, api  # noqa: F401 (the module's API server)

pytestmark = pytest.mark.kube

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MANIFESTS = os.path.join(ROOT, "deploy", "kubernetes")
DEDICATED = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}  # the site's own taint
CONTROL = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}
SA = {"agent": "gpugate-node-agent", "unbound": "gpugate-node-agent", "keeper": "gpugate-keeper",
      "sweep": "gpugate-sweep"}
WHO = {"agent": "node agent", "unbound": "node agent", "keeper": "keeper", "sweep": "sweep"}
CLAIM = "writes only the Node its pod runs on"
# A record that claims the cordon, as gpugate.kube.nodeview.drain_patch writes it.
RECORD = '{"at": 1, "cordon": true, "effects": ["NoSchedule"], "reason": "gpugate: health xid:gpu2=79"}'


def _token(admin, ns: str, who: str, node: str = ""):
    """A real ServiceAccount token from a TokenRequest: bound to a Pod on
    ``node`` (the API server stamps authentication.kubernetes.io/node-name,
    as for the DaemonSet's pod; no kubelet: the Pod is only an object), or
    bound to nothing (a `kubectl create token`)."""
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}}
    if node:
        pod = admin.create("/api/v1/namespaces/%s/pods" % ns, {
            "metadata": {"generateName": SA[who] + "-"},
            "spec": {"nodeName": node, "serviceAccountName": SA[who],
                     "containers": [{"name": "c", "image": "registry.example/gpugate:1"}]}})
        body["spec"]["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"],
                                          "uid": pod["metadata"]["uid"]}
    answer = admin.create("/api/v1/namespaces/%s/serviceaccounts/%s/token" % (ns, SA[who]), body)
    return answer["status"]["token"]


def _wait_enforced(api, clients, timeout: float = 60.0) -> None:
    """Each identity's label write refused by a policy (a new policy is
    enforced a moment after it is created): probed as the tests use them."""
    from gpugate.testbed.kube import add_node

    admin = api.admin()
    add_node(admin, "probe01")
    try:
        for who, client in clients.items():
            deadline, last = time.monotonic() + timeout, ""
            while True:
                try:
                    client.request("PATCH", node_path("probe01"), {"metadata": {"labels": {"probe": "x"}}},
                                   "application/merge-patch+json", query={"dryRun": "All"})
                    last = "let through"
                except KubeError as exc:
                    if exc.status in (403, 422) and "ValidatingAdmissionPolicy" in str(exc):
                        break
                    last = str(exc)[:200]
                assert time.monotonic() < deadline, "%s: no policy enforced (%s)" % (who, last)
                time.sleep(0.2)
    finally:
        admin.request("DELETE", node_path("probe01"))


class Rig:
    def __init__(self, api, ns: str = "gpugate"):
        from gpugate.testbed.kube import add_node

        self.api, self.admin, self.ns = api, api.admin(), ns
        self.add_node = add_node
        self.clients = {"agent": self.client(_token(self.admin, ns, "agent", "gpu01")),
                        "unbound": self.client(_token(self.admin, ns, "unbound")),
                        "keeper": self.client(_token(self.admin, ns, "keeper")),
                        "sweep": self.client(_token(self.admin, ns, "sweep"))}

    def client(self, token: str) -> KubeClient:
        made = KubeClient(self.api.server, token, self.api.ca_file)
        made.ca_file = self.api.ca_file
        return made

    def nodes(self) -> None:
        """gpu01 and gpu02 registered anew (the site's taint; the API server adds its not-ready one), and a
        control-plane node."""
        for name in ("gpu01", "gpu02"):
            self.add_node(self.admin, name, {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, [DEDICATED])
        self.add_node(self.admin, "cp01", {"node-role.kubernetes.io/control-plane": ""}, [CONTROL])

    def get(self, name: str) -> dict:
        return self.admin.get(node_path(name))

    def held(self, name: str, cordon: bool = True) -> dict:
        """The patch of gpugate's hold on ``name`` as it is now (its taint beside the others, its record)."""
        taints = (self.get(name)["spec"].get("taints") or []) + [
            {"key": nv.TAINT_KEY, "value": "health", "effect": "NoSchedule"}]
        spec = {"taints": taints, "unschedulable": True} if cordon else {"taints": taints}
        return {"metadata": {"annotations": {nv.OWNED: RECORD if cordon else RECORD.replace("true", "false")}},
                "spec": spec}


@pytest.fixture(scope="module")
def rig(api):
    made = Rig(api)
    _wait_enforced(api, made.clients)
    return made


def _write(client: KubeClient, path: str, patch, kind: str = "merge"):
    """(HTTP status, the API server's whole message): KubeError keeps 300 characters of it, and a write
    refused on several counts lists each policy's words."""
    import json
    import ssl
    import urllib.error
    import urllib.request

    types = {"merge": "application/merge-patch+json", "strategic": "application/strategic-merge-patch+json"}
    req = urllib.request.Request(client.server + path, json.dumps(patch).encode(), method="PATCH", headers={
        "Authorization": "Bearer " + client.token, "Content-Type": types[kind], "Accept": "application/json"})
    context = ssl.create_default_context(cafile=client.ca_file)
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as answer:
            return answer.status, ""
    except urllib.error.HTTPError as exc:
        return exc.code, str(json.loads(exc.read() or b"{}").get("message", ""))


def _refused(rig, who, name, patch, said, sub="", kind="merge"):
    before = rig.get(name)["metadata"]["resourceVersion"]
    status, text = _write(rig.clients[who], node_path(name, sub), patch, kind)
    assert status in (403, 422), (who, status, text)
    assert any(words in text for words in ((said,) if isinstance(said, str) else said)), (who, text)
    assert rig.get(name)["metadata"]["resourceVersion"] == before  # nothing written
    return text


def _status_refused(who: str, said: str):
    """The keeper and the sweep have no RBAC on nodes/status: RBAC refuses first; the node agent, its policy."""
    return ("the gpugate node agent " + said,) if who in ("agent",) else ('cannot patch resource "nodes/status"',
                                                                          "the gpugate node agent " + said)


def _forbidden(rig, who):
    """(what, Node, patch, words of the refusal, subresource, patch kind) for one identity."""
    name = "gpu01"  # the agent's own Node: refused for what it writes, not where
    mine = WHO[who]
    taints = rig.get(name)["spec"]["taints"]
    cp_taints = [t for t in rig.get("cp01")["spec"]["taints"] if t["key"] != CONTROL["key"]]
    writes = [
        ("a label", name, {"metadata": {"labels": {"nvidia.com/gpu.product": "other"}}}, "does not change a Node's labels"),
        ("the site's taint removed", name, {"spec": {"taints": [t for t in taints if t != DEDICATED]}},
         "changes only its own gpugate.io/unfit taints"),
        ("another taint added", name, {"spec": {"taints": taints + [{"key": "evil", "effect": "NoExecute"}]}},
         "changes only its own gpugate.io/unfit taints"),
        ("a finalizer", name, {"metadata": {"finalizers": ["example.com/keep"]}},
         "does not change a Node's ownerReferences or finalizers"),
        ("an ownerReference", name, {"metadata": {"ownerReferences": [
            {"apiVersion": "v1", "kind": "Namespace", "name": "gpugate", "uid": "0d1c6a4e-0000-4000-8000-000000000001"}]}},
         "does not change a Node's ownerReferences or finalizers"),
        ("a bare cordon", name, {"spec": {"unschedulable": True}}, "cordons a Node only with its gpugate.io/unfit"),
        ("another's annotation", name, {"metadata": {"annotations": {"example.com/owner": "me"}}},
         "changes only the annotations"),
        ("a providerID", name, {"spec": {"providerID": "aws:///forged"}},
         "does not change a Node's podCIDR or providerID"),
    ]
    if who != "sweep":
        writes.append(("the sweep's request", name, {"metadata": {"annotations": {"gpugate.io/request": "{}"}}},
                       "changes only the annotations"))
    if who != "agent":
        writes.append(("the node agent's answer", name, {"metadata": {"annotations": {"gpugate.io/answer": "{}"}}},
                       "changes only the annotations"))
    if who != "agent":  # (the agent's own Node has no control-plane taint: its writes there are by node below)
        writes.append(("the control-plane taint lifted", "cp01", {"spec": {"taints": cp_taints}},
                       "changes only its own gpugate.io/unfit taints"))
    status = [("bootID", {"status": {"nodeInfo": {"bootID": "forged"}}}),
              ("capacity", {"status": {"capacity": {"nvidia.com/gpu": "4"}}}),
              ("allocatable", {"status": {"allocatable": {"nvidia.com/gpu": "4"}}}),
              ("addresses", {"status": {"addresses": [{"type": "InternalIP", "address": "10.9.9.9"}]}}),
              ("the Ready condition", {"status": {"conditions": [
                  {"type": "Ready", "status": "False", "reason": "Forged", "message": "x"}]}})]
    for what, patch in status:
        said = "changes only the GpugateHealthy condition" if what == "the Ready condition" else "changes no Node status"
        writes.append((what, name, patch, _status_refused(who, said), "status", "strategic"))
    out = []
    for item in writes:
        what, node, patch, said = item[:4]
        said = tuple("the gpugate %s %s" % (mine, s) if not s.startswith(("the gpugate", "cannot")) else s
                     for s in ((said,) if isinstance(said, str) else said))
        out.append((what, node, patch, said) + tuple(item[4:]))
    return out


@pytest.mark.parametrize("who", ["agent", "keeper", "sweep"])
def test_each_identity_is_refused_each_write_that_is_not_gpugates(rig, who):
    rig.nodes()
    for item in _forbidden(rig, who):
        what, node, patch, said = item[:4]
        try:
            _refused(rig, who, node, patch, said, *item[4:])
        except AssertionError as exc:
            raise AssertionError("%s writing %s on %s: %s" % (who, what, node, exc)) from None


@pytest.mark.parametrize("who", ["agent", "keeper", "sweep"])
def test_no_identity_lifts_an_admins_cordon_or_claims_it(rig, who):
    """An admin's cordon stays the admin's: gpugate holds the node beside it (its record says the cordon
    is not its own) and may never lift it, nor rewrite its record to claim it."""
    rig.nodes()
    rig.admin.patch(node_path("gpu01"), {"spec": {"unschedulable": True}})
    mine = "the gpugate %s " % WHO[who]
    _refused(rig, who, "gpu01", {"spec": {"unschedulable": False}}, mine + "lifts only its own cordon")
    _refused(rig, who, "gpu01", rig.held("gpu01"), mine + "records a cordon as its own only in the write that makes it")
    rig.clients[who].patch(node_path("gpu01"), rig.held("gpu01", cordon=False))  # held beside it: allowed
    _refused(rig, who, "gpu01", {"spec": {"unschedulable": False}}, mine + "lifts only its own cordon")
    _refused(rig, who, "gpu01", {"metadata": {"annotations": {nv.OWNED: RECORD}}},
             mine + "records a cordon as its own only in the write that makes it")
    assert rig.get("gpu01")["spec"]["unschedulable"] is True


def test_the_node_agent_writes_its_own_node_only_and_a_token_naming_none_writes_nothing(rig):
    """The issue's reproduction: a token of the agent's ServiceAccount from a TokenRequest bound to no Pod
    wrote gpugate.io/pending on a Node (HTTP 200).  Now refused, as is its own token on another Node."""
    rig.nodes()
    pending = {"metadata": {"annotations": {nv.PENDING: "forged"}}}
    condition = {"status": {"conditions": [{"type": "GpugateHealthy", "status": "False", "reason": "Forged",
                                            "message": "x"}]}}
    for name in ("gpu01", "gpu02"):
        _refused(rig, "unbound", name, pending, "the gpugate node agent " + CLAIM)
        _refused(rig, "unbound", name, condition, "the gpugate node agent " + CLAIM, "status", "strategic")
    _refused(rig, "agent", "gpu02", pending, "the gpugate node agent " + CLAIM)
    _refused(rig, "agent", "gpu02", rig.held("gpu02"), "the gpugate node agent " + CLAIM)
    _refused(rig, "agent", "gpu02", condition, "the gpugate node agent " + CLAIM, "status", "strategic")
    rig.clients["agent"].patch(node_path("gpu01"), pending)  # its own Node: allowed
    assert rig.get("gpu01")["metadata"]["annotations"][nv.PENDING] == "forged"


def test_the_sweep_asks_only_on_a_held_node_and_evicts_with_the_pods_own_grace(rig):
    rig.nodes()
    ask = {"metadata": {"annotations": {"gpugate.io/request": '{"id":"x","argv":["reset-gpus"]}'}}}
    _refused(rig, "sweep", "gpu02", ask, "the gpugate sweep asks the node agent only on a Node gpugate holds")
    rig.admin.create("/api/v1/namespaces/default/pods", {"metadata": {"name": "tenant"}, "spec": {
        "nodeName": "gpu02", "containers": [{"name": "c", "image": "registry.example/app:1"}]}})
    try:
        with pytest.raises(KubeError) as info:
            rig.clients["sweep"].create("/api/v1/namespaces/default/pods/tenant/eviction", {
                "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "tenant", "namespace": "default"},
                "deleteOptions": {"gracePeriodSeconds": 0}})
        assert info.value.status in (403, 422) and "evicts with each pod's own grace period" in str(info.value)
        assert not rig.admin.get("/api/v1/namespaces/default/pods/tenant")["metadata"].get("deletionTimestamp")
    finally:
        rig.admin.request("DELETE", "/api/v1/namespaces/default/pods/tenant",
                          {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})
    rig.admin.patch(node_path("gpu02"), rig.held("gpu02"))
    rig.clients["sweep"].patch(node_path("gpu02"), ask)  # held: asked


def test_the_writes_gpugate_makes_still_pass(rig):
    """Through gpugate's own code with each token: the agent holds its Node (taint, cordon, record),
    publishes, answers and clears; the keeper holds and gives back; the sweep takes the node with its
    work reason, asks, clears the answer it read and returns the node."""
    from gpugate.kube.nodes import KubeNodes
    from gpugate.kube.transport import KubeTransport

    rig.nodes()
    agent, keeper, sweep = (KubeNodes(rig.clients[w], {}, "gpugate:") for w in ("agent", "keeper", "sweep"))
    agent.drain("gpu01", "gpugate: health xid:gpu2=79")
    held = rig.get("gpu01")
    assert [t["value"] for t in nv.our_taints(held)] == ["health"] and held["spec"]["unschedulable"] is True
    rig.clients["agent"].patch(node_path("gpu01", "status"), {"status": {"conditions": [{
        "type": "GpugateHealthy", "status": "False", "reason": "XidFallenOffBus", "message": "gpugate: health",
        "lastHeartbeatTime": "2026-12-05T00:00:00Z", "lastTransitionTime": "2026-12-05T00:00:00Z"}]}}, "strategic")
    agent.own_record("gpu01")  # (read again: each write carries the resourceVersion it was decided on)
    agent.set_comment("gpu01", "published")
    agent.undrain("gpu01")
    assert nv.our_taints(rig.get("gpu01")) == [] and not rig.get("gpu01")["spec"].get("unschedulable")
    keeper.drain("gpu02", "gpugate: drift driver=550.54.15 (want 570.172.08)")
    assert nv.state_of(rig.get("gpu02")).drain
    keeper.undrain("gpu02")
    assert not nv.state_of(rig.get("gpu02")).drain
    # The sweep: the keeper's hold, its work reason, a request it gave up on with the agent's answer left
    # on the Node: its return (one patch with the lift) takes both off.
    keeper.drain("gpu01", "gpugate: drift driver=550.54.15 (want 570.172.08)")
    sweep.drain("gpu01", "gpugate: sweep drift driver=550.54.15 (want 570.172.08)")
    transport = KubeTransport(rig.clients["sweep"])
    transport._ask("gpu01", '{"id":"abc","argv":["facts"],"timeout":5,"at":1}')
    rig.clients["agent"].patch(node_path("gpu01"), {"metadata": {"annotations": {"gpugate.io/answer": '{"id":"abc"}'}}})
    sweep.own_record("gpu01")
    sweep.set_comment("gpu01", "")
    sweep.resume("gpu01")
    done = rig.get("gpu01")
    assert not nv.state_of(done).drain and not set(done["metadata"].get("annotations") or {}) & {
        nv.OWNED, nv.PENDING, "gpugate.io/request", "gpugate.io/answer"}


def test_the_sweep_reads_and_evicts_only_the_pods_of_the_node_it_holds(rig):
    """RBAC lets the sweep list every Pod and an Eviction names no Node, so no policy can hold it to
    the held node: its code does (every Pod list with fieldSelector spec.nodeName).  Its real requests,
    recorded, on gpu02 held by the sweep beside a tenant's pod on gpu01."""
    from gpugate.kube import evict
    from gpugate.kube.nodes import KubeNodes

    rig.nodes()
    keeper, holder = (KubeNodes(rig.clients[w], {}, "gpugate:") for w in ("keeper", "sweep"))
    keeper.drain("gpu02", "gpugate: drift driver=550.54.15 (want 570.172.08)")
    holder.drain("gpu02", "gpugate: sweep drift driver=550.54.15 (want 570.172.08)")
    assert nv.our_taints(rig.get("gpu02")) and not nv.our_taints(rig.get("gpu01"))
    for name in ("gpu01", "gpu02"):
        rig.admin.create("/api/v1/namespaces/default/pods", {"metadata": {"name": "app-" + name}, "spec": {
            "nodeName": name, "containers": [{"name": "c", "image": "registry.example/app:1"}]}})
    seen = []

    class Recorded(KubeClient):
        def request(self, method, path, body=None, content_type="application/json", query=None, text=False):
            seen.append((method, path, dict(query or {})))
            return super().request(method, path, body, content_type, query, text)

    try:
        sweep = Recorded(rig.api.server, rig.clients["sweep"].token, rig.api.ca_file)
        left, refused = evict.evict_round(sweep, "gpu02")  # the held node (gpu01 has the agent's token's Pod too)
        assert left == ["default/app-gpu02"] and not refused
        lists = [(p, q) for m, p, q in seen if m == "GET"]
        assert lists and all(p == "/api/v1/pods" and q.get("fieldSelector") == "spec.nodeName=gpu02"
                             for p, q in lists), lists
        assert [p for m, p, _ in seen if m == "POST"] == ["/api/v1/namespaces/default/pods/app-gpu02/eviction"]
        assert rig.admin.get("/api/v1/namespaces/default/pods/app-gpu02")["metadata"].get("deletionTimestamp")
        assert not rig.admin.get("/api/v1/namespaces/default/pods/app-gpu01")["metadata"].get("deletionTimestamp")
    finally:
        for name in ("gpu01", "gpu02"):
            rig.admin.request("DELETE", "/api/v1/namespaces/default/pods/app-" + name,
                              {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})


def _documented():
    """docs/explanation/kubernetes.md's table "What each identity may write": {who: (sets, removes)}."""
    with open(os.path.join(ROOT, "docs", "explanation", "kubernetes.md")) as handle:
        text = handle.read()
    table = text[text.index("<!-- least-privilege-table -->"):]
    rows = {}
    for line in table.splitlines()[3:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        who = re.search(r"`gpugate-(node-agent|keeper|sweep)`", cells[0]).group(1)
        sets = set(re.findall(r"`(gpugate\.io/[a-z-]+)`", cells[1]))
        rows[{"node-agent": "agent"}.get(who, who)] = (sets, sets | set(re.findall(r"`(gpugate\.io/[a-z-]+)`", cells[2])))
    return rows


def _readme_lists():
    """docs/how-to/kubernetes.md's short list: {who: the annotations it names for each}."""
    with open(os.path.join(ROOT, "docs", "how-to", "kubernetes.md")) as handle:
        text = handle.read()
    block = text[text.index("may write on a Node ([What each identity may"):text.index("None of them changes labels")]
    rows = re.split(r"\n  - the (node agent|keeper|sweep):", block)[1:]
    return {{"node agent": "agent"}.get(who, who): set(re.findall(r"`(gpugate\.io/[a-z-]+)`", said)) - {nv.TAINT_KEY}
            for who, said in zip(rows[::2], rows[1::2])}


def _policy_lists():
    """node-fields-policy.yaml's annotation lists, per identity: {who: (sets, removes)}."""
    with open(os.path.join(MANIFESTS, "node-fields-policy.yaml")) as handle:
        policy = next(d for d in yaml.safe_load_all(handle) if d["kind"] == "ValidatingAdmissionPolicy")
    exprs = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}

    def branches(expr):
        parts = re.findall(r"\[([^\]]*)\]", expr)
        return [set(re.findall(r"'([^']+)'", p)) for p in parts]

    sets, extra = branches(exprs["sets"]), branches(exprs["removes"])
    return {who: (sets[i], sets[i] | extra[i]) for i, who in enumerate(("agent", "keeper", "sweep"))}


def test_the_documented_write_lists_are_the_policys_and_hold_on_the_server(rig):
    """docs/explanation/kubernetes.md says exactly which annotations each identity writes; the policy holds that list
    (each one it sets passes, each it may only remove cannot be set, any other gpugate.io/ one is refused)."""
    rig.nodes()
    documented = _documented()
    assert documented == _policy_lists()
    assert _readme_lists() == {who: sets for who, (sets, _) in documented.items()}
    for who, (sets, removes) in sorted(documented.items()):
        name = "gpu01"
        rig.admin.patch(node_path(name), rig.held(name))  # held: the sweep may ask there
        for key in sorted(sets):
            rig.clients[who].patch(node_path(name), {"metadata": {"annotations": {key: "{}"}}})
        for key in sorted(removes):
            rig.admin.patch(node_path(name), {"metadata": {"annotations": {key: "{}"}}})
            rig.clients[who].patch(node_path(name), {"metadata": {"annotations": {key: None}}})
        for key in sorted(removes - sets) + ["gpugate.io/other"]:
            _refused(rig, who, name, {"metadata": {"annotations": {key: "{}"}}},
                     "the gpugate %s changes only the annotations" % WHO[who])
        rig.nodes()


def _renamed(directory: str, namespace: str) -> None:
    """deploy/kubernetes with gpugate's namespace renamed, as kustomize's namespace does: each namespaced
    object's namespace, the Namespace itself, and the bindings' ServiceAccount subjects."""
    for name in sorted(os.listdir(MANIFESTS)):
        if not name.endswith(".yaml"):
            continue
        with open(os.path.join(MANIFESTS, name)) as handle:
            docs = [d for d in yaml.safe_load_all(handle) if d]
        for doc in docs:
            meta = doc["metadata"]
            if doc["kind"] == "Namespace" and meta["name"] == "gpugate":
                meta["name"] = namespace
            if meta.get("namespace") == "gpugate":
                meta["namespace"] = namespace
            for subject in doc.get("subjects") or []:
                if subject.get("namespace") == "gpugate":
                    subject["namespace"] = namespace
        with open(os.path.join(directory, name), "w") as handle:
            yaml.safe_dump_all(docs, handle)


def test_installed_in_another_namespace_the_policies_still_refuse(tmp_path):
    """A renamed namespace (kustomize's namespace: gpu-health) leaves no policy naming `gpugate`: the same
    refusals, with tokens of the ServiceAccounts in gpu-health."""
    _require_kube()
    from gpugate.testbed.kube import KubeAPI

    try:
        from gpugate.testbed.manifests import COLLECTIONS
    except ImportError:  # (before the Helm chart's gpugate.testbed.manifests)
        from gpugate.testbed.kube import _COLLECTIONS as COLLECTIONS

    manifests = tmp_path / "manifests"
    manifests.mkdir()
    _renamed(str(manifests), "gpu-health")
    text = "".join(p.read_text() for p in manifests.iterdir())
    assert "namespace: gpu-health" in text and not re.search(r"namespace: gpugate$", text, re.M)
    api = KubeAPI(str(tmp_path / "kube")).start()
    try:
        admin = api.admin()
        # (KubeAPI.apply probes with the static token of the gpugate namespace's agent: applied here)
        for path in sorted(manifests.iterdir(), key=lambda p: (p.name != "namespace.yaml", p.name)):
            for doc in yaml.safe_load_all(path.read_text()):
                where = COLLECTIONS[doc["kind"]].format(ns=doc["metadata"].get("namespace", ""))
                admin.request("POST", where, doc, query={"fieldValidation": "Strict"})
        made = Rig(api, "gpu-health")
        _wait_enforced(api, made.clients)
        made.nodes()
        pending = {"metadata": {"annotations": {nv.PENDING: "x"}}}
        _refused(made, "unbound", "gpu01", pending, "the gpugate node agent " + CLAIM)
        _refused(made, "agent", "gpu02", pending, "the gpugate node agent " + CLAIM)
        for who in ("agent", "keeper", "sweep"):
            _refused(made, who, "gpu01", {"metadata": {"labels": {"x": "y"}}},
                     "the gpugate %s does not change a Node's labels" % WHO[who])
            _refused(made, who, "gpu01", {"spec": {"unschedulable": True}},
                     "the gpugate %s cordons a Node only with its gpugate.io/unfit" % WHO[who])
        made.clients["agent"].patch(node_path("gpu01"), pending)  # its own write, through its renamed RBAC
        made.clients["keeper"].patch(node_path("gpu02"), made.held("gpu02"))
        assert nv.state_of(made.get("gpu02")).drain
    finally:
        api.stop()
