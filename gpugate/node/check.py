"""One check of one node: collect facts for the mode, judge, decide.
No Slurm here; the entry points act on the verdict."""

from __future__ import annotations


from gpugate.model.facts import NodeFacts
from gpugate.judges import judge
from gpugate.probes import Budget, collect
from gpugate.core.record import dataclass
from gpugate.model.verdict import Verdict, decide

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Optional, Sequence

# Time kept back from the collection to act on the verdict (drain, state, log).
ACT_RESERVE = {"healthcheck": 12.0, "prolog": 3.0, "epilog": 12.0, "verify": 5.0}


@dataclass(frozen=True)
class CheckResult:
    """A check's facts and verdict."""

    facts: NodeFacts
    verdict: Verdict


def run_check(settings, baseline, node: str, mode: str, xid_after: int = -1,
              gpus: Optional[Sequence[int]] = None, budget: Optional[Budget] = None,
              processes: bool = False, extra=(), nvml_started=None, job: Optional[str] = None) -> CheckResult:
    """``extra``: findings judged outside (e.g. the epilog's per-job deltas);
    nvml_started: the NVML reader already forked (see probes.collect)."""
    if budget is None:
        total = settings.budgets[mode]
        budget = Budget(max(total - min(ACT_RESERVE[mode], total / 3), 0.5))
    facts = collect(settings, baseline, node, mode, budget, xid_after=xid_after, gpus=gpus,
                    processes=processes, nvml_started=nvml_started, job=job)
    findings = judge(baseline, facts) + list(extra(facts) if callable(extra) else extra)
    if facts.hcas is not None:  # the health check's: a port it lost is not reported twice
        from gpugate.judges.hca import supersede

        findings = supersede(findings)
    return CheckResult(facts, decide(findings, settings.reason_tag))


def baseline_id(path: str) -> dict:
    """Which baseline file a check used: the sweep refuses a verification
    made against another one (a node that missed the latest push)."""
    import hashlib

    from gpugate.safety.safeio import CONFIG_CAP, read_capped

    try:
        return {"path": path, "sha256": hashlib.sha256(read_capped(path, CONFIG_CAP)).hexdigest()}
    except OSError:
        return {"path": path, "sha256": None}


def result_json(result: CheckResult, baseline=None, baseline_path: str = "") -> dict:
    from gpugate.model.facts import to_jsonable, unchecked_facts

    v, f = result.verdict, result.facts
    return {
        "node": f.node, "mode": f.mode, "fit": v.fit, "class": v.cls, "reason": v.reason,
        "exit_code": v.exit_code,
        "findings": [x.to_json() for x in v.findings],
        "pending": [x.to_json() for x in v.notes],
        # What this check could not verify (DCGM refuses its diagnostic on MIG):
        # the verdict covers everything else, never these.
        "not_verified": [x.to_json() for x in v.not_verified],
        # Facts left unread on purpose ([services] ROLE = "none", no modinfo): no finding, never good.
        "unchecked": [{"fact": what, "why": why} for what, why in unchecked_facts(f)],
        "facts": to_jsonable(f),
        "durations": {k: round(t, 4) for k, t in f.durations.items()},
        "baseline": dict(baseline_id(baseline_path), name=getattr(baseline, "name", None)) if baseline_path else None,
    }
