"""Human and JSON output of the sweep: the plan, the summary, the journal."""

import time

from gpugate.sweep.evidence import directory as evidence_dir
from gpugate.node.transport import expand


def _hostlist(nodes) -> str:
    from ClusterShell.NodeSet import NodeSet

    return str(NodeSet.fromlist(sorted(nodes))) if nodes else "-"


def _commands(batch, settings):
    cfg = settings.sweep
    nodes = list(batch.nodes)
    out = []
    kube = getattr(settings, "scheduler", "slurm") == "kubernetes"
    if batch.remedy == "escalate":
        if kube:
            return ["taint %s gpugate.io/unfit=rma:NoSchedule, reason '%s rma ...'" % (_hostlist(nodes),
                                                                                    settings.reason_tag)]
        return ["scontrol update NodeName=%s State=DRAIN Reason='%s rma ...'" % (_hostlist(nodes), settings.reason_tag)]
    if kube:
        out.append("evict the pods on %s through the Eviction API (PodDisruptionBudgets respected; at %ss a "
                   "blocked node is deferred, held)" % (_hostlist(nodes), cfg["drain_timeout"]))
    if batch.remedy == "reconverge" and cfg["converge"]:
        groups = [[n] for n in nodes] if cfg["converge_per"] == "node" else [nodes]
        out += [" ".join(expand(cfg["converge"], g)) for g in groups[:3]]
        if len(groups) > 3:
            out.append("... (%d more, one per node)" % (len(groups) - 3))
    if cfg["preview"] and batch.remedy == "reconverge":
        out.append("preview: " + " ".join(expand(cfg["preview"], nodes)))
    if int(cfg["evidence_keep"]):
        out.insert(0, "%s evidence --json   (on each node, first, not in a rollout: the bundle kept in %s)"
                   % (" ".join(cfg["gpugate"]), evidence_dir(cfg)))
    if batch.remedy == "reset":
        out.append("%s reset-gpus --gpu N ... --json   (on each node; falls to the reboot if it fails)"
                   % " ".join(cfg["gpugate"]))
    elif kube:
        reboot = settings.kubernetes.get("reboot") or []
        out.append(" ".join(expand(reboot, nodes[:1])) + "   (each node; then a new bootID and Ready)" if reboot
                   else "(no [kubernetes] reboot command: the sweep stops here, the nodes held)")
    else:
        out.append("scontrol reboot ASAP nextstate=DOWN reason=<gpugate reason> %s" % _hostlist(nodes))
    out.append("%s check --mode verify --json   (on each node, %s transport)"
               % (" ".join(cfg["gpugate"]), cfg["transport"]))
    if kube:
        if cfg["smoke"]:
            out.append("smoke Pod on each node: %s %s" % (settings.kubernetes.get("smoke_image") or
                                                          "(no [kubernetes] smoke_image: the sweep stops here)",
                                                          " ".join(str(a) for a in cfg["smoke"])[:100]))
        out.append("lift gpugate's taint and cordon on the verified nodes   (only if the hold is still gpugate's)")
        return out
    out.append("scontrol update NodeName=<verified nodes> State=RESUME   (only if the reason is still gpugate's)")
    return out


def plan_text(plan, settings, snap) -> str:
    lines = ["Partitions (floor: nodes that must stay in service):"]
    lines.append("  %-12s %7s %10s %10s %8s %9s %6s %7s" % ("partition", "members", "in service", "out other",
                                                            "pending", "in flight", "floor", "budget"))
    for f in sorted(plan.partitions.values(), key=lambda f: f.name):
        lines.append("  %-12s %7d %10d %10d %8d %9d %6d %7d" % (f.name, f.members, f.in_service, f.out_other,
                                                                f.pending, f.in_flight, f.floor, f.budget))
    if not plan.batches:
        lines.append("\nNothing to do in this run.")
    for batch in plan.batches:
        lines.append("\nBatch %d: %s%s  %s (%d)" % (batch.index, batch.remedy, " (canary)" if batch.canary else "",
                                                 _hostlist(batch.nodes), len(batch.nodes)))
        lines += ["  $ " + c for c in _commands(batch, settings)]
    lines.append("\nDrained nodes:")
    for name in sorted(plan.decisions):
        d = plan.decisions[name]
        mark = "batch %d" % d.batch if d.batch else ("escalate" if d.included else "skip")
        mark = "deferred" if d.why.startswith("escalation deferred") else mark  # no room for its rma
        lines.append("  %-10s %-9s %s" % (name, mark, d.why))
    lines.append("\nThis is the plan only: run with --apply to execute it.")
    return "\n".join(lines)


def plan_json(plan, settings, snap) -> dict:
    return {
        "batches": [{"index": b.index, "remedy": b.remedy, "canary": b.canary, "nodes": _hostlist(b.nodes),
                     "count": len(b.nodes), "commands": _commands(b, settings)} for b in plan.batches],
        "decisions": {n: {"included": d.included, "remedy": d.remedy, "why": d.why, "batch": d.batch}
                      for n, d in plan.decisions.items()},
        "partitions": {p: f.__dict__ for p, f in plan.partitions.items()},
    }


def report_text(report) -> str:
    lines = ["", "Sweep summary:", "  %-10s %-11s %-10s %8s  %s" % ("node", "remedy", "result", "attempts", "detail")]
    for name in sorted(report.outcomes):
        o = report.outcomes[name]
        lines.append("  %-10s %-11s %-10s %8d  %s" % (name, o.remedy, o.result, o.attempts, o.detail[:80]))
    if not report.outcomes:
        lines.append("  (nothing to do)")
    counts = {}
    for o in report.outcomes.values():
        counts[o.result] = counts.get(o.result, 0) + 1
    lines.append("  " + ", ".join("%d %s" % (c, r) for r, c in sorted(counts.items())))
    return "\n".join(lines)


def report_json(report) -> dict:
    return {"outcomes": {n: o.__dict__ for n, o in report.outcomes.items()}, "batches": report.batches,
            "stopped": report.stopped, "max_out": report.max_out}


def status_text(journal) -> str:
    lines = ["Recent sweeps:"]
    for run_id, started, ended, pid, outcome in journal.runs(5):
        lines.append("  run %d  pid %d  started %s  %s" % (run_id, pid, time.strftime("%Y-%m-%d %H:%M:%S",
                                                                                     time.localtime(started)),
                                                       outcome or ("running or interrupted" if not ended else "")))
    nodes = journal.nodes()
    flying = {n: r for n, r in nodes.items() if not r.finished}
    lines.append("\nIn flight: %s" % (_hostlist(flying) if flying else "none"))
    lines.append("\n  %-10s %-11s %-6s %-13s %-8s %-8s %s" % ("node", "remedy", "batch", "step", "status", "attempt",
                                                            "detail"))
    for name in sorted(nodes):
        r = nodes[name]
        lines.append("  %-10s %-11s %-6d %-13s %-8s %-8d %s" % (name, r.remedy, r.batch, r.step, r.status,
                                                              r.attempt, r.detail[:70]))
    proofs = {name: journal.proofs(name) for name in sorted(nodes)}
    if any(proofs.values()):
        lines.append("\nProofs of the current attempt (in order; the first failure stops the rest):")
        for name, rows in proofs.items():
            for step, status, at, detail in rows:
                lines.append("  %-10s %-13s %-6s %s  %s" % (name, step, "pass" if status == "done" else "FAIL",
                                                           time.strftime("%H:%M:%S", time.localtime(at)), detail[:70]))
    bundles = {name: journal.evidence(name) for name in sorted(nodes)}
    if any(bundles.values()):
        lines.append("\nEvidence kept before a reset or reboot (gpugate/sweep/evidence.py; one per attempt):")
        for name, rows in bundles.items():
            for attempt, at, detail in rows:
                lines.append("  %-10s attempt %d  %s  %s" % (name, attempt, time.strftime("%H:%M:%S",
                                                                                      time.localtime(at)), detail[:100]))
    return "\n".join(lines)


def status_json(journal) -> dict:
    return {"runs": [dict(zip(("id", "started", "ended", "pid", "outcome"), r)) for r in journal.runs(20)],
            "nodes": {n: dict(r.__dict__, proofs=[dict(zip(("step", "status", "at", "detail"), p))
                                                  for p in journal.proofs(n)],
                              evidence=[dict(zip(("attempt", "at", "detail"), e)) for e in journal.evidence(n)],
                              evidence_id=journal.evidence_id(n) or None)
                      for n, r in journal.nodes().items()},
            "in_flight": sorted(journal.in_flight())}
