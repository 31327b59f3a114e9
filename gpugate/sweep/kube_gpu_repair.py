"""The sweep's repair of GPUs held alone on Kubernetes ([kubernetes]
device_holds): a node whose hold is gpugate's DeviceTaintRules only (no
Node taint) and whose remedy is the GPU reset rung is repaired GPU by GPU,
the Node left serving:

- wait_drained: a NoExecute DeviceTaintRule of the sweep's own beside
  gpugate's rule for each held GPU (KubeNodes.empty_gpus); the device taint
  eviction controller (kube-controller-manager) evicts the Pods whose
  claims hold it, and the sweep waits until no Pod's claim does
  (gpugate.kube.claims; until drain_timeout, then deferred, held).  The
  Node is neither tainted nor cordoned: its other GPUs keep their Pods;
- evidence, then the reset rung for those GPUs (``reset-gpus --gpu N``),
  the sweep's work reason written in gpugate's record, the rules kept;
- verify: the node's verification on those GPUs alone (``check --mode
  verify --gpu N``: their facts and the deep diagnostic, ``dcgmi diag -i``);
  no smoke Pod (it asks for every GPU of the node);
- resume: the proof lifts every gpugate rule for the node, the record with them.

A failed reset or verification escalates at once (rma): the GPU stays held
alone, the Node serving.  The reboot rung, which empties the node, is not
tried for a GPU's own finding: hold the Node (`gpugate drain`) for it.

Only where one GPU can be reset while the others serve (``alone``: an
NVIDIA node whose baseline says ``nvswitch = false``).  An HGX node resets
every GPU of its baseboard together (gpugate.vendors.nvidia.reset), an AMD
node every GPU of its hive: there, and for any other node (a Node hold,
another remedy), the sweep repairs the node whole, as before."""

from __future__ import annotations

from gpugate.errors import GpugateError
from gpugate.kube import claims
from gpugate.kube import nodeview as nv
from gpugate.kube.client import KubeError
from gpugate.model import reason as reasons
from gpugate.sweep.plan import RESET

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Tuple

GPU_PIPELINE = ("wait_drained", "evidence", "reset", "verify", "resume")


def alone(baseline, name: str) -> bool:
    """Can one of this node's GPUs be reset while the others serve?  An
    NVIDIA node whose baseline says it has no NVSwitch (PCIe GPUs): ``nvidia-smi
    -r -i N``.  Not an HGX baseboard (NVLink peers, Fabric Manager: every
    GPU reset together), nor an AMD node (an XGMI hive resets as one), nor a
    node whose baseline does not say."""
    return baseline.vendor_for(name) == "nvidia" and baseline.expect_for(name).nvswitch is False


class GpuCheck:
    """The transport with ``--gpu N`` added to its checks: the verification of those GPUs alone."""

    def __init__(self, inner, gpus):
        self.inner, self.gpus = inner, tuple(gpus)

    def check(self, nodes, args, timeout):
        extra = []
        for gpu in self.gpus:
            extra += ["--gpu", str(gpu)]
        return self.inner.check(nodes, list(args) + extra, timeout)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class KubeGpuRepair:
    """Mixed into KubeSweeper before engine.Sweeper."""

    def gpu_only(self, name: str, rec=None) -> Tuple[int, ...]:
        """The GPUs this node's repair is of, where it is theirs alone; () for a whole-node repair."""
        known = self.__dict__.setdefault("_gpu_only", {})
        if name in known:
            return known[name]
        rec = rec if rec is not None else self.journal.nodes().get(name)
        gpus: Tuple[int, ...] = ()
        if rec is not None and rec.remedy == RESET and rec.attempt < 3 and self.slurm.device_holds \
                and alone(self.baseline, name):
            try:
                node = self.slurm.node_object(name)
            except (KubeError, GpugateError):
                node = {}
            if nv.devices_held(node):
                record = nv.owned(node)
                found = record.get("gpus") or [f.gpu for f in getattr(reasons.parse(rec.reason, self.tag),
                                                                      "findings", ())]
                if found and all(isinstance(g, int) for g in found):
                    gpus = tuple(sorted(set(found)))
        if gpus:
            self.slurm.gpu_repair.add(name)  # its work reason keeps the GPUs held alone (KubeNodes.drain)
        known[name] = gpus
        return gpus

    def _pipeline(self, rec):
        return GPU_PIPELINE if self.gpu_only(rec.node, rec) else super()._pipeline(rec)

    def _gpu_nodes(self, nodes) -> Tuple[List[str], List[str]]:
        mine = [n for n in nodes if self.gpu_only(n)]
        return mine, [n for n in nodes if n not in mine]

    def _empty_gpus(self, nodes, before: str, cleared) -> List[str]:
        """The held GPUs of ``nodes`` emptied of their Pods (cleared(name,
        the Pods found at first) for each); a node whose GPU still has Pods at
        drain_timeout is deferred, held.  The nodes whose GPUs are empty."""
        devices: Dict[str, list] = {}
        for name in nodes:
            try:
                devices[name] = self.slurm.empty_gpus(name, self.gpu_only(name))
            except (KubeError, GpugateError, ValueError) as exc:
                self._defer_held(name, "%s: its GPU could not be emptied: %s" % (before, str(exc)[:300]))
        found: Dict[str, list] = {}

        def settle(states, waiting):
            for name in sorted(waiting):
                if self._lost(name, states.get(name)):
                    yield name
                    continue
                left = claims.using(self.slurm.client, name, devices[name])
                found.setdefault(name, left)
                if not left:
                    cleared(name, found[name])
                    yield name

        late = self._wait(sorted(devices), settle, float(self.cfg["drain_timeout"])) if devices else set()
        for name in sorted(late):
            self._defer_held(name, "%s: Pods still use its held GPU at the drain timeout (the device taint "
                                   "eviction controller evicts them): %s" % (before, ", ".join(found[name][:3])))
        return [n for n in devices if n not in late and n not in self.handled]

    def _step_wait_drained(self, nodes, records) -> None:
        mine, rest = self._gpu_nodes(nodes)
        if mine:
            self._begin(mine, "wait_drained")

            def cleared(name, found):
                what = "GPU %s emptied, the Node serving" % ",".join(str(g) for g in self.gpu_only(name))
                self._done(name, "wait_drained", what + (": %d Pod(s) evicted by its NoExecute rule: %s" % (
                    len(found), ", ".join(found[:3])) if found else ": no Pod used it"))
                self.say("  %s: %s" % (name, what))

            self._empty_gpus(mine, "wait_drained", cleared)
        if rest:
            super()._step_wait_drained(rest, records)

    def _evict_again(self, nodes, before: str) -> list:
        mine, rest = self._gpu_nodes(nodes)
        ready = self._empty_gpus(mine, "before " + before, lambda name, found: None) if mine else []
        return ready + (super()._evict_again(rest, before) if rest else [])

    def _step_verify(self, nodes, records) -> None:
        mine, rest = self._gpu_nodes(nodes)
        if rest:
            super()._step_verify(rest, records)
        groups: Dict[Tuple[int, ...], List[str]] = {}
        for name in mine:
            groups.setdefault(self.gpu_only(name), []).append(name)
        for gpus, group in sorted(groups.items()):
            transport = self.transport
            self.transport = GpuCheck(transport, gpus)
            try:
                super()._step_verify(group, records)
            finally:
                self.transport = transport

    def _attempt_failed(self, name, rec, why) -> None:
        if not self.gpu_only(name):
            return super()._attempt_failed(name, rec, why)
        self.say("  %s: %s; the GPU is escalated, held alone (the reboot rung would empty the Node)" % (name, why))
        self._escalate([name], why)
