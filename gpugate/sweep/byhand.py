"""`gpugate smoke -w NODES`: the sweep's smoke job by hand, in a maintenance
reservation of its own, changing no node state.  The same submission, wait
and judgement as the sweep's stage (sweep.smoke), and the same pairing
(sweep.pairs); the CLI only renders what this returns."""

import os
from typing import Dict, List, Tuple

from gpugate.errors import SlurmError
from gpugate.sweep.pairs import FAIL, PairRun, PairVerdict, decide, run_rounds
from gpugate.sweep.partner import Lender
from gpugate.core.record import dataclass, field
from gpugate.sweep.slurm_smoke import run_pairs, run_smoke
from gpugate.schedulers.reservations import reservation_minutes
from gpugate.sweep.steps import hostlist


@dataclass
class ByHand:
    """Per node (passed, detail); the pair runs and each node's pair verdict."""

    verdicts: Dict[str, Tuple[bool, str]] = field(default_factory=dict)
    runs: List[PairRun] = field(default_factory=list)
    pair_verdicts: Dict[str, PairVerdict] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return all(p for p, _ in self.verdicts.values())


def smoke_by_hand(slurm, settings, baseline, nodes: List[str], pairs: bool) -> ByHand:
    """Run the smoke job on each node in service (a drained node takes no
    job), then with ``pairs`` the pair rounds among those that passed."""
    out = ByHand()
    states = slurm.nodes(hostlist(nodes))
    ready = []
    for name in nodes:
        st = states.get(name)
        if st is None:
            out.verdicts[name] = (False, "not a Slurm node")
        elif st.drain or st.down or not st.responding:
            out.verdicts[name] = (False, "not in service (%s): a drained node takes no job" % (st.reason or "down"))
        else:
            ready.append(name)
    if ready:
        reservation = "gpugate_smoke_%d" % os.getpid()
        slurm.reserve(reservation, hostlist(ready), reservation_minutes(settings.sweep))  # a kill -9 leaves it bounded
        try:
            results = run_smoke(slurm, settings.sweep, baseline, ready, reservation)
            out.verdicts.update({n: (r.passed, "job %s in %.0fs%s" % (r.job, r.seconds,
                                                                    "" if r.passed else ": " + r.problem))
                                 for n, r in results.items()})
            if pairs:
                _pair(out, slurm, settings, baseline, [n for n in ready if results[n].passed], ready, reservation)
        except SlurmError as exc:
            out.verdicts.update({n: (False, "not run: %s" % exc) for n in ready})
        finally:
            slurm.unreserve(reservation)
    for name, verdict in out.pair_verdicts.items():
        if verdict.verdict == FAIL:
            why = "; pair failed: pair=%s %s" % (verdict.partner, verdict.problem)
            out.verdicts[name] = (False, out.verdicts[name][1] + why)
    return out


def _pair(out: ByHand, slurm, settings, baseline, passed, ready, reservation) -> None:
    lender = Lender(slurm, reservation, ready) if settings.sweep["pair_with_in_service"] else None
    try:
        out.runs = run_rounds(passed, lambda p: run_pairs(slurm, settings.sweep, baseline, p, reservation), lender)
    finally:
        if lender is not None:
            lender.give_back()
    out.pair_verdicts = decide(passed, out.runs)
