"""Know before you push: what a new baseline would do to the fleet.

The judges `gpugate check` uses (gpugate.judges, then gpugate.model.verdict) run on
each node's facts from the last audit, under the old and the new baseline.
Per node: the findings the new one adds and removes, each acute (drains at
once) or budgeted (drains only within the partition's drain budget).  Per
partition: the nodes the new baseline leaves unfit for budgeted findings
against budget.allowance.  Pure: baselines, facts and partitions in, a
Prediction out; nodes without readable facts are "unknown", never fit."""

from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from gpugate.budget.rules import allowance
from gpugate.model.facts import from_jsonable
from gpugate.model.findings import Finding, is_acute
from gpugate.judges import judge
from gpugate.core.record import dataclass
from gpugate.model.verdict import decide

FIT, UNFIT, UNKNOWN = "fit", "unfit", "unknown"


@dataclass(frozen=True)
class NodePrediction:
    node: str
    status: str  # fit | unfit | unknown, under the new baseline
    why: str = ""  # unknown: what was missing
    findings: Tuple[Finding, ...] = ()  # unfit findings under the new baseline
    added: Tuple[Finding, ...] = ()  # ... that the old one did not raise
    removed: Tuple[Finding, ...] = ()  # raised under the old one only
    budgeted_before: bool = False  # unfit for budgeted findings only under the old one

    @property
    def acute(self) -> bool:
        return any(is_acute(f.cls, f.component) for f in self.findings)

    @property
    def budgeted(self) -> bool:
        """Counts against the budget: unfit, and nothing acute (a node with
        an acute finding drains at once, outside the budget)."""
        return self.status == UNFIT and not self.acute


@dataclass(frozen=True)
class PartitionPrediction:
    partition: str
    members: int
    allowance: int
    unfit: Tuple[str, ...]  # budgeted-unfit under the new baseline
    new: Tuple[str, ...]  # of those, not budgeted-unfit under the old one
    acute: Tuple[str, ...]  # drain at once, outside the budget
    unknown: Tuple[str, ...]

    @property
    def over(self) -> bool:
        """The new baseline makes more members unfit than the budget allows.
        A partition already over it that the change makes no worse is not
        the change's fault: reported, not failed."""
        return len(self.unfit) > self.allowance and bool(self.new)


@dataclass(frozen=True)
class Prediction:
    nodes: Mapping[str, NodePrediction]
    partitions: Optional[Tuple[PartitionPrediction, ...]]  # None: the audit has no partitions
    uncovered: Tuple[str, ...]  # nodes no [nodes] section of the new baseline names

    @property
    def over(self) -> Tuple[PartitionPrediction, ...]:
        return tuple(p for p in self.partitions or () if p.over)


def _key(f: Finding):
    return (f.cls, f.component, f.gpu, f.observed, f.expected)


def _unfit(baseline, facts, tag: str) -> Tuple[Finding, ...]:
    return decide(judge(baseline, facts), tag).findings


def predict_node(node: str, old, new, facts_json, tag: str) -> NodePrediction:
    """One node under ``old`` (None: no current baseline) and ``new``.
    ``facts_json``: the audit's JSON facts, or why there are none."""
    if not isinstance(facts_json, Mapping):
        return NodePrediction(node, UNKNOWN, why=str(facts_json or "no facts in the audit"))
    try:
        facts = from_jsonable(dict(facts_json))
        if facts.node != node:
            raise ValueError("the facts are of node %s" % facts.node)
        after = _unfit(new, facts, tag)
        before = _unfit(old, facts, tag) if old is not None else ()
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        return NodePrediction(node, UNKNOWN, why="unreadable facts: %s" % exc)
    was, now = {_key(f) for f in before}, {_key(f) for f in after}
    budgeted_before = bool(before) and not any(is_acute(f.cls, f.component) for f in before)
    return NodePrediction(node, UNFIT if after else FIT, findings=after,
                          added=tuple(f for f in after if _key(f) not in was),
                          removed=tuple(f for f in before if _key(f) not in now),
                          budgeted_before=budgeted_before)


def tally(partitions: Mapping[str, Iterable[str]], budgeted: Set[str], budgeted_before: Set[str],
          acute: Set[str], unknown: Set[str], share: float) -> Tuple[PartitionPrediction, ...]:
    """Per partition (node -> its partitions, as Slurm lists them): members,
    allowance and which members are budgeted-unfit, new, acute, unknown."""
    members: Dict[str, List[str]] = {}
    for node, parts in partitions.items():
        for part in set(parts):
            members.setdefault(part, []).append(node)
    out = []
    for part, nodes in sorted(members.items()):
        nodes.sort()
        unfit = tuple(n for n in nodes if n in budgeted)
        out.append(PartitionPrediction(part, len(nodes), allowance(len(nodes), share), unfit,
                                       tuple(n for n in unfit if n not in budgeted_before),
                                       tuple(n for n in nodes if n in acute),
                                       tuple(n for n in nodes if n in unknown)))
    return tuple(out)


def predict(old, new, facts: Mapping[str, object], partitions: Optional[Mapping[str, Sequence[str]]],
            share: float, tag: str) -> Prediction:
    """facts: node -> facts JSON (or why it has none), from the audit;
    partitions: node -> partitions from the audit (None when it has none).
    A partition member the audit did not reach is unknown."""
    names = sorted(set(facts) | set(partitions or {}))
    nodes = {n: predict_node(n, old, new, facts.get(n), tag) for n in names}
    per = None
    if partitions is not None:
        per = tally(partitions, {n for n, p in nodes.items() if p.budgeted},
                    {n for n, p in nodes.items() if p.budgeted_before},
                    {n for n, p in nodes.items() if p.acute},
                    {n for n, p in nodes.items() if p.status == UNKNOWN}, share)
    return Prediction(nodes, per, tuple(n for n in names if not new.covers(n)))


# ---------------------------------------------------------------------------
# Rendering: folded into hostlists, so a fleet-wide change is one line.


def _text(f: Finding) -> str:
    from gpugate.model.reason import render_finding

    return render_finding(f)


def _kind(f: Finding) -> str:
    return "acute" if is_acute(f.cls, f.component) else "budgeted"


def changes(prediction: Prediction) -> List[dict]:
    """Every finding the new baseline adds (+) or removes (-), with the
    nodes it does so on; most nodes first."""
    from gpugate.fleet.audit import hostlist

    groups: Dict[tuple, Set[str]] = {}
    for node, p in prediction.nodes.items():
        for sign, found in (("+", p.added), ("-", p.removed)):
            for f in found:
                groups.setdefault((sign, f.cls, _text(f), _kind(f)), set()).add(node)
    rows = [{"change": sign, "class": cls, "finding": text, "kind": kind, "count": len(nodes),
             "nodes": hostlist(nodes)} for (sign, cls, text, kind), nodes in groups.items()]
    rows.sort(key=lambda r: (r["change"] != "+", -r["count"], r["class"], r["finding"]))
    return rows


def over_lines(prediction: Prediction, first: int = 3) -> List[str]:
    """One line per partition over its budget, with its first findings."""
    from gpugate.fleet.audit import hostlist

    lines = []
    for part in prediction.over:
        groups: Dict[str, Set[str]] = {}
        for node in part.unfit:
            for f in prediction.nodes[node].findings:
                groups.setdefault(_text(f), set()).add(node)
        ranked = sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))
        shown = ["%s on %s" % (text, hostlist(nodes)) for text, nodes in ranked[:first]]
        lines.append("partition %s: %d of %d nodes would be unfit (budget %d): %s%s" % (
            part.partition, len(part.unfit), part.members, part.allowance, "; ".join(shown),
            "; ..." if len(ranked) > first else ""))
    return lines


def to_json(prediction: Prediction) -> dict:
    from gpugate.fleet.audit import hostlist

    def finding(f):
        return dict(f.to_json(), kind=_kind(f))

    nodes = {n: {"status": p.status, "why": p.why, "budgeted": p.budgeted, "acute": p.acute,
                 "findings": [finding(f) for f in p.findings], "added": [finding(f) for f in p.added],
                 "removed": [finding(f) for f in p.removed]} for n, p in prediction.nodes.items()}
    parts = None if prediction.partitions is None else [
        {"partition": p.partition, "members": p.members, "allowance": p.allowance, "unfit": len(p.unfit),
         "unfit_nodes": hostlist(p.unfit), "new": len(p.new), "new_nodes": hostlist(p.new),
         "acute": len(p.acute), "acute_nodes": hostlist(p.acute), "unknown": len(p.unknown),
         "unknown_nodes": hostlist(p.unknown), "over_budget": p.over} for p in prediction.partitions]
    unknown = [n for n, p in prediction.nodes.items() if p.status == UNKNOWN]
    return {"nodes": nodes, "changes": changes(prediction), "partitions": parts,
            "unknown": {"count": len(unknown), "nodes": hostlist(unknown)},
            "uncovered": {"count": len(prediction.uncovered), "nodes": hostlist(prediction.uncovered)},
            "over_budget": over_lines(prediction)}


def to_text(prediction: Prediction) -> str:
    from gpugate.fleet.audit import hostlist

    lines = []
    rows = changes(prediction)
    if rows:
        lines.append("Findings the new baseline adds (+) and removes (-), per node:")
        width = max(len(r["finding"]) for r in rows)
        lines += ["  %s %-7s %-*s  %-8s %5d  %s" % (r["change"], r["class"], width, r["finding"], r["kind"],
                                                    r["count"], r["nodes"]) for r in rows]
    else:
        lines.append("The new baseline adds and removes no finding on any audited node.")
    unknown = sorted((n, p.why) for n, p in prediction.nodes.items() if p.status == UNKNOWN)
    if unknown:
        lines.append("Unknown (not predicted, not fine): %d  %s" % (len(unknown), hostlist([n for n, _ in unknown])))
        lines += ["    %s: %s" % (n, why[:100]) for n, why in unknown[:10]]
    if prediction.uncovered:
        lines.append("Uncovered (no [nodes] section of the new baseline names them): %d  %s"
                     % (len(prediction.uncovered), hostlist(prediction.uncovered)))
    lines.append("")
    if prediction.partitions is None:
        lines.append("No partitions in the audit: run gpugate audit on the controller (Slurm answering) "
                     "to see the drain budget per partition.")
        return "\n".join(lines)
    head = ("partition", "members", "budget", "unfit", "new", "acute", "unknown", "verdict")
    table = [head] + [(p.partition, p.members, p.allowance, len(p.unfit), len(p.new), len(p.acute),
                       len(p.unknown), "OVER BUDGET" if p.over else
                       ("over budget already" if len(p.unfit) > p.allowance else "within budget"))
                      for p in prediction.partitions]
    width = max([len(str(row[0])) for row in table] + [9])
    lines += ["%-*s  %7s %6s %5s %4s %5s %7s  %s" % ((width,) + tuple(row)) for row in table]
    lines += over_lines(prediction)
    return "\n".join(lines)
