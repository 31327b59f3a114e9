"""Judges: pure functions (baseline, node expectations, facts) -> findings.

No I/O here.  Each module judges one concern; ``judge`` runs them all.

May import: gpugate.core, gpugate.safety, gpugate.model, gpugate.parsers,
gpugate.probes' types, and the vendors' judges (gpugate.vendors.<vendor>.judge*)
and model modules (facts, the Xid catalog)."""

from __future__ import annotations


from gpugate.model.baseline import Baseline
from gpugate.model.facts import NodeFacts, failed
from gpugate.model.findings import DRIFT, INVESTIGATE, PENDING, PROBE, Finding, sort_findings
from gpugate.core.record import replace
from gpugate.judges import dcgm
from gpugate.judges import gpus
from gpugate.judges import stack
from gpugate.judges import versions

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import List


def judge(baseline: Baseline, facts: NodeFacts) -> List[Finding]:
    expect = baseline.expect_for(facts.node)
    findings: List[Finding] = []
    if baseline.vendor_for(facts.node) == "amd":  # the vendor seam: gpugate.vendors.amd.judge
        from gpugate.vendors.amd import judge as amd

        findings += amd.judge(baseline, expect, facts)
    else:
        findings += stack.judge(baseline, expect, facts)
        # A node whose NVML does not answer has no GPU facts to judge.
        findings += versions.judge(baseline, expect, facts)
        findings += gpus.judge(baseline, expect, facts)
        findings += dcgm.judge(baseline, expect, facts)
    if facts.hcas is not None or facts.imex is not None:  # read by the health check and verify only
        from gpugate.judges import hca
        from gpugate.judges import imex

        findings += hca.judge(baseline, expect, facts)
        findings += imex.judge(baseline, expect, facts)
    findings += _uncovered(baseline, facts.node)
    findings += _install(facts)
    return sort_findings(_fold_gpus(_dedupe(findings), _gpu_count(facts)))


def _uncovered(baseline: Baseline, node: str) -> List[Finding]:
    """No [nodes] section names the node: its GPU count, product and the
    rest are unknown, so it is not judged fit on the pins alone.  A probe
    finding (within the drain budget): it clears once a section covers it."""
    if baseline.covers(node):
        return []
    where = baseline.source or "the baseline"
    return [Finding(PROBE, "uncovered", node, "a [nodes] section in %s" % where, INVESTIGATE,
                    detail="no [nodes.\"...\"] section of %s names %s" % (where, node))]


def _install(facts: NodeFacts) -> List[Finding]:
    """Others could change the code this node runs as root (its interpreter,
    site-packages, gpugate's package: gpugate.probes.install_trust).  A probe
    finding, budgeted: gpugate cannot vouch for its own answers there."""
    install = facts.install
    if not failed(install):
        return []
    return [Finding(PROBE, "install", install.kind, "root-only", INVESTIGATE, detail=install.detail)]


def _dedupe(findings: List[Finding]) -> List[Finding]:
    seen, out = set(), []
    for f in findings:
        key = (f.cls, f.component, f.gpu, f.observed, f.expected)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


def _gpu_count(facts: NodeFacts) -> int:
    nvml = facts.nvml
    if facts.amd is not None:
        from gpugate.vendors.amd.facts import gpu_count

        return gpu_count(facts.amd)
    return len(nvml.gpus) if nvml is not None and not failed(nvml) else 0


def _fold_gpus(findings: List[Finding], gpus: int) -> List[Finding]:
    """One finding for the same problem on several GPUs (a driver install
    moves every GPU's GSP firmware): drift and pending on two or more GPUs,
    anything on every GPU.  The GPU list goes to ``detail``."""
    groups = {}
    for f in findings:
        if f.gpu is not None:
            groups.setdefault((f.cls, f.component, f.observed, f.expected, f.action), []).append(f)
    out, done = [], set()
    for f in findings:
        key = (f.cls, f.component, f.observed, f.expected, f.action)
        same = groups.get(key, []) if f.gpu is not None else []
        foldable = len(same) >= 2 and (f.cls in (DRIFT, PENDING) or len(same) == gpus)
        if not foldable:
            out.append(f)
        elif key not in done:
            done.add(key)
            out.append(replace(f, gpu=None, detail="gpus %s" % ",".join(str(g.gpu) for g in same)))
    return out
