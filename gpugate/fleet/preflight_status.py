"""The job preflights' figures for `gpugate status` (issue 36): what the
nodes' own counts say (gpugate.preflight.memory, gathered by the last
`gpugate audit`) and which nodes a preflight holds out now (their Slurm
reasons).  Pure.

A node's counts are written by whoever holds root there: only whole
non-negative integers below a bound are summed, anything else is that
node's counts left out (and said)."""

from typing import Dict, List, Mapping, Optional

from gpugate.preflight.memory import ACROSS, OUTCOMES

_BOUND = 10 ** 9
# The reason components a preflight drains or publishes (gpugate.preflight.node).
COMPONENTS = ("preflight", "preflight_busbw", "preflight_setup", "preflight_across")


def figures(last_audit: Optional[Mapping[str, object]], drains: Mapping[str, List[dict]], tag: str,
            now: float) -> Optional[dict]:
    """{"nodes": reporting, "runs": {outcome: n}, "across": {outcome: n},
    "seconds": s, "unreadable": [nodes], "held_now": [nodes]} or None when
    no node has run one and none is held by one.  ``drains``: status's
    "gpugate" entries by class."""
    counts = last_audit.get("preflight") if isinstance(last_audit, Mapping) else None
    runs = {o: 0 for o in OUTCOMES}
    across = {o: 0 for o in ACROSS}
    seconds, reporting, unreadable = 0.0, 0, []
    for node, stats in sorted((counts or {}).items()) if isinstance(counts, Mapping) else ():
        if not _sound(stats):
            unreadable.append(str(node))
            continue
        reporting += 1
        for o in OUTCOMES:
            runs[o] += stats["runs"].get(o, 0)
        for o in ACROSS:
            across[o] += (stats.get("across") or {}).get(o, 0)
        seconds += float(stats["seconds"])
    held = sorted(e["node"] for entries in drains.values() for e in entries if _by_preflight(e.get("reason"), tag))
    if not reporting and not unreadable and not held:
        return None
    at = last_audit.get("at") if isinstance(last_audit, Mapping) else None
    age = now - at if isinstance(at, (int, float)) and not isinstance(at, bool) and at <= now else None
    return {"nodes": reporting, "runs": runs, "across": across, "seconds": round(seconds, 3),
            "unreadable": unreadable, "held_now": held, "audit_age": age}


def _sound(stats) -> bool:
    def whole(v):
        return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < _BOUND

    if not isinstance(stats, Mapping) or not isinstance(stats.get("runs"), Mapping):
        return False
    across = stats.get("across") or {}
    seconds = stats.get("seconds")
    return (all(whole(v) for v in stats["runs"].values()) and isinstance(across, Mapping)
            and all(whole(v) for v in across.values())
            and isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and 0 <= seconds < _BOUND)


def _by_preflight(reason, tag: str) -> bool:
    from gpugate.model.reason import parse

    parsed = parse(reason, tag) if isinstance(reason, str) else None
    return parsed is not None and any(f.component in COMPONENTS for f in parsed.findings)


def lines(pf: Optional[Mapping[str, object]], format_age) -> List[str]:
    """status's text for the figures ([] without any); ``format_age``:
    status's own way of saying a duration."""
    if not pf:
        return []
    age = format_age(pf.get("audit_age"))
    runs: Dict[str, int] = pf["runs"]
    across: Dict[str, int] = pf["across"]
    out = ["", "preflight (counts of %d nodes, audit of %s ago): %d node proofs: passed %d, drained %d (their "
           "jobs requeued), budgeted %d, undecided %d; %d jobs across nodes: passed %d, culprit %d, undecided %d, "
           "not run %d; %s spent" % (
               pf["nodes"], age, sum(runs.values()), runs["passed"], runs["acute"], runs["budgeted"],
               runs["undecided"], sum(across.values()), across["passed"], across["culprit"], across["undecided"],
               across["not_run"], format_age(pf["seconds"]))]
    if pf["held_now"]:
        out.append("held out by a preflight now: %s (%d)" % (",".join(pf["held_now"][:20]), len(pf["held_now"])))
    if pf["unreadable"]:
        out.append("preflight counts unreadable (left out): %s" % ",".join(pf["unreadable"][:20]))
    return out

