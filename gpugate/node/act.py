"""Act on a verdict in Slurm: read the node's state, apply the ownership
rules, then drain / update / undrain.

No controller RPC on the healthy path unless a marker in the state directory
says gpugate drained this node (whichever of health check, prolog or epilog
did) or published a budgeted finding on it: only then may a fit verdict have
a drain or a comment to clear.  The node never reads the fleet: a budgeted
finding is published for the budget keeper (gpugate.node.hold)."""

from __future__ import annotations

import os
import time

from gpugate.errors import GpugateError
from gpugate.node import hold
from gpugate.safety.state import KUBE_HOLD

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Any, Dict, Optional

MARKER = "drained-by-gpugate"
# Kubernetes: the node's GpugateHealthy condition says unfit, or names what
# is pending during a rollout; a fit run must read the node (and set it to a
# plain True) even when gpugate holds nothing there.
REPORTED_UNFIT = "reported-unfit"


def marker_path(settings, node: str) -> str:
    return os.path.join(settings.state_dir(node), MARKER)


def act(settings, node: str, verdict, check_fit: bool = False, deadline: Optional[float] = None,
        spread: bool = False, in_service: Optional[bool] = None, read_at: Optional[float] = None,
        gpus: Optional[Dict[int, Dict[str, str]]] = None) -> Dict[str, Any]:
    """Returns what happened: action, why, ok (False: the verdict could not
    be applied; the caller keeps what it needs to try again next run), and
    applied (the node carries the verdict as far as gpugate may put it).
    Action "held": unfit, but the drain budget keeps the node in service.
    deadline (time.monotonic()): every Slurm call and wait ends by then.
    spread: wait a random moment before a budgeted drain (health check).
    in_service: slurmd's SLURM_NODE_IS_HEALTHY (None: not given).
    read_at (time.time()): when the verdict's facts began to be read; a
    drain is not applied if the sweep reset the node's GPUs since (see
    _reset_since).  gpus: {index: {"uuid", "pci"}} as this run read them
    (gpu_identities): on Kubernetes with [kubernetes] device_holds, a GPU's
    own finding holds that GPU alone where the cluster can (KubeNodes.hold_devices)."""
    from gpugate.model import ownership  # here: a fit prolog never acts, and never loads it

    marker = marker_path(settings, node)
    # A fit run with something pending (a rollout) on Kubernetes reads the
    # node: its condition names what is pending (written only on change).
    # Not where Slurm runs the checks (slurm, slurm+kubernetes): a fit
    # prolog asks the controller nothing.
    kube = getattr(settings, "scheduler", "slurm") == "kubernetes"
    reports_pending = bool(verdict.notes) and kube
    if (verdict.fit and not check_fit and not reports_pending and not os.path.exists(marker)
            and not hold.published(settings, node)
            and not os.path.exists(os.path.join(settings.state_dir(node), REPORTED_UNFIT))
            and not (kube and os.path.exists(os.path.join(settings.state_dir(node), KUBE_HOLD)))):
        if kube:  # the condition's heartbeat, every run: one status patch, no read
            return _heartbeat(settings, node, verdict, deadline)
        return {"action": ownership.NONE, "ok": True, "rpc": False, "applied": True}
    if verdict.fit and in_service and not hold.published(settings, node):
        # slurmctld says the node is in service: no drain of ours to clear.
        # The marker stays: it only costs a read once Slurm says "no" (and
        # never delays a new drain: see the jitter below).
        return {"action": ownership.NONE, "ok": True, "rpc": False, "applied": True,
                "why": "fit, and slurmctld holds the node in service (SLURM_NODE_IS_HEALTHY=yes)"}
    why_held = hold.held_recently(settings, node, verdict)
    if why_held:
        return {"action": hold.HELD, "why": why_held, "ok": True, "rpc": False, "applied": True}
    why_kept = hold.kept_recently(settings, node, verdict)
    if why_kept:
        return {"action": ownership.KEEP, "why": why_kept, "ok": True, "rpc": False, "applied": True}
    limit = float(settings.slurm["timeout_seconds"])
    if deadline is not None:
        limit = min(limit, max(deadline - time.monotonic(), 0.0))
    # spread: kept for the callers; a node no longer reads the fleet, so a
    # fleet-wide finding costs slurmctld one single-node read and one comment
    # update per node, with nothing to spread out.
    return _apply(settings, node, verdict, marker, limit, deadline, read_at, gpus)


def _apply(settings, node: str, verdict, marker: str, limit: float, deadline: Optional[float],
           read_at: Optional[float] = None, gpus=None) -> Dict[str, Any]:
    """Read the node's state, decide by the ownership rules, write; the
    outcome names the Slurm backend that did it (the log line's "backend")."""
    used: list = []
    outcome = _read_decide_write(settings, node, verdict, marker, limit, deadline, used, read_at, gpus)
    if used:
        outcome["backend"] = used[0].name
        if used[0].why != "configured":
            outcome["backend_why"] = used[0].why[:300]
        if used[0].node_read not in ("", "libslurm"):
            outcome["node_read"] = used[0].node_read[:300]  # read with two RPCs, and why
        used[0].close()
    return outcome


def _read_decide_write(settings, node: str, verdict, marker: str, limit: float, deadline: Optional[float],
                       used: list, read_at: Optional[float] = None, gpus=None) -> Dict[str, Any]:
    from gpugate.schedulers.registry import connect
    from gpugate.model import ownership

    try:
        # Health check, prolog and epilog may act at once: read, decide and
        # write under one lock, so no run undoes another's newer decision.
        with _act_lock(settings.state_dir(node), limit):
            slurm = connect(settings, deadline=deadline)
            used.append(slurm)
            budgeted = hold.applies(settings, verdict)
            # The node's own record only, in one RPC: never the fleet, nor the partitions.
            state = slurm.own_record(node)
            survives = getattr(slurm, "restore_hold", None)  # Kubernetes: a hold its Node lost, written again
            if survives is not None:
                state = survives(settings.state_dir(node), node, state)
            decision = ownership.decide(state, verdict, settings.reason_tag, settings.slurm["self_clearing"])
            stale = (decision.kind in (ownership.DRAIN, ownership.UPDATE)
                     and _reset_since(settings, node, read_at))
            if stale:
                return {"action": ownership.NONE, "ok": True, "rpc": True, "applied": False, "why": stale}
            why_held = None
            if budgeted and decision.kind not in (ownership.UNKNOWN, ownership.KEEP):
                # Published for the keeper, whatever else holds the node; not
                # once gpugate drained it for more (rma, the sweep's work, an
                # acute finding): a span there reads as waiting for the keeper.
                if getattr(slurm, "device_holds", False):  # one GPU's finding: the keeper may hold it alone
                    slurm.offer_devices(node, verdict.findings, gpus or {})
                why_held = hold.publish(settings, slurm, node, state, verdict.reason)
            elif budgeted and decision.kind == ownership.KEEP:
                hold.remember_kept(settings, slurm, node, state, verdict.reason)
            elif decision.kind != ownership.UNKNOWN:
                hold.unpublish(settings, slurm, node, state)
            if decision.kind == ownership.DRAIN and budgeted:
                pass  # the keeper drains it, within the budget
            elif decision.kind in (ownership.DRAIN, ownership.UPDATE):
                if _hold_devices(slurm, node, decision.reason, verdict, gpus) != "":
                    slurm.drain(node, decision.reason)
            elif decision.kind == ownership.UNDRAIN:
                slurm.undrain(node)
            reported = _report(settings, slurm, node, verdict, state if decision.kind != ownership.UNDRAIN
                               else None) if decision.kind != ownership.UNKNOWN else ""
            if survives is not None:
                slurm.remember_hold(settings.state_dir(node), node)
    except (GpugateError, OSError) as exc:
        return {"action": "failed", "ok": False, "error": str(exc)[:300], "rpc": True, "applied": False}
    outcome = _decided(settings, verdict, decision, state, marker, why_held)
    if getattr(slurm, "scope", {}).get(node):
        outcome["scope"] = slurm.scope[node][:300]  # the GPUs held alone, or why the Node is
    if reported:
        outcome["condition_error"] = reported
    return outcome


def _hold_devices(backend, node: str, reason: str, verdict, gpus) -> Optional[str]:
    """"" when the verdict's GPUs are held alone (Kubernetes, [kubernetes]
    device_holds); why not, or None where the backend has no such holds."""
    if not getattr(backend, "device_holds", False):
        return None
    return backend.hold_devices(node, reason, verdict.findings, gpus or {})


def gpu_identities(facts) -> Dict[int, Dict[str, str]]:
    """{index: {"uuid", "pci"}} of the GPUs a run read (NVML's, or amdgpu's
    PCI functions): how a DRA driver's ResourceSlice names them."""
    found: Dict[int, Dict[str, str]] = {}
    nvml, amd = getattr(facts, "nvml", None), getattr(facts, "amd", None)
    for gpu in getattr(nvml, "gpus", None) or ():
        found[gpu.index] = {k: v for k, v in (("uuid", gpu.uuid), ("pci", gpu.pci_bus_id)) if isinstance(v, str)}
    for gpu in getattr(amd, "gpus", None) or ():
        found.setdefault(gpu.index, {"pci": gpu.bdf} if isinstance(gpu.bdf, str) else {})
    return found


def _heartbeat(settings, node: str, verdict, deadline: Optional[float]) -> Dict[str, Any]:
    """Kubernetes, a fit run with nothing to lift: the GpugateHealthy
    condition written all the same (its lastHeartbeatTime: a dead agent
    shows as a stale heartbeat, never as a node fit for ever)."""
    from gpugate.schedulers.registry import connect
    from gpugate.model import ownership

    outcome = {"action": ownership.NONE, "ok": True, "rpc": True, "applied": True}
    try:
        backend = connect(settings, deadline=deadline)
        try:
            backend.heartbeat(node, verdict)
        finally:
            backend.close()
    except (GpugateError, OSError) as exc:  # the verdict stands; the next run writes it
        outcome["condition_error"] = str(exc)[:300]
    return outcome


def _report(settings, slurm, node: str, verdict, state) -> str:
    """The verdict where the scheduler carries one (Kubernetes' condition):
    best effort, after the drain or lift it describes, which stands either
    way; "" or why it was not written (the log line says so; the next run
    that reads the node writes it)."""
    if not slurm.reports_verdict:
        return ""
    try:
        slurm.report_verdict(node, verdict, state)
    except (GpugateError, OSError) as exc:
        return str(exc)[:300]
    _set_marker(os.path.join(settings.state_dir(node), REPORTED_UNFIT), not verdict.fit or bool(verdict.notes))
    return ""


def _decided(settings, verdict, decision, state, marker: str, why_held) -> Dict[str, Any]:
    from gpugate.model import ownership

    if why_held and decision.kind == ownership.DRAIN:
        return {"action": hold.HELD, "why": why_held, "ok": True, "rpc": True, "applied": True}
    if decision.kind == ownership.UNKNOWN:
        return {"action": decision.kind, "why": decision.why, "ok": verdict.fit, "rpc": True,
                "error": decision.why, "applied": verdict.fit}
    reason_ours = state.drain and ownership.reasons.parse(state.reason, settings.reason_tag) is not None
    ours = decision.kind in (ownership.DRAIN, ownership.UPDATE) or (
        decision.kind in (ownership.KEEP, ownership.NONE) and reason_ours)
    _set_marker(marker, ours)
    # Someone else holds the node: our findings are not applied (yet).
    applied = decision.kind != ownership.KEEP_ADMIN or verdict.fit
    return {"action": decision.kind, "why": decision.why, "ok": True, "rpc": True, "applied": applied}


def _reset_since(settings, node: str, read_at: Optional[float]) -> str:
    """Why a verdict is stale: the sweep reset the node's GPUs (`gpugate
    reset-gpus` ends by writing gpureset.MARKER) after this run began to
    read them.  A health check that read ECC counts before the reset and
    came to act after the sweep verified the node and lifted its drain for
    the smoke job would drain it again for what the reset cleared: the
    smoke job then waits on a drained node until its deadline, and a node
    the reset repaired is rebooted.  The next check judges the node as it
    is now."""
    if read_at is None:
        return ""
    from gpugate.node.gpureset import MARKER
    from gpugate.safety.state import read_json

    mark = read_json(os.path.join(settings.state_dir(node), MARKER)) or {}
    at = mark.get("at")
    # Only a reset between the read and now: a marker "in the future" (a
    # clock stepped back) must not hold every drain off until then.
    if isinstance(at, (int, float)) and read_at <= at <= time.time():
        return ("stale: the GPUs were reset after this run read them (%.1fs later); the next check judges "
                "them as they are now" % (at - read_at))
    return ""


class _act_lock:
    """One run acts on a node at a time (state_dir/locks/act.lock, a lock
    only root can take: gpugate.safety.lock).  A class, not
    contextlib.contextmanager: contextlib is half a millisecond of every
    prolog, which never acts when the node is fit."""

    def __init__(self, state_dir: str, timeout: float):
        from gpugate.safety.lock import RunLock, lock_path  # here: a fit prolog never acts

        self.path = lock_path(state_dir, "act")
        self.lock, self.timeout = RunLock(self.path), timeout

    def __enter__(self):
        from gpugate.safety.lock import describe

        deadline = time.monotonic() + max(self.timeout, 0.5)
        while not self.lock.acquire():
            if time.monotonic() >= deadline:
                raise GpugateError("another gpugate run is acting on this node (%s, held by %s)"
                                   % (self.path, describe(self.lock.holder, time.time())))
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.lock.release()
        return False


def _set_marker(path: str, present: bool) -> None:
    """Made or removed by name below the state directory's fd (safeio):
    no symlink followed, nothing opened but a new or regular file."""
    from gpugate.safety.safeio import open_dir

    try:
        dir_fd = open_dir(os.path.dirname(path), 0o755 if present else 0)
        try:
            name = os.path.basename(path)
            if present:
                os.close(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                                 0o600, dir_fd=dir_fd))
            else:
                os.unlink(name, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass  # absent already, or worst case: one extra RPC, or a probe drain cleared by the sweep


def settle(settings, node: str, result, record: Dict[str, Any], deadline: Optional[float] = None) -> bool:
    """Record a prolog/epilog verdict and drain when unfit.  True when the
    node is fit, its drain was applied, or a budgeted drain could not be
    (Slurm away or slow: the budget cannot be read, so the node is not
    taken out by a non-zero exit either)."""
    verdict = result.verdict
    record.update(verdict="fit" if verdict.fit else "unfit", cls=verdict.cls, reason=verdict.reason,
                  durations={k: round(v, 4) for k, v in result.facts.durations.items()})
    if verdict.fit:
        return True
    outcome = act(settings, node, verdict, deadline=deadline)
    record["action"] = outcome["action"]
    for key in ("backend", "backend_why", "node_read", "condition_error"):
        if key in outcome:
            record[key] = outcome[key]
    if not outcome["ok"]:
        record["slurm_error"] = outcome.get("error")
        if hold.applies(settings, verdict):
            # A non-zero exit would make slurmd drain the node ("Prolog
            # error") outside the budget: a bad file could then take out
            # every node whose prolog runs while slurmctld is away.
            record["action"] = hold.HELD
            record["why"] = hold.UNPUBLISHED
            return True
    if outcome["action"] == hold.HELD:
        record["why"] = outcome["why"]
    return bool(outcome["ok"])
