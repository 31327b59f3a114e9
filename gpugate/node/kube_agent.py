"""The node agent on Kubernetes as the DaemonSet runs it (`gpugate agent`):
the health check every interval (gpugate-healthcheck, exactly as before),
and the sweep's requests (gpugate.kube.channel), served while gpugate holds
its Node.  Between checks the agent watches its own Node (one watch, as
the kubelet keeps on it; the Node is read again only when it changes), so
a request is served within a second of being written.  A watch that cannot
be made falls back to reading the Node every --poll seconds.

A request is run at most once: the agent claims it on the Node first (the
answer's id with state "running", written with the resourceVersion read:
of two agents, one wins), and a request the Node's answer names, claimed
or answered, is never run again (an agent restarted mid-reset leaves it
claimed: the sweep's wait ends unanswered, the attempt fails, the next one
asks anew).  Each served request leaves one structured log line (mode
"agent").  An error in one pass is logged and the loop goes on.

Every read of its Node also keeps the node's own record of gpugate's hold
in line (gpugate.kube.survive): a hold seen there is remembered, and a Node
registered anew without it is health-checked at once, which holds it again."""

from __future__ import annotations

import os
import sys
import time

from gpugate.model import reason as reasons
from gpugate.errors import CommandError, GpugateError
from gpugate.kube import channel
from gpugate.kube import nodeview as nv
from gpugate.kube.client import KubeError, node_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, List, Optional, Tuple


class Agent:
    def __init__(self, settings, node: str, config: str, healthcheck: List[str], gpugate: Optional[List[str]] = None,
                 interval: float = 300.0, poll: float = 5.0, clock=time.monotonic, sleep=time.sleep):
        self.settings, self.node, self.config = settings, node, config
        self.kube_node = node
        self.healthcheck_argv, self.interval, self.poll = list(healthcheck), float(interval), float(poll)
        self.gpugate = list(gpugate or [sys.executable, "-m", "gpugate"])
        self.clock, self.sleep = clock, sleep
        self.watching = True  # said once when a watch cannot be made, not on every poll
        self.check_now = False  # its Node registered anew without the hold this node keeps: check at once
        self.rechecked = ""  # the Node (uid) last checked at once for that

    # ---------------------------------------------------------------- the loop
    def run(self, stop: Callable[[], bool] = lambda: False) -> None:
        next_check = self.clock()
        while not stop():
            try:
                if self.clock() >= next_check or self.check_now:
                    next_check, self.check_now = self.clock() + self.interval, False
                    self.health_check()
                version = self.serve_once()
                if self.check_now:
                    continue
                left = max(0.0, next_check - self.clock())
                if not self._wait(version, min(left, 600.0)):
                    self.sleep(min(self.poll, left))
            except Exception as exc:  # noqa: BLE001 (the DaemonSet's only process: one bad pass never ends it)
                sys.stderr.write("gpugate agent: %s: %s\n" % (type(exc).__name__, str(exc)[:300]))
                self.sleep(self.poll)

    def _wait(self, version: str, seconds: float) -> bool:
        """Until the Node changes (True), or the time passes: False when no watch could be made."""
        from gpugate.kube.client import connect

        if not version or seconds < 1:
            return False
        try:
            client = connect(dict(self.settings.kubernetes))
            began = self.clock()
            changed = client.wait_for_change("/api/v1/nodes", version, seconds,
                                             fieldSelector="metadata.name=" + self.kube_node)
            self.watching = True
            # A watch that ended early with no change (a proxy closing it): the caller waits a poll.
            return changed or self.clock() - began >= seconds - 1
        except GpugateError as exc:
            if self.watching:
                sys.stderr.write("gpugate agent: no watch on the Node (%s): reading it every %gs\n"
                                 % (str(exc)[:200], self.poll))
            self.watching = False
            return False

    def health_check(self) -> bool:
        """True when the check ran to the end (its metrics say when: gpugate.fleet.metrics_server)."""
        from gpugate.safety.runner import run

        env = dict(os.environ, GPUGATE_NODE_NAME=self.node)
        try:  # its own log line says what it found; a check that fails is the next one's business
            run(self.healthcheck_argv, float(self.settings.budgets["healthcheck"]) + 30, env=env, ok_codes=(0, 1, 2))
        except CommandError as exc:
            sys.stderr.write("gpugate agent: the health check did not run: %s\n" % str(exc)[:300])
            self._not_run(str(exc))
            return False
        return True

    def _not_run(self, why: str) -> None:
        """The condition says gpugate cannot tell (Unknown), rather than a
        verdict that is no longer being checked."""
        from gpugate.kube.nodes import connect

        try:
            backend = connect(self.settings, timeout=10.0)
            try:
                backend.report_unknown(self.kube_node, why)
            finally:
                backend.close()
        except GpugateError as exc:
            sys.stderr.write("gpugate agent: the condition was not written: %s\n" % str(exc)[:300])

    def _follow_hold(self, node) -> None:
        """The hold this node keeps (gpugate.kube.survive) follows its Node
        as read: a hold seen there is remembered now (under the act lock,
        as the health check writes it); a Node registered anew without it
        is checked at once, and the check holds it again."""
        from gpugate.node.act import _act_lock
        from gpugate.kube import survive

        state_dir = self.settings.state_dir(self.node)
        action, _ = survive.decide(survive.read(state_dir), node, self.settings.reason_tag)
        uid = str((node.get("metadata") or {}).get("uid") or "")
        if action == survive.RESTORE and uid != self.rechecked:
            self.check_now, self.rechecked = True, uid  # once a Node object: a failed write waits its interval
        elif action == survive.REMEMBER:
            try:
                with _act_lock(state_dir, 0.5):
                    action, reason = survive.decide(survive.read(state_dir), node, self.settings.reason_tag)
                    survive.settle(state_dir, action if action == survive.REMEMBER else "", reason, node)
            except (GpugateError, OSError) as exc:  # a health check has the lock: it records the hold
                sys.stderr.write("gpugate agent: the hold was not recorded this time: %s\n" % str(exc)[:200])

    def serve_once(self) -> str:
        """Read the Node; serve its request if gpugate holds it.  Returns the
        Node's resourceVersion as last seen ("" when it could not be read)."""
        from gpugate.kube.nodes import connect

        try:
            backend = connect(self.settings, timeout=10.0)
        except GpugateError as exc:
            sys.stderr.write("gpugate agent: %s\n" % str(exc)[:300])
            return ""
        try:
            node = backend.client.get(node_path(self.kube_node))
            version = str((node.get("metadata") or {}).get("resourceVersion") or "")
            self._follow_hold(node)
            hold = reasons.parse(nv.state_of(node).reason, self.settings.reason_tag)
            request = channel.read_request(node)
            if hold is None or request is None or channel.claimed(node, request["id"]):
                return version
            if channel.expired(request, time.time()):
                answer, error = None, ("expired: asked at %.0f, it is %.0f by this node's clock: not started "
                                       "(the sweep may have moved on; clocks more than %.0fs apart read so too)"
                                       % (request["at"], time.time(), channel.START_WITHIN_SECONDS))
            elif request["argv"][:1] == ["reset-gpus"] and not any(f.component == "sweep" for f in hold.findings):
                answer, error = None, ("refused: a GPU reset only while the sweep has the node (its pods evicted); "
                                       "held for %r" % nv.state_of(node).reason[:200])
            else:
                node = self._claim(backend.client, node, request["id"])
                if node is None:
                    return ""  # another agent, or a change in between: read again
                answer, error = self._answer(request)
            text = channel.answer_text(request["id"], time.time(), answer if isinstance(answer, dict) else None,
                                       error or (answer if isinstance(answer, str) else ""))
            try:
                written = self._write(backend.client, text)
            except GpugateError as exc:  # ran, and said so below; the sweep's wait ends unanswered
                written, error = "", (error + "; " if error else "") + "the answer was not written: %s" % exc
            self._log(request, answer, error)
            return written
        except GpugateError as exc:
            sys.stderr.write("gpugate agent: %s\n" % str(exc)[:300])
            return ""
        finally:
            backend.close()

    def _answer(self, request) -> Tuple[object, str]:
        from gpugate.safety.runner import run
        from gpugate.node.transport import parse_output

        why = channel.refusal(request["argv"])
        if why:
            return None, "refused: " + why
        argv = channel.run_argv(self.gpugate, request["argv"], self.node, self.config)
        try:
            out = run(argv, min(float(request["timeout"]), 3600.0), ok_codes=(0, 1))
        except CommandError as exc:
            return None, str(exc)[:1000]
        return parse_output(out.stdout), ""

    def _claim(self, client, node, ident: str):
        """The request taken up on the Node, with the resourceVersion read: the Node after, or None (409)."""
        version = (node.get("metadata") or {}).get("resourceVersion")
        text = channel.answer_text(ident, time.time(), state=channel.RUNNING)
        try:
            return client.patch(node_path(self.kube_node), {"metadata": {
                "annotations": {channel.ANSWER: text}, "resourceVersion": version}})
        except KubeError as exc:
            if exc.status == 409:
                return None
            raise

    def _write(self, client, text: str) -> str:
        """The answer on the Node; the resourceVersion after it.  Without a
        resourceVersion: the claim settled whose answer this is, the patch
        touches this one annotation only, and a command that ran an hour
        (the kubelet writes the Node meanwhile) must not lose its answer."""
        done = client.patch(node_path(self.kube_node), {"metadata": {"annotations": {channel.ANSWER: text}}})
        return str((done.get("metadata") or {}).get("resourceVersion") or "")

    def _log(self, request, answer, error: str) -> None:
        from gpugate.node.logline import emit

        record = {"node": self.node, "mode": "agent", "request": request["id"], "argv": request["argv"][:8],
                  "ok": isinstance(answer, dict) and not error}
        if error or isinstance(answer, str):
            record["error"] = (error or str(answer))[:300]
        try:
            emit(self.settings.log, self.settings.state_dir(self.node), record)
        except OSError:
            pass
