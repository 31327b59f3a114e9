"""`gpugate status`: one screen for the on-call admin.  Pure: a snapshot of
Slurm's node states and the sweep journal in, a summary (and its text) out.

* gpugate's drains, by class (most severe first), oldest drain first, each
  with how long it has been out and what the sweep journal says about it.  A
  node carrying the sweep's work reason (first finding ``sweep=...``) is
  listed under the class it was drained for.
* "others": nodes out of service for a reason that is not gpugate's (an
  admin's drain, DOWN, not responding).  Listed and counted, never touched.
"""

from typing import Dict, List, Mapping, Optional

from gpugate.model.findings import CLASSES, ROLLOUT

__all__ = ["summarize", "render_text", "format_age", "state_text", "repeat_offenders", "locks_stuck"]

# Journal steps that end a node's stay in the sweep; their detail says why.
_EXPLAINED_STEPS = ("left", "deferred", "halted", "escalate")
_CLOCK_SLACK = 2.0  # seconds between Slurm's reason time and the journal's


def state_text(state) -> str:
    """Base state and flags of a NodeState: "IDLE+DRAIN", "DOWN+NOT_RESPONDING"."""
    flags = sorted(state.flags, key=lambda f: (f != "DRAIN", f))
    return "+".join([state.state] + flags)


def _view_state(view) -> str:
    """What a NodeView alone tells (used when no NodeState is given)."""
    if view.draining:
        return "DRAINING"
    if view.drain:
        return "DRAINED"
    return "IN_SERVICE" if view.in_service else "OUT"


def _out_for(since: Optional[int], now: float) -> Optional[float]:
    return None if since is None else max(0.0, float(now) - float(since))


def _journal_text(rec) -> str:
    text = "%s %s (attempt %d)" % (rec.step, rec.status, rec.attempt)
    if rec.detail and (rec.status == "failed" or rec.step in _EXPLAINED_STEPS):
        detail = " ".join(rec.detail.split())
        text += ": " + (detail if len(detail) <= 80 else detail[:78] + "..")
    return text


def _sweep_info(view, rec) -> Optional[str]:
    """What the sweep says about a node gpugate drained, or None."""
    first = view.ours.first if view.ours is not None else None
    work = first is not None and first.component == "sweep"
    if rec is not None:
        stale = (rec.finished and view.reason_time is not None
                 and view.reason_time > rec.updated + _CLOCK_SLACK)
        if not stale or work:
            return _journal_text(rec)
    if work:
        # The sweep's reason without a journal record (journal lost or moved):
        # the next sweep continues it from the reason.
        return "%s (no journal record)" % first.observed
    return None


def _order(entry: dict):
    since = entry["since"]
    return (since is None, since if since is not None else 0, entry["node"])


def summarize(snapshot, journal_nodes: Mapping[str, object], now: float,
              states: Optional[Mapping[str, object]] = None,
              budget: Optional[Mapping[str, object]] = None) -> dict:
    """The status summary (JSON-ready).

    snapshot: gpugate.sweep.snapshot.Snapshot; journal_nodes: Journal.nodes()
    (may be empty); now: epoch seconds.  states (name -> NodeState, the ones
    the snapshot was taken from) gives each node's exact Slurm state ("IDLE+
    DRAIN", "DOWN+NOT_RESPONDING"); without it the state is what the snapshot
    tells ("DRAINED", "DRAINING", "OUT").  budget: partition ->
    gpugate.budget.rules.Use, computed over whole partitions (None: no budget).
    """
    journal_nodes = journal_nodes or {}
    states = states or {}
    by_class: Dict[str, List[dict]] = {}
    others: List[dict] = []
    members: Dict[str, Dict[str, int]] = {}
    in_service = 0

    for name, view in snapshot.nodes.items():
        st = states.get(name)
        state = state_text(st) if st is not None else _view_state(view)
        kind = None
        if view.ours is not None:
            cls = view.ours.cls if view.ours.cls in CLASSES else ROLLOUT
            by_class.setdefault(cls, []).append({
                "node": name, "reason": view.reason, "since": view.reason_time,
                "out_for": _out_for(view.reason_time, now), "state": state,
                "sweep": _sweep_info(view, journal_nodes.get(name)),
            })
            kind = "gpugate"
        elif not view.in_service:
            rec = journal_nodes.get(name)
            others.append({
                "node": name, "state": state, "reason": view.reason, "since": view.reason_time,
                "out_for": _out_for(view.reason_time, now),
                # In the sweep's hands (e.g. rebooting): say so, so nobody intervenes.
                "sweep": _journal_text(rec) if rec is not None and not rec.finished else None,
            })
            kind = "others"
        else:
            in_service += 1
        for part in view.partitions:
            figures = members.setdefault(part, {"members": 0, "in_service": 0, "gpugate": 0, "others": 0})
            figures["members"] += 1
            figures[kind or "in_service"] += 1

    gpugate = {cls: sorted(by_class[cls], key=_order) for cls in CLASSES if cls in by_class}
    return {
        "gpugate": gpugate,
        "others": sorted(others, key=_order),
        "counts": {
            "total": len(snapshot.nodes),
            "in_service": in_service,
            "gpugate": sum(len(v) for v in gpugate.values()),
            "gpugate_by_class": {cls: len(v) for cls, v in gpugate.items()},
            "others": len(others),
        },
        "partitions": {p: dict(members[p], **_budget_figures((budget or {}).get(p))) for p in sorted(members)},
    }


def _budget_figures(use) -> dict:
    if use is None:
        return {}
    return {"budget": {"allowance": use.allowance, "drained": len(use.drained), "used": use.weight, "spent": use.spent}}


def format_age(seconds: Optional[float]) -> str:
    """45s, 4m, 3h12m, 2d05h; "?" when unknown."""
    if seconds is None:
        return "?"
    s = int(max(0, seconds))
    if s < 60:
        return "%ds" % s
    if s < 3600:
        return "%dm" % (s // 60)
    if s < 86400:
        return "%dh%02dm" % (s // 3600, s % 3600 // 60)
    return "%dd%02dh" % (s // 86400, s % 86400 // 3600)


def _body(reason: str, cls: str) -> str:
    """The reason without its tag and class (the class has its own column)."""
    words = reason.split(" ", 2)
    if len(words) >= 2 and words[1] == cls:
        return words[2] if len(words) == 3 else ""
    return reason


def _short_state(state: str) -> str:
    """sinfo's mark for a node that does not respond: "DOWN+NOT_RESPONDING" -> "DOWN*"."""
    words = state.split("+")
    if "NOT_RESPONDING" in words:
        words.remove("NOT_RESPONDING")
        words[0] += "*"
    return "+".join(words)


def _others_text(entry: dict) -> str:
    """A node out for a reason not gpugate's: the reason and for how long,
    in words where Slurm gives neither."""
    reason, age = entry["reason"], entry.get("out_for")
    if not reason:
        not_responding = "NOT_RESPONDING" in entry["state"].split("+")
        reason = "no reason set" + (": slurmd does not answer slurmctld (rebooting, stopped or "
                                    "unreachable)" if not_responding else "")
    return reason if age is None else "%s (%s)" % (reason, format_age(age))


def render_text(summary: dict) -> str:
    counts = summary["counts"]
    by_class = counts["gpugate_by_class"]
    head = "gpugate drains: %d" % counts.get("gpugate", sum(by_class.values()))
    if by_class:
        head += " (%s)" % ", ".join("%s %d" % (cls, n) for cls, n in by_class.items())
    lines = ["%s        others out: %d        in service: %d/%d"
             % (head, counts["others"], counts["in_service"], counts["total"])]

    ours = [(cls, e["node"], format_age(e["out_for"]), _body(e["reason"], cls), e.get("sweep"))
            for cls, entries in summary["gpugate"].items() for e in entries]
    others = [("others", e["node"], _short_state(e["state"]), _others_text(e), e.get("sweep"))
              for e in summary["others"]]
    if not ours and not others:
        lines.append("(every node is in service)")
    every = ours + others
    w = [max([len(r[i]) for r in every] or [0]) for i in range(2)]
    for rows in (ours, others):
        if not rows:
            continue
        third = max(len(r[2]) for r in rows)
        text_w = min(max(len(r[3]) for r in rows), 64)
        for first, node, col, text, sweep in rows:
            line = "%-*s  %-*s  %-*s  %s" % (w[0], first, w[1], node, third, col,
                                            text.ljust(text_w) if sweep else text)
            if sweep:
                line += "  sweep: " + sweep
            lines.append(line.rstrip())
    if any(r[2].split("+")[0].endswith("*") for r in others):
        lines.append("(*: slurmd does not answer slurmctld: Slurm's NOT_RESPONDING, sinfo's mark)")

    parts = summary.get("partitions") or {}
    if parts:
        lines.append("")
        pw = max(len(p) for p in parts)
        spent = []
        for part, f in parts.items():
            line = "partition %-*s  in service %d/%d  gpugate %d  others %d" % (
                pw, part, f["in_service"], f["members"], f["gpugate"], f["others"])
            b = f.get("budget")
            if b:
                line += "  drain budget %d/%d%s" % (b["drained"], b["allowance"], " SPENT" if b["spent"] else "")
                if b["spent"]:
                    spent.append(part)
            lines.append(line)
        if spent:
            lines.append("drain budget spent in %s: nodes found unfit for a budgeted class stay in service "
                         "(their log says action=held; metric gpugate_drain_held); `gpugate audit` lists "
                         "the drifted nodes" % ", ".join(spent))
    lines += _held_lines(summary)
    lines += _repeat_lines(summary.get("repeat_offenders"))
    errors = summary.get("config_errors")
    if errors and errors.get("nodes"):
        lines.append("")
        lines.append("CONFIG ERROR on %d nodes (audit of %s ago): %s gate with their last good gpugate.toml/"
                     "baseline; fix the pushed file. First: %s" % (
                         len(errors["nodes"]), format_age(errors.get("age")), errors["hostlist"],
                         errors["first"][:200]))
    stuck = summary.get("locks_stuck")
    if stuck and stuck.get("nodes"):
        lines.append("")
        lines.append("HEALTH CHECK LOCK STUCK on %d nodes (audit of %s ago): %s run no health check until its "
                     "holder ends (log line lock_stuck=...). First: %s" % (
                         len(stuck["nodes"]), format_age(stuck.get("age")), stuck["hostlist"], stuck["first"]))
    lines += _kernel_log_lines(summary.get("kernel_log"))
    from gpugate.fleet.preflight_status import lines as preflight_lines

    lines += preflight_lines(summary.get("preflight"), format_age)
    backend = summary.get("slurm_backend")
    if backend:
        lines.append("")
        lines.append("Slurm read through: %s%s" % (backend["name"], "" if backend["why"] == "configured"
                                                     else " (%s)" % backend["why"]))
    return "\n".join(lines)


def _kernel_log_lines(watch) -> List[str]:
    """gpugate.fleet.audit.kernel_log_watch's nodes: said, never drained (issue 33)."""
    from gpugate.fleet.audit import hostlist

    out = []
    if watch and watch.get("not_following"):
        out += ["", "KERNEL-LOG FOLLOWER NOT RUNNING on %d nodes (latest audit): %s: an Xid a flood of kernel records "
                "pushes out of the ring goes unseen there (systemctl status gpugate-kmsg-follow)"
                % (len(watch["not_following"]), hostlist(watch["not_following"]))]
    if watch and watch.get("lost_unread"):
        out += ["", "KERNEL-LOG RECORDS LOST UNREAD on %d nodes (latest audit): %s: Xids among them may be missed; "
                "never a drain (log line kernel_log_lost)" % (len(watch["lost_unread"]), hostlist(watch["lost_unread"]))]
    return out


def config_errors(last_audit: Optional[Mapping[str, object]], now: float) -> Optional[dict]:
    """What the latest audit says of nodes whose files did not load, for the
    summary: {"nodes", "hostlist", "first", "age"}; None without an audit."""
    from gpugate.fleet.audit import hostlist

    if not isinstance(last_audit, Mapping):
        return None
    errors = last_audit.get("config_errors")
    errors = {str(n): str(e) for n, e in errors.items()} if isinstance(errors, Mapping) else {}
    first = "%s: %s" % sorted(errors.items())[0] if errors else ""
    return {"nodes": sorted(errors), "hostlist": hostlist(errors), "first": first, "age": _audit_age(last_audit, now)}


def _audit_age(last_audit: Mapping[str, object], now: float) -> Optional[float]:
    try:
        return max(now - float(last_audit.get("at", 0)), 0.0)
    except (TypeError, ValueError):
        return None


def locks_stuck(last_audit: Optional[Mapping[str, object]], now: float) -> Optional[dict]:
    """What the latest audit says of nodes whose health check lock is held
    past a check's whole budget (gpugate.safety.lock), for the summary:
    {"nodes", "hostlist", "first", "age"}; None without an audit."""
    from gpugate.fleet.audit import hostlist

    if not isinstance(last_audit, Mapping):
        return None
    stuck = last_audit.get("locks_stuck")
    stuck = {str(n): s for n, s in stuck.items() if isinstance(s, Mapping)} if isinstance(stuck, Mapping) else {}
    first = ""
    if stuck:
        node, held = sorted(stuck.items())[0]
        pid, seconds = held.get("pid"), held.get("seconds")
        first = "%s: pid %s, for %s" % (node, pid if isinstance(pid, int) else "?",
                                        format_age(seconds if isinstance(seconds, (int, float)) else None))
    return {"nodes": sorted(stuck), "hostlist": hostlist(stuck), "first": first, "age": _audit_age(last_audit, now)}


def repeat_offenders(history: Mapping[str, object], now: float, limit: int, window: float) -> dict:
    """For the summary: the nodes the sweep returned to service at least
    twice for one component within the window, and those it escalated for
    it.  history: Journal.history()."""
    from gpugate.sweep.history import offenders

    nodes = offenders(history, now, limit, window)
    for entry in nodes.values():
        entry["ago"] = [max(now - t, 0.0) for t in entry["last"]]
    return {"limit": limit, "window": window, "nodes": nodes}


def _repeat_lines(repeats: Optional[Mapping[str, object]]) -> List[str]:
    if not repeats or not repeats.get("nodes"):
        return []
    from gpugate.sweep.history import span

    limit = repeats["limit"]
    lines = ["", "Repeat offenders (returned to service again and again for one component within %s; limit %s%s):"
             % (span(repeats["window"]), limit, ", off" if not limit else "")]
    nodes = repeats["nodes"]
    width = max(len(n) for n in nodes)
    order = sorted(nodes, key=lambda n: (not nodes[n]["escalated"], -nodes[n]["count"], n))
    for name in order:
        e = nodes[name]
        state = ("ESCALATED rma" if e["escalated"] else
                 "next drain for it escalates" if e["next_drain_escalates"] else "")
        lines.append(("  %-*s  %-12s %3dx  last %s ago  %s" % (
            width, name, e["component"], e["count"], ", ".join(format_age(a) for a in e["ago"]), state)).rstrip())
    lines.append("  `gpugate sweep forgive NODE` clears a node's record (after a part was replaced)")
    return lines


def budget_held(states: Mapping[str, object], tag: str) -> dict:
    """Nodes that published a budgeted finding (gpugate.slurm.pending) and
    are not drained: held by the drain budget, or waiting for the keeper.
    node -> {reason, since, partitions}, oldest first."""
    from gpugate.budget.rules import published

    held = []
    for name, state in states.items():
        seen = published(state, tag)
        if seen is not None and not state.drain:
            held.append((seen.since, name, {"reason": seen.reason, "since": seen.since,
                                            "partitions": list(state.partitions)}))
    return {name: info for _since, name, info in sorted(held)}


def _count(nodes) -> int:
    """Nodes as a list (the local status), or their count (the Kubernetes Lease's)."""
    return nodes if isinstance(nodes, int) and not isinstance(nodes, bool) else len(nodes or ())


def _held_lines(summary: Mapping) -> list:
    """The published nodes the budget holds, and the keeper's last run."""
    if "budget_keeper" not in summary:
        return []
    import time as _time

    from gpugate.keeper.run import hostlist

    lines = [""]
    held = summary.get("held") or {}
    if held:
        first = next(iter(held.values()))
        lines.append("HELD %d nodes (budgeted findings published, not drained; they run jobs): %s; oldest: %s" % (
            len(held), hostlist(held), first["reason"][:160]))
    keeper = summary.get("budget_keeper") or {}
    last = keeper.get("last_ok")
    failed = "" if keeper.get("ok", True) else "LATEST RUN FAILED: %s" % str(keeper.get("error"))[:500]
    if not last and failed:  # it runs, and has never got through (a new install without its key)
        lines.append("budget keeper: NO GOOD RUN here: budgeted findings are held and never drained; " + failed)
    elif not last:
        lines.append("budget keeper: NEVER RAN here: budgeted findings are held and never drained "
                     "(install slurm_conf/gpugate-budget.timer, or run `gpugate budget --watch 30`)")
    else:
        line = "budget keeper: last good run %s ago (drained %d, gave back %d, held %d)" % (
            format_age(_time.time() - float(last)), _count(keeper.get("drained")),
            _count(keeper.get("given_back")), int(keeper.get("held") or 0))
        if keeper.get("last_ok_by"):  # Kubernetes: the Lease's word, whichever replica ran it
            line += " by %s; the Lease is %s" % (keeper["last_ok_by"], "held by " + keeper["holder"]
                                                if keeper.get("holder") else "free (given up, or never taken)")
        if keeper.get("failed_runs"):
            line += "; %d FAILED RUNS IN A ROW since" % int(keeper["failed_runs"])
        if keeper.get("unverified"):  # tags their node did not sign: held, never drained (`gpugate budget`)
            line += "; %d UNVERIFIED TAGS (not signed by their node: never drained)" % int(keeper["unverified"])
        if failed:  # whole (record() keeps 500): the fix it names, a key's path and command, included
            line += "; " + failed
        lines.append(line)
    return lines
