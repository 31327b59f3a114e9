"""Judges: pure functions (baseline, node expectations, facts) -> findings.

No I/O here.  Each module judges one concern; ``judge`` runs them all.
"""

from typing import List

from ..baseline import Baseline
from ..facts import NodeFacts
from ..findings import Finding, sort_findings
from . import dcgm, gpus, stack, versions


def judge(baseline: Baseline, facts: NodeFacts) -> List[Finding]:
    expect = baseline.expect_for(facts.node)
    findings: List[Finding] = []
    findings += stack.judge(baseline, expect, facts)
    # A node whose NVML does not answer has no GPU facts to judge.
    findings += versions.judge(baseline, expect, facts)
    findings += gpus.judge(baseline, expect, facts)
    findings += dcgm.judge(baseline, expect, facts)
    return sort_findings(_dedupe(findings))


def _dedupe(findings: List[Finding]) -> List[Finding]:
    seen, out = set(), []
    for f in findings:
        key = (f.cls, f.component, f.gpu, f.observed, f.expected)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out
