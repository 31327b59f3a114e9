"""The smoke stage on Slurm: after the node-side checks pass, a real job
through Slurm on each verified node, inside the batch's maintenance
reservation (the stage's shared part: gpugate.sweep.smoke).

One job per node: `sbatch --reservation=R --nodelist=NODE --exclusive` running
the site's command (default nccl-tests all_reduce_perf over the node's GPUs),
its output written to ``smoke_output_dir``, a file system the node and the
sweeper both see.  A pass resumes a node, so the proof must be the job's:
the directory must pass the trust walk (root's alone, or the stage is
refused with the fix named and no node resumes), and each job's output file
is created by the sweeper before the job is submitted (O_EXCL|O_NOFOLLOW, a
random name, root's, 0600), then read back only if it is still that very
file: a regular file (no symlink, FIFO or device: opened non-blocking),
owned by root, the same inode, read by its head and tail (bounded).  The job
runs as root (the sweeper submits it, no --uid) and slurmstepd opens the
file with O_TRUNC as the job's user, so it stays root's: a job run as anyone
else could not write it, and fails.

The sweeper polls `scontrol show job` until every job ended or the deadline
passed; a job still there at the deadline is cancelled and
waited for, so no job outlives the reservation.  The result is judged by
gpugate.judges.smoke (exit code, nccl-tests' own correctness lines, average
bus bandwidth against the baseline's per-product minimum).

A drained node takes no job, not even in a reservation: the stage lifts the
drain for the job (the MAINT reservation, Users=root, still keeps every other
job off) and sets the sweep's work reason again afterwards, whatever the
result, so the resume step compares and clears it as before.
"""

from __future__ import annotations

import errno
import math
import os
import time
from typing import Dict, List

from gpugate.errors import ConfigError, SlurmError
from gpugate.judges.smoke import template
from gpugate.slurm import jobs as sj
from gpugate.sweep import journal as jr
from gpugate.sweep.pairs import FAIL, NOT_REPROVEN, decide, run_rounds
from gpugate.sweep.partner import Lender
from gpugate.sweep.smoke import SmokeResult, SmokeStep, _by_vendor, _command_key, _want, finding
from gpugate.sweep.smoke_output import JOB_NAME, Outputs
from gpugate.sweep.waits import poll_until

# After a scancel, how long to wait for slurmd to end the job before the
# reservation may go (KillWait plus the epilog).
CANCEL_WAIT = 60.0


def run_smoke(slurm, cfg, baseline, nodes: List[str], reservation: str, sleep=time.sleep,
              say=lambda text: None) -> Dict[str, SmokeResult]:
    """Submit the smoke job on each node inside ``reservation``, wait, judge.
    Changes no node state (the caller lifts and sets drains)."""
    return _run_jobs(slurm, cfg, baseline, [(n,) for n in nodes], reservation, sleep, say)


def run_pairs(slurm, cfg, baseline, pairs, reservation: str, sleep=time.sleep,
              say=lambda text: None) -> Dict[str, SmokeResult]:
    """One 2-node job per pair (``smoke_pair``), keyed "a,b"."""
    return _run_jobs(slurm, cfg, baseline, [tuple(p) for p in pairs], reservation, sleep, say)


def _run_jobs(slurm, cfg, baseline, units, reservation, sleep, say) -> Dict[str, SmokeResult]:
    if not reservation or reservation not in slurm.reservations():
        raise SlurmError("reservation %r is missing: the smoke job is never submitted outside it" % reservation)
    outputs = Outputs(str(cfg["smoke_output_dir"]))  # trust.Untrusted (a ConfigError) names the fix
    try:
        return _submit_and_judge(slurm, cfg, baseline, units, reservation, sleep, say, outputs)
    finally:
        outputs.close()


def _submit_and_judge(slurm, cfg, baseline, units, reservation, sleep, say, outputs) -> Dict[str, SmokeResult]:
    deadline = float(cfg["smoke_deadline"])
    minutes = int(math.ceil(deadline / 60.0)) + 1  # Slurm's own limit only backs ours up
    results: Dict[str, SmokeResult] = {}
    jobs: Dict[str, str] = {}  # job -> unit label
    started = time.monotonic()
    partitions = _partitions(slurm, units)
    try:
        for unit in units:
            label, pair = ",".join(unit), len(unit) > 1
            gpus = baseline.expect_for(unit[0]).gpus
            argv = template(cfg[_command_key(baseline, unit[0], pair)], unit[0], gpus, label)
            extra = template(cfg["smoke_pair_sbatch" if pair else "smoke_sbatch"], unit[0], gpus, label)
            job = sj.submit(slurm, argv, label, reservation, minutes, outputs.create(label), JOB_NAME, extra,
                            partitions.get(label, ""))
            results[label] = SmokeResult(label, job)
            jobs[job] = label
            say("  %s: smoke job %s submitted in reservation %s" % (label, job, reservation))
    except (SlurmError, ConfigError):
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
    for job, label in jobs.items():
        res = results[label]
        res.seconds = took.get(job, time.monotonic() - started)
        argv = cfg[_command_key(baseline, label.split(",")[0], "," in label)]
        # nccl-tests (all_reduce_perf, all_gather_perf, ...; also behind srun)
        # must print its table and average; a site's own command is judged
        # on its exit code (and any nccl-tests-like error or wrong-value lines).
        nccl_tests = any(os.path.basename(str(word)).endswith("_perf") for word in argv)
        res.passed, res.problem, res.site = _judge(baseline, label.split(","), ended.get(job), job in late,
                                                   outputs.reader(label), deadline, nccl_tests)
        outputs.name_after(label, job)
    return results


def _partitions(slurm, units) -> Dict[str, str]:
    """The partitions each job may run in ("a,b": those its nodes share):
    without one, sbatch picks the default partition, and a node outside it
    is "Requested node configuration is not available" (an MI300X partition
    beside the default H100 one).  One call for every node of the batch."""
    from gpugate.sweep.steps import hostlist

    states = slurm.nodes(hostlist(sorted({n for unit in units for n in unit})))
    out = {}
    for unit in units:
        shared = None
        for node in unit:
            parts = set(getattr(states.get(node), "partitions", ()) or ())
            shared = parts if shared is None else shared & parts
        out[",".join(unit)] = ",".join(sorted(shared or ()))
    return out


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


def _judge(baseline, nodes, state, timed_out, output, deadline, nccl_tests=True):
    """(passed, problem, site): site is why the command never ran, when it did not."""
    from gpugate.judges.smoke import cannot_run, judge_smoke
    from gpugate.parsers.nccl import parse_nccl_tests

    want = _want(baseline, nodes)
    if timed_out:
        return False, judge_smoke(None, None, True, want, deadline_s=deadline).problem, ""
    if state is None or state.state == sj.GONE:
        return False, "the job's record was gone before gpugate read it", ""
    try:
        text = output.read()
    except OSError as exc:
        if exc.errno == errno.EPERM:  # not the job's proof (safeio.refused): no node is judged on it
            problem = "smoke_output_dir: the job's output %s %s" % (output.path, exc.strerror)
            return False, problem, problem
        problem = "cannot read the job's output %s (%s): smoke_output_dir must be shared" % (
            output.path, exc.strerror or exc)
        # No output from a job that ran to its end: it never started (a wrong
        # smoke_output_dir); a node that failed the job (NODE_FAIL) is the node's.
        return False, problem, problem if state.state in ("COMPLETED", "FAILED") else ""
    exit_code = state.exit_code if state.state != "CANCELLED" else None
    run = parse_nccl_tests(text)
    site = cannot_run(run, exit_code, text)
    if site:
        return False, "cannot run: " + site, site
    verdict = judge_smoke(run, exit_code, False, want, require_result=nccl_tests)
    if verdict.passed and state.state != "COMPLETED":
        return False, "job %s" % state.state.lower(), ""
    return verdict.passed, verdict.problem, ""


class SlurmSmokeStep(SmokeStep):
    """The stage's proof on Slurm, mixed into engine.Sweeper."""

    def _smoke_nodes(self, nodes, records) -> None:
        """The proof itself (Slurm: a job per node in the batch's reservation)."""
        by_reservation: Dict[str, List[str]] = {}
        for name in nodes:
            by_reservation.setdefault(records[name].reservation, []).append(name)
        for reservation, group in sorted(by_reservation.items()):
            self._smoke_group(group, records, reservation)

    def _smoke_group(self, group, records, reservation) -> None:
        from gpugate.model import reason as reasons
        from gpugate.sweep.steps import hostlist

        runs, pair_verdicts = [], {}
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
        refused = ""
        try:
            # One left by an interrupted sweeper would hold the node.
            sj.cancel_named(self.slurm, JOB_NAME, reservation)
            # Made again where it ended (bounded) or went with an earlier run: the nodes are drained.
            self._reserve(group)
            if reservation not in self.slurm.reservations():
                raise SlurmError("reservation %s is missing: no smoke job outside it" % reservation)
            Outputs(str(self.cfg["smoke_output_dir"])).close()  # refused before any drain is lifted
            # Into the reservation only (Slurm on Kubernetes: its Node stays held, gpugate.kube.paired).
            getattr(self.slurm, "undrain_in_reservation", self.slurm.undrain)(hostlist(group))
            results = run_smoke(self.slurm, self.cfg, self.baseline, group, reservation, self.sleep, self.say)
            if self.cfg["pairs"] and self.cfg["smoke_pair"] and not any(r.site for r in results.values()):
                passed = [n for n in group if results[n].passed]
                lender = Lender(self.slurm, reservation, group, self.say) if self.cfg["pair_with_in_service"] else None
                try:
                    runs = []
                    for same in _by_vendor(self.baseline, passed):  # an MI300X never pairs with an H100
                        runs += run_rounds(same, lambda pairs: run_pairs(self.slurm, self.cfg, self.baseline, pairs,
                                                                         reservation, self.sleep, self.say), lender)
                finally:
                    if lender is not None:
                        lender.give_back()
                pair_verdicts = decide(passed, runs, {n for n in passed if self._failed_pair_before(n)})
        except SlurmError as exc:
            results = {n: SmokeResult(n, problem="not run: %s" % exc) for n in group}
            runs, pair_verdicts = [], {}
        except ConfigError as exc:  # smoke_output_dir untrusted (trust.Untrusted names the fix) or unusable
            refused = str(exc)
            results = {n: SmokeResult(n, problem="not run: " + refused) for n in group}
            runs, pair_verdicts = [], {}
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
        if refused:
            return self._smoke_cannot_run(ours, "smoke_output_dir refused: " + refused)
        site = self._journal_smoke(ours, results, runs, pair_verdicts)
        if site:
            return self._smoke_cannot_run(ours, site)
        for name in ours:
            res, verdict = results[name], pair_verdicts.get(name)
            detail = "job %s %s in %.0fs" % (res.job or "-", "passed" if res.passed else res.problem, res.seconds)
            if res.passed and (verdict is None or verdict.verdict != FAIL):
                self._done(name, "smoke", detail + ("; pair %s with %s" % (verdict.verdict, verdict.partner)
                                                    if verdict and verdict.partner else ""))
                continue
            problem = res.problem if not res.passed else "pair=%s %s" % (verdict.partner, verdict.problem)
            self.failures.add(name)
            if not (verdict and verdict.problem == NOT_REPROVEN and name in self.last_findings):
                self.last_findings[name] = [finding(problem)]  # (alone: the pair it failed stays the finding)
            self.journal.record(name, "smoke", jr.FAILED, detail=detail if not res.passed else problem)
            self._attempt_failed(name, records[name], "smoke all_reduce " + problem)
