"""Issue 45, item 7 (the Node channel's part), on the real API server: the
sweep's request and the node agent's answer (up to 64 KiB of facts) are
removed from the Node once the sweep has read the answer, in one patch
with the resourceVersion they were read at, and only while they are still
that request's; a stale answer of an old request is never taken for a new
one, and an annotation that is not the sweep's request's stays."""

import os
import subprocess
import sys
import time

import pytest

from gpugate.kube import channel
from gpugate.kube.client import node_path
from gpugate.kube.transport import KubeTransport
from test_kube_agent import api  # noqa: F401 (the module's API server)
from test_kube_sweep import held, site  # noqa: F401 (the sweep's fleet and kubelets)

pytestmark = pytest.mark.kube


def annotations(site, node):  # noqa: F811
    return site.admin.get(node_path(node))["metadata"].get("annotations") or {}


def stale(site, node, ident):  # noqa: F811
    """An old request and its answer left on the Node (a sweep that gave up after the agent took it up)."""
    site.admin.patch(node_path(node), {"metadata": {"annotations": {
        channel.REQUEST: channel.request_text(ident, ["check", "--mode", "verify"], 30, time.time() - 3600),
        channel.ANSWER: channel.answer_text(ident, time.time() - 3500, {"node": node, "fit": False,
                                                                        "reason": "stale: an old request's"})}}})


def test_the_answer_read_goes_with_its_request_and_a_stale_answer_is_never_taken(site):  # noqa: F811
    agent_config = site.config("agent")
    site.sim("gpu01", "driver=550.54.15")
    site.healthcheck(agent_config, "gpu01")
    assert [t["value"] for t in held(site.admin, "gpu01")] == ["drift"]  # the agent serves held nodes only
    stale(site, "gpu01", "old0")
    agent = subprocess.Popen([sys.executable, "-m", "gpugate", "agent", "--config",
                              site.node_config(agent_config, "gpu01"), "--node", "gpu01",
                              "--interval", "3600", "--poll", "0.3"], env=dict(os.environ, GPUGATE_NODE_NAME="gpu01"),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        answer = KubeTransport(site.api.client("sweep"), poll=0.2).run(["gpu01"], ["check", "--mode", "verify"], 60)
    finally:
        agent.terminate()
        agent.wait(timeout=15)
    got = answer["gpu01"]
    assert isinstance(got, dict) and "stale" not in str(got.get("reason")), got  # the new request's answer
    assert got.get("node") == "gpu01", got
    left = annotations(site, "gpu01")
    assert channel.REQUEST not in left and channel.ANSWER not in left, left


def test_with_no_answer_the_old_one_stays_untaken_and_untouched(site):  # noqa: F811
    """No agent: the sweep's request is withdrawn, nothing is taken, and the old answer it did not
    write for its request is not the sweep's to remove."""
    site.sim("gpu02", "driver=550.54.15")
    site.healthcheck(site.config("agent"), "gpu02")  # held: the sweep asks only on a Node gpugate holds
    stale(site, "gpu02", "old1")
    old = annotations(site, "gpu02")[channel.ANSWER]
    import gpugate.kube.transport as kt

    grace, kt.AGENT_GRACE = kt.AGENT_GRACE, 1.0
    try:
        got = KubeTransport(site.api.client("sweep"), poll=0.2).run(["gpu02"], ["facts", "--max-age", "60"], 1)
    finally:
        kt.AGENT_GRACE = grace
    assert isinstance(got["gpu02"], str) and got["gpu02"].startswith("no answer from the node agent"), got
    left = annotations(site, "gpu02")
    assert channel.REQUEST not in left and left[channel.ANSWER] == old, left


def test_only_what_is_still_the_request_s_is_removed(site):  # noqa: F811
    """The clear's patch carries the resourceVersion its answer was read at: a newer request written
    since (a conflict) stays; the answer read goes."""
    client = site.api.client("sweep")
    stale(site, "gpu03", "a1")
    read = client.get(node_path("gpu03"))
    site.admin.patch(node_path("gpu03"), {"metadata": {"annotations": {
        channel.REQUEST: channel.request_text("b2", ["facts", "--max-age", "60"], 30, time.time())}}})
    KubeTransport(client)._clear("gpu03", read, "a1")
    left = annotations(site, "gpu03")
    assert channel.read_request({"metadata": {"annotations": left}})["id"] == "b2", left
    assert channel.ANSWER not in left, left
    # Read as it is now, with request b2 and no answer of its own: nothing of b2's is removed.
    KubeTransport(client)._clear("gpu03", client.get(node_path("gpu03")), "a1")
    assert channel.read_request({"metadata": {"annotations": annotations(site, "gpu03")}})["id"] == "b2"
