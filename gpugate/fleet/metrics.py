"""Controller-side metrics: the fleet by gpugate class, drift per component
(from the latest audit), the sweep's progress.  Label values come from fixed
sets (classes, components, sweep results): cardinality stays bounded."""

import time
from typing import Mapping, Optional, Sequence

from gpugate.model.findings import CLASSES
from gpugate.fleet.audit import DRIFT, GPU_COMPONENTS, NODE_COMPONENTS, STATUSES, fold, node_states

SWEEP_RESULTS = ("in_flight", "resumed", "escalated", "left", "deferred", "halted")
_TERMINAL_RESULT = {"resume": "resumed", "escalate": "escalated", "left": "left", "deferred": "deferred",
                    "halted": "halted"}


def fleet_families(snapshot, journal_nodes: Mapping, last_audit: Optional[Mapping], baseline,
                   budget: Optional[Mapping] = None, last_run: Optional[Sequence] = None,
                   now: Optional[float] = None, evidence: Optional[Mapping[str, str]] = None) -> list:
    """budget: partition -> gpugate.budget.rules.Use (None: the budget is off).
    last_run: the journal's latest run (id, started, ended, pid, outcome).
    evidence: node -> the evidence bundle kept before its escalation ("" none),
    for the nodes the sweep escalated (rma): one series each, as many as
    there are rma nodes."""
    by_class = {c: 0 for c in CLASSES}
    others = in_service = 0
    for view in snapshot.nodes.values():
        if view.ours is not None:
            by_class[view.ours.cls] = by_class.get(view.ours.cls, 0) + 1
        elif not view.in_service:
            others += 1
        if view.in_service:
            in_service += 1
    families = [
        ("gpugate_fleet_nodes", "gauge", "Nodes Slurm knows.", [("gpugate_fleet_nodes", {}, len(snapshot.nodes))]),
        ("gpugate_fleet_nodes_in_service", "gauge", "Nodes in service.",
         [("gpugate_fleet_nodes_in_service", {}, in_service)]),
        ("gpugate_fleet_drained", "gauge", "Nodes drained by gpugate, per class.",
         [("gpugate_fleet_drained", {"class": c}, n) for c, n in sorted(by_class.items())]),
        ("gpugate_fleet_out_for_others", "gauge", "Nodes out of service for reasons that are not gpugate's.",
         [("gpugate_fleet_out_for_others", {}, others)]),
    ]
    if budget:
        families += [
            ("gpugate_drain_budget_nodes", "gauge",
             "Nodes of the partition gpugate may keep drained for budgeted findings (all but acute ones).",
             [("gpugate_drain_budget_nodes", {"partition": p}, u.allowance) for p, u in sorted(budget.items())]),
            ("gpugate_drain_budget_used_nodes", "gauge", "Nodes of the partition drained for budgeted findings "
             "(an rma they caused and a deferred escalation included; on Kubernetes a node whose GPUs are held "
             "alone counts their share of it: k/n).",
             [("gpugate_drain_budget_used_nodes", {"partition": p}, u.weight)
              for p, u in sorted(budget.items())]),
        ]
    results = {r: 0 for r in SWEEP_RESULTS}
    for rec in journal_nodes.values():
        key = _TERMINAL_RESULT.get(rec.step) if rec.finished else "in_flight"
        if key:
            results[key] += 1
    families.append(("gpugate_sweep_nodes", "gauge", "Nodes in the sweep journal by their latest outcome.",
                     [("gpugate_sweep_nodes", {"result": r}, n) for r, n in results.items()]))
    families += _sweep_run(last_run)
    if evidence is not None:
        escalated = {n: evidence.get(n, "") for n, r in journal_nodes.items()
                     if r.finished and _TERMINAL_RESULT.get(r.step) == "escalated"}
        families.append(("gpugate_sweep_rma_evidence", "gauge",
                         "Nodes the sweep escalated (rma): 1 with the evidence bundle kept before it (the id names "
                         "the file in [sweep] evidence_dir), 0 when none was kept.",
                         [("gpugate_sweep_rma_evidence", {"node": n, "evidence": escalated[n]}, 1 if escalated[n] else 0)
                          for n in sorted(escalated)]))
    # Written with the rest: an alert on its age tells a stopped `gpugate metrics` from a quiet fleet.
    families.append(("gpugate_metrics_timestamp_seconds", "gauge", "When `gpugate metrics` wrote this.",
                     [("gpugate_metrics_timestamp_seconds", {}, round(time.time() if now is None else now, 3))]))
    if last_audit and isinstance(last_audit.get("facts"), Mapping):
        errors = last_audit.get("config_errors")
        audit = fold(last_audit["facts"], baseline, errors if isinstance(errors, Mapping) else None)
        states = node_states(audit)
        components = sorted(NODE_COMPONENTS + GPU_COMPONENTS)
        counts = {(c, s): 0 for c in components for s in STATUSES}
        for c in components:
            for state in states.get(c, {}).values():
                counts[(c, state)] += 1
        families += [
            ("gpugate_audit_drift_nodes", "gauge", "Nodes whose component differs from the pin (latest audit).",
             [("gpugate_audit_drift_nodes", {"component": c}, counts[(c, DRIFT)]) for c in components]),
            ("gpugate_audit_component_nodes", "gauge",
             "Nodes per component and state in the latest audit: pinned, drift, pending, unpinned, unreadable "
             "(could not be read), unchecked (configured off). A node counts once, in its worst state.",
             [("gpugate_audit_component_nodes", {"component": c, "state": s.lower()}, counts[(c, s)])
              for c in components for s in STATUSES]),
            ("gpugate_audit_unreachable_nodes", "gauge", "Nodes the latest audit could not read.",
             [("gpugate_audit_unreachable_nodes", {}, len(audit.unreachable))]),
            ("gpugate_audit_config_error_nodes", "gauge",
             "Nodes whose gpugate.toml or baseline did not load in the latest audit (they gate with their "
             "last good copies).", [("gpugate_audit_config_error_nodes", {}, len(audit.config_errors))]),
            ("gpugate_audit_timestamp_seconds", "gauge", "When the latest audit ran.",
             [("gpugate_audit_timestamp_seconds", {}, float(last_audit.get("at", 0)))]),
        ]
    return families


def _sweep_run(last_run: Optional[Sequence]) -> list:
    """The latest sweep run: the journal records outcome "stopped" when its
    circuit breaker ended it, "ok" otherwise, nothing while it runs."""
    if not last_run:
        return []
    _run_id, started, ended, _pid, outcome = last_run
    return [
        ("gpugate_sweep_stopped", "gauge", "1 when the latest sweep run was stopped by its circuit breaker.",
         [("gpugate_sweep_stopped", {}, 1 if outcome == "stopped" else 0)]),
        ("gpugate_sweep_last_run_timestamp_seconds", "gauge", "When the latest sweep run started.",
         [("gpugate_sweep_last_run_timestamp_seconds", {}, float(started or 0))]),
    ]


def keeper_families(status: Optional[Mapping], now: float, held: Optional[Mapping[str, int]] = None) -> list:
    """The drain-budget keeper (gpugate.keeper.run): when its last good run was
    (0: it never ran here, which the GpugateBudgetKeeperStale alert catches
    like a stale one: without it nothing budgeted is ever drained), whether
    its latest try failed, and what that run did.  held: partition ->
    nodes that published a budgeted finding and are not drained (from the
    fleet read `gpugate metrics` makes anyway)."""
    status = status or {}
    try:
        last_ok = float(status.get("last_ok") or 0)
    except (TypeError, ValueError):
        last_ok = 0.0
    families = [
        ("gpugate_budget_keeper_last_run_timestamp_seconds", "gauge",
         "When the drain-budget keeper (gpugate budget) last ran to the end; 0: never here.",
         [("gpugate_budget_keeper_last_run_timestamp_seconds", {}, last_ok)]),
        ("gpugate_budget_keeper_last_error", "gauge",
         "1 when the keeper's latest run failed (Slurm did not answer, or no usable drain budget key).",
         [("gpugate_budget_keeper_last_error", {}, 0 if status.get("ok", True) else 1)]),
    ]
    if status.get("ok"):
        families += [
            ("gpugate_budget_keeper_drained_nodes", "gauge", "Nodes the keeper's latest run drained.",
             [("gpugate_budget_keeper_drained_nodes", {}, len(status.get("drained") or ()))]),
            ("gpugate_budget_keeper_given_back_nodes", "gauge",
             "Drains the keeper's latest run gave back (over the budget: two keepers at once).",
             [("gpugate_budget_keeper_given_back_nodes", {}, len(status.get("given_back") or ()))]),
            ("gpugate_budget_keeper_held_nodes", "gauge", "Published nodes the keeper's latest run held.",
             [("gpugate_budget_keeper_held_nodes", {}, int(status.get("held") or 0))]),
            ("gpugate_budget_keeper_unverified_nodes", "gauge",
             "Held nodes whose published tag their node did not sign (pasted, copied, old, older release): never drained.",
             [("gpugate_budget_keeper_unverified_nodes", {}, int(status.get("unverified") or 0))]),
        ]
    if held is not None:
        families.append(("gpugate_drain_budget_held_nodes", "gauge",
                         "Nodes of the partition that published a budgeted finding and are not drained (held).",
                         [("gpugate_drain_budget_held_nodes", {"partition": p}, n) for p, n in sorted(held.items())]))
    return families
