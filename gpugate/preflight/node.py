"""A node's own part of a job's preflight (issue 36, docs/explanation/preflight-design.md):
the diagnostic at ``[preflight] dcgm_level`` on the job's GPUs (`dcgmi diag
-r N`; RVS on an AMD node), then the single-node all_reduce
(``[preflight] allreduce``: nccl-tests, rccl-tests on AMD) on them, judged
as the sweep's smoke job is, against the baseline's ``[smoke]
min_busbw_gbps`` for the node's product.  Root's commands from gpugate's
configuration, under one deadline, with an environment of gpugate's own
making (the job's GPUs, nothing of the job's).

What a proof can pin on this node decides what it does:

- a diagnostic test that fails, or wrong values from the all_reduce
  (``#wrong``, out of bounds): the hardware under load.  Acute findings
  (``dcgm_diag``/``rvs``, ``preflight``): drained at once, and the prolog's
  exit 1 makes Slurm requeue the job.  DCGM's deployment tests of software
  (libraries, persistence mode, environment) are budgeted
  (``preflight_setup``): a package pushed everywhere fails them everywhere.
- a bus bandwidth under the product's floor: the floor is a file's, and a
  wrong one would take every preflighted node at once, so a budgeted
  finding (``preflight_busbw``): published for the keeper; the job runs.
- anything else is undecided: an NCCL error or abort (the host's /dev/shm
  filled by another job, a port taken), a timeout (the site's sizes for
  its deadline), an exit code, no result, a tool missing or not root's.
  No finding; the job runs; the log line says why.  A preflight that
  cannot decide never takes capacity."""

import time
from typing import Dict, List, Optional

from gpugate.model.findings import HEALTH, INVESTIGATE, RESET_GPU, Finding
from gpugate.core.record import dataclass

ACUTE_COMPONENT, BUSBW_COMPONENT, SETUP_COMPONENT = "preflight", "preflight_busbw", "preflight_setup"


@dataclass
class Proof:
    findings: List[Finding]
    undecided: List[str]  # why a part could not decide, for the log line
    seconds: Dict[str, float]  # each part's wall time
    busbw_gbps: Optional[float] = None
    floor_judged: bool = False  # the bandwidth was held to the product's floor (a whole node's run)

    def to_json(self) -> dict:
        return {"findings": [f.to_json() for f in self.findings], "undecided": list(self.undecided),
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()}, "busbw_gbps": self.busbw_gbps}


def prove(settings, baseline, node: str, gpus: Optional[List[int]], deadline: float) -> Proof:
    cfg = settings.preflight
    proof = Proof([], [], {})
    if not gpus:
        # Slurm named no GPUs for the job (no GPU GRES): every job on the
        # node may use every GPU, so a proof there would judge the others'.
        proof.undecided.append("the job's GPUs unknown (no SLURM_JOB_GPUS): not run")
        return proof
    amd = baseline.vendor_for(node) == "amd"
    whole = baseline.expect_for(node).gpus
    level = int(cfg["dcgm_level"])
    if level:
        started = time.monotonic()
        _diagnose(settings, node, level, gpus, whole, amd, deadline, proof)
        proof.seconds["rvs" if amd else "dcgm"] = time.monotonic() - started
    if cfg["allreduce"] and not proof.findings:  # a node that failed its diagnostic proves no more
        started = time.monotonic()
        _allreduce(settings, baseline, node, gpus, whole, amd, deadline, proof)
        proof.seconds["allreduce"] = time.monotonic() - started
    return proof


def _left(deadline: float) -> float:
    return deadline - time.monotonic()


def _diagnose(settings, node, level, gpus, whole, amd, deadline, proof: Proof) -> None:
    from gpugate.judges.dcgm import diagnostic
    from gpugate.model.facts import ProbeFailure
    from gpugate.probes import commands
    from gpugate.probes import rvs

    if _left(deadline) < 1.0:
        proof.undecided.append("no time left for the diagnostic")
        return
    if amd:
        # RVS takes no GPU list: it would test other jobs' GPUs too, and
        # their load is not this node's fault.
        if whole is None or len(gpus) < whole:
            proof.undecided.append("diagnostic: RVS tests every GPU; the job has %d of %s" % (len(gpus), whole or "?"))
            return
        diag = rvs.diag(settings.command("rvs", node), level, _left(deadline))
        findings = diagnostic("rvs", diag, "rvs -r %d")
    else:
        diag = commands.dcgm_diag(settings.command("dcgmi", node), level, _left(deadline), gpus)
        findings = diagnostic("dcgm_diag", diag, "r%d")
    if isinstance(diag, ProbeFailure):
        proof.undecided.append("diagnostic: %s" % diag.describe()[:200])
        return
    failed = node_findings(findings)
    if whole is None or len(gpus) < whole:
        # Part of the node: another job's load on the shared links and power can fail a bandwidth or
        # stress test; only a GPU's own tests (memory, compute, context) pin on the node then.
        shared = [f for f in failed if f.observed.startswith(SHARED_TESTS)]
        failed = [f for f in failed if not f.observed.startswith(SHARED_TESTS)]
        proof.undecided += ["diagnostic on part of the node: %s" % f.observed for f in shared[:2]]
    proof.findings += failed
    if findings and not failed and not proof.undecided:
        proof.undecided.append("diagnostic: %s" % findings[0].observed)


# DCGM's deployment tests that check software, not the GPU (its r1
# "Deployment" plugin): a package or a setting pushed to every node fails
# them everywhere at once, so they are budgeted (preflight_setup), never
# drained outside the budget.  Short names as judges.dcgm writes them.
_SETUP_TESTS = ("denylist", "blacklist", "nvml_library", "cuda_main_library", "cuda_toolkit", "permissions_and_os",
                "persistence_mode", "environment_variables", "fabric_manager")


# DCGM's tests whose result another job on the same node can disturb: its traffic on a PCIe switch or
# NVLink, its power draw under the node's cap (short names as judges.dcgm writes them).
SHARED_TESTS = ("pcie", "nvbandwidth", "targeted_power", "targeted_stress", "pulse_test", "diagnostic")


def node_findings(findings: List[Finding]) -> List[Finding]:
    """What of a diagnostic's findings a preflight pins on the node, and how:
    a software deployment test budgeted, a GPU's test acute, the rest none."""
    return [_setup(f) if f.observed.startswith(_SETUP_TESTS) else f for f in findings if nodes_fault(f)]


def _setup(finding: Finding) -> Finding:
    return Finding(HEALTH, SETUP_COMPONENT, finding.observed, finding.expected, INVESTIGATE, gpu=finding.gpu,
                   detail=finding.detail)


def nodes_fault(finding: Finding) -> bool:
    """Only a test that failed is the node's; "no test ran", an exit code
    without a failed test or a refusal (MIG) decides nothing, and neither
    does DCGM's "Graphics Processes": a process on the job's GPUs is
    someone's (a user's left behind: the epilog judges it by its owner)."""
    return (finding.cls == HEALTH and not finding.observed.startswith("exit ")
            and not finding.observed.startswith("graphics_processes"))


def _allreduce(settings, baseline, node, gpus, whole, amd, deadline, proof: Proof) -> None:
    from gpugate.errors import CommandError
    from gpugate.judges.smoke import cannot_run, judge_smoke
    from gpugate.parsers.nccl import parse_nccl_tests
    from gpugate.safety.runner import run
    from gpugate.judges.smoke import template

    left = _left(deadline)
    if left < 1.0:
        proof.undecided.append("no time left for the all_reduce")
        return
    argv = template(settings.preflight["allreduce"], node, len(gpus))
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C", "HOME": "/root",
           # nvidia-smi's and NVML's numbering, not CUDA's fastest-first.
           "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    env["HIP_VISIBLE_DEVICES" if amd else "CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
    timed_out, rc, text = False, None, ""
    try:
        result = run(argv, left, env=env, ok_codes=range(256))
        rc, text = result.rc, result.stdout + result.stderr
    except CommandError as exc:
        if not exc.timed_out:
            proof.undecided.append("all_reduce: %s" % str(exc)[:200])
            return
        timed_out = True
    parsed = parse_nccl_tests(text) if text else None
    site = "" if timed_out else cannot_run(parsed, rc, text)
    if site:
        proof.undecided.append("all_reduce: cannot run: %s" % site[:200])
        return
    # The floor is a whole node's (the sweep's smoke runs on every GPU): a
    # job on some of the GPUs is judged on its values alone.
    product = baseline.expect_for(node).product
    full = whole is not None and len(gpus) >= whole  # a count the baseline does not pin: not whole
    want = baseline.smoke_min_busbw.get(product) if product and full else None
    verdict = judge_smoke(parsed, rc, timed_out, want, deadline_s=round(left))
    proof.busbw_gbps = verdict.busbw_gbps
    proof.floor_judged = want is not None
    if verdict.passed:
        return
    if verdict.component in ("wrong", "out_of_bounds"):
        proof.findings.append(Finding(HEALTH, ACUTE_COMPONENT, "all_reduce " + verdict.problem,
                                      verdict.expected, RESET_GPU, detail=" ".join(argv)[:160]))
    elif verdict.component == "busbw" and verdict.expected.startswith(">="):
        proof.findings.append(Finding(HEALTH, BUSBW_COMPONENT, verdict.observed, verdict.expected, INVESTIGATE,
                                      detail="product %s, [smoke] min_busbw_gbps" % product))
    else:
        proof.undecided.append("all_reduce: %s" % verdict.problem[:200])
