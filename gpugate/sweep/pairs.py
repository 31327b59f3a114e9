"""The smoke stage's 2-node pairs ([sweep] pairs = true): after every node of
a batch ran its single-node job, the nodes that passed run one 2-node job per
pair, in the same reservation, which proves the inter-node path (HCAs,
cables, switch ports) a single-node run never touches.

The rule (pure, below; the jobs go through gpugate.sweep.smoke):

1. Round 1: the passed nodes sorted by name, paired in order (a,b) (c,d) ...;
   an odd one out pairs with an idle in-service node of its partition when
   pair_with_in_service allows it (gpugate.sweep.partner), else runs no
   pair: journaled "pair not run: odd node out", which is no failure.
2. A failed pair makes both its nodes suspects.  Round 2: each suspect runs
   once more with a *different* partner, one that passed its pair first (a
   known good node tells the two apart), else another suspect.
3. A node passes when it passed any pair.  It fails (the retry, rollback,
   rma path, reason `smoke=all_reduce pair=PARTNER ...`) when it failed pairs
   with two different partners, or failed its only pair and no other
   partner was left to tell it from its partner: then both stay suspects
   together and the retry (reboot) runs them again.  A node is never failed
   for a partner it could be told apart from.
4. A node retried after failing its pairs must pass a pair again: alone in
   the retry (no partner), it fails once more ("not re-proven").
"""

from typing import Dict, FrozenSet, List, Sequence, Set, Tuple

from gpugate.core.record import dataclass

PASS, FAIL, UNPAIRED = "pass", "fail", "unpaired"
ODD_ONE_OUT = "pair not run: odd node out"
NOT_REPROVEN = "not re-proven: no partner (it failed its pairs in an earlier attempt)"


@dataclass(frozen=True)
class PairRun:
    nodes: Tuple[str, str]
    round: int
    passed: bool
    detail: str  # "job 12 passed in 3s" or "job 12 busbw=... in 3s"
    problem: str = ""
    site: str = ""  # the pair command never ran: the site's configuration


@dataclass(frozen=True)
class PairVerdict:
    node: str
    verdict: str  # pass | fail | unpaired
    partner: str = ""  # of the pair that decided it (the last failed one for a fail)
    problem: str = ""


def first_round(nodes: Sequence[str]) -> Tuple[List[Tuple[str, str]], List[str]]:
    """(pairs, odd one out): sorted names paired in order."""
    ordered = sorted(set(nodes))
    pairs = [(ordered[i], ordered[i + 1]) for i in range(0, len(ordered) - 1, 2)]
    return pairs, ordered[len(pairs) * 2:]


def second_round(suspects: Set[str], good: Set[str], tried: Set[FrozenSet[str]]) -> List[Tuple[str, str]]:
    """Each suspect with a partner it has not run with, a good node first;
    every node in at most one pair."""
    used: Set[str] = set()
    pairs = []
    candidates = sorted(good) + sorted(suspects)
    for node in sorted(suspects):
        if node in used:
            continue
        partner = next((p for p in candidates if p != node and p not in used and frozenset((node, p)) not in tried),
                       None)
        if partner is not None:
            used.update((node, partner))
            pairs.append((min(node, partner), max(node, partner)))
    return pairs


def decide(nodes: Sequence[str], runs: Sequence[PairRun], failed_before: Set[str] = frozenset()
           ) -> Dict[str, PairVerdict]:
    """Each node's verdict from the pair runs it was in (see the module's
    rule).  ``failed_before``: nodes retried after failing pairs; alone now,
    they are not proven (a reboot proves nothing about the link)."""
    out = {}
    for node in sorted(set(nodes)):
        mine = [r for r in runs if node in r.nodes]
        if not mine and node in failed_before:
            out[node] = PairVerdict(node, FAIL, "none", NOT_REPROVEN)
            continue
        if not mine:
            out[node] = PairVerdict(node, UNPAIRED, problem=ODD_ONE_OUT)
            continue
        passed = [r for r in mine if r.passed]
        if passed:
            out[node] = PairVerdict(node, PASS, _partner(passed[-1], node))
            continue
        # Failed every pair it ran: two partners, or the only one it could have.
        last = mine[-1]
        out[node] = PairVerdict(node, FAIL, _partner(last, node), last.problem)
    return out


def _partner(run: PairRun, node: str) -> str:
    return run.nodes[1] if run.nodes[0] == node else run.nodes[0]


def run_rounds(nodes, run_pairs, partner_for=None) -> List[PairRun]:
    """Round 1, then round 2 for the suspects; the runs in order.
    ``run_pairs(pairs)`` runs the jobs (gpugate.sweep.slurm_smoke.run_pairs):
    {"a,b": SmokeResult}; ``partner_for(odd)``, when given, an in-service
    partner for round 1's odd one out (or None).  Only the batch's nodes
    are judged or reused as partners.  A site fault (the pair command cannot
    run) stops after its round: another round would only fail the same way."""
    from gpugate.errors import SlurmError

    pairs, odd = first_round(nodes)
    partner = partner_for(odd[0]) if odd and partner_for is not None else None
    if partner is not None:
        pairs.append((odd[0], partner))
    batch = set(nodes)
    runs: List[PairRun] = []
    for number in (1, 2):
        if not pairs:
            break
        try:
            results = run_pairs(pairs)
        except SlurmError as exc:
            results = {}
            runs += [PairRun(p, number, False, "not run: %s" % exc, "not run: %s" % exc) for p in pairs]
        for pair in pairs:
            res = results.get(",".join(pair))
            if res is None:
                continue
            detail = "job %s %s in %.0fs" % (res.job or "-", "passed" if res.passed else res.problem, res.seconds)
            runs.append(PairRun(pair, number, res.passed, detail, res.problem, res.site))
        if number == 2 or any(r.site for r in runs):
            break
        good = {n for r in runs if r.passed for n in r.nodes} & batch
        suspects = {n for r in runs if not r.passed for n in r.nodes} & batch
        pairs = second_round(suspects, good, {frozenset(r.nodes) for r in runs})
    return runs


__all__ = ["first_round", "second_round", "decide", "run_rounds", "PairRun", "PairVerdict", "PASS", "FAIL",
           "UNPAIRED", "ODD_ONE_OUT"]
