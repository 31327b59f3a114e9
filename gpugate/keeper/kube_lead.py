"""The budget keeper's run on Kubernetes (gpugate.keeper.run.run with
``scheduler = "kubernetes"``): one replica leads through the Lease
(gpugate.kube.lease), and what must survive a failover or be seen from
anywhere lives on it, not in a replica's emptyDir:

- its memory: the spans it drained (gpugate.budget.memory) and the pools
  each held node counts in (gpugate.budget.pools: a label changed under a
  held node never frees its pool's budget).  A memory that cannot be read
  fails the run: deciding without the pools could drain past a budget;
- its latest run (lease.STATUS): the last good run and by whom, the failed
  runs in a row, the error.  `gpugate status` and every replica's metrics
  read it there, so a standby says that the leader is failing;
- giving up: the leader renews the Lease before each run, so one whose runs
  all fail (a bad key, RBAC, an API refusing its writes) would keep it for
  ever and nothing budgeted would drain.  After ``[kubernetes]
  lease_give_up_runs`` failed runs in a row it releases the Lease, and
  another replica takes it at its next run (this one only after
  ``lease_seconds``, when no other has)."""

from __future__ import annotations

import socket
import time

from gpugate.errors import GpugateError
from gpugate.keeper import kube_lease_memory as lease_memory
from gpugate.kube import lease
from gpugate.kube.client import KubeError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable


def _namespace(settings) -> str:
    return str(settings.kubernetes.get("namespace") or "gpugate")


def run(settings, nodes, failed_before: int, decide: Callable, clock=time.time) -> dict:
    """One run through the Lease.  nodes: the connected KubeNodes; failed_before:
    this replica's failed runs in a row before this one (its last status);
    decide(memory, pools): gpugate.keeper.run.run_once on them.  Returns the
    figures: "standby" and the Lease's last good run when another leads;
    "_error" (and "leader" 0 once given up) for a failed leading run, said
    on the Lease first.  Raises GpugateError when the Lease cannot be held."""
    who = socket.gethostname()
    standby = nodes.lead(who)  # KubeError when the Lease cannot be read or written: failed, not standing by
    if standby:
        figures = {"fleet_reads": 0, "drained": [], "given_back": [], "ok": True, "standby": standby[:300],
                   "leader": 0}
        try:
            seen = lease.read_status(nodes.client, _namespace(settings))
        except GpugateError as exc:
            seen = {}
            figures["lease_error"] = str(exc)[:300]
        figures["last_ok"] = seen.get("last_ok")  # the keeper's, whichever replica ran it
        figures["leader_status"] = {k: seen[k] for k in ("holder", "ok", "failed_runs", "error") if k in seen}
        return figures
    figures = {"fleet_reads": 0, "drained": [], "given_back": []}
    try:
        try:
            loaded = lease_memory.read_memory(nodes.client, _namespace(settings))
        except KubeError:  # as if lost: the run fails below and writes nothing over it
            loaded = None
        if loaded is None:
            raise GpugateError("the keeper's memory on its Lease %s/%s cannot be read: nothing drained (a held "
                               "node's pools are counted from it)" % (_namespace(settings), lease.NAME))
        figures = decide(loaded, getattr(loaded, "pools", None) or {})
        from gpugate.budget.memory import Memory

        spans, pools = figures.pop("_memory", None), figures.pop("_pools", None)
        memory = None if spans is None else Memory(spans, pools or {})  # None: the budget is off, kept as it is
        figures["leader"] = 1
        status = {"at": round(clock(), 3), "by": who, "ok": True, "last_ok": round(clock(), 3), "last_ok_by": who,
                  "failed_runs": 0, "drained": len(figures.get("drained") or ()),
                  "given_back": len(figures.get("given_back") or ()), "held": int(figures.get("held") or 0),
                  "unverified": int(figures.get("unverified") or 0)}
        lease_memory.write_memory(nodes.client, _namespace(settings), who, memory, status=status)
        return figures
    except GpugateError as exc:
        error = str(exc) or type(exc).__name__
        gave_up = _failed(settings, nodes, who, failed_before + 1, error, clock)
        return dict(figures, _error=error, leader=0 if gave_up else 1)  # drains made before a late failure kept


def _failed(settings, nodes, who: str, failed: int, error: str, clock) -> bool:
    """Said on the Lease while this replica holds it; given up after the
    limit.  True when it was given up."""
    give_up = failed >= int(settings.kubernetes.get("lease_give_up_runs") or 3)
    try:
        lease.note_failure(nodes.client, _namespace(settings), who,
                           {"at": round(clock(), 3), "by": who, "ok": False, "failed_runs": failed,
                            "error": error[:500]}, give_up, clock)
    except GpugateError:
        return False  # the run failed already; a Lease that refuses this too is the next run's failure
    return give_up
