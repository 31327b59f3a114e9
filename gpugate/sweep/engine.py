"""The sweep's reconcile loop: snapshot -> plan -> apply one batch -> verify
-> resume, every step journaled, so a sweeper killed at any point is taken
up by the next run from the recorded step.

Invariants: a node is RESUMEd only after it passed verification and only
while its reason is still gpugate's; every node in the sweep's hands keeps a
gpugate reason (the reboot carries it, and it is set again after the reboot).
"""

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Sequence

from .. import reason as reasons
from ..errors import CommandError, SlurmError
from ..findings import RMA, ROLLOUT, Finding
from ..runner import run
from . import journal as jr
from .plan import ESCALATE, REBOOT, RECONVERGE, Options, Plan, plan
from .snapshot import take
from .transport import expand

# The steps of one attempt, in order, per remedy.  Attempt 3 is the rollback.
PIPELINES = {
    RECONVERGE: ("wait_drained", "converge", "reboot", "wait_up", "verify", "resume"),
    REBOOT: ("wait_drained", "reboot", "wait_up", "verify", "resume"),
    "rollout": ("drain", "wait_drained", "converge", "reboot", "wait_up", "verify", "resume"),
    "rollback": ("rollback", "reboot", "wait_up", "verify", "resume"),
}
RETRY_FROM = {RECONVERGE: "converge", REBOOT: "reboot", "rollout": "converge"}
# Failures and escalations are handled first, then the pipeline in order.
STEP_ORDER = ("failed", "escalate", "drain", "wait_drained", "rollback", "converge", "reboot", "wait_up",
              "verify", "resume")
_REBOOT_FLAGS = {"REBOOT_REQUESTED", "REBOOT_ISSUED"}


@dataclass
class Outcome:
    node: str
    remedy: str
    result: str = "in progress"  # resumed | escalated | left | deferred | halted
    attempts: int = 1
    detail: str = ""


@dataclass
class SweepReport:
    outcomes: Dict[str, Outcome] = field(default_factory=dict)
    batches: List[dict] = field(default_factory=list)
    stopped: str = ""  # why the circuit breaker stopped the sweep
    max_out: Dict[str, int] = field(default_factory=dict)  # most nodes in our hands per partition


class Sweeper:
    def __init__(self, settings, baseline, slurm, transport, journal: jr.Journal, options: Options,
                 force: bool = False, say: Callable[[str], None] = lambda text: None, sleep=time.sleep):
        self.settings = settings
        self.cfg = settings.sweep
        self.baseline = baseline
        self.slurm = slurm
        self.transport = transport
        self.journal = journal
        self.options = options
        self.force = force
        self.say = say
        self.sleep = sleep
        self.tag = settings.reason_tag
        self.report = SweepReport()
        self.handled: set = set()
        self.batch_count = 0
        self.last_findings: Dict[str, List[Finding]] = {}  # what the last failed verification found
        self.failures: set = set()  # nodes of the current batch whose attempt failed

    # ------------------------------------------------------------ the loop
    def snapshot(self):
        return take(self.slurm.nodes(), self.tag, time.time())

    def make_plan(self, snapshot, rollout_nodes=None) -> Plan:
        in_flight = frozenset(self.journal.in_flight())
        return plan(snapshot, replace(self.options, in_flight=in_flight,
                                      exclude=frozenset(self.handled) | self.options.exclude,
                                      rollout=rollout_nodes if rollout_nodes is not None else self.options.rollout))

    def run(self) -> SweepReport:
        self._resume_in_flight()
        self.cleanup_reservations()
        while not self.report.stopped:
            snap = self.snapshot()
            current = self.make_plan(snap)
            if not current.batches:
                break
            batch = current.batches[0]
            self._start_batch(batch, snap)
            if batch.canary and not self.report.stopped:
                if self._batch_failed(batch.nodes):
                    self.report.stopped = ("canary batch %s failed verification: rollout stopped before the "
                                           "next batch" % _hostlist(batch.nodes))
                self.options = replace(self.options, canary_done=True)
        return self.report

    def _resume_in_flight(self) -> None:
        flying = self.journal.in_flight()
        if not flying:
            return
        self.say("taking up %d node(s) from an interrupted sweep: %s" % (len(flying), _hostlist(flying)))
        by_batch: Dict[tuple, List[str]] = {}
        for name, rec in flying.items():
            by_batch.setdefault((rec.batch, rec.remedy), []).append(name)
        for (batch, remedy), names in sorted(by_batch.items()):
            for name in names:
                self.report.outcomes[name] = Outcome(name, remedy, attempts=flying[name].attempt)
            self._drive(sorted(names), remedy, batch)

    def _start_batch(self, batch, snap) -> None:
        nodes = list(batch.nodes)
        self.batch_count += 1
        batch = replace(batch, index=self.batch_count)
        self.say("batch %d (%s%s): %s" % (batch.index, batch.remedy, ", canary" if batch.canary else "",
                                          _hostlist(nodes)))
        remedy = "rollout" if self.options.rollout is not None else batch.remedy
        known = self.journal.nodes()
        for name in nodes:
            view = snap.nodes[name]
            reason_text = view.reason if view.ours is not None else self._rollout_reason(name)
            first = view.ours.first if view.ours is not None else None
            if first is not None and first.component == "sweep" and name in known:
                reason_text = known[name].reason  # an earlier sweep's work reason: keep the original
            self.journal.enrol(name, remedy, batch.index, reason_text)
            self.report.outcomes[name] = Outcome(name, remedy)
        self._track_out(snap, nodes)
        self.report.batches.append({"index": batch.index, "remedy": remedy, "nodes": _hostlist(nodes),
                                    "canary": batch.canary})
        self._drive(nodes, remedy, batch.index)
        self._wait_in_service([n for n in nodes if self.report.outcomes[n].result == "resumed"])

    def _wait_in_service(self, nodes) -> None:
        """Resumed nodes count toward the floor only once Slurm has them in
        service (a rebooted slurmd can show as not responding for a ping or
        two): wait for that before planning the next batch."""
        deadline = time.monotonic() + float(self.cfg["reboot_timeout"])
        waiting = set(nodes)
        while waiting and time.monotonic() < deadline:
            states = self.slurm.nodes()
            waiting = {n for n in waiting if not (states.get(n) is not None and states[n].in_service)}
            if waiting:
                self.sleep(min(float(self.cfg["poll_seconds"]), 1.0))
        if waiting:
            self.say("  %s resumed but not yet in service; the floor counts them as out" % _hostlist(waiting))

    def _track_out(self, snap, nodes) -> None:
        for part, members in snap.partition_members().items():
            count = sum(1 for n in nodes if n in members)
            self.report.max_out[part] = max(self.report.max_out.get(part, 0), count)

    # ------------------------------------------------------ one batch's nodes
    def _drive(self, nodes: List[str], remedy: str, batch: int) -> None:
        """Move each node through its pipeline, steps taken together for
        every node that is at the same step."""
        self.failures = set()
        if remedy == ESCALATE:
            self._escalate(nodes, "no automatic remedy for this finding")
            return
        while True:
            records = self.journal.nodes()
            pending = {n: records[n] for n in nodes if n in records and not records[n].finished}
            if not pending:
                self._release_reservations(nodes)
                return
            steps = {n: self._next_step(rec) for n, rec in pending.items()}
            step = min(steps.values(), key=lambda s: STEP_ORDER.index(s))
            group = sorted(n for n, s in steps.items() if s == step)
            getattr(self, "_step_" + step)(group, pending)
            self._check_breaker(len(nodes))
            if self.report.stopped:
                for name in nodes:
                    rec = self.journal.nodes().get(name)
                    if rec is not None and not rec.finished:
                        self.journal.record(name, "halted", jr.DONE, detail=self.report.stopped)
                        self._finish(name, "halted", self.report.stopped)
                self._release_reservations(nodes)
                return

    def _pipeline(self, rec) -> Sequence[str]:
        return PIPELINES["rollback"] if rec.attempt >= 3 else PIPELINES[rec.remedy]

    def _next_step(self, rec) -> str:
        """The step to take next.  A recorded failure is handled again (its
        retry, rollback or escalation was not recorded before a crash);
        nothing ever moves from a failure straight to the next step."""
        pipeline = self._pipeline(rec)
        if rec.status == jr.FAILED:
            return "failed"
        if rec.step == "escalate":
            return "escalate"
        if rec.step == "planned":
            return pipeline[0]
        if rec.status == jr.STARTED or rec.step not in pipeline:
            return rec.step if rec.step in pipeline else pipeline[0]  # redo what was interrupted
        index = pipeline.index(rec.step)
        return pipeline[index + 1] if index + 1 < len(pipeline) else "resume"

    # ----------------------------------------------------------------- steps
    def _begin(self, nodes, step) -> None:
        for name in nodes:
            self.journal.record(name, step, jr.STARTED)

    def _done(self, name, step, detail="") -> None:
        self.journal.record(name, step, jr.DONE, detail=detail)

    def _step_failed(self, nodes, records) -> None:
        for name in nodes:
            self._attempt_failed(name, records[name], "after an interrupted sweep: " + records[name].detail)

    def _step_escalate(self, nodes, records) -> None:
        self._escalate(nodes, records[nodes[0]].detail or "escalated")

    def _step_drain(self, nodes, records) -> None:
        """Rollout: take in-service nodes on the previous pin out, with a rollout reason."""
        self._begin(nodes, "drain")
        states = self.slurm.nodes()
        to_drain: Dict[str, List[str]] = {}
        for name in nodes:
            st = states.get(name)
            ours = reasons.parse(st.reason, self.tag) if st is not None and st.drain else None
            if st is None or (st.drain and (ours is None or ours.cls != ROLLOUT)):
                self._leave(name, "drained by someone else (or gone) before the rollout reached it")
            elif not st.drain:
                to_drain.setdefault(records[name].reason, []).append(name)
            else:
                self._done(name, "drain")  # drained by us before a crash
        for reason_text, group in to_drain.items():  # one Slurm call per reason
            self.slurm.drain(_hostlist(group), reason_text)
            for name in group:
                self._done(name, "drain")

    def _step_wait_drained(self, nodes, records) -> None:
        self._begin(nodes, "wait_drained")
        if self.force:
            # --force: the admin accepts killing the jobs still running there.
            self.slurm.cancel_jobs(_hostlist(nodes))
        deadline = time.monotonic() + float(self.cfg["drain_timeout"])
        waiting = set(nodes)
        while waiting:
            states = self.slurm.nodes()
            for name in sorted(waiting):
                st = states.get(name)
                if st is None or not st.drain or reasons.parse(st.reason, self.tag) is None:
                    self._leave(name, "its reason is no longer gpugate's: %r" % (st.reason if st else "gone"))
                    waiting.discard(name)
                elif st.drained or st.down:
                    self._done(name, "wait_drained")
                    waiting.discard(name)
            if not waiting:
                break
            if time.monotonic() >= deadline:
                for name in sorted(waiting):
                    self.journal.record(name, "deferred", jr.DONE, detail="jobs still running at the drain timeout")
                    self._finish(name, "deferred", "still draining: left for the next run")
                break
            self.sleep(float(self.cfg["poll_seconds"]))

    def _step_converge(self, nodes, records, template=None, step="converge") -> None:
        template = list(template if template is not None else self.cfg["converge"])
        self._begin(nodes, step)
        if not template:
            for name in nodes:
                self._done(name, step, "no converge command configured: reboot only")
            return
        groups = [[n] for n in nodes] if self.cfg["converge_per"] == "node" else [list(nodes)]
        for group in groups:
            argv = expand(template, group)
            try:
                run(argv, float(self.cfg["converge_timeout"]))
            except CommandError as exc:
                if len(group) > 1:
                    # The site's tool failed for the whole batch: that says
                    # nothing about the nodes. Stop; never escalate them for it.
                    for name in group:
                        self.journal.record(name, step, jr.STARTED, detail=str(exc))
                    self.report.stopped = ("the %s command failed for the whole batch (%s): fix it, then run "
                                           "gpugate sweep again" % (step, exc))
                    return
                for name in group:
                    self.failures.add(name)
                    self.journal.record(name, step, jr.FAILED, detail=str(exc))
                    self._attempt_failed(name, records[name], "%s failed: %s" % (step, exc))
                continue
            for name in group:
                self._done(name, step)

    def _step_rollback(self, nodes, records) -> None:
        self._step_converge(nodes, records, template=self.cfg["rollback"], step="rollback")

    def _step_reboot(self, nodes, records) -> None:
        self._begin(nodes, "reboot")
        states = self.slurm.nodes()
        ready = []
        for name in nodes:
            st = states.get(name)
            if st is None or reasons.parse(st.reason, self.tag) is None:
                self._leave(name, "reason changed before the reboot: %r" % (st.reason if st else "gone"))
            elif st.flags & _REBOOT_FLAGS:
                self._done(name, "reboot", "already rebooting")  # taken up after a crash
            else:
                ready.append(name)
        # A maintenance reservation keeps jobs off the nodes until they are
        # verified, whatever state the reboot leaves them in (22.05-23.11 clear
        # the drain after a reboot; ReturnToService=2 revives DOWN nodes).
        existing = self.slurm.reservations() if ready else {}
        by_reservation: Dict[str, List[str]] = {}
        current = self.journal.nodes()
        for name in ready:
            by_reservation.setdefault(current[name].reservation, []).append(name)
        for reservation, group in sorted(by_reservation.items()):
            if reservation not in existing:
                self.slurm.reserve(reservation, _hostlist(group))
        for (_, reason_text), group in self._work_groups(ready, records).items():
            self.slurm.reboot(_hostlist(group), reason_text, next_state="DOWN")
            for name in group:
                self._done(name, "reboot")

    def _step_wait_up(self, nodes, records) -> None:
        self._begin(nodes, "wait_up")
        deadline = time.monotonic() + float(self.cfg["reboot_timeout"])
        waiting = set(nodes)
        while waiting:
            states = self.slurm.nodes()
            back = []
            for name in sorted(waiting):
                st = states.get(name)
                if st is None or (st.flags & _REBOOT_FLAGS) or not st.responding:
                    continue
                # Ours (Slurm appends ": reboot complete"), or cleared when
                # ReturnToService revived it; anyone else's reason wins.
                if st.reason and reasons.parse(st.reason, self.tag) is None:
                    self._leave(name, "reason changed during the reboot: %r" % st.reason)
                    waiting.discard(name)
                    continue
                back.append(name)
            for (_, reason_text), group in self._work_groups(back, records).items():
                # Drained again with a gpugate reason: out of service until verified.
                self.slurm.drain(_hostlist(group), reason_text)
                for name in group:
                    self._done(name, "wait_up")
                    waiting.discard(name)
            if not waiting:
                break
            if time.monotonic() >= deadline:
                for name in sorted(waiting):
                    self.failures.add(name)
                    self.journal.record(name, "wait_up", jr.FAILED, detail="slurmd did not register in time")
                    self._attempt_failed(name, records[name], "did not come back from the reboot")
                break
            self.sleep(min(float(self.cfg["poll_seconds"]), 1.0))

    def _step_verify(self, nodes, records) -> None:
        self._begin(nodes, "verify")
        rollback = [n for n in nodes if records[n].attempt >= 3]
        normal = [n for n in nodes if records[n].attempt < 3]
        answers = {}
        timeout = float(self.cfg["verify_timeout"])
        if normal:
            answers.update(self.transport.check(normal, ["--mode", "verify"], timeout))
        if rollback:
            answers.update(self.transport.check(rollback, ["--mode", "verify", "--pin", "previous"], timeout))
        for name in nodes:
            answer = answers.get(name, "no answer")
            problem = self._verify_problem(name, answer, records[name])
            if problem is None:
                self._done(name, "verify", "fit")
                continue
            if problem:
                self.journal.record(name, "verify", jr.FAILED, detail=problem)
                self._attempt_failed(name, records[name], problem)
                continue
            why = answer.get("reason") if isinstance(answer, dict) else answer
            self.failures.add(name)
            if isinstance(answer, dict):
                self.last_findings[name] = [Finding.from_json(f) for f in answer.get("findings", [])
                                            if isinstance(f, dict) and "class" in f and "component" in f]
            self.journal.record(name, "verify", jr.FAILED, detail=str(why))
            self._attempt_failed(name, records[name], "verification failed: %s" % why)

    def _check_breaker(self, batch_size: int) -> None:
        """K failed nodes in one batch (every node of a smaller batch of two
        or more) stop the sweep: a bad image, converge or baseline is likelier
        than that many bad nodes at once."""
        limit = int(self.cfg["circuit_breaker"])
        if batch_size >= 2:
            limit = min(limit, batch_size)
        if len(self.failures) >= limit and not self.report.stopped:
            self.report.stopped = ("circuit breaker: %d node(s) failed in this batch (limit %d). A bad image, "
                                   "converge or baseline is the likely cause; no further batch was started. "
                                   "Fix it, then run gpugate sweep again." % (len(self.failures), limit))

    def _verify_problem(self, name, answer, rec):
        """None when the answer passes; a text when it passes but must not be
        resumed; "" when it plainly failed (the caller records the reason)."""
        if not isinstance(answer, dict) or answer.get("fit") is not True:
            return ""
        if answer.get("node") not in (None, name):
            return "the verification answered for %s, not %s" % (answer.get("node"), name)
        if answer.get("pending") and rec.attempt < 3:
            return "still on the previous pin: %s" % ", ".join(p["component"] for p in answer["pending"])
        mine = self._baseline_id()
        if answer.get("baseline") and mine and answer["baseline"].get("sha256") != mine:
            return "the node checked against another baseline (%s): push the baseline first" % (
                answer["baseline"].get("name"))
        if rec.attempt >= 3 and not self.baseline.rollout_in_progress:
            return "the new pin fails verification here; the previous one passes"
        return None

    def _baseline_id(self):
        if not hasattr(self, "_baseline_sha"):
            from ..node.check import baseline_id

            self._baseline_sha = baseline_id(self.settings.baseline).get("sha256")
        return self._baseline_sha

    def _step_resume(self, nodes, records) -> None:
        self._begin(nodes, "resume")
        states = self.slurm.nodes()
        ok = []
        for name in nodes:
            st = states.get(name)
            if st is not None and not st.drain and not st.reason and records[name].step == "resume":
                # Our RESUME went through before a crash: nothing left to do.
                self._done(name, "resume", "resumed before the sweeper was interrupted")
                self._finish(name, "resumed", "verified and returned to service")
                continue
            # Compare, then set: only the reason the sweep itself set may be
            # cleared (Slurm may have appended ": reboot complete").
            expected = self._work_reason(records[name])
            if st is None or not (st.reason == expected or st.reason.startswith(expected + " :")):
                self._leave(name, "reason changed during the sweep: %r" % (st.reason if st else "gone"))
            else:
                ok.append(name)
        if ok:
            self.slurm.resume(_hostlist(ok))
            for name in ok:
                self._done(name, "resume")
                self._finish(name, "resumed", "verified and returned to service")

    # -------------------------------------------------------- failure paths
    def _attempt_failed(self, name, rec, why) -> None:
        rec = self.journal.nodes()[name]
        outcome = self.report.outcomes.setdefault(name, Outcome(name, rec.remedy))
        if rec.attempt == 1:
            outcome.attempts = 2
            self.journal.record(name, RETRY_FROM[rec.remedy], jr.STARTED, attempt=2, detail="retry: " + why)
            self.say("  %s: %s; retrying once" % (name, why))
            return
        if rec.attempt == 2 and rec.remedy != REBOOT and self.cfg["rollback"] and self.baseline.previous:
            outcome.attempts = 3
            self.journal.record(name, "rollback", jr.STARTED, attempt=3, detail="rollback: " + why)
            self.say("  %s: %s; rolling back to the previous baseline" % (name, why))
            return
        self._escalate([name], why)

    def _escalate(self, nodes, why) -> None:
        for name in nodes:
            self.journal.record(name, "escalate", jr.STARTED, detail=why)
        states = self.slurm.nodes()
        for name in nodes:
            st = states.get(name)
            ours = reasons.parse(st.reason, self.tag) if st is not None else None
            if ours is None:
                self._leave(name, "reason changed: %r" % (st.reason if st else "gone"))
                continue
            # What is wrong now (the last verification), else what it was drained for.
            record = self.journal.nodes().get(name)
            original = reasons.parse(record.reason, self.tag) if record is not None else None
            found = self.last_findings.get(name) or (list(original.findings) if original else [])
            findings = [replace(f, cls=RMA) for f in found] or [Finding(RMA, "verify", "failed", "pass", "rma")]
            text = reasons.render(self.tag, RMA, findings)
            self.slurm.drain(name, text)
            self.journal.record(name, "escalate", jr.DONE, detail=why)
            self._finish(name, "escalated", why)
            self.say("  %s: escalated (%s): %s" % (name, text, why))

    def _leave(self, name, why) -> None:
        self.journal.record(name, "left", jr.DONE, detail=why)
        self._finish(name, "left", why)
        self.say("  %s: left alone: %s" % (name, why))

    def _finish(self, name, result, detail) -> None:
        self.handled.add(name)
        outcome = self.report.outcomes.setdefault(name, Outcome(name, "?"))
        outcome.result = result
        outcome.detail = detail

    def _batch_failed(self, nodes) -> bool:
        return any(self.report.outcomes[n].result != "resumed" for n in nodes if n in self.report.outcomes)

    def _work_reason(self, rec) -> str:
        """The reason a node carries while the sweep has it: gpugate's tag, the
        class it was drained for, and what the sweep is doing.  One text per
        batch, so a batch of any size costs one Slurm call per step."""
        ours = reasons.parse(rec.reason, self.tag)
        cls = ours.cls if ours is not None else ROLLOUT
        what = "%s batch %d attempt %d" % (rec.remedy, rec.batch, rec.attempt)
        return reasons.render(self.tag, cls, [Finding(cls, "sweep", what, "verified", "")])

    def _work_groups(self, nodes, records) -> Dict[tuple, List[str]]:
        groups: Dict[tuple, List[str]] = {}
        current = self.journal.nodes()  # one read: batches can hold thousands of nodes
        for name in nodes:
            rec = current[name]
            groups.setdefault((rec.reservation, self._work_reason(rec)), []).append(name)
        return groups

    def _release_reservations(self, nodes) -> None:
        """Delete a batch's reservation once none of its nodes is in flight."""
        records = self.journal.nodes()
        names = {records[n].reservation for n in nodes if n in records}
        flying = {r.reservation for r in records.values() if not r.finished}
        existing = self.slurm.reservations() if names else {}
        for name in sorted(names - flying):
            if name in existing:
                self.slurm.unreserve(name)

    def cleanup_reservations(self) -> None:
        """Reservations an interrupted sweep left behind, with nothing in flight."""
        flying = {r.reservation for r in self.journal.in_flight().values()}
        for name in sorted(self.slurm.reservations()):
            if name.startswith("gpugate_sweep_") and name not in flying:
                self.slurm.unreserve(name)

    def _rollout_reason(self, name: str) -> str:
        pin, prev = self.baseline.pin, self.baseline.previous
        findings = [Finding(ROLLOUT, c, prev.get(c), pin.get(c), "reconverge")
                    for c in ("driver", "cuda_driver", "fabricmanager", "dcgm", "image", "kernel",
                              "container_toolkit") if prev is not None and prev.get(c) and prev.get(c) != pin.get(c)]
        return reasons.render(self.tag, ROLLOUT, findings or [Finding(ROLLOUT, "baseline", "previous", "pin", "")])




def _hostlist(nodes) -> str:
    from ClusterShell.NodeSet import NodeSet

    return str(NodeSet.fromlist(sorted(nodes)))


__all__ = ["Sweeper", "SweepReport", "SlurmError"]
