"""The sweep's side of "RMA never bypasses the budget" (escalation.py):
the gate read from Slurm, and a deferred escalation recorded where an
admin looks (the node's reason, the journal: `gpugate sweep status`,
`gpugate status`, the metric of deferred nodes).  Mixed into engine.Sweeper."""

from gpugate.sweep import escalation as esc
from gpugate.sweep import journal as jr
from gpugate.sweep.plan import ESCALATE, floor_count

_DEFERRED = "escalation deferred: "  # plan.py's decision text, the journal's detail


class DeferStep:
    def _gate(self) -> esc.Gate:
        """The room for escalations of budgeted cause, from one fleet read."""
        snap, o = self.snapshot(), self.options
        return esc.Gate(snap.nodes.values(), o.budget_share, {p: floor_count(len(m), o.floors.get(p, o.floor))
                                                               for p, m in snap.partition_members().items()})

    def _defer(self, name, ours, found, why) -> None:
        """No room for the rma: the node stays drained and ours, with the
        sweep's note and the findings, and every later sweep asks again."""
        self.slurm.drain(name, esc.deferred_reason(self.tag, ours.cls, found))
        self.journal.record(name, "deferred", jr.DONE, detail=_DEFERRED + why)
        self._finish(name, "deferred", _DEFERRED + why)
        self.say("  %s: %s%s" % (name, _DEFERRED, why))

    def _hold(self, snap, current) -> None:
        """The plan's deferred escalations, recorded once: a node that
        already carries the deferred reason is left as it is."""
        for name, d in sorted(current.decisions.items()):
            view = snap.nodes[name]
            if d.remedy != ESCALATE or d.included or not d.why.startswith(_DEFERRED) or esc.deferred(view.ours):
                continue
            self.journal.enrol(name, ESCALATE, 0, view.reason)
            self._defer(name, view.ours, list(view.ours.findings), d.why[len(_DEFERRED):])
            self.report.outcomes[name].remedy = ESCALATE
