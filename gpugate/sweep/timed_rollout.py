"""`gpugate sweep --apply --rollout-if-in-progress`: the rollout mode the
sweep's timer can run.

`gpugate sweep --rollout` is not for a timer: a rollout run repairs no
other drained node, it fails where the baseline has no [previous], and once
its canary batch passed the sweep's own proofs it rolls every other batch in
the same run, before anyone watched the canary under real jobs.  This mode
repairs first (what `gpugate sweep --apply` does), and only while the
baseline says `[rollout] in_progress = true` rolls the canary batch (`[sweep]
canary` nodes still on [previous]) once per rollout, and never more: the
rest of the fleet waits for approval, which is an admin running `gpugate
sweep --rollout --apply` by hand after looking at the canary.  A rollout is
"already canaried" when the sweep journal records a node the rollout took
(its reason names this [previous] -> [pin]; the journal's rollouts table,
kept when the node is enrolled again later, for a drain_timeout deferral's
reconverge or for an Xid after its rollback), or when a node of the scope is
on the new pin already; then nothing more is rolled, and a canary that failed
(rolled back or escalated) is never followed by another one on the timer."""

import time
from typing import Optional, Tuple

from gpugate.model.findings import ROLLOUT
from gpugate.core.record import replace
from gpugate.sweep.engine import rollout_reason
from gpugate.sweep.plan import Options
from gpugate.sweep.snapshot import take
from gpugate.sweep.steps import hostlist


def canary(settings, baseline, slurm, transport, journal, opts: Options) -> Tuple[Optional[Options], str]:
    """(the options of a canary-only rollout run, or None; what it decided, for the admin)."""
    if not baseline.rollout_in_progress or baseline.previous is None:
        return None, "no rollout in progress ([rollout] in_progress is false): nothing rolled"
    key = rollout_reason(settings.reason_tag, baseline)
    taken = journal.rollout_taken(key)
    snap = take(slurm.nodes(), settings.reason_tag, time.time())
    rolling = sorted(n for n, v in snap.nodes.items() if v.ours is not None and v.ours.cls == ROLLOUT)
    if taken or rolling:
        return None, _waiting(taken or rolling)
    scope = [n for n, v in snap.nodes.items() if v.in_service and (opts.nodes is None or n in opts.nodes)
             and (opts.partitions is None or set(v.partitions) & opts.partitions)]
    answers = transport.check(sorted(scope), ["--mode", "healthcheck"], float(settings.sweep["verify_timeout"]))
    pending = sorted(n for n, a in answers.items() if isinstance(a, dict) and a.get("pending"))
    on_pin = sorted(n for n, a in answers.items() if isinstance(a, dict) and a.get("fit") is True
                    and not a.get("pending"))
    if not pending:
        return None, ("rollout in progress, but no node in scope is still on [previous]: when every node is on "
                      "the pin, set [rollout] in_progress = false")
    if on_pin:
        return None, _waiting(on_pin)
    size = max(1, min(int(opts.canary), int(opts.max_batch)))
    chosen = frozenset(pending[:size])
    return replace(opts, rollout=chosen, canary_done=False), (
        "rollout in progress: the canary batch (%s) rolls now; the other %d node(s) on [previous] wait for "
        "approval (`gpugate sweep --rollout --apply`)" % (hostlist(sorted(chosen)), len(pending) - len(chosen)))


def _waiting(nodes) -> str:
    return ("rollout in progress: the canary (%s) is rolled already; the rest waits for approval: watch the "
            "canary, then `gpugate sweep --rollout --apply` by hand rolls the nodes still on [previous] (the "
            "timer never does)" % hostlist(nodes))


def merged(first, second):
    """One report of the repair run and the canary run that followed it."""
    first.outcomes.update(second.outcomes)
    first.batches.extend(second.batches)
    first.stopped = first.stopped or second.stopped
    for part, count in second.max_out.items():
        first.max_out[part] = max(first.max_out.get(part, 0), count)
    return first
