"""The smoke stage: after the node-side checks pass, a real job through
Slurm on each verified node, inside the batch's maintenance reservation.

One job per node: `sbatch --reservation=R --nodelist=NODE --exclusive` running
the site's command (default nccl-tests all_reduce_perf over the node's GPUs),
its output written to ``smoke_output_dir``, a file system the node and the
sweeper both see.  The sweeper polls `scontrol show job` until every job ended
or the deadline passed; a job still there at the deadline is cancelled and
waited for, so no job outlives the reservation.  The result is judged by
gpugate.judges.smoke (exit code, nccl-tests' own correctness lines, average
bus bandwidth against the baseline's per-product minimum).

A drained node takes no job, not even in a reservation: the stage lifts the
drain for the job (the MAINT reservation, Users=root, still keeps every other
job off) and sets the sweep's work reason again afterwards, whatever the
result, so the resume step compares and clears it as before.
"""

import math
import os
import time
from dataclasses import dataclass
from typing import Dict, List, Optional

from ..errors import SlurmError
from ..findings import RMA, Finding
from ..slurm import jobs as sj
from . import journal as jr
from .waits import poll_until

JOB_NAME = "gpugate-smoke"
# After a scancel, how long to wait for slurmd to end the job before the
# reservation may go (KillWait plus the epilog).
CANCEL_WAIT = 60.0
MAX_OUTPUT = 8 << 20
HEAD = 64 << 10


@dataclass
class SmokeResult:
    node: str
    job: str = ""
    passed: bool = False
    problem: str = ""  # e.g. "busbw=23.4GB/s (want >= 350)"
    seconds: float = 0.0


def template(argv, node: str, gpus: Optional[int]) -> List[str]:
    """{node} and {gpus} in the command; an unknown GPU count leaves the
    tool's own default (all_reduce_perf -g {gpus} needs a number)."""
    out = []
    for word in argv:
        if "{gpus}" in word and gpus is None:
            if out and out[-1] in ("-g", "--ngpus"):
                out.pop()
            continue
        out.append(word.replace("{node}", node).replace("{gpus}", str(gpus)))
    return out


def run_smoke(slurm, cfg, baseline, nodes: List[str], reservation: str, sleep=time.sleep,
              say=lambda text: None) -> Dict[str, SmokeResult]:
    """Submit the smoke job on each node inside ``reservation``, wait, judge.
    Changes no node state (the caller lifts and sets drains)."""
    if not reservation or reservation not in slurm.reservations():
        raise SlurmError("reservation %r is missing: the smoke job is never submitted outside it" % reservation)
    outdir = str(cfg["smoke_output_dir"])
    os.makedirs(outdir, mode=0o755, exist_ok=True)
    deadline = float(cfg["smoke_deadline"])
    minutes = int(math.ceil(deadline / 60.0)) + 1  # Slurm's own limit only backs ours up
    # nccl-tests (all_reduce_perf, all_gather_perf, ...) must print its table
    # and average; a site's own command is judged on its exit code (and any
    # nccl-tests-like error or wrong-value lines it prints).
    nccl_tests = os.path.basename(str(cfg["smoke"][0])).endswith("_perf")
    results: Dict[str, SmokeResult] = {}
    jobs: Dict[str, str] = {}  # job -> node
    started = time.monotonic()
    try:
        for node in nodes:
            gpus = baseline.expect_for(node).gpus
            argv = template(cfg["smoke"], node, gpus)
            extra = template(cfg["smoke_sbatch"], node, gpus)
            output = os.path.join(outdir, "%s-%s-%%j.out" % (JOB_NAME, node))
            job = sj.submit(slurm, argv, node, reservation, minutes, output, JOB_NAME, extra)
            results[node] = SmokeResult(node, job)
            jobs[job] = node
            say("  %s: smoke job %s submitted in reservation %s" % (node, job, reservation))
    except SlurmError:
        _cancel_and_wait(slurm, cfg, sorted(jobs), sleep)  # none of this batch's jobs is left behind
        raise
    ended: Dict[str, sj.JobState] = {}
    took: Dict[str, float] = {}

    def settle(states, waiting):
        for job in waiting:
            if states[job].ended:
                ended[job] = states[job]
                took[job] = time.monotonic() - started
                yield job

    late = poll_until(jobs, lambda waiting: sj.show(slurm, sorted(waiting)), settle, deadline,
                      float(cfg["poll_seconds"]), sleep)
    _cancel_and_wait(slurm, cfg, sorted(late), sleep)
    for job, node in jobs.items():
        res = results[node]
        res.seconds = took.get(job, time.monotonic() - started)
        state = ended.get(job)
        output = os.path.join(outdir, "%s-%s-%s.out" % (JOB_NAME, node, job))
        res.passed, res.problem = _judge(baseline, node, state, job in late, output, deadline, nccl_tests)
    return results


def _cancel_and_wait(slurm, cfg, jobs, sleep) -> None:
    """scancel, then wait until slurmctld has the jobs ended: only then may the reservation go."""
    if not jobs:
        return
    sj.cancel(slurm, jobs)
    still = poll_until(jobs, lambda waiting: sj.show(slurm, sorted(waiting)),
                       lambda states, waiting: [j for j in waiting if states[j].ended], CANCEL_WAIT,
                       float(cfg["poll_seconds"]), sleep)
    if still:
        raise SlurmError("smoke job(s) %s still there %.0fs after scancel" % (",".join(sorted(still)), CANCEL_WAIT))


def _read_bounded(path: str) -> str:
    """The output, or (NCCL_DEBUG=INFO can write gigabytes) its head, where
    the versions are, and its last MAX_OUTPUT bytes, where the table, the
    averages and the failure lines are."""
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size <= MAX_OUTPUT + HEAD:
            data = handle.read()
        else:
            data = handle.read(HEAD) + b"\n"
            handle.seek(size - MAX_OUTPUT)
            data += handle.read(MAX_OUTPUT).split(b"\n", 1)[-1]  # from the first whole line
    return data.decode("utf-8", "replace")


def _judge(baseline, node, state, timed_out, output, deadline, nccl_tests=True):
    from ..judges.smoke import judge_smoke
    from ..parsers.nccl import parse_nccl_tests

    product = baseline.expect_for(node).product
    want = baseline.smoke_min_busbw.get(product) if product else None
    if timed_out:
        return False, judge_smoke(None, None, True, want, deadline_s=deadline).problem
    if state is None or state.state == sj.GONE:
        return False, "the job's record was gone before gpugate read it"
    try:
        text = _read_bounded(output)
    except OSError as exc:
        return False, "cannot read the job's output %s (%s): smoke_output_dir must be shared" % (
            output, exc.strerror or exc)
    exit_code = state.exit_code if state.state != "CANCELLED" else None
    verdict = judge_smoke(parse_nccl_tests(text), exit_code, False, want, require_result=nccl_tests)
    if verdict.passed and state.state != "COMPLETED":
        return False, "job %s" % state.state.lower()
    return verdict.passed, verdict.problem


def finding(problem: str) -> Finding:
    """The reason's finding: `gpugate: rma smoke=all_reduce busbw=23.4GB/s (want >= 350)`."""
    observed, _, want = problem.partition(" (want ")
    return Finding(RMA, "smoke", "all_reduce " + observed, want.rstrip(")") or "pass", "rma")


class SmokeStep:
    """Mixed into engine.Sweeper (next to steps.Steps)."""

    def _step_smoke(self, nodes, records) -> None:
        self._begin(nodes, "smoke")
        if not self.cfg["smoke"]:
            for name in nodes:
                self._done(name, "smoke", "no smoke job configured")
            return
        by_reservation: Dict[str, List[str]] = {}
        for name in nodes:
            by_reservation.setdefault(records[name].reservation, []).append(name)
        for reservation, group in sorted(by_reservation.items()):
            self._smoke_group(group, records, reservation)

    def _smoke_group(self, group, records, reservation) -> None:
        from .. import reason as reasons
        from .steps import hostlist

        states = self._states(group)
        for name in list(group):
            st = states.get(name)
            # UNDRAIN clears the reason too: undrained with none while the journal
            # says this stage had started is our own lift, before a crash.
            lifted = st is not None and not st.drain and not st.reason and records[name].step == "smoke"
            if st is None or (reasons.parse(st.reason, self.tag) is None and not lifted):
                self._leave(name, "reason changed before the smoke job: %r" % (st.reason if st else "gone"))
                group.remove(name)
        if not group:
            return
        try:
            # One left by an interrupted sweeper would hold the node.
            sj.cancel_named(self.slurm, JOB_NAME, reservation)
            if reservation not in self.slurm.reservations():
                raise SlurmError("reservation %s is missing: no smoke job outside it" % reservation)
            self.slurm.undrain(hostlist(group))
            results = run_smoke(self.slurm, self.cfg, self.baseline, group, reservation, self.sleep, self.say)
        except SlurmError as exc:
            results = {n: SmokeResult(n, problem="not run: %s" % exc) for n in group}
        finally:
            # Out of service again with the work reason, unless someone set a
            # reason of their own meanwhile: theirs wins, as everywhere.
            after = self._states(group)
            theirs = {n: after[n].reason for n in group if n in after and after[n].reason
                      and reasons.parse(after[n].reason, self.tag) is None}
            ours = [n for n in group if n not in theirs]
            for (_, reason_text), names in self._work_groups(ours, records).items():
                self.slurm.drain(hostlist(names), reason_text)
        for name, reason_text in sorted(theirs.items()):
            self._leave(name, "reason changed during the smoke job: %r" % reason_text)
        for name in ours:
            res = results[name]
            detail = "job %s %s in %.0fs" % (res.job or "-", "passed" if res.passed else res.problem, res.seconds)
            self.journal.stage(name, "smoke single", jr.DONE if res.passed else jr.FAILED, detail)
            if res.passed:
                self._done(name, "smoke", detail)
                continue
            self.failures.add(name)
            self.last_findings[name] = [finding(res.problem)]
            self.journal.record(name, "smoke", jr.FAILED, detail=detail)
            self._attempt_failed(name, records[name], "smoke all_reduce " + res.problem)


__all__ = ["run_smoke", "SmokeStep", "SmokeResult"]
