"""Slurm on Kubernetes (SchedMD's Slinky, Nebius' soperator): one machine
is a Slurm node (slurmd in a pod) and a Kubernetes Node.  With
``scheduler = "slurm+kubernetes"`` Slurm is the primary: gpugate's
ownership rules, drain budget, keeper and sweep decide there exactly as on
any Slurm, and every hold gpugate puts on a Slurm node, or lifts, is
mirrored on the Kubernetes Node that runs it (``[kubernetes] node_name``,
"{node}": the same name, as Slinky's DaemonSet mode names them) with the
same reason: gpugate's NoSchedule taint and ownership record, and the
GpugateHealthy condition.  One finding, one reason on both sides; one
budget (Slurm's); one proof returns both.

No cordon: Slinky's NodeSet controller drains the Slurm node of a cordoned
Node itself, and undrains it when the Node is uncordoned.  Were gpugate to
cordon, the operator would drain the node again in every moment the sweep
has Slurm's drain lifted (a reboot that clears it, the smoke job in the
sweep's reservation), and the smoke job could not start.  gpugate drains
Slurm itself; the taint (NoSchedule only: NoExecute would evict slurmd's
own pod) keeps new pods off the Node.  An admin's cordon stays the
admin's (and Slinky's).

Order:

- hold: Slurm first, then the Node;
- lift: the Node first, then Slurm.  A lift the Node refuses leaves Slurm
  drained: held and visible, and the next run lifts both.
- the sweep's smoke job runs in its reservation with Slurm's drain lifted
  for it (undrain_in_reservation): the Node stays held until the proof.

A mirror that fails after Slurm's drain raises (the run says so); the next
run that reads the node (report_verdict) puts the Node right."""

from __future__ import annotations

from gpugate.model import reason as reasons
from gpugate.errors import GpugateError, MirrorError
from gpugate.kube.client import KubeError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List

PAIRED = "slurm+kubernetes"


def node_name(settings, node: str) -> str:
    """The Kubernetes Node of a node gpugate.toml's scheduler names."""
    if getattr(settings, "scheduler", "slurm") != PAIRED:
        return node
    return str(settings.kubernetes.get("node_name") or "{node}").replace("{node}", node)


def _expand(names: str) -> List[str]:
    from ClusterShell.NodeSet import NodeSet

    return list(NodeSet(names))


class PairedNodes:
    """``slurm``: a Slurm backend (the primary); ``kube``: a
    gpugate.kube.nodes.KubeNodes (the mirror); ``template``: [kubernetes]
    node_name.  What this class does not define (the sweep's reservations,
    reboots, job cancels) is the Slurm backend's."""

    reports_verdict = True  # the Node's GpugateHealthy condition, and the mirror put right

    def __init__(self, slurm, kube, template: str = "{node}"):
        self.slurm, self.kube, self.template = slurm, kube, template or "{node}"
        self.tag = kube.tag
        self.name = "%s+kubernetes" % slurm.name
        self._written: Dict[str, str] = {}  # node -> the hold this run mirrored ("": lifted)

    def __getattr__(self, attr):
        return getattr(self.slurm, attr)

    def kube_name(self, node: str) -> str:
        return self.template.replace("{node}", node)

    def close(self) -> None:
        try:
            self.slurm.close()
        finally:
            self.kube.close()

    # ------------------------------------------------------------ reads (Slurm's)
    def own_record(self, name: str):
        return self.slurm.own_record(name)

    def nodes(self, names=None, lean: bool = False):
        return self.slurm.nodes(names, lean=lean)

    def lead(self, who: str) -> str:
        return self.slurm.lead(who)

    def set_comment(self, name: str, text: str) -> None:
        self.slurm.set_comment(name, text)  # the budget's publication lives on the primary

    # ----------------------------------------------------------------- writes
    def drain(self, names: str, reason: str) -> None:
        self.slurm.drain(names, reason)
        failed = []
        for name in _expand(names):
            try:
                self._hold(name, reason)
            except (GpugateError, ValueError) as exc:
                failed.append("%s: %s" % (self.kube_name(name), exc))
        if failed:
            raise MirrorError("Slurm drained %s; its Kubernetes Node not yet (the next health check mirrors it): %s"
                              % (names, "; ".join(failed)[:500]))

    def undrain(self, names: str) -> None:
        self.slurm.undrain(self._lift_all(names))

    def undrain_in_reservation(self, names: str) -> None:
        """The sweep's smoke job in its reservation: Slurm's drain lifted, the Node still held."""
        self.slurm.undrain(names)

    def resume(self, names: str) -> None:
        self.slurm.resume(self._lift_all(names))

    def _lift_all(self, names: str) -> str:
        """Lift the mirrors first; a Node that refuses keeps its Slurm node drained (raised)."""
        failed = []
        for name in _expand(names):
            try:
                self._lift(name)
            except (GpugateError, ValueError) as exc:
                failed.append("%s: %s" % (self.kube_name(name), exc))
        if failed:
            raise KubeError("the Kubernetes Node's hold could not be lifted, so its Slurm node stays drained (the "
                            "next run lifts both): %s" % "; ".join(failed)[:500])
        return names

    def _hold(self, name: str, reason: str) -> None:
        node = self.kube_name(name)
        state = self.kube.own_record(node)
        if state is None:
            raise KubeError("no Node named %s ([kubernetes] node_name maps Slurm's %s to it)" % (node, name), 404)
        self._written[name] = reason
        if state.reason != reason:  # written only on change
            self.kube.drain(node, reason)

    def _lift(self, name: str) -> None:
        node = self.kube_name(name)
        self._written[name] = ""
        state = self.kube.own_record(node)
        if state is not None and reasons.parse(state.reason, self.tag) is not None:
            self.kube.undrain(node)

    def _sweep_has(self, name: str, state) -> bool:
        """Does the sweep still have the node (Slurm's drain lifted on
        purpose)?  A reboot under way, or a reservation of the sweep's
        (made before its reboot and smoke, left by a sweeper that was
        killed until the next run): Slurm 22.05's node record does not say
        RESERVED, so its reservations are read (one call, only here)."""
        from ClusterShell.NodeSet import NodeSet

        from gpugate.schedulers.reservations import PREFIX

        if state is None or state.down or state.flags & {"REBOOT_REQUESTED", "REBOOT_ISSUED", "MAINTENANCE"}:
            return True
        return any(res.startswith(PREFIX) and name in NodeSet(hosts or "")
                   for res, hosts in self.slurm.reservations().items())

    def report_verdict(self, name: str, verdict, state) -> None:
        """The Node's GpugateHealthy condition; and, where this run wrote no
        hold, the Node's hold put in line with Slurm's as read (``state``):
        gpugate's reason there, gpugate's hold here.  With none there, a
        hold of the node's own finding goes (an admin resumed the Slurm
        node); the sweep's hold stays while the sweep has the node: it
        lifts Slurm's drain on purpose (the smoke job in its reservation, a
        reboot that clears the drain), and its resume, after the proof,
        lifts both.  Once the sweep has let go (an admin resumed a node it
        escalated, or one it left), the sweep's hold goes too."""
        node = self.kube_name(name)
        if name not in self._written:
            ours = state is not None and state.drain and reasons.parse(state.reason, self.tag) is not None
            if ours:
                self._hold(name, state.reason)
            else:
                mirrored = self.kube.own_record(node)
                held = reasons.parse(mirrored.reason, self.tag) if mirrored is not None else None
                sweeps = held is not None and any(f.component == "sweep" for f in held.findings)
                if held is not None and not (sweeps and self._sweep_has(name, state)):
                    self._lift(name)
        self.kube.report_verdict(node, verdict, state)  # on the Node as just read (raises if there is none)


def connect(settings, timeout=None, deadline=None) -> PairedNodes:
    from gpugate.slurm import connect as slurm_connect
    from gpugate.kube.nodes import connect as kube_connect

    slurm = slurm_connect(settings, timeout=timeout, deadline=deadline)
    template = str(settings.kubernetes.get("mirror_file") or "")
    if template:  # slurmd's gpugate holds no token: the sidecar writes the Node (gpugate.kube.mirror)
        from gpugate.kube.mirror import MirrorFile

        return PairedNodes(slurm, MirrorFile(template, settings.reason_tag),
                           str(settings.kubernetes.get("node_name") or "{node}"))
    try:
        kube = kube_connect(settings, deadline=deadline, timeout=timeout, cordon=False)
    except BaseException:
        slurm.close()
        raise
    kube.no_execute = False  # NoExecute would evict slurmd's own pod: Slurm's drain ends the jobs' way
    return PairedNodes(slurm, kube, str(settings.kubernetes.get("node_name") or "{node}"))
