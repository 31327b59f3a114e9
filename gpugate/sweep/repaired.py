"""`gpugate sweep repaired NODES`: the way back from rma after a hardware
repair (a GPU replaced), through the sweep's proof, never a bare RESUME.

For each node whose reason is gpugate's rma (and nothing else: a reason
gpugate did not write is never overwritten), the repeat-offender record is
cleared as `sweep forgive` does (the history stays, marked forgiven) and
the rma reason is replaced by the sweep's work reason

    gpugate: health sweep=reboot after repair (want verified)

(the class it was drained for when the journal knows it; ``reconverge``
for versions and a broken stack).  A work reason is the sweep's: the
node's own checks keep it (gpugate.model.ownership), the drain budget
counts it, and the next `gpugate sweep --apply` takes the node, reboots
(or converges and reboots) it, verifies it, runs the smoke job and only
then RESUMEs it; a node that fails is retried, then escalated again."""

from typing import List, Sequence, Tuple

from gpugate.model import reason as reasons
from gpugate.model.findings import BROKEN, CHECK_CLASSES, DRIFT, HEALTH, RMA, ROLLOUT, Finding
from gpugate.sweep import history as hist
from gpugate.sweep import journal as jr
from gpugate.sweep.steps import hostlist

AFTER_REPAIR = "after repair"  # the work reason's observed value ends so: plan.remedy_for says why


def repaired_reason(tag: str, original) -> str:
    """The work reason for a repaired node; ``original`` is the gpugate
    reason the sweep had recorded for it (None when unknown)."""
    cls = original.cls if original is not None else HEALTH
    cls = DRIFT if cls == ROLLOUT else (cls if cls in CHECK_CLASSES else HEALTH)
    remedy = "reconverge" if cls in (DRIFT, BROKEN) else "reboot"
    return reasons.render(tag, cls, [Finding(cls, "sweep", "%s %s" % (remedy, AFTER_REPAIR), "verified", "")])


def repaired(settings, slurm, journal, names: Sequence[str], who: str = "") -> Tuple[List[str], List[str]]:
    """(what was done, what was refused), one line per node."""
    tag = settings.reason_tag
    records = journal.nodes()
    states = slurm.nodes(hostlist(names)) if names else {}
    done, refused = [], []
    for name in names:
        st = states.get(name)
        ours = reasons.parse(st.reason, tag) if st is not None and st.reason else None
        if st is None:
            refused.append("%s: refused: Slurm does not know it" % name)
            continue
        if ours is None or ours.cls != RMA:
            refused.append("%s: refused, left as it is: %s" % (name, _not_rma(st, ours)))
            continue
        record = records.get(name)
        text = repaired_reason(tag, reasons.parse(record.reason, tag) if record is not None else None)
        changed = _changed(slurm, name, st.reason)
        if changed:
            refused.append("%s: refused, left as it is: %s" % (name, changed))
            continue
        by = " by " + who if who else ""
        journal.note(name, hist.FORGIVEN, detail="repaired%s: rma %r -> %r" % (by, st.reason, text))
        journal.stage(name, "repaired", jr.DONE, detail="repaired%s: was %r" % (by, st.reason))
        slurm.drain(name, text)
        up = "" if st.responding else " (Slurm says it is not responding: the sweep's reboot waits for slurmd)"
        done.append("%s: repaired: repeat record cleared; rma reason replaced by %r; the next `gpugate sweep "
                    "--apply` reboots, verifies and smoke-tests it, and only then resumes it%s" % (name, text, up))
    return done, refused


def _changed(slurm, name: str, reason: str) -> str:
    """Why the node's reason is no longer the rma reason read ("": it still is):
    its own record, read again just before the write, so that a reason an
    admin set since the read is never overwritten."""
    now = slurm.own_record(name)
    if now is None:
        return "Slurm no longer knows it"
    if now.reason != reason:
        return ("its reason changed since it was read (%r, was %r): a reason gpugate did not write is never "
                "replaced; run it again if the node is still to return from rma" % (now.reason[:80], reason[:80]))
    return ""


def _not_rma(st, ours) -> str:
    if ours is not None:
        return "gpugate's %s reason, not rma: the sweep works on it already" % ours.cls
    if st.reason:
        return "its reason is not gpugate's rma (%r): a reason gpugate did not write is never replaced" % st.reason[:80]
    return "not drained by gpugate (%s, no reason): nothing to return" % st.state.lower()
