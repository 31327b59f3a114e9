"""Kubernetes as a scheduler backend: the Slurm backends' interface over
Node objects (gpugate.kube.nodeview says how a Node reads as a NodeState
and what each write is).  Node-side runs read their own Node (one GET) and
write only on change; the keeper lists the nodes once per run, paginated.

Names may be a hostlist (the keeper groups the nodes it drains): each node
is one PATCH, carrying the resourceVersion of the read it was decided on.
A node changed since (409) is read once more: when gpugate's own hold on
it (its record, taints, cordon, pending mark) is what it was, the change
was someone else's (a kubelet's status, a label) and the patch is built
from the new read and written; when the hold changed, it is left for the
next run, never written over."""

from __future__ import annotations

import time

from gpugate.model import reason as reasons
from gpugate.errors import GpugateError
from gpugate.kube import condition as cond
from gpugate.kube import nodeview as nv
from gpugate.kube.client import KubeError, node_path
from gpugate.kube.nodes_gpus import DeviceHolds

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Optional


# Up to this many nodes are read one GET each; more, one paginated list.
FEW = 32


def _expand(names: str):
    from ClusterShell.NodeSet import NodeSet

    return list(NodeSet(names))


class KubeNodes(DeviceHolds):
    """``client``: a gpugate.kube.client.KubeClient; ``kube``: gpugate.toml's
    [kubernetes] table; ``tag``: the reason tag."""

    name = "kubernetes"
    node_read = ""
    reports_verdict = True  # the GpugateHealthy condition: act keeps a fit run reading until it says so

    def __init__(self, client, kube, tag: str, clock=time.time, cordon: bool = True):
        self.client, self.tag, self.clock, self.cordon = client, tag, clock, cordon
        self.kube = kube
        self.pool_label = str(kube.get("pool_label") or "")
        self.selector = str(kube.get("node_selector") or "")  # the keeper's nodes: the GPU nodes gpugate judges
        self.no_execute = bool(kube.get("no_execute"))
        self.why = "configured"
        self.device_holds = bool(kube.get("device_holds"))  # one GPU held, not its Node (gpugate.kube.dra)
        self.scope: Dict[str, str] = {}  # node -> what this run held there (devices, or the Node and why)
        self._offers: Dict[str, str] = {}  # node -> its agent's offer to hold GPUs alone (gpugate.kube.gpushare)
        self._tried: set = set()  # nodes whose GPUs this run tried to hold alone: a drain holds the Node
        self._served: Optional[bool] = None  # DeviceTaintRule served (read once a run, by the keeper's list)
        self.gpu_repair: set = set()  # nodes whose held GPUs the sweep repairs alone (gpugate.sweep.kube_gpu_repair)
        self._seen: Dict[str, dict] = {}  # the Node objects last read, for the writes decided on them

    def close(self) -> None:
        self.client.close()

    # The keeper keeps its memory and status on a Lease (gpugate.keeper.kube_lease_memory), not in a file.
    memory_on_lease = True

    def lead(self, who: str) -> str:
        """Why this keeper must not act now ("": it holds the Lease);
        KubeError when the Lease cannot be read or written (a failed run,
        never a quiet standby: the keeper-stale alert must fire)."""
        from gpugate.kube.lease import acquire

        return acquire(self.client, self._namespace(), who,
                       float(self.kube.get("lease_seconds") or 60.0), self.clock)

    def _namespace(self) -> str:
        return str(self.kube.get("namespace") or "gpugate")

    # ------------------------------------------------------------- reads
    def own_record(self, name: str):
        try:
            node = self.client.get(node_path(name))
        except KubeError as exc:
            if exc.status == 404:
                self._seen.pop(name, None)
                return None
            raise
        meta = node.get("metadata") if isinstance(node.get("metadata"), dict) else {}
        if node.get("kind") not in (None, "Node") or meta.get("name") != name:
            raise KubeError("kubernetes: GET %s answered something that is not that Node" % node_path(name))
        self._seen[name] = nv.slim(node)
        return nv.state_of(node, self.pool_label)

    def nodes(self, names: Optional[str] = None, lean: bool = False):
        wanted = set(_expand(names)) if names else None
        if wanted is not None and len(wanted) <= FEW:
            # The sweep's reads of a batch: one GET per node, not the fleet's list.
            states = {}
            for name in sorted(wanted):
                state = self.own_record(name)
                if state is not None:
                    states[name] = state
            return states
        states = {}
        query = {"labelSelector": self.selector} if self.selector else {}
        offers = self._devices_served()  # a waiting node's offer to hold GPUs alone counts its share
        for node in self.client.list_pages("/api/v1/nodes", **query):
            name = (node.get("metadata") or {}).get("name")
            if not isinstance(name, str) or (wanted is not None and name not in wanted):
                continue
            self._seen[name] = nv.slim(node)
            states[name] = nv.state_of(node, self.pool_label, offers)
        return states

    def node_object(self, name: str) -> dict:
        """The Node as last read (read now when it was not)."""
        if name not in self._seen:
            if self.own_record(name) is None:
                raise KubeError("kubernetes: no Node named %s" % name, 404, "NotFound")
        return self._seen[name]

    def boot_id(self, name: str) -> str:
        """The kubelet's bootID of the Node as last read ("" when none): a
        reboot is proven by a new one."""
        info = (self.node_object(name).get("status") or {}).get("nodeInfo") or {}
        return str(info.get("bootID") or "")

    # ------------------------------------------------------------- writes
    def _patch(self, name: str, patch, sub: str = "", kind: str = "merge") -> None:
        try:
            self._seen[name] = nv.slim(self.client.patch(node_path(name, sub), patch, kind))
        except KubeError as exc:
            self._seen.pop(name, None)  # read again before any other write
            if exc.status == 409:
                raise KubeError("kubernetes: Node %s changed since it was read: not written (the next run "
                                "reads it again)" % name, 409, "Conflict") from None
            raise

    def _write(self, name: str, build, sub: str = "", kind: str = "merge") -> None:
        """build(node) -> the patch, from the Node as read; on a 409 once
        more from a new read while gpugate's hold there stands as decided on
        (a kubelet updates its Node's status at any moment: an acute hold
        must not wait for the next run for that)."""
        node = self.node_object(name)
        try:
            return self._patch(name, build(node), sub, kind)
        except KubeError as exc:
            if exc.status != 409:
                raise
            conflict = exc
        if self.own_record(name) is None:
            raise KubeError("kubernetes: no Node named %s" % name, 404, "NotFound")
        fresh = self._seen[name]
        if nv.hold_of(fresh) != nv.hold_of(node):
            self._seen.pop(name, None)  # as _patch: read again before any other write
            raise conflict  # gpugate's own hold changed in between: the next run decides again
        self._patch(name, build(fresh), sub, kind)

    def drain(self, names: str, reason: str) -> None:
        parsed = reasons.parse(reason, self.tag)
        cls = parsed.cls if parsed is not None else "probe"
        # NoExecute (running pods evicted) for an acute finding only, where the site asked:
        # a budgeted drift, or a probe that could not tell, lets running pods finish.
        no_execute = self.no_execute and reasons.acute(parsed)
        failed = []
        for name in _expand(names):
            try:
                if self._stays_on_devices(name, parsed) or self._offered(name, reason, parsed):
                    continue
                self._write(name, lambda node: nv.drain_patch(node, reason, cls, no_execute, int(self.clock()),
                                                               self.cordon))
            except (ValueError, GpugateError) as exc:
                failed.append("%s: %s" % (name, exc))
        if failed:
            raise KubeError("; ".join(failed)[:600])

    def undrain(self, names: str, build=nv.undrain_patch) -> None:
        failed = []
        for name in _expand(names):
            try:
                if self.device_holds or nv.device_rules(self.node_object(name)):
                    from gpugate.kube import dra

                    dra.lift(self.client, name)  # its GPUs' rules first: the record naming them goes last
                self._write(name, build)
            except (ValueError, GpugateError) as exc:  # ValueError: a read with no resourceVersion
                failed.append("%s: %s" % (name, exc))
        if failed:
            raise KubeError("; ".join(failed)[:600])

    def resume(self, names: str) -> None:
        """The sweep's return: one hold to lift on Kubernetes (gpugate's taint, cordon and record), and
        the transport's request and answer left on the Node with it (nodeview.return_patch)."""
        self.undrain(names, nv.return_patch)

    def set_comment(self, name: str, text: str) -> None:
        offer = self._offers.get(name)
        if text and offer is not None:
            from gpugate.kube import gpushare

            text = gpushare.with_offer(text, offer[1], offer[0], offer[2])
        try:
            self._write(name, lambda node: nv.comment_patch(node, text))
        except ValueError as exc:  # a read with no resourceVersion: nothing written
            raise KubeError("kubernetes: Node %s: %s" % (name, exc)) from None

    def report_verdict(self, name: str, verdict, state) -> None:
        """The GpugateHealthy condition, written on every run that reads
        the Node (its heartbeat; the transition time kept while the status
        stands)."""
        held = state.reason if state is not None and verdict.fit and reasons.parse(
            state.reason, self.tag) is not None else ""
        want = self._wanted(verdict, held)
        if not verdict.fit and self.scope.get(name):  # which GPUs are held, or why the Node is
            want = (want[0], want[1], ("%s; %s" % (want[2], self.scope[name]))[:1024])
        self.write_condition(name, want, self._now())

    def write_condition(self, name: str, want, at_iso: str) -> None:
        """GpugateHealthy as ``want`` (status, reason, message), its heartbeat ``at_iso``."""
        self._write(name, lambda node: cond.patch(node, want, at_iso), sub="status", kind="strategic")

    def heartbeat(self, name: str, verdict) -> None:
        """A fit run that holds nothing reads no Node: one status patch, its
        heartbeat.  The server keeps the transition time there; a Node
        without one (registered anew) gets it in a second patch."""
        now = self._now()
        done = self.client.patch(node_path(name, "status"), cond.patch(None, self._wanted(verdict, ""), now),
                                 "strategic")
        if not cond.current(done).get("lastTransitionTime"):
            self.client.patch(node_path(name, "status"), cond.patch(done, self._wanted(verdict, ""), now),
                              "strategic")

    def report_unknown(self, name: str, why: str) -> None:
        """GpugateHealthy Unknown: the health check did not run."""
        self.write_condition(name, cond.not_run(why), self._now())

    def _wanted(self, verdict, held: str):
        pending = "; ".join(reasons.render_finding(f) for f in verdict.notes) if verdict.fit else ""
        return cond.wanted(verdict.fit, verdict.cls, verdict.reason, self.tag, held, pending)

    def _now(self) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock()))

    # ------------------------------------------- the node's own hold record
    def restore_hold(self, state_dir: str, name: str, state):
        """Node side, after own_record: a hold this node remembers that its
        Node lost (registered anew) is written again (gpugate.kube.survive).
        Returns the state to decide on."""
        from gpugate.kube import survive

        if state is None or name not in self._seen:
            return state
        action, reason = survive.decide(survive.read(state_dir), self._seen[name], self.tag)
        if action != survive.RESTORE:
            return state
        self._tried.add(name)  # restored as a Node hold (the safe side)
        self.drain(name, reason)
        return nv.state_of(self._seen[name], self.pool_label)

    def remember_hold(self, state_dir: str, name: str) -> None:
        """Node side, after this run's writes: the record follows the Node as last written or read."""
        from gpugate.kube import survive

        node = self._seen.get(name)
        if node is not None:
            action, reason = survive.decide(survive.read(state_dir), node, self.tag)
            survive.settle(state_dir, action, reason, node)

def connect(settings, deadline: Optional[float] = None, timeout: Optional[float] = None,
            cordon: bool = True) -> KubeNodes:
    from gpugate.kube.client import connect as client_for

    kube = dict(settings.kubernetes)
    if timeout:
        kube["timeout_seconds"] = min(float(kube.get("timeout_seconds", 10.0)), float(timeout))
    return KubeNodes(client_for(kube, deadline), settings.kubernetes, settings.reason_tag, cordon=cordon)
