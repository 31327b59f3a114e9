"""The sweep's plan: a pure function of (snapshot, options).

Which of gpugate's drained nodes to work on in this run, grouped into batches
by remedy, oldest drain first, never a node whose reason is no longer
gpugate's, and never more nodes in the sweep's hands at once than each
partition can spare:

    budget(partition) = members - floor - out for other reasons - in flight

Nodes gpugate drained and nobody works on yet do not count against the floor
(they are out either way); nodes out for any other reason (an admin's drain,
down, not responding) and nodes already in the sweep's hands do.

A repeat offender (history.py: returned to service ``repeat_limit`` times for
a component within ``repeat_window`` and drained for it again) is escalated,
whatever its remedy would be.
"""

import math
from typing import Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

from gpugate.model.findings import BROKEN, DRIFT, HEALTH, PROBE, RMA, ROLLOUT
from gpugate.core.names import is_node_name
from gpugate.sweep import escalation as esc
from gpugate.sweep import history as hist
from gpugate.core.record import dataclass, field, replace

RECONVERGE = "reconverge"
RESET = "reset"
REBOOT = "reboot"
ESCALATE = "escalate"
REMEDIES = (RECONVERGE, RESET, REBOOT, ESCALATE)

# health components a reboot (which resets every GPU) can fix; the rest escalate.
_REBOOT_FIXES = {"xid", "sxid", "fallen_off_bus", "gpu", "gpu_count", "gpus_lost", "pci_gpus", "recovery", "ecc", "retired_pages", "nvlink",
                 "ecc_during_job", "remap_during_job", "fabric", "processes", "nvml", "nvml_gpus",
                 "pcie_gen", "pcie_width", "row_remap",
                 "preflight", "preflight_busbw", "preflight_setup", "preflight_across"}  # a reboot retrains links, applies remaps; verify proves it
_RECONVERGE_FIXES = {"dkms"}  # broken, but only a converge (build the module) fixes it
# The reset rung (issue 28): what a GPU reset clears, per finding.  Volatile
# ECC counts, pending row remaps and page retirements (applied at the reset),
# a recovery action asking for a reset, and the Xids whose policy action is
# reset_gpu (NVIDIA's catalog: RESET_GPU).  Not: a GPU off the bus (Xid 79)
# or lost, a GPU missing, drift, anything else: those reboot or reconverge.
_RESET_FIXES = {"ecc": None, "row_remap": ("pending",), "retired_pages": ("pending",),
                "recovery": ("gpu reset", "drain and reset")}
_NOT_RESET_XIDS = frozenset((79, 154))  # off the bus; 154 names its own recovery
# AMD (gpugate.vendors.amd.judge_gpus, judge_events): what a reset clears (RAS counters, pending
# pages retired, links retrained), what only a reboot does (the driver could
# not recover), and what no repair does (pages it could not retire, the
# driver's bad-page threshold reached): by the finding's observed words.
_AMD_RESET_FIXES = {"ras": None, "ras_deferred": None, "xgmi": None, "bad_pages": ("pending",),
                    "amdgpu_event": ("ue", "de", "ue_event", "poison"), "amdgpu_repeat": ("ring_timeout",)}
_AMD_ESCALATE = {"bad_pages": ("unreservable", "threshold", "retired"), "amdgpu_event": ("bad_page_threshold",)}
_REBOOT_FIXES |= set(_AMD_RESET_FIXES)
# The application's Xids on one GPU for different users (judges.apprepeat):
# as NVSentinel (RUN_DCGMEUD first), a GPU reset proven by the deep
# diagnostic (the node's verification runs it: node.xidhistory.deepen), never
# rma at once; a pass clears the GPU's history.  The ladder still applies.
_RESET_FIXES["xid_repeat"] = None
_REBOOT_FIXES.add("xid_repeat")


@dataclass(frozen=True)
class Options:
    max_batch: int = 8
    floor: float = 0.5  # < 1: a fraction of each partition; >= 1: a node count
    floors: Mapping[str, float] = field(default_factory=dict)  # per partition
    nodes: Optional[FrozenSet[str]] = None  # only these (--nodes)
    partitions: Optional[FrozenSet[str]] = None  # only nodes in these (--partition)
    in_flight: FrozenSet[str] = frozenset()  # in the journal, not finished
    exclude: FrozenSet[str] = frozenset()  # already handled in this run
    rollout: Optional[FrozenSet[str]] = None  # nodes still on `previous` (sweep --rollout)
    canary: int = 1
    canary_done: bool = False  # the sweep's canary batch already passed in this run
    escalate_xids: FrozenSet[int] = frozenset()  # Xids whose action is rma/investigate
    history: Mapping[str, Tuple[hist.Event, ...]] = field(default_factory=dict)  # the journal's, per node
    repeat_limit: int = 0  # 0: repeat offenders are not escalated
    repeat_window: float = 7 * 86400.0
    reset: bool = False  # the reset rung ([sweep] reset)
    reboot_xids: FrozenSet[int] = frozenset()  # Xids whose policy action is not reset_gpu
    budget_share: float = 1.0  # [drain_budget] max_share: bounds rma of budgeted cause (escalation.py)


@dataclass(frozen=True)
class Decision:
    node: str
    included: bool
    remedy: Optional[str]
    why: str
    batch: Optional[int] = None
    repeat: Optional[hist.Repeat] = None  # escalated as a repeat offender


@dataclass(frozen=True)
class PartitionFigures:
    name: str
    members: int
    in_service: int
    out_other: int
    pending: int  # drained by gpugate, waiting
    in_flight: int
    floor: int
    budget: int


@dataclass(frozen=True)
class Batch:
    index: int
    remedy: str
    nodes: Tuple[str, ...]
    canary: bool = False


@dataclass(frozen=True)
class Plan:
    batches: Tuple[Batch, ...]
    decisions: Mapping[str, Decision]
    partitions: Mapping[str, PartitionFigures]


def remedy_for(ours, options: Options) -> Tuple[Optional[str], str]:
    """(remedy, why) for a node gpugate drained; remedy None: not the sweep's."""
    cls = ours.cls
    first = ours.first
    component = first.component if first else ""
    if component == "sweep" and cls != RMA:
        # A sweep was interrupted (halted, or its journal lost): continue its remedy.
        word = first.observed.split(" ")[0] if first.observed else ""
        if esc.deferred(ours):
            return ESCALATE, "its escalation was deferred (drain budget or floor): rma once there is room"
        remedy = {"reconverge": RECONVERGE, "rollout": RECONVERGE, "reboot": REBOOT}.get(word, REBOOT)
        if first.observed.endswith("after repair"):  # `gpugate sweep repaired` (repaired.py)
            return remedy, "repaired after rma: %s, verify, smoke test, then resume" % remedy
        return remedy, "an earlier sweep left it mid-way (%s): %s again" % (first.observed, remedy)
    if cls == PROBE:
        return None, "probe drains clear themselves once the node answers"
    if cls == RMA:
        return None, "escalated (rma): a human must look; never resumed automatically"
    if cls in (DRIFT, ROLLOUT):
        return RECONVERGE, "%s: reconverge to the pin" % cls
    if cls == BROKEN:
        if component in _RECONVERGE_FIXES or (component == "module" and first.observed.startswith("none")):
            return RECONVERGE, "broken %s: converge (build/install the module), reboot" % component
        return REBOOT, "broken %s: reload by reboot" % (component or "stack")
    if cls == HEALTH:
        # What no repair brings back, in any finding the reason names, not
        # only the first: a reason keeps the events that drained the node
        # (an Xid) before later findings (gpugate.model.ownership).
        findings = ours.findings or (first,)
        escalating = [x for x in _xids(ours) if x in options.escalate_xids]
        if escalating:
            return ESCALATE, "Xid %d: the policy says rma/investigate" % escalating[0]
        if any(f.component == "row_remap" and f.observed == "failure" for f in findings):
            return ESCALATE, "row remap failure: out of spare rows"
        final = [f for f in findings if _amd_words(f.observed, _AMD_ESCALATE.get(f.component, ()))]
        if final:  # a reboot would not bring it back either
            return ESCALATE, "health %s %s: no repair brings it back" % (final[0].component, final[0].observed)
        if component == "xid":
            xid = (_xids(ours) or [-1])[0]
            return REBOOT, "Xid %d: reset by reboot" % xid
        if component in _REBOOT_FIXES:
            if resettable(ours, options):
                return RESET, "health %s: a GPU reset clears it (reboot if it does not)" % component
            return REBOOT, "health %s: reset by reboot" % component
        return ESCALATE, "health %s: no automatic remedy" % (component or "?")
    return None, "unknown class %r" % cls


def _xids(ours) -> list:
    """The Xid codes a reason names, in its order (a code that does not read as one: -1)."""
    codes = []
    for f in ours.findings or ((ours.first,) if ours.first else ()):
        if f.component == "xid":
            try:
                codes.append(int(f.observed))
            except ValueError:
                codes.append(-1)
    return codes


def resettable(ours, options: Options) -> bool:
    """Whether a GPU reset can clear every finding of this reason (all
    shown: a reason cut at ``+N more`` hides some, so it is rebooted)."""
    if not options.reset or ours.cls != HEALTH or ours.more or not ours.findings:
        return False
    for f in ours.findings:
        if f.component == "xid":
            try:
                xid = int(f.observed)
            except ValueError:
                return False
            if xid in _NOT_RESET_XIDS or xid in options.reboot_xids or xid in options.escalate_xids:
                return False
        elif f.component in _AMD_RESET_FIXES:
            words = _AMD_RESET_FIXES[f.component]
            if words is not None and not _amd_words(f.observed, words):
                return False
        elif f.component not in _RESET_FIXES:
            return False
        elif _RESET_FIXES[f.component] is not None and f.observed not in _RESET_FIXES[f.component]:
            return False
    return True


def _amd_words(observed: str, words) -> bool:
    """Does an AMD finding's observed value name one of these? ("1 pending",
    "ue umc", "bad_page_threshold", "threshold exceeded")."""
    said = observed.replace(":", " ").split()
    return any(w in said for w in words)


def floor_count(members: int, floor: float) -> int:
    if floor < 1:
        return int(math.ceil(floor * members - 1e-9))
    return min(int(floor), members)


def partition_figures(snapshot, options: Options) -> Dict[str, PartitionFigures]:
    figures = {}
    for part, names in snapshot.partition_members().items():
        views = [snapshot.nodes[n] for n in names]
        members = len(views)
        in_flight = sum(1 for v in views if v.name in options.in_flight)
        out_other = sum(1 for v in views if v.out_for_others and v.name not in options.in_flight)
        pending = sum(1 for v in views if v.ours is not None and v.name not in options.in_flight)
        in_service = sum(1 for v in views if v.in_service)
        floor = floor_count(members, options.floors.get(part, options.floor))
        if options.rollout is not None:
            # A rollout takes healthy nodes out: only what is in service counts.
            budget = max(in_service - floor, 0)
        else:
            budget = max(members - floor - out_other - in_flight, 0)
        figures[part] = PartitionFigures(part, members, in_service, out_other, pending, in_flight, floor, budget)
    return figures


def plan(snapshot, options: Options) -> Plan:
    figures = partition_figures(snapshot, options)
    decisions: Dict[str, Decision] = {}
    candidates: List[Tuple[str, str]] = []  # (node, remedy)
    escalations: List[str] = []
    for view in sorted(snapshot.nodes.values(), key=_age_order):
        if not _in_scope(view, options):
            continue
        if view.name in options.in_flight:
            decisions[view.name] = Decision(view.name, False, None, "in flight: the journal continues it")
            continue
        if view.name in options.exclude:
            decisions[view.name] = Decision(view.name, False, None, "handled earlier in this run")
            continue
        if not is_node_name(view.name):
            decisions[view.name] = Decision(view.name, False, None,
                                            "name unsafe in a command line or path: left to an admin")
            continue
        if options.rollout is not None:
            if view.name in options.rollout and not view.drain and view.in_service:
                candidates.append((view.name, RECONVERGE))
            elif view.ours is not None and view.ours.cls == ROLLOUT:
                candidates.append((view.name, RECONVERGE))  # drained by an earlier rollout run
            elif view.name in options.rollout:
                decisions[view.name] = Decision(view.name, False, None, "on the previous pin but out of service")
            continue
        if view.ours is None:
            if view.drain:
                decisions[view.name] = Decision(view.name, False, None,
                                                "drained by someone else (%r): not gpugate's" % view.reason[:60])
            continue
        remedy, why = remedy_for(view.ours, options)
        remedy, why = _ladder(view, options, snapshot.taken_at, remedy, why)
        repeat = None
        if remedy in (RECONVERGE, RESET, REBOOT):
            repeat = hist.repeat_of(hist.components(view.ours), options.history.get(view.name, ()),
                                    snapshot.taken_at, options.repeat_limit, options.repeat_window)
        if repeat is not None:
            escalations.append(view.name)
            decisions[view.name] = Decision(
                view.name, True, ESCALATE, "repeat offender: returned to service %dx for %s within %s "
                "(limit %d): rma" % (repeat.count, repeat.component, hist.span(options.repeat_window),
                                     options.repeat_limit), repeat=repeat)
        elif remedy is None:
            decisions[view.name] = Decision(view.name, False, None, why)
        elif remedy == ESCALATE:
            escalations.append(view.name)
            decisions[view.name] = Decision(view.name, True, ESCALATE, why)
        else:
            candidates.append((view.name, remedy))
            decisions[view.name] = Decision(view.name, True, remedy, why)

    escalations = _gated(snapshot, options, figures, escalations, decisions)
    batches: List[Batch] = []
    if escalations:  # changes a reason only: costs no capacity now (the gate bounds what rma holds)
        batches.append(Batch(1, ESCALATE, tuple(escalations)))
    batches += _batches(snapshot, options, figures, candidates, decisions, start=len(batches) + 1)
    return Plan(tuple(batches), decisions, figures)


def _gated(snapshot, options: Options, figures, escalations: List[str], decisions) -> List[str]:
    """The escalations that go now; one of budgeted cause without room in
    the budget or above the floor waits, and says why (escalation.py)."""
    views = [snapshot.nodes[n] for n in escalations]
    decided = esc.decide(lambda: esc.Gate(snapshot.nodes.values(), options.budget_share,
                                          {p: f.floor for p, f in figures.items()}),
                         [(v.name, v.ours, list(v.ours.findings), v.partitions) for v in views])
    for name, (_, held) in decided.items():
        if held is not None:
            decisions[name] = Decision(name, False, ESCALATE, "escalation deferred: " + held)
    return [n for n in escalations if decided[n][1] is None]


def _ladder(view, options: Options, now: float, remedy, why):
    """Fewer good nodes to RMA, no bad node back (issue 28): a fault that
    came back within the repeat window after a GPU reset is rebooted, not
    reset again; one that came back after a reset and then a reboot is
    escalated."""
    if remedy not in (RESET, REBOOT) or not (remedy == RESET or resettable(view.ours, replace(options, reset=True))):
        return remedy, why
    rungs = hist.rungs_within(hist.components(view.ours), options.history.get(view.name, ()), now,
                              options.repeat_window)
    span = hist.span(options.repeat_window)
    if hist.ladder_spent(hist.components(view.ours), options.history.get(view.name, ()), now,
                         options.repeat_window):
        return ESCALATE, ("came back within %s after a GPU reset and then a reboot: the ladder's last rung "
                          "failed, rma" % span)
    if remedy == RESET and hist.RUNG_RESET in rungs:
        return REBOOT, "came back within %s after a GPU reset: reboot, not another reset" % span
    return remedy, why


def _batches(snapshot, options, figures, candidates, decisions, start) -> List[Batch]:
    """Cut the candidates into batches.  Each batch fits every partition's
    budget on its own (the previous batch is back in service, or stopped the
    sweep, before the next starts); the first rollout batch is the canary."""
    out: List[Batch] = []
    remaining = []
    for name, remedy in candidates:
        # A partition at its floor blocks its nodes in every batch of this run.
        blocked = [p for p in snapshot.nodes[name].partitions if figures[p].budget <= 0]
        if blocked:
            decisions[name] = Decision(name, False, remedy, _floor_why(figures, blocked))
        else:
            remaining.append((name, remedy))
    index = start
    canary = options.rollout is not None and not options.canary_done
    while remaining:
        limit = max(1, min(options.max_batch, options.canary if canary else options.max_batch))
        budget = {p: f.budget for p, f in figures.items()}
        taken: Dict[str, List[str]] = {}
        size = 0
        for name, remedy in remaining:
            if size >= limit:
                break  # full: the rest waits, in age order
            parts = snapshot.nodes[name].partitions
            if all(budget[p] > 0 for p in parts):
                for p in parts:
                    budget[p] -= 1
                taken.setdefault(remedy, []).append(name)
                size += 1
        # One remedy per batch, the first of REMEDIES among what fits; the
        # rest waits for the next batch with its age order and the whole
        # budget again.  The sweep (engine.Sweeper.run) does exactly this:
        # it runs the first batch of a fresh plan, then plans again without
        # the nodes it handled, so the plan numbers batches as --apply runs them.
        remedy = next(r for r in REMEDIES if r in taken)
        chosen = set(taken[remedy])
        out.append(Batch(index, remedy, tuple(taken[remedy]), canary=canary))
        for name in taken[remedy]:
            why = decisions[name].why if name in decisions else "still on the previous pin: roll out"
            decisions[name] = Decision(name, True, remedy, why, batch=index)
        index += 1
        canary = False
        remaining = [c for c in remaining if c[0] not in chosen]
    return out


def _floor_why(figures, blocked: Sequence[str]) -> str:
    if not blocked:
        return "no budget left in this run"
    f = figures[blocked[0]]
    return ("partition %s at its floor: %d of %d must stay in service, %d out for other reasons, %d in flight"
            % (f.name, f.floor, f.members, f.out_other, f.in_flight))


def _in_scope(view, options: Options) -> bool:
    if options.nodes is not None and view.name not in options.nodes:
        return False
    if options.partitions is not None and not set(view.partitions) & options.partitions:
        return False
    return True


def _age_order(view):
    """Oldest drain first; unknown times last; then by name."""
    return (view.reason_time is None, view.reason_time or 0, view.name)
