"""Which node broke a job's all_reduce across its nodes (issue 36).  Pure:
the job's nodes and a way to run groups of them in, each node's verdict
out.

A collective that fails names no node: any rank's HCA, cable, switch port
or GPU can slow or break it.  The rule, after Google's
cluster-health-scanner and the sweep's pairs (gpugate.sweep.pairs):

1. Round 1: every node of the job in one group.  It passes: all good.  It
   cannot decide (the command cannot run, no result): nothing is known.
2. A failed group of three or more is halved; the halves of two or more
   run at once.  A half that passes proves its nodes good.
3. A failed pair, or a half of one node, breaks up: each of its nodes runs
   as a pair with a node already proven good (one not tried with it).  One
   that passes is good.  One that fails runs once more, with another proven
   partner which now hosts the run (the collective's rendezvous is the
   first node's): failing again, it failed every group it was in and two
   proven partners, and is the culprit; passing, it is good.
4. Never pinned: a node no good partner was left for, a node whose runs
   could not decide, and every node when more than a quarter of the job
   (at least one) would be pinned: that many at once is the fabric or the
   floor, not the nodes.

Work: a failed round 1 costs ceil(log2(N)) halving rounds and two pair
rounds; each node is in one run per round; nothing grows with
the job per node but the number of rounds."""

from typing import Callable, Dict, List, Sequence, Set, Tuple

from gpugate.core.record import dataclass

PASS, FAIL, UNDECIDED = "pass", "fail", "undecided"
GOOD, CULPRIT, UNKNOWN = "good", "culprit", "unknown"


@dataclass(frozen=True)
class GroupRun:
    nodes: Tuple[str, ...]
    outcome: str  # pass | fail | undecided
    problem: str = ""  # what failed: "busbw=12.1GB/s" / "wrong=3" / "exit 1" / "timed out"
    expected: str = ""  # the floor or rule it failed, for the reason's "(want ...)"
    kind: str = ""  # wrong | busbw | abort | hang, for a fail


@dataclass
class Search:
    verdicts: Dict[str, str]  # node -> good | culprit | unknown
    pinned_by: Dict[str, GroupRun]  # a culprit's second failed pair run (its first: first_strike)
    first_strike: Dict[str, GroupRun]
    runs: List[GroupRun]
    rounds: int
    why: str = ""  # why nothing was pinned, when a round failed

    @property
    def culprits(self) -> List[str]:
        return sorted(n for n, v in self.verdicts.items() if v == CULPRIT)


RunGroups = Callable[[List[Tuple[str, ...]]], List[GroupRun]]


def search(nodes: Sequence[str], run_groups: RunGroups, max_rounds: int = 0) -> Search:
    """Each node's verdict (the module's rule).  ``run_groups(groups)`` runs
    disjoint groups at once and answers a GroupRun for each, in order;
    ``max_rounds`` (0: no limit but the rule's) stops early, leaving the
    undecided nodes unknown."""
    order = list(dict.fromkeys(nodes))
    verdicts = {n: UNKNOWN for n in order}
    found = Search(verdicts, {}, {}, [], 0)
    if not order:
        return found
    good: Set[str] = set()
    failing: List[Tuple[str, ...]] = [tuple(order)]
    singles: List[str] = []
    tried: Set[Tuple[str, str]] = set()
    first = True
    while failing or singles:
        if max_rounds and found.rounds >= max_rounds:
            found.why = "stopped after %d rounds" % found.rounds
            break
        groups = list(failing) if first else _halves(failing, singles)
        failing = []
        pairs, singles = _pairs(singles, good, tried, found.first_strike)
        if not groups and not pairs:
            found.why = "no node proven good to tell %s apart" % ", ".join(singles)[:200]
            break  # suspects left with no good partner: unknown
        answers = run_groups(groups + list(pairs))
        if len(answers) != len(groups) + len(pairs):
            raise ValueError("run_groups answered %d runs for %d groups" % (len(answers), len(groups) + len(pairs)))
        found.rounds += 1
        found.runs += answers
        if first and answers[0].outcome != FAIL:
            if answers[0].outcome == PASS:
                verdicts.update({n: GOOD for n in order})
            else:
                found.why = "the all_reduce across the nodes could not decide: %s" % answers[0].problem
            return found
        first = False
        for group, answer in zip(groups, answers):
            if answer.outcome == PASS:
                _good(group, good, verdicts)
            elif answer.outcome == FAIL:
                failing.append(group)
            # undecided: its nodes stay unknown, never pinned
        for pair, answer in zip(pairs, answers[len(groups):]):
            suspect, partner = (pair[1], pair[0]) if pair[1] in found.first_strike else pair
            tried.add((suspect, partner))
            if answer.outcome == PASS:
                found.first_strike.pop(suspect, None)
                _good(pair, good, verdicts)
            elif answer.outcome == FAIL and suspect in found.first_strike:
                verdicts[suspect] = CULPRIT
                found.pinned_by[suspect] = answer
            elif answer.outcome == FAIL:
                found.first_strike[suspect] = answer
                singles.append(suspect)  # once more, with another proven partner
    _cap(order, found)
    if not found.culprits and not found.why:
        found.why = "no node pinned: the failure followed no single node"
    return found


def _halves(failing: List[Tuple[str, ...]], singles: List[str]) -> List[Tuple[str, ...]]:
    """Groups of four or more halved; smaller ones' nodes join ``singles``."""
    out = []
    for group in failing:
        halves = [group[:len(group) // 2], group[len(group) // 2:]] if len(group) >= 3 else [group]
        for half in halves:
            if len(half) >= 2 and len(group) >= 3:
                out.append(half)
            else:
                singles += list(half)  # a pair's two, or a half of one: each with a proven partner
    return out


def _pairs(singles: List[str], good: Set[str], tried: Set[Tuple[str, str]], struck: Dict[str, GroupRun]
           ) -> Tuple[List[Tuple[str, str]], List[str]]:
    """Each suspect with a proven node it has not run with, every node in
    one pair at most: (suspect, partner) the first time, (partner, suspect)
    the second; (pairs, suspects left waiting)."""
    used: Set[str] = set()
    pairs, waiting = [], []
    for suspect in singles:
        partner = next((g for g in sorted(good) if g not in used and (suspect, g) not in tried), None)
        if partner is None:
            waiting.append(suspect)
            continue
        used.add(partner)
        pairs.append((partner, suspect) if suspect in struck else (suspect, partner))
    return pairs, waiting


def _good(nodes, good: Set[str], verdicts: Dict[str, str]) -> None:
    for node in nodes:
        if verdicts[node] != CULPRIT:
            verdicts[node] = GOOD
            good.add(node)


def _cap(order: List[str], found: Search) -> None:
    culprits = found.culprits
    limit = max(1, len(order) // 4)
    if len(culprits) > limit:
        for node in culprits:
            found.verdicts[node] = UNKNOWN
        found.pinned_by.clear()
        found.why = ("%d of %d nodes failed with proven partners (more than %d): the fabric or the floor, "
                     "not the nodes; none pinned" % (len(culprits), len(order), limit))
