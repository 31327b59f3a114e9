"""DCGM: the health watches and the diagnostic.  A diagnostic that fails on
the pinned versions is hardware (`health`); one we could not run is `probe`;
one DCGM refuses on MIG GPUs is `not_run` (reported, neither pass nor fail)."""

from __future__ import annotations


from gpugate.model.facts import ProbeFailure, failed
from gpugate.model.findings import HEALTH, INVESTIGATE, NOT_RUN, PROBE, RESET_GPU, RMA_ACTION, Finding
from gpugate.judges.common import probe_finding

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import List

# DCGM error severities (dcgmErrorSeverity_t): 2 isolate the GPU, 6 reset it.
_SEVERITY_ACTION = {2: RMA_ACTION, 6: RESET_GPU}


def judge(baseline, expect, facts) -> List[Finding]:
    policy = baseline.health
    out: List[Finding] = []
    health = facts.dcgm_health
    if isinstance(health, ProbeFailure):
        out.append(probe_finding("dcgm_health", health))
    elif health is not None:
        if health.watches_set is False:
            out.append(Finding("probe", "dcgm_health", "no watches set", "dcgmi health -s a", INVESTIGATE))
        wanted = {"Failure": policy.dcgm_health_failure, "Warning": policy.dcgm_health_warning}
        if wanted.get(health.overall) == "drain":
            first = health.incidents[0] if health.incidents else ""
            out.append(Finding(HEALTH, "dcgm_health", health.overall.lower(), "healthy", INVESTIGATE,
                               detail=first[:160]))
    diag = facts.dcgm_diag
    if diag is not None and not isinstance(diag, ProbeFailure) and diag.not_run:
        out.append(_refused(diag, facts))
    else:
        out += diagnostic("dcgm_diag", diag, "r%d")
    return out


def diagnostic(component: str, diag, level: str) -> List[Finding]:
    """A diagnostic's verdict (DCGM's, or the ROCm Validation Suite's in the
    same DcgmDiag shape): each failed test, a run with no test passed, a
    non-zero exit without a failed test.  level: "r%d", "rvs -r %d"."""
    if isinstance(diag, ProbeFailure):
        return [probe_finding(component, diag)]
    if diag is None:
        return []
    out: List[Finding] = []
    want = "pass (%s)" % (level % diag.level)
    for result in diag.failures:
        out.append(Finding(HEALTH, component, "%s %s" % (_short(result.test), result.status.lower()),
                           want, _SEVERITY_ACTION.get(result.severity, INVESTIGATE),
                           gpu=result.gpu, detail=result.message[:160]))
    if not diag.failures and not any(r.status == "Pass" for r in diag.results):
        out.append(Finding("probe", component, "no test ran", want, INVESTIGATE))
    if not diag.failures and diag.exit_code not in (0,):
        out.append(Finding(HEALTH, component, "exit %d" % diag.exit_code, want, INVESTIGATE))
    return out


def _mig_gpus(facts) -> List[int]:
    nvml = facts.nvml
    if nvml is None or failed(nvml):
        return []
    return [g.index for g in nvml.gpus if g.mig_enabled is True]


def _refused(diag, facts) -> Finding:
    """DCGM refused the whole run on MIG: nothing was diagnosed, on any GPU.
    Believed only when NVML shows MIG on: otherwise gpugate cannot tell."""
    words = "; ".join(r.message for r in diag.not_run)[:300]
    mig = _mig_gpus(facts)
    if not mig:
        return Finding(PROBE, "dcgm_diag", "refused for MIG, NVML shows no MIG GPU", "pass (r%d)" % diag.level,
                       INVESTIGATE, detail=words)
    return Finding(NOT_RUN, "dcgm_diag", "not run on MIG (MIG on gpus %s)" % ",".join(str(g) for g in mig),
                   "pass (r%d)" % diag.level, INVESTIGATE, detail=words)


def _short(test: str) -> str:
    return test.lower().replace(" ", "_")[:24]
