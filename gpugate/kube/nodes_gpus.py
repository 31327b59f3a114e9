"""KubeNodes' holds of GPUs alone ([kubernetes] device_holds): a GPU's own
finding held as DRA DeviceTaintRules (gpugate.kube.dra) by the agent, or by
the keeper from the agent's offer (its published budgeted finding: an
application-Xid repeat on one GPU); the record on the Node that names
them, which GPUs of how many (the budget's share, gpugate.kube.gpushare);
and the sweep's repair of one held GPU: its own NoExecute rule, so the
device taint eviction controller empties that GPU and not the Node
(gpugate.sweep.kube_gpu_repair)."""

from __future__ import annotations

from gpugate.model import reason as reasons
from gpugate.kube import nodeview as nv
from gpugate.kube.client import KubeError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import List, Tuple

# The sweep's own notes in a reason (its work reason, a repeat, the budget's mark): no finding of a GPU.
_NOTES = ("sweep", "repeat", "budgeted")


class DeviceHolds:
    """Mixed into KubeNodes (its client, kube settings, _write, node_object, scope)."""

    def _devices_served(self) -> bool:
        """device_holds on and the server serves DeviceTaintRule (asked once)."""
        if self._served is None:
            from gpugate.kube import dra

            try:
                self._served = self.device_holds and not dra.served(self.client)
            except KubeError:
                self._served = False  # not known: every waiting node counts whole
        return self._served

    def _stays_on_devices(self, name: str, parsed) -> bool:
        """A hold of GPUs alone stays one where the new reason names only
        their own findings on the GPUs already held (the sweep's escalation
        of a row-remap failure: rma), besides the sweep's notes: the reason
        written, the rules kept.  The sweep's work reason (notes alone)
        stays one only while the sweep repairs those GPUs alone
        (``gpu_repair``).  Anything else (the sweep's work on the node, a
        node-wide finding) holds the Node."""
        from gpugate.kube import devicehold

        node = self.node_object(name)
        rules = nv.devices_held(node)
        if not rules or parsed is None or parsed.more:
            return False
        record = nv.owned(node)
        before = reasons.parse(record.get("reason"), self.tag)
        found = [f for f in parsed.findings if not (f.component in _NOTES and f.gpu is None)]
        work = any(f.component == "sweep" for f in parsed.findings)
        if (work or not found) and name not in self.gpu_repair:
            return False  # the sweep's work on the node: the Node held
        held, why = devicehold.plan(found, False) if found else ({}, "")
        was = set(record.get("gpus") or ()) | ({f.gpu for f in before.findings} if before is not None else set())
        if why or before is None or not set(held) <= was:
            return False
        self._write(name, lambda fresh: nv.device_patch(fresh, parsed.text, rules, int(self.clock())))
        self.scope[name] = "still held: %s, not the Node" % ", ".join("gpu%d" % g for g in sorted(held or was))
        return True

    def empty_gpus(self, name: str, gpus) -> List[Tuple[str, str, str]]:
        """The sweep's repair of GPUs held alone: a NoExecute rule of its own
        beside each of gpugate's rules for those GPUs, so that the device
        taint eviction controller evicts the Pods using them (not the
        Node's other Pods); named in the record, lifted with the hold.
        The devices (driver, pool, device) so emptied.  KubeError when a
        rule cannot be written; ValueError when there is none to go by."""
        import json

        from gpugate.kube import dra

        node = self.node_object(name)
        names, record = nv.devices_held(node), nv.owned(node)
        devices, written = [], []
        for item in dra.ours_for(self.client, name):
            if item["metadata"]["name"] not in names:
                continue
            try:
                gpu = json.loads(item["metadata"]["annotations"][dra.OWNED]).get("gpu")
            except (KeyError, TypeError, ValueError):
                continue
            selector = item["spec"]["deviceSelector"]
            where = (selector.get("driver"), selector.get("pool"), selector.get("device"))
            if gpu not in gpus or not all(isinstance(w, str) and w for w in where) or where in devices:
                continue
            body = dra.rule(name, gpu, where, "NoExecute", "sweep", record.get("reason") or "", dra.EMPTY)
            written.append(dra.write(self.client, body, name))
            devices.append(where)
        if not devices:
            raise ValueError("gpugate's record names no rule for gpu%s" % ",".join(str(g) for g in gpus))
        if not set(written) <= set(names):
            self._write(name, lambda fresh: nv.device_patch(fresh, record.get("reason") or "",
                                                            sorted(set(names) | set(written)), int(self.clock())))
        return devices

    def _offered(self, name: str, reason: str, parsed) -> bool:
        """The keeper's drain of a budgeted finding its node published with
        an offer to hold its GPUs alone (offer_devices): held so where the
        cluster can (hold_devices), else the Node (False)."""
        if not self.device_holds or name in self._tried or parsed is None or reasons.acute(parsed):
            return False
        from gpugate.kube import gpushare
        from gpugate.slurm import pending

        node = self.node_object(name)
        comment, offer = gpushare.split(str(((node.get("metadata") or {}).get("annotations") or {}).get(
            nv.PENDING) or ""))
        seen = pending.read(comment)
        if offer is None or seen is None or seen.reason != reason:
            return False
        return self.hold_devices(name, reason, parsed.findings, offer["gpus"]) == ""

    def offer_devices(self, name: str, findings, gpus) -> None:
        """Node side, before a budgeted finding is published (gpugate.node.hold):
        where its findings are one GPU's, the comment carries the GPUs'
        identities, so that the keeper can hold them alone (and count them
        as their share of the node: gpugate.kube.gpushare)."""
        from gpugate.kube import devicehold

        held, why = devicehold.plan(findings, False) if self.device_holds else ({}, "off")
        if why or not all((gpus or {}).get(g) for g in held):
            self._offers.pop(name, None)
            return
        self._offers[name] = (held, dict(gpus), max(len(gpus), max(held) + 1))

    def hold_devices(self, name: str, reason: str, findings, gpus) -> str:
        """[kubernetes] device_holds: hold the GPUs the findings name as
        DeviceTaintRules, not the Node.  "" when held so; else why the Node
        is to be held instead (the caller drains it; nothing guessed).
        gpus: {index: {"uuid", "pci"}} as the node read its GPUs."""
        from gpugate.kube import devicehold, dra

        if not self.device_holds:
            return "device holds are off ([kubernetes] device_holds)"
        self._tried.add(name)
        held, why = devicehold.plan(findings, self.no_execute)
        if why:
            return self._node_scope(name, why)
        parsed, named = reasons.parse(reason, self.tag), {(f.component, f.gpu) for f in findings}
        if parsed is None or parsed.more or any((f.component, f.gpu) not in named for f in parsed.findings):
            return self._node_scope(name, "the reason names more than this run's findings")
        if nv.our_taints(self.node_object(name)):
            return self._node_scope(name, "gpugate holds the Node already")
        try:
            why = dra.served(self.client) if self._served is None else ("" if self._served else dra.NOT_SERVED)
            if why:
                return self._node_scope(name, why)
            slices, targets = dra.slices_of(self.client, name), []
            for gpu, effect in sorted(held.items()):
                found, why = dra.locate(slices, (gpus or {}).get(gpu) or {})
                if why:
                    return self._node_scope(name, "gpu%d: %s" % (gpu, why))
                targets += [(gpu, effect, where) for where in found]
            written = [dra.write(self.client, dra.rule(name, gpu, where, effect, parsed.cls, reason), name)
                       for gpu, effect, where in targets]
            if nv.device_rules(self.node_object(name)):  # a GPU held before and not now (a rule named by no
                dra.lift(self.client, name, keep=written)  # record goes with the Node's lift: no list per hold)
        except KubeError as exc:
            try:  # none left half-written: the Node's hold stands for them all
                dra.lift(self.client, name, keep=nv.device_rules(self.node_object(name)))
            except KubeError:
                pass  # the Node's lift deletes them (its record names them, or device_holds is on)
            return self._node_scope(name, "the GPUs could not be held alone: %s" % str(exc)[:300])
        of = max(dra.gpu_count(slices), max(held) + 1)  # the GPUs its DRA driver publishes: the budget's n
        self._write(name, lambda node: nv.device_patch(node, reason, written, int(self.clock()), sorted(held), of))
        self.scope[name] = "held: %s, not the Node" % ", ".join(
            "gpu%d %s/%s %s" % (gpu, where[1], where[2], effect) for gpu, effect, where in targets)
        return ""

    def _node_scope(self, name: str, why: str) -> str:
        self.scope[name] = "the Node is held: " + why
        return why
