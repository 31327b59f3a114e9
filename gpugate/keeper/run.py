"""The drain-budget keeper (`gpugate budget`): the one place that drains
nodes for budgeted findings.

Nodes never read the fleet: a node with a budgeted finding publishes it on
its own Slurm record (gpugate.slurm.pending) and keeps running jobs.  The
keeper runs on the controller (a systemd timer every 30 s, or `--watch`):

1. one fleet read (``REQUEST_NODE_INFO``);
2. gpugate.budget.rules.plan: per partition, the published nodes to
   drain, oldest first, up to the allowance; every other one held.  Only a
   finding the node itself signed recently counts (``screen``: the proof of
   gpugate.slurm.pending, the key gpugate.safety.budgetkey): an unverified
   tag (a paste, a copy, an old release's) is held and named, takes no
   budget.  No key here: the run fails, draining nothing;
3. a single-node read of each node it is about to drain (still published
   with the same reason, not drained, no reason of anyone else's), then one
   ``scontrol update NodeName=<hostlist> State=DRAIN`` per distinct reason
   (a wrong pin gives every node the same one);
4. only when it drained something: after Slurm's clock has passed the
   second of its drains, one more fleet read, and the drains ranked beyond
   an allowance that are this run's or a concurrent keeper's (stamped since
   this run's read began) are given back (gpugate.budget.rules.over).  Two
   keepers (two controller hosts) that decide at once may both drain; the
   later one's re-read sees both and gives back the excess, the ranking
   being the same for both.

That re-read is kept (budget-keeper-view.json, root's) and the next run on
this host decides on it instead of reading the fleet again, once, when it
is under CACHE_SECONDS old: a run that drains costs two full reads and the
one after it none, so a fleet-wide event costs slurmctld at most one full
read per run on average, two in the first minute.  Deciding on a view a
run old is safe: every node is re-read before it is drained, and a run
that drains reads the fleet after writing, counting every drain stamped
since that view was read.

The proofs' verdicts are kept too (budget-keeper-proofs.bin, root's,
HMACed under the budget key: gpugate.budget.proofs): a later run checks
afresh only the comments whose text changed since; a file it cannot trust
is no memory, and every proof is checked.

No keeper, no harm: without it budgeted findings are never drained; they
stay published and visible (`gpugate status`, the node log's
``action=held``, ``gpugate_drain_held``), and `gpugate metrics` exports the
keeper's last run (``gpugate_budget_keeper_last_run_timestamp_seconds``)
for the alert that fires when it is stale.  Acute findings never wait
for it: the node drains them at once."""

import os
import socket
import time

from gpugate.budget import rules as budget
from gpugate.budget import pins as budget_pins
from gpugate.budget import memory as keeper_memory
from gpugate.budget import keeper_pins
from gpugate.budget import pools as keeper_pools
from gpugate.budget import fleet_plan, proof_file, proofs as keeper_proofs
from gpugate.model import reason as reasons
from gpugate.errors import GpugateError, MirrorError
from gpugate.core.record import replace
from gpugate.keeper.view import save_view, take_view

STATUS_FILE = "budget-keeper.json"
LOCK_NAME = "budget-keeper"
# Slurm stamps reasons in whole seconds: past this, every drain stamped at
# or before ours is visible to the re-read.
SETTLE_SECONDS = 1.1
# One run ends well before the timer's next (30 s).
RUN_SECONDS = 25.0


def status_path(settings) -> str:
    """Beside the sweep journal and the latest audit (controller state)."""
    return os.path.join(os.path.dirname(os.path.abspath(settings.sweep["journal"])), STATUS_FILE)


def hostlist(nodes) -> str:
    from ClusterShell.NodeSet import NodeSet

    return str(NodeSet.fromlist(sorted(nodes)))


def run_once(settings, slurm, clock=time.time, sleep=time.sleep, view=None, memory=None, pools=None) -> dict:
    """One keeper run against ``slurm`` (a connected backend).  Returns its
    figures; raises GpugateError when Slurm fails (nothing half-decided is
    left: drains already sent are within the budget, or given back by the
    next run's or another keeper's re-read).  view: (read_at, states), the
    previous run's re-read, to decide on instead of reading the fleet; the
    figures carry this run's re-read as "_view" when it made one.  memory:
    the spans earlier runs drained (gpugate.budget.memory), the figures
    carry it brought up to date as "_memory".  pools: node -> the pools a
    held node was counted in (gpugate.budget.pools; Kubernetes, whose pools
    are labels), carried up to date as "_pools"; None (Slurm): none kept."""
    tag, share = settings.reason_tag, float(settings.drain_budget["max_share"])
    started = clock()
    read_at = started
    figures = {"started": round(started, 3), "host": socket.gethostname(), "pid": os.getpid(),
               "fleet_reads": 0, "single_reads": 0, "drained": [], "given_back": [], "skipped": {}}
    if not budget.switched_on(share):
        figures.update(ok=True, why="max_share = 1: the drain budget is off (nodes drain themselves)",
                       held=0, published=0, partitions={})
        return figures
    key = _key(settings)  # before any read: no key, nothing published is drained
    proofs = keeper_proofs.Proofs(key)  # each (node, comment) checked once
    kept_proofs = proof_file.path(status_path(settings)) if not proofs.old else None
    if kept_proofs:  # a new process (the timer's, or --watch's first run): what an earlier run kept, if trusted
        proofs.stored = proof_file.load(kept_proofs, key)
    from gpugate.slurm.nodestate.lean import of_states, paused_gc

    with paused_gc():  # one pause over the read and the decision: no collection walks the records between them
        if view is not None:
            read_at, fleet = view
            if isinstance(fleet, dict):  # a full read
                fleet = of_states(fleet)
            figures["view"] = "the last run's re-read, %.1f s old" % (started - read_at)
        else:
            fleet = read_fleet(slurm)
            figures["fleet_reads"] += 1
            _note_fleet_read(figures, slurm)
        if pools is not None:  # a held node counts in every pool it was held in, whatever its labels say now
            alone = {n: slurm.own_record(n) for n in keeper_pools.absent(fleet, pools)}
            figures["single_reads"] += len(alone)
            fleet = keeper_pools.count_held(fleet, pools, tag, alone)
        pins = keeper_pins.load(status_path(settings))  # the preflight pins drained in the last hour
        step = decide(fleet, proofs, tag, share, int(settings.preflight["pins_per_hour"]), memory or {}, clock,
                      pins)
    memory, waiting, decided, unverified = step.memory, step.waiting, step.plan, step.unverified
    # Re-read each node before writing: the single-node RPC alone (read locks only).
    groups = {}
    for name, reason in decided.drain:
        now = slurm.own_record(name)
        figures["single_reads"] += 1
        if now is not None:
            now = keeper_proofs.screen({name: now}, proofs, clock())[0][name]
        seen = budget.published(now, tag) if now is not None else None
        foreign = bool(now is not None and now.reason and reasons.parse(now.reason, tag) is None)
        if now is None or now.drain or foreign or seen is None or seen.reason != reason:
            figures["skipped"][name] = "changed since the fleet read"
            continue
        groups.setdefault(reason, []).append(name)
    for reason, names in sorted(groups.items()):
        try:
            slurm.drain(hostlist(names), reason)
        except MirrorError as exc:  # drained; their Nodes are held by their next health check
            figures.setdefault("mirror_errors", []).append(str(exc)[:300])
        figures["drained"] += sorted(names)
    final, mine, spans = fleet, step.mine, step.spans
    if figures["drained"]:
        sleep(SETTLE_SECONDS)
        reread_at = clock()
        final = read_fleet(slurm)
        figures["fleet_reads"] += 1
        _note_fleet_read(figures, slurm)
        raw_final = final
        if pools is not None:
            final = keeper_pools.count_held(final, pools, tag, alone)
        mine, unverified, spans = keeper_proofs.screen(final.states, proofs, clock())
        # Stamped since the view decided on was read: ours, or a concurrent keeper's.
        back = budget.over(mine, tag, share, int(read_at) - 1, final.sizes)
        if back:
            slurm.undrain(hostlist(back))
            figures["given_back"] = list(back)
        else:
            figures["_view"] = (reread_at, raw_final)  # as read: the next run counts the held pools anew
    # Held: published and not drained after this run (given back included);
    # an unverified tag is held too, and said so.
    kept = set(figures["drained"]) - set(figures["given_back"])
    given_back = set(figures["given_back"])
    raw, sizes, final = final.states, final.sizes, mine
    held, memo, held_in = {}, {}, {}
    for name, state in final.items():
        if name in unverified and not state.drain and budget.published(raw[name], tag) is not None:
            held[name] = unverified[name]
        elif name in kept or budget.published(state, tag, memo, spans) is None:
            continue
        elif not state.drain or name in given_back:
            held[name] = (waiting.get(name) or decided.held.get(name) or figures["skipped"].get(name)
                          or "given back: over the budget")
        else:
            continue
        for part in state.partitions:
            held_in[part] = held_in.get(part, 0) + 1
    memory = keeper_memory.drained(memory, kept, final, tag, clock())
    drained_for = dict(decided.drain)
    if pins is not None and any(budget_pins.pin_only(drained_for.get(n, ""), tag) for n in kept):
        keeper_pins.save(status_path(settings), keeper_pins.noted(
            pins, kept, drained_for, {n: final[n].partitions for n in kept if n in final}, tag, clock()))
    figures["_memory"] = {n: e for n, e in memory.items() if n not in given_back}
    if pools is not None:
        figures["_pools"] = keeper_pools.remember(final, tag, given_back)
    uses = budget.usage({n: replace(s, flags=s.flags - {"DRAIN"}) if n in given_back else s
                         for n, s in final.items()}, tag, share, sizes=sizes)
    if kept_proofs:  # when due: most runs of a fleet-wide event write nothing (--watch's later runs never)
        proof_file.save(kept_proofs, proofs)
    proofs.keep()
    figures.update(ok=True, held=len(held), held_nodes=dict(sorted(held.items())[:20]),
                   unverified=sum(1 for n in held if n in unverified),
                   partitions={p: {"size": u.size, "allowance": u.allowance, "drained": len(u.drained),
                                   "held": held_in.get(p, 0)}
                               for p, u in sorted(uses.items())},
                   took=round(clock() - started, 3))
    return figures


class Decision:
    """What decide() decided on one read: the screened states (``mine``),
    the unverified tags, the verified spans, the memory reviewed, the nodes
    waiting (a RESUMEd span, a preflight pin over its allowance) and the plan."""

    __slots__ = ("mine", "unverified", "spans", "memory", "waiting", "plan")

    def __init__(self, mine, unverified, spans, memory, waiting, plan):
        self.mine, self.unverified, self.spans = mine, unverified, spans
        self.memory, self.waiting, self.plan = memory, waiting, plan


def decide(fleet, proofs, tag: str, share: float, pins_per_hour: int, memory: dict, clock=time.time,
           pins=()) -> Decision:
    """The decision on one fleet read (gpugate.slurm.nodestate.lean.Fleet):
    what bench/bench_budget.py times, with the read.  pins: the preflight
    pins drained in the last hour (gpugate.budget.keeper_pins; None: unreadable)."""
    from gpugate.slurm.nodestate.lean import paused_gc

    with paused_gc():
        # Only what each node wrote itself takes a place in the queue and budget.
        mine, unverified, spans = keeper_proofs.screen(fleet.states, proofs, clock())
        # A span drained before and returned to service since waits for its node to sign it again.
        memory, waiting = keeper_memory.review(memory, mine, tag, clock())
        # A preflight's pins: at most [preflight] pins_per_hour a partition, within the budget besides.
        for name, why in budget_pins.pins_held(mine, tag, clock(), pins_per_hour, spans, pins).items():
            waiting.setdefault(name, why)
        planned = {n: s for n, s in spans.items() if n not in waiting} if waiting else spans
        return Decision(mine, unverified, spans, memory, waiting,
                        fleet_plan.plan_published(mine, tag, share, fleet.sizes, planned))


def read_fleet(slurm):
    """One full read, as a Fleet: the command backend's `scontrol show
    node` text read lean (gpugate.slurm.nodestate.show_fleet); any other
    backend's nodes()."""
    read = getattr(slurm, "fleet", None)
    if read is not None:
        return read()
    from gpugate.slurm.nodestate.lean import of_states

    return of_states(slurm.nodes(lean=True))


def _note_fleet_read(figures: dict, slurm) -> None:
    """Said in the run's status when the lean read refused the text and the
    fleet was read the full way (slower at scale: the admin should know why)."""
    how = getattr(slurm, "fleet_read", "")
    if isinstance(how, str) and how.startswith("full read"):
        figures["fleet_read"] = how


def _key(settings) -> bytes:
    from gpugate.safety.budgetkey import KeyUnavailable, load

    try:
        return load(settings)
    except KeyUnavailable as exc:
        raise KeyUnavailable("the keeper drains nothing published in node comments: %s" % exc) from None


def screen(states, key: bytes, now: float, checked=None):
    """(states, unverified): each node's comment reduced to the span that
    node wrote and signed recently (gpugate.slurm.pending), or to none;
    node -> why the tag there is unverified.  An admin's pasted span, or
    one copied from another node or from long ago, is never planned on.
    checked: a run's gpugate.budget.proofs.Proofs, shared by its calls
    (anything else: this call's own)."""
    proofs = checked if isinstance(checked, keeper_proofs.Proofs) else keeper_proofs.Proofs(key)
    return keeper_proofs.screen(states, proofs, now)[:2]


def record(settings, figures: dict, error: str = "", last_ok=False) -> dict:
    """Write the run's status (what `gpugate metrics` and `gpugate status`
    read): the last successful run's time survives a failed one; the
    failed runs in a row are counted.  last_ok: the keeper's last good run
    when another keeper ran it (a Kubernetes standby: the Lease's word)."""
    from gpugate.safety.state import read_json, write_json

    path = status_path(settings)
    last = read_json(path) or {}
    status = dict(figures)
    status["at"] = round(time.time(), 3)
    if error:
        status.update(ok=False, error=error[:500], last_ok=last.get("last_ok"),
                      failed_runs=failed_runs(last) + 1)
    else:
        status["last_ok"] = status["at"] if last_ok is False else last_ok
        status["failed_runs"] = 0
    from gpugate.safety.safeio import makedirs

    makedirs(os.path.dirname(path), 0o755)
    write_json(path, status, durable=False)
    return status


def failed_runs(status) -> int:
    """The keeper's failed runs in a row, as its status counts them (0 when it does not say)."""
    runs = (status or {}).get("failed_runs")
    return runs if isinstance(runs, int) and not isinstance(runs, bool) and runs > 0 else 0


def read_status(settings):
    """The keeper's latest status, or None (never ran here)."""
    from gpugate.safety.state import read_json

    return read_json(status_path(settings))


class _host_lock:
    """One keeper run at a time on this host (the timer and a --watch loop
    alike): gpugate's lock only root can take (gpugate.safety.lock, in the
    0700 locks/ beside the status file); other hosts are settled through
    Slurm (see the module doc)."""

    def __init__(self, settings):
        from gpugate.safety.lock import RunLock, lock_path

        self.lock = RunLock(lock_path(os.path.dirname(status_path(settings)), LOCK_NAME))

    def __enter__(self):
        from gpugate.safety.lock import describe

        if not self.lock.acquire():
            raise GpugateError("another gpugate budget run holds %s (%s)" % (
                self.lock.path, describe(self.lock.holder, time.time())))
        return self

    def __exit__(self, *exc):
        self.lock.release()
        return False


def run(settings, connect=None) -> dict:
    """One run as `gpugate budget` makes it: connect with a deadline, run,
    record the outcome (failures too: the metric says how long since the
    last good run).  On Kubernetes through the Lease (gpugate.keeper.kube_lead)."""
    if connect is None:
        from gpugate.schedulers.registry import connect
    try:
        with _host_lock(settings):
            slurm = connect(settings, deadline=time.monotonic() + RUN_SECONDS)
            memory = None
            try:
                if getattr(slurm, "memory_on_lease", False):  # Kubernetes: memory and status on the Lease
                    from gpugate.keeper import kube_lead as keeper_lead

                    figures = keeper_lead.run(settings, slurm, failed_runs(read_status(settings)), lambda mem, pools: (
                        run_once(settings, slurm, view=take_view(settings, time.time()), memory=mem, pools=pools)))
                else:
                    standby = slurm.lead(socket.gethostname())
                    if standby:
                        return record(settings, {"fleet_reads": 0, "drained": [], "given_back": [], "ok": True,
                                                 "standby": standby[:300]})
                    figures = run_once(settings, slurm, view=take_view(settings, time.time()),
                                       memory=keeper_memory.load(status_path(settings)))
                    memory = figures.pop("_memory", None)
            finally:
                slurm.close()
            view = figures.pop("_view", None)
            if view is not None:
                save_view(settings, *view)
            if memory is not None:
                keeper_memory.save(status_path(settings), memory)
    except GpugateError as exc:
        return record(settings, {"fleet_reads": 0, "drained": [], "given_back": []}, str(exc) or type(exc).__name__)
    error = figures.pop("_error", "")
    if "standby" in figures:  # the keeper's last good run is the leader's, from the Lease
        return record(settings, figures, last_ok=figures.pop("last_ok", None))
    return record(settings, figures, error)
