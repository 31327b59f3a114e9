"""The sweep's steps, one method per journaled step (``_step_<name>``),
each taken together for every node of a batch at that step.  The engine
(engine.py) decides which step comes next and what a failure leads to.

Every read here names only the nodes the step is about (`scontrol show node
--json HOSTLIST` from 23.02, `sinfo -n HOSTLIST` on 22.05): a batch of four
on a 10,000-node fleet reads four nodes, not the fleet.
"""

from typing import Dict, List

from gpugate.model import reason as reasons
from gpugate.errors import CommandError
from gpugate.model.findings import ROLLOUT, Finding
from gpugate.safety.runner import run
from gpugate.sweep import journal as jr
from gpugate.schedulers.reservations import reservation_minutes
from gpugate.node.transport import expand
from gpugate.sweep.waits import poll_until

_REBOOT_FLAGS = {"REBOOT_REQUESTED", "REBOOT_ISSUED"}


def hostlist(nodes) -> str:
    from ClusterShell.NodeSet import NodeSet

    return str(NodeSet.fromlist(sorted(nodes)))


class Steps:
    """Mixed into engine.Sweeper, which provides journal, slurm, cfg, tag,
    failures, _begin/_done, _leave, _finish, _attempt_failed, _work_groups,
    _work_reason and _resumed."""

    def _states(self, nodes) -> Dict[str, object]:
        """Slurm's view of these nodes only (one call)."""
        return self.slurm.nodes(hostlist(nodes)) if nodes else {}

    def _wait(self, nodes, settle, timeout) -> set:
        return poll_until(nodes, self._states, settle, timeout, float(self.cfg["poll_seconds"]), self.sleep,
                          note=lambda text: self.say("  %s: %s" % (hostlist(nodes), text)))

    def _step_drain(self, nodes, records) -> None:
        """Rollout: take in-service nodes on the previous pin out, with a rollout reason."""
        self._begin(nodes, "drain")
        states = self._states(nodes)
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
            self.slurm.drain(hostlist(group), reason_text)
            for name in group:
                self._done(name, "drain")

    def _step_wait_drained(self, nodes, records) -> None:
        self._begin(nodes, "wait_drained")
        if self.force:
            # --force: the admin accepts killing the jobs still running there.
            self.slurm.cancel_jobs(hostlist(nodes))

        def settle(states, waiting):
            for name in sorted(waiting):
                st = states.get(name)
                if st is None or not st.drain or reasons.parse(st.reason, self.tag) is None:
                    self._leave(name, "its reason is no longer gpugate's: %r" % (st.reason if st else "gone"))
                    yield name
                elif st.drained or st.down:
                    self._done(name, "wait_drained")
                    yield name

        for name in sorted(self._wait(nodes, settle, float(self.cfg["drain_timeout"]))):
            self.journal.record(name, "deferred", jr.DONE, detail="jobs still running at the drain timeout")
            self._finish(name, "deferred", "still draining: left for the next run")

    def _step_converge(self, nodes, records, template=None, step="converge") -> None:
        template = list(template if template is not None else self.cfg["converge"])
        self._begin(nodes, step)
        if not template:
            for name in nodes:
                self._done(name, step, "no converge command configured: reboot only")
            return
        timeout = float(self.cfg["converge_timeout"])
        if self.cfg["converge_per"] == "node" or len(nodes) == 1:
            failed = self._converge_each(nodes, template, timeout, step)
        else:
            error = _converge(template, list(nodes), timeout)
            failed = self._converge_each(nodes, template, timeout, step, error) if error else {}
            if not error:
                for name in nodes:
                    self._done(name, step)
            elif len(failed) == len(nodes):
                # It failed for every node on its own too: the site's tool is
                # broken, which says nothing about the nodes. Stop; escalate none.
                for name in nodes:
                    self.journal.record(name, step, jr.STARTED, detail=failed[name])
                self.report.stopped = ("the %s command failed for the whole batch and for each node on its own "
                                       "(%s): fix it, then run gpugate sweep again" % (step, failed[nodes[0]]))
                return
        for name in sorted(failed):
            self.failures.add(name)
            self.journal.record(name, step, jr.FAILED, detail=failed[name])
            self._attempt_failed(name, records[name], "%s failed: %s" % (step, failed[name]))

    def _converge_each(self, nodes, template, timeout, step, batch_error="") -> Dict[str, str]:
        """One node at a time: {node: error} of those that failed.  After a
        batch failure (one bad host can fail a whole Ansible run), so that
        the others go on to reboot and only the failing ones take the
        failure path."""
        if batch_error:
            self.say("  %s failed for %s (%s); trying each node on its own" % (step, hostlist(nodes), batch_error))
        failed = {}
        for name in nodes:
            if batch_error:
                # Journaled per node: a sweeper killed here redoes only the nodes not recorded done.
                self.journal.record(name, step, jr.STARTED, detail="per node, the batch failed: " + batch_error)
            error = _converge(template, [name], timeout)
            if error:
                failed[name] = error
            else:
                self._done(name, step, "converged on its own after the batch failed" if batch_error else "")
        return failed

    def _step_rollback(self, nodes, records) -> None:
        self._step_converge(nodes, records, template=self.cfg["rollback"], step="rollback")

    def _step_reboot(self, nodes, records) -> None:
        self._begin(nodes, "reboot")
        states = self._states(nodes)
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
        self._reserve(ready)
        for (_, reason_text), group in self._work_groups(ready, records).items():
            self.slurm.reboot(hostlist(group), reason_text, next_state="DOWN")
            for name in group:
                self._done(name, "reboot")

    def _reserve(self, nodes) -> None:
        """The batch's maintenance reservation over these nodes (the smoke job
        runs in it), made where missing, for reservation_minutes at most."""
        existing = self.slurm.reservations() if nodes else {}
        by_reservation: Dict[str, List[str]] = {}
        current = self.journal.nodes()
        for name in nodes:
            by_reservation.setdefault(current[name].reservation, []).append(name)
        for reservation, group in sorted(by_reservation.items()):
            if reservation not in existing:
                self.slurm.reserve(reservation, hostlist(group), reservation_minutes(self.cfg))

    def _step_wait_up(self, nodes, records) -> None:
        self._begin(nodes, "wait_up")

        def settle(states, waiting):
            back = []
            for name in sorted(waiting):
                st = states.get(name)
                if st is None or (st.flags & _REBOOT_FLAGS) or not st.responding:
                    continue
                # Ours (Slurm appends ": reboot complete"), or cleared when
                # ReturnToService revived it; anyone else's reason wins.
                if st.reason and reasons.parse(st.reason, self.tag) is None:
                    self._leave(name, "reason changed during the reboot: %r" % st.reason)
                    yield name
                    continue
                back.append(name)
            for (_, reason_text), group in self._work_groups(back, records).items():
                # Drained again with a gpugate reason: out of service until verified.
                self.slurm.drain(hostlist(group), reason_text)
                for name in group:
                    self._done(name, "wait_up")
                    yield name

        for name in sorted(self._wait(nodes, settle, float(self.cfg["reboot_timeout"]))):
            self.failures.add(name)
            self.journal.record(name, "wait_up", jr.FAILED, detail="slurmd did not register in time")
            self._attempt_failed(name, records[name], "did not come back from the reboot")

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
            _journal_diag(self.journal, name, answer)
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
                self.last_answers[name] = answer  # its DCGM run, for the evidence bundle
                self.last_findings[name] = [Finding.from_json(f) for f in answer.get("findings", [])
                                            if isinstance(f, dict) and "class" in f and "component" in f]
            self.journal.record(name, "verify", jr.FAILED, detail=str(why))
            self._attempt_failed(name, records[name], "verification failed: %s" % why)

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
            from gpugate.node.check import baseline_id

            self._baseline_sha = baseline_id(self.settings.baseline).get("sha256")
        return self._baseline_sha

    def _step_resume(self, nodes, records) -> None:
        self._begin(nodes, "resume")
        states = self._states(nodes)
        ok = []
        for name in nodes:
            st = states.get(name)
            if st is not None and not st.drain and not st.reason and records[name].step == "resume":
                # Our RESUME went through before a crash: nothing left to do.
                self._resumed(records[name], "resumed before the sweeper was interrupted")
                continue
            # Compare, then set: only the reason the sweep itself set may be
            # cleared (Slurm may have appended ": reboot complete").
            expected = self._work_reason(records[name])
            if st is None or not (st.reason == expected or st.reason.startswith(expected + " :")):
                self._leave(name, "reason changed during the sweep: %r" % (st.reason if st else "gone"))
            else:
                ok.append(name)
        if ok:
            self.slurm.resume(hostlist(ok))
            for name in ok:
                self._resumed(records[name])
            self._clear_published(ok, states)

    def _clear_published(self, nodes, states) -> None:
        """A node the sweep verified and resumed may still carry a budgeted
        finding it published before (gpugate.slurm.pending) until its next
        health check clears it: the budget keeper would drain it again for
        the old finding meanwhile.  Clear gpugate's part now (the admin's
        text stays); a failure only leaves it to that health check."""
        from gpugate.errors import GpugateError
        from gpugate.slurm import pending

        for name in nodes:
            st = states.get(name)
            if st is None or pending.read(getattr(st, "comment", "")) is None:
                continue
            try:
                self.slurm.set_comment(name, pending.clear(st.comment))
            except GpugateError as exc:
                self.say("  %s: its published finding stays until its next health check (%s)" % (name, exc))

    def _wait_in_service(self, nodes) -> None:
        """Resumed nodes count toward the floor only once Slurm has them in
        service (a rebooted slurmd can show as not responding for a ping or
        two): wait for that before planning the next batch."""
        def settle(states, waiting):
            return [n for n in waiting if states.get(n) is not None and states[n].in_service]

        waiting = self._wait(nodes, settle, float(self.cfg["reboot_timeout"]))
        if waiting:
            self.say("  %s resumed but not yet in service; the floor counts them as out" % hostlist(waiting))


def _journal_diag(journal, name, answer) -> None:
    """Each DCGM level the node's check ran, as its own proof in the journal."""
    facts = answer.get("facts") if isinstance(answer, dict) else None
    diag = facts.get("dcgm_diag") if isinstance(facts, dict) else None
    if not isinstance(diag, dict) or "level" not in diag:
        return
    for level in diag.get("passed_levels") or ():
        journal.stage(name, "diag r%d" % level, jr.DONE, "pass")
    bad = [r for r in diag.get("results") or () if isinstance(r, dict) and r.get("status") != "Pass"]
    clean = diag.get("exit_code") == 0 and not bad and diag.get("results")
    journal.stage(name, "diag r%d" % diag["level"], jr.DONE if clean else jr.FAILED,
                  "pass" if clean else "; ".join("%s %s" % (r.get("test"), r.get("status")) for r in bad[:3])
                  or "exit %s" % diag.get("exit_code"))


def _converge(template, nodes, timeout) -> str:
    """Run the converge (or rollback) command for these nodes: "" or the error."""
    try:
        run(expand(template, nodes), timeout)
    except CommandError as exc:
        return str(exc) or "failed"
    return ""
