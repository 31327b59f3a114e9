"""The sweep's reconcile loop: snapshot -> plan -> apply one batch -> verify
-> resume, every step journaled, so a sweeper killed at any point is taken
up by the next run from the recorded step.

Invariants: a node is RESUMEd only after it passed verification and only
while its reason is still gpugate's; every node in the sweep's hands keeps a
gpugate reason (the reboot carries it, and it is set again after the reboot).
The steps themselves are in steps.py; the waits poll through waits.py.
"""

import time
from typing import Callable, Dict, List, Sequence

from gpugate.model import reason as reasons
from gpugate.errors import SlurmError
from gpugate.model.findings import RMA, ROLLOUT, Finding
from gpugate.sweep import history as hist
from gpugate.sweep import journal as jr
from gpugate.sweep import evidence
from gpugate.schedulers import reservations
from gpugate.sweep import escalation as esc
from gpugate.sweep.plan import ESCALATE, REBOOT, RECONVERGE, RESET, Options, Plan, plan
from gpugate.core.record import dataclass, field, replace
from gpugate.sweep.snapshot import take
from gpugate.sweep.defer_step import DeferStep
from gpugate.sweep.reset_step import ResetStep
from gpugate.sweep.slurm_smoke import SlurmSmokeStep
from gpugate.sweep.steps import Steps
from gpugate.sweep.steps import hostlist as _hostlist

# The steps of one attempt, in order, per remedy.  Attempt 3 is the rollback.
# "evidence" (a bundle from the node) comes before anything that loses it:
# a converge can reload the driver, a reset or a reboot clears the GPUs'
# state and the kernel log.  A planned rollout keeps none (not a fault).
PIPELINES = {
    RECONVERGE: ("wait_drained", "evidence", "converge", "reboot", "wait_up", "verify", "smoke", "resume"),
    RESET: ("wait_drained", "evidence", "reset", "verify", "smoke", "resume"),
    REBOOT: ("wait_drained", "evidence", "reboot", "wait_up", "verify", "smoke", "resume"),
    "rollout": ("drain", "wait_drained", "converge", "reboot", "wait_up", "verify", "smoke", "resume"),
    "rollback": ("rollback", "reboot", "wait_up", "verify", "smoke", "resume"),
}
# A retry keeps a bundle of its own (one per node per attempt) before it repeats the remedy.
RETRY_FROM = {RECONVERGE: "evidence", REBOOT: "evidence", "rollout": "converge"}
# Failures and escalations are handled first, then the pipeline in order.
STEP_ORDER = ("failed", "escalate", "drain", "wait_drained", "evidence", "rollback", "converge", "reset", "reboot",
              "wait_up", "verify", "smoke", "resume")


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


class Sweeper(Steps, ResetStep, SlurmSmokeStep, DeferStep):
    def __init__(self, settings, baseline, slurm, transport, journal: jr.Journal, options: Options,
                 force: bool = False, say: Callable[[str], None] = lambda text: None, sleep=time.sleep,
                 clock=time.time):
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
        self.clock = clock  # wall clock, for Slurm's reason times and the history; waits are monotonic
        self.tag = settings.reason_tag
        self.report = SweepReport()
        self.handled: set = set()
        self.batch_count = 0
        self.last_findings: Dict[str, List[Finding]] = {}  # what the last failed verification found
        self.last_answers: Dict[str, dict] = {}  # its whole answer (the DCGM run), for the evidence bundle
        self.failures: set = set()  # nodes of the current batch whose attempt failed

    # ------------------------------------------------------------ the loop
    def snapshot(self):
        return take(self.slurm.nodes(), self.tag, self.clock())

    def make_plan(self, snapshot, rollout_nodes=None) -> Plan:
        in_flight = frozenset(self.journal.in_flight())
        return plan(snapshot, replace(self.options, in_flight=in_flight, history=self.journal.history(),
                                      exclude=frozenset(self.handled) | self.options.exclude,
                                      rollout=rollout_nodes if rollout_nodes is not None else self.options.rollout))

    def run(self) -> SweepReport:
        try:
            return self._run()
        finally:
            reservations.at_exit(self)  # however it ended: none outlives the sweep (issue 33)

    def _run(self) -> SweepReport:
        self._resume_in_flight()
        self.cleanup_reservations()
        while not self.report.stopped:
            snap = self.snapshot()
            current = self.make_plan(snap)
            self._hold(snap, current)
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
        history = self.journal.history()
        for name in nodes:
            view = snap.nodes[name]
            reason_text = view.reason if view.ours is not None else self._rollout_reason(name)
            first = view.ours.first if view.ours is not None else None
            if first is not None and first.component == "sweep" and name in known:
                reason_text = known[name].reason  # an earlier sweep's work reason: keep the original
            past = [e.kind for e in history.get(name, ()) if e.kind in (hist.RESUMED, hist.REDRAINED)]
            if past and past[-1] == hist.RESUMED and hist.components(view.ours):
                # Back after the sweep returned it to service: the history the repeat rule counts on.
                self.journal.note(name, hist.REDRAINED, hist.components(view.ours), at=view.reason_time or None)
            self.journal.enrol(name, remedy, batch.index, reason_text,
                               rollout=self._rollout_reason(name) if remedy == "rollout" else "")
            self.report.outcomes[name] = Outcome(name, remedy)
        self._track_out(snap, nodes)
        self.report.batches.append({"index": batch.index, "remedy": remedy, "nodes": _hostlist(nodes),
                                    "canary": batch.canary})
        self._drive(nodes, remedy, batch.index)
        self._wait_in_service([n for n in nodes if self.report.outcomes[n].result == "resumed"])

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

    # -------------------------------------------------------- failure paths
    def _attempt_failed(self, name, rec, why) -> None:
        rec = self.journal.nodes()[name]
        outcome = self.report.outcomes.setdefault(name, Outcome(name, rec.remedy))
        if rec.remedy == RESET:
            # The reset rung did not hold: the reboot rung, as the retry (a bundle first).
            outcome.attempts, outcome.remedy = rec.attempt + 1, REBOOT
            self.journal.rerung(name, REBOOT, "evidence", rec.attempt + 1, "reboot: " + why)
            self.say("  %s: %s; falling to the reboot rung" % (name, why))
            return
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
        states = self._states(nodes)
        records, history, now = self.journal.nodes(), self.journal.history(), self.clock()
        items, originals = [], {}
        for name in nodes:
            st = states.get(name)
            ours = reasons.parse(st.reason, self.tag) if st is not None else None
            if ours is None:
                self._leave(name, "reason changed: %r" % (st.reason if st else "gone"))
                continue
            # What is wrong now (the last verification), else what it was drained for.
            record = records.get(name)
            originals[name] = reasons.parse(record.reason, self.tag) if record is not None else None
            items.append((name, ours, self.last_findings.get(name) or esc.cause(ours) or (
                list(originals[name].findings) if originals[name] else []), st.partitions))
        decided = esc.decide(self._gate, items)  # budgeted cause: only with room (escalation.py)
        for name, ours, found, _ in items:
            (mark, held), original = decided[name], originals[name]
            if held is not None:
                self._defer(name, ours, found, held)
                continue
            findings = [replace(f, cls=RMA) for f in found] or [Finding(RMA, "verify", "failed", "pass", "rma")]
            repeat = self._repeat(name, original, history, now)
            node_why = why
            if repeat is not None:
                observed, expected = hist.finding_text(repeat, self._window(), self._limit())
                findings.insert(0, Finding(RMA, "repeat", observed, expected, "rma"))
                node_why = self._repeat_why(name, repeat)
            elif hist.ladder_spent(hist.components(original), history.get(name, ()), now, self._window()):
                span = hist.span(self._window())
                findings.insert(0, Finding(RMA, "repeat", "reset then reboot in %s" % span, "a rung that holds", "rma"))
                node_why = ("repeat offender: came back within %s after a GPU reset and then a reboot; `gpugate "
                            "sweep forgive %s` clears the record" % (span, name))
            findings[:0] = [mark] if mark is not None else []
            text = evidence.with_id(reasons.render(self.tag, RMA, findings), self.journal.evidence_id(name))
            self.slurm.drain(name, text)
            self.journal.note(name, hist.ESCALATED, hist.components(original), at=now, detail=node_why)
            self.journal.record(name, "escalate", jr.DONE, detail=node_why)
            self._finish(name, "escalated", node_why)
            self.say("  %s: escalated (%s): %s" % (name, text, node_why))

    # ------------------------------------------------ history: repeat offenders
    def _limit(self) -> int:
        return int(self.cfg["repeat_limit"])

    def _window(self) -> float:
        return float(self.cfg["repeat_window"])

    def _repeat(self, name, original, history, now):
        return hist.repeat_of(hist.components(original), history.get(name, ()), now, self._limit(), self._window())

    def _repeat_why(self, name, repeat) -> str:
        return ("repeat offender: returned to service %dx for %s within %s and drained for it again; "
                "`gpugate sweep forgive %s` clears the record" % (
                    repeat.count, repeat.component, hist.span(self._window()), name))

    def _resumed(self, rec, detail="") -> None:
        """RESUME done, and the history row the repeat rule counts."""
        comps = hist.components(reasons.parse(rec.reason, self.tag)) if rec.remedy != "rollout" else ()
        rung = {RESET: hist.RUNG_RESET, REBOOT: hist.RUNG_REBOOT}.get(rec.remedy, "")
        self.journal.resumed(rec.node, comps, detail, at=self.clock(), rung=rung)
        self._finish(rec.node, "resumed", "verified and returned to service")

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
        """Reservations an interrupted sweep of this journal left behind, with
        nothing in flight; never one it did not make (reservations.py)."""
        for name in reservations.stale(self.journal, self.slurm.reservations()):
            self.slurm.unreserve(name)

    def _rollout_reason(self, name: str) -> str:
        return rollout_reason(self.tag, self.baseline)


def rollout_reason(tag: str, baseline) -> str:
    """The reason a rollout drains an in-service node with: [previous] -> [pin]."""
    pin, prev = baseline.pin, baseline.previous
    findings = [Finding(ROLLOUT, c, prev.get(c), pin.get(c), "reconverge")
                for c in ("driver", "cuda_driver", "fabricmanager", "dcgm", "image", "kernel",
                          "container_toolkit") if prev is not None and prev.get(c) and prev.get(c) != pin.get(c)]
    return reasons.render(tag, ROLLOUT, findings or [Finding(ROLLOUT, "baseline", "previous", "pin", "")])


__all__ = ["Sweeper", "SweepReport", "SlurmError"]
