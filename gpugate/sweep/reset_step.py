"""The sweep's evidence and reset steps (issue 28), mixed into engine.Sweeper
like steps.Steps: ``_step_evidence`` keeps what the node knows before a reset
or a reboot wipes it (gpugate/sweep/evidence.py), ``_step_reset`` is the
reset rung (the node side: gpugate/vendors/nvidia/reset.py, gpugate/vendors/amd/reset.py).

The reset rung runs on a drained, idle node (wait_drained came first): the
batch's maintenance reservation is made (the smoke job runs in it), the node
takes the sweep's work reason (as after a reboot), then `gpugate reset-gpus`
runs on it through the transport.  A node whose reset fails takes the
failure path (engine._attempt_failed: the reboot rung), counted by the
circuit breaker.  A sweeper killed during the reset finds the step started
and runs it again: the node side restarts the services an interrupted run
left stopped, and a reset of a reset GPU is a reset.
"""

from typing import Dict, List, Optional, Tuple

from gpugate.model import reason as reasons
from gpugate.sweep import evidence
from gpugate.sweep import journal as jr
from gpugate.sweep.steps import hostlist


class ResetStep:
    def _step_evidence(self, nodes, records) -> None:
        self._begin(nodes, "evidence")
        if int(self.cfg["evidence_keep"]) == 0:
            for name in nodes:
                self._done(name, "evidence", "off (evidence_keep = 0)")
            return
        results = evidence.collect(self, nodes, self.journal.nodes())
        for name in nodes:
            complete, bundle, detail = results[name]
            text = ("kept " if complete else "incomplete, kept ") + detail if bundle else detail
            self._done(name, "evidence", text)
            self.say("  %s: evidence %s" % (name, text))

    def _step_reset(self, nodes, records) -> None:
        self._begin(nodes, "reset")
        states = self._states(nodes)
        ready = []
        for name in nodes:
            st = states.get(name)
            if st is None or not st.drain or reasons.parse(st.reason, self.tag) is None:
                self._leave(name, "reason changed before the GPU reset: %r" % (st.reason if st else "gone"))
            else:
                ready.append(name)
        self._reserve(ready)
        for (_, reason_text), group in self._work_groups(ready, records).items():
            self.slurm.drain(hostlist(group), reason_text)  # in the sweep's hands, as after a reboot
        timeout = float(self.cfg["reset_timeout"])
        answers: Dict[str, object] = {}
        for gpus, group in sorted(_by_gpus(ready, records, self.tag).items()):
            args = ["reset-gpus", "--timeout", "%g" % timeout]
            for gpu in gpus:
                args += ["--gpu", str(gpu)]
            try:
                # Each node's own commands are bounded by --timeout; the whole call by two resets' worth.
                answers.update(self.transport.run(group, args, 4 * timeout + 60))
            except Exception as exc:  # noqa: BLE001 (a transport that cannot start: the nodes fail, the sweep goes on)
                answers.update({n: "the reset could not be run: %s" % exc for n in group})
        for name in ready:
            answer = answers.get(name, "no answer")
            if isinstance(answer, dict) and answer.get("ok") is True and answer.get("node") in (None, name):
                steps = answer.get("steps") or []
                said = "; ".join("%s: %s" % (s.get("step"), " ".join(str(s.get("detail")).split())[:80])
                                 for s in steps if isinstance(s, dict))
                self._done(name, "reset", ("all GPUs" if answer.get("all") else "GPUs %s" % answer.get("gpus"))
                           + " reset: " + said)
                continue
            why = answer.get("error") if isinstance(answer, dict) else answer
            self.failures.add(name)
            self.journal.record(name, "reset", jr.FAILED, detail=str(why))
            self._attempt_failed(name, records[name], "GPU reset failed: %s" % why)


def _by_gpus(nodes: List[str], records, tag) -> Dict[Tuple[int, ...], List[str]]:
    """Nodes grouped by the GPUs their findings name (() for all: a finding
    without a GPU, or a reason that does not say)."""
    out: Dict[Tuple[int, ...], List[str]] = {}
    for name in nodes:
        out.setdefault(_gpus(records[name].reason, tag), []).append(name)
    return out


def _gpus(reason_text: str, tag: str) -> Tuple[int, ...]:
    ours: Optional[reasons.ParsedReason] = reasons.parse(reason_text, tag)
    if ours is None or ours.more or not ours.findings or any(f.gpu is None for f in ours.findings):
        return ()
    return tuple(sorted({f.gpu for f in ours.findings}))
