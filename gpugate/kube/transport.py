"""``[sweep] transport = "kubernetes"``: the sweep's commands on a node go
through the Node object to the node agent (gpugate.kube.channel), not ssh.
One request per node, written with the resourceVersion read; the answers
are read back each poll (one GET per node of the batch) until the
command's timeout and the agent's poll have passed.  An answer read is
removed from the Node with its request, in one patch (``_clear``): every
watcher of Nodes would carry its up to 64 KiB of facts for ever."""

from __future__ import annotations

import os
import time

from gpugate.model.answers import problem
from gpugate.kube import channel
from gpugate.kube.client import KubeError, node_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Sequence, Union

    Answer = Union[dict, str]

# The agent sees a request within a second (its watch) unless it is in a health check (its
# budget, about a minute), and answers after the command ends: the sweep waits this much longer.
AGENT_GRACE = 120.0


class KubeTransport:
    """gpugate.node.transport's interface (check, facts, run) over the Node channel."""

    def __init__(self, client, poll: float = 1.0, sleep=time.sleep, clock=time.monotonic):
        self.client, self.poll, self.sleep, self.clock = client, float(poll), sleep, clock

    def check(self, nodes: Sequence[str], args: Sequence[str], timeout: float) -> Dict[str, Answer]:
        return self.run(nodes, ["check"] + list(args), timeout)

    def facts(self, nodes: Sequence[str], max_age: float, timeout: float) -> Dict[str, Answer]:
        return self.run(nodes, ["facts", "--max-age", "%g" % max_age], timeout)

    def run(self, nodes: Sequence[str], args: Sequence[str], timeout: float, max_stdout: int = 0) -> Dict[str, Answer]:
        why = channel.refusal(args)
        if why:  # (an evidence bundle: megabytes, more than a Node's annotations hold)
            return {n: "not over the Node channel (%s): [sweep] transport = \"ssh\" runs it" % why for n in nodes}
        ident = os.urandom(6).hex()
        answers: Dict[str, Answer] = {}
        waiting = []
        for node in nodes:
            try:
                self._ask(node, channel.request_text(ident, args, timeout, time.time()))
                waiting.append(node)
            except KubeError as exc:
                answers[node] = "the request could not be written on the Node: %s" % str(exc)[:300]
        deadline = self.clock() + float(timeout) + AGENT_GRACE
        while waiting and self.clock() < deadline:
            self.sleep(self.poll)
            for node in list(waiting):
                try:
                    obj = self.client.get(node_path(node))
                    got = channel.read_answer(obj, ident)
                except KubeError:
                    continue  # asked again next poll, until the deadline
                if got is not None:
                    answers[node] = (problem(got) or got) if isinstance(got, dict) else got
                    waiting.remove(node)
                    self._clear(node, obj, ident)
        for node in waiting:
            self._withdraw(node, ident)
            answers[node] = ("no answer from the node agent within %.0fs: it serves requests while gpugate holds "
                             "its Node; is `gpugate agent` (the DaemonSet) running there?" % (timeout + AGENT_GRACE))
        return answers

    def _withdraw(self, node: str, ident: str) -> None:
        """A request given up on goes, unless the agent has taken it up (best effort: it expires anyway)."""
        try:
            obj = self.client.get(node_path(node))
            request = channel.read_request(obj)
            if request is None or request["id"] != ident or channel.claimed(obj, ident):
                return
            self.client.patch(node_path(node), {"metadata": {"annotations": {channel.REQUEST: None},
                                                             "resourceVersion": obj["metadata"]["resourceVersion"]}})
        except (KubeError, KeyError, TypeError):
            pass

    def _clear(self, node: str, obj: dict, ident: str) -> None:
        """Request ``ident`` and its answer off the Node, with the resourceVersion they were read at; on a
        conflict read again, and only what is still this request's goes (a newer request or answer stays).
        Best effort: one left goes with the sweep's return of the node (nodeview.return_patch), or is
        replaced by the next request and its answer."""
        for _ in range(3):
            annotations = (obj.get("metadata") or {}).get("annotations") or {}
            request = channel.read_request(obj)
            gone = {key: None for key, ours in (
                (channel.REQUEST, request is not None and request["id"] == ident),
                (channel.ANSWER, channel.ANSWER in annotations and channel.claimed(obj, ident))) if ours}
            if not gone:
                return
            try:
                self.client.patch(node_path(node), {"metadata": {
                    "annotations": gone, "resourceVersion": (obj.get("metadata") or {}).get("resourceVersion")}})
                return
            except KubeError as exc:
                if exc.status != 409:
                    return
            try:
                obj = self.client.get(node_path(node))
            except KubeError:
                return

    def _ask(self, node: str, text: str) -> None:
        for attempt in (1, 2):
            version = (self.client.get(node_path(node)).get("metadata") or {}).get("resourceVersion")
            try:
                self.client.patch(node_path(node), {"metadata": {"annotations": {channel.REQUEST: text},
                                                                 "resourceVersion": version}})
                return
            except KubeError as exc:
                if exc.status != 409 or attempt == 2:
                    raise


def make(settings) -> KubeTransport:
    from gpugate.errors import ConfigError
    from gpugate.kube.client import connect

    if getattr(settings, "scheduler", "slurm") != "kubernetes":
        raise ConfigError("[sweep] transport = \"kubernetes\" goes through the node agent on Kubernetes Nodes: it "
                          "needs scheduler = \"kubernetes\" (this gpugate.toml says %r): use ssh or local"
                          % getattr(settings, "scheduler", "slurm"))
    return KubeTransport(connect(dict(settings.kubernetes)), poll=min(float(settings.sweep["poll_seconds"]), 2.0))
