"""What `gpugate sweep` does, without click: the options from gpugate.toml,
the plan of this moment, the preview, the rollout's scope, a run under the
lock, and forgiving repeat offenders.  The CLI parses, calls these, renders."""

import os
import time
from typing import Callable, List, Optional, Sequence, Tuple

from gpugate.model import reason as reasons
from gpugate.errors import CommandError, ConfigError, GpugateError
from gpugate.model.findings import RMA
from gpugate.sweep import history as hist
from gpugate.sweep.plan import ESCALATE, Options, Plan, plan
from gpugate.core.record import replace
from gpugate.sweep.snapshot import Snapshot, take
from gpugate.sweep.steps import hostlist


class SweepBusy(GpugateError):
    pass


def options(settings, baseline, partition: Sequence[str] = (), nodes: Optional[str] = None,
            max_batch: Optional[int] = None) -> Options:
    """The planner's options: gpugate.toml's [sweep], the baseline's Xid policy, -p/-w/--max-batch."""
    from gpugate.core.names import parse_hostlist

    actions = {int(k): v for k, v in baseline.health.xid_actions.items()}
    cfg = settings.sweep
    return Options(
        max_batch=int(max_batch or cfg["max_batch"]), floor=float(cfg["floor"]),
        floors={k: float(v) for k, v in cfg["floors"].items()},
        nodes=frozenset(parse_hostlist(nodes)) if nodes else None,
        partitions=frozenset(partition) if partition else None,
        canary=int(cfg["canary"]),
        escalate_xids=frozenset(x for x, a in actions.items() if a in ("rma", "investigate")),
        repeat_limit=int(cfg["repeat_limit"]), repeat_window=float(cfg["repeat_window"]),
        reset=bool(cfg.get("reset", False)),
        reboot_xids=frozenset(x for x, a in actions.items() if a != "reset_gpu"),
        budget_share=float((getattr(settings, "drain_budget", None) or {}).get("max_share", 1)))


def _check_journal(settings) -> None:
    from gpugate.model.config import check_state

    path = str(settings.sweep["journal"])
    check_state(os.path.dirname(os.path.abspath(path)), files=(path,))


def open_journal(settings):
    from gpugate.sweep.journal import Journal

    _check_journal(settings)
    return Journal(str(settings.sweep["journal"]))


def lock(settings):
    """The sweep's lock (a second sweeper refuses to run), or SweepBusy."""
    from gpugate.safety.lock import RunLock

    _check_journal(settings)  # before the lock file is created in its directory
    path = lock_path(settings)
    held = RunLock(path)
    if not held.acquire():
        from gpugate.safety.lock import describe, held_for

        now = time.time()
        message = "another gpugate sweep (%s) holds %s; it must finish first" % (describe(held.holder, now), path)
        bound = batch_bound(settings)
        if held_for(held.holder, now) > bound:
            message += (". That is longer than one batch's time limits (%ds): if that sweep is stuck, stop it "
                        "(`gpugate sweep status` shows its last step; the next run continues from the journal)"
                        % bound)
        raise SweepBusy(message)
    return held


def lock_path(settings) -> str:
    """The sweep's lock: in a 0700 directory next to the journal (gpugate.safety.lock)."""
    from gpugate.safety.lock import lock_path as in_dir

    return in_dir(os.path.dirname(os.path.abspath(settings.sweep["journal"])), "sweep")


def batch_bound(settings) -> float:
    """The longest one batch may take by its own time limits: drain,
    converge, reboot, verify and the smoke job, with a retry of the last two."""
    cfg = settings.sweep
    return float(cfg["drain_timeout"]) + float(cfg["converge_timeout"]) + float(cfg["reboot_timeout"]) + 2 * (
        float(cfg["verify_timeout"]) + float(cfg["smoke_deadline"]))


def with_rollout(settings, baseline, slurm, transport, opts: Options) -> Options:
    """--rollout: the options with the in-service nodes still on [previous]."""
    if baseline.previous is None:
        raise ConfigError("%s: --rollout needs a [previous] block in the baseline" % settings.baseline)
    snap = take(slurm.nodes(), settings.reason_tag, time.time())
    scope = [n for n, v in snap.nodes.items() if v.in_service and (opts.nodes is None or n in opts.nodes)
             and (opts.partitions is None or set(v.partitions) & opts.partitions)]
    answers = transport.check(sorted(scope), ["--mode", "healthcheck"], float(settings.sweep["verify_timeout"]))
    return replace(opts, rollout=frozenset(n for n, a in answers.items() if isinstance(a, dict) and a.get("pending")))


def current_plan(settings, slurm, journal, opts: Options) -> Tuple[Plan, Snapshot]:
    """What a run would do now (changes nothing)."""
    snap = take(slurm.nodes(), settings.reason_tag, time.time())
    return plan(snap, replace(opts, in_flight=frozenset(journal.in_flight()), history=journal.history())), snap


def preview(settings, current: Plan) -> Tuple[List[str], str]:
    """The configured preview command on the first batch to converge: (argv, its output)."""
    from gpugate.safety.runner import run
    from gpugate.node.transport import expand

    template = settings.sweep["preview"]
    batches = [b for b in current.batches if b.remedy != ESCALATE]
    if not template or not batches:
        return [], "(no preview command configured, or nothing to converge)"
    argv = expand(template, list(batches[0].nodes))
    try:
        return argv, run(argv, float(settings.sweep["converge_timeout"]), ok_codes=range(256)).stdout
    except CommandError as exc:
        return argv, "preview failed: %s" % exc


def apply(settings, baseline, slurm, transport, journal, opts: Options, argv: Sequence[str], force: bool = False,
          say: Callable[[str], None] = lambda text: None):
    """Run the sweep (the caller holds the lock); the journal records the run."""
    journal.start_run(list(argv))
    report = sweeper_class(settings)(settings, baseline, slurm, transport, journal, opts, force=force, say=say).run()
    journal.end_run("stopped" if report.stopped else "ok")
    return report


def sweeper_class(settings):
    """The sweep engine for the scheduler gpugate.toml names: Slurm's, or
    Kubernetes' (the same planner, journal and ladder; its own evictions,
    reboot proof and smoke Pod: gpugate.sweep.kube_sweeper)."""
    if getattr(settings, "scheduler", "slurm") == "kubernetes":
        from gpugate.sweep.kube_sweeper import KubeSweeper

        return KubeSweeper
    from gpugate.sweep.engine import Sweeper

    return Sweeper


def forgive(settings, slurm, journal, names: Sequence[str], who: str = "") -> List[str]:
    """Clear the repeat-offender record of these nodes (the history is kept,
    marked forgiven).  A node that carries the sweep's repeat escalation is
    drained again with the reason it had before, so that the next sweep
    repairs and verifies it; any other reason is left as it is."""
    records = journal.nodes()
    states = slurm.nodes(hostlist(names)) if names else {}
    out = []
    for name in names:
        journal.note(name, hist.FORGIVEN, detail="forgiven%s" % (" by " + who if who else ""))
        st = states.get(name)
        ours = reasons.parse(st.reason, settings.reason_tag) if st is not None and st.drain else None
        # The sweep's rma for a repeat, or for the application's Xids on a GPU (an
        # older gpugate's "no automatic remedy"): back to the sweep, which resets
        # and diagnoses it (the node clears its Xid history on that drain).
        repeat = ours is not None and ours.cls == RMA and any(f.component in ("repeat", "xid_repeat")
                                                              for f in ours.findings)
        before = records[name].reason if name in records else ""
        if repeat and reasons.parse(before, settings.reason_tag) is not None:
            slurm.drain(name, before)
            out.append("%s: repeat record cleared; drained again as %r: the next gpugate sweep repairs and "
                       "verifies it" % (name, before))
        elif repeat:
            out.append("%s: repeat record cleared; the journal has no earlier reason: once it is fixed, "
                       "`scontrol update NodeName=%s State=RESUME`" % (name, name))
        else:
            out.append("%s: repeat record cleared%s" % (name, "" if st is not None else " (Slurm does not know it)"))
    return out
