"""The smoke stage, shared by every scheduler: after the node-side checks
pass, a real workload on each verified node proves it (Slurm: a job in the
batch's reservation, gpugate.sweep.slurm_smoke; Kubernetes: a Pod,
gpugate.sweep.kube_sweeper).  Here: the result of one proof, the finding a
failed one leaves, which command and which bandwidth a node is held to, and
the stage's journal entries.  The result is judged by gpugate.judges.smoke
(exit code, nccl-tests' own correctness lines, average bus bandwidth against
the baseline's per-product minimum)."""

from typing import Dict, List

from gpugate.core.record import dataclass
from gpugate.model.findings import RMA, Finding
from gpugate.sweep import journal as jr
from gpugate.sweep.pairs import FAIL

@dataclass
class SmokeResult:
    node: str  # the node, or "a,b" for a pair's job
    job: str = ""
    passed: bool = False
    problem: str = ""  # e.g. "busbw=23.4GB/s (want >= 350)"
    seconds: float = 0.0
    site: str = ""  # the command never ran (a wrong path): the site's configuration, not the node


def _by_vendor(baseline, nodes) -> List[List[str]]:
    """The nodes in groups of one GPU vendor, in their order (one group on a
    one-vendor fleet): a 2-node job runs one vendor's collective library."""
    vendor_for = getattr(baseline, "vendor_for", None)
    groups: Dict[str, List[str]] = {}
    for node in nodes:
        groups.setdefault(vendor_for(node) if vendor_for is not None else "nvidia", []).append(node)
    return list(groups.values())


def _command_key(baseline, node: str, pair: bool) -> str:
    """[sweep] smoke / smoke_pair, or their _amd twins on an AMD node (rccl-tests)."""
    key = "smoke_pair" if pair else "smoke"
    vendor_for = getattr(baseline, "vendor_for", None)  # a baseline stand-in without vendors: NVIDIA's
    return key + "_amd" if vendor_for is not None and vendor_for(node) == "amd" else key


def _want(baseline, nodes):
    """The minimum busbw for these nodes' product (a pair: the pair table,
    and only when both nodes are the same listed product)."""
    products = {baseline.expect_for(n).product for n in nodes}
    table = baseline.smoke_min_pair_busbw if len(nodes) > 1 else baseline.smoke_min_busbw
    product = products.pop() if len(products) == 1 else None
    return table.get(product) if product else None


def finding(problem: str) -> Finding:
    """The reason's finding: `gpugate: rma smoke=all_reduce busbw=23.4GB/s (want >= 350)`."""
    observed, _, want = problem.partition(" (want ")
    return Finding(RMA, "smoke", "all_reduce " + observed, want.rstrip(")") or "pass", "rma")


class SmokeStep:
    """Mixed into engine.Sweeper (next to steps.Steps)."""

    smoke_unit = "job"  # what runs the proof, in the journal: a Slurm job (a Pod on Kubernetes)

    def _step_smoke(self, nodes, records) -> None:
        self._begin(nodes, "smoke")
        if not self.cfg["smoke"]:
            for name in nodes:
                self._done(name, "smoke", "no smoke job configured")
            return
        self._smoke_nodes(nodes, records)

    def _failed_pair_before(self, name) -> bool:
        """Did an earlier attempt of this sweep fail the node on its pairs?"""
        events = self.journal.events(name)
        since = max((i for i, e in enumerate(events) if e[2] == "planned"), default=-1)
        return any(e[2] == "smoke" and e[3] == jr.FAILED and e[6].startswith("pair=") for e in events[since + 1:])

    def _journal_smoke(self, nodes, results, runs, verdicts) -> str:
        """Each proof as its own journal entry: the single job, every pair
        the node ran (or why it ran none: the odd one out, not re-proven).  Returns the
        first "the command cannot run" it saw, else ""."""
        site = ""
        for name in nodes:
            res = results[name]
            detail = "%s %s %s in %.0fs" % (self.smoke_unit, res.job or "-", "passed" if res.passed else res.problem,
                                             res.seconds)
            self.journal.stage(name, "smoke single", jr.DONE if res.passed else jr.FAILED, detail)
            site = site or (res.site and "%s on %s: %s" % (_command(self.cfg["smoke"]), name, res.site))
            mine = [r for r in runs if name in r.nodes]
            for run in mine:
                partner = run.nodes[1] if run.nodes[0] == name else run.nodes[0]
                where = "" if partner in nodes else " (in service)"
                self.journal.stage(name, "smoke pair", jr.DONE if run.passed else jr.FAILED,
                                   "round %d with %s%s: %s" % (run.round, partner, where, run.detail))
                site = site or (run.site and "%s on %s: %s" % (_command(self.cfg["smoke_pair"]),
                                                              ",".join(run.nodes), run.site))
            alone = verdicts.get(name)
            if alone is not None and not mine and not site:  # the odd one out, or not re-proven
                self.journal.stage(name, "smoke pair", jr.FAILED if alone.verdict == FAIL else jr.DONE, alone.problem)
        return site

    def _smoke_cannot_run(self, nodes, site) -> None:
        """The command never ran: the site's configuration, not the nodes.
        No node takes the failure path; they stay drained with the sweep's
        work reason (the next run takes them up again) and the sweep stops."""
        for name in nodes:
            self.journal.record(name, "smoke", jr.STARTED, detail="cannot run: " + site)
        if "smoke_output_dir" in site:  # no proof root can trust: none is judged, none resumed
            self.report.stopped = ("no smoke proof can be trusted (%s): not the nodes' fault, none was failed or "
                                   "resumed; the nodes stay drained for the next gpugate sweep" % site)
            return
        self.report.stopped = ("the smoke command cannot run (%s): not the nodes' fault, none was failed. Set "
                               "[sweep] smoke (or smoke_pair) in gpugate.toml to the right path, or smoke = [] to "
                               "turn the stage off; the nodes stay drained for the next gpugate sweep" % site)


def _command(argv) -> str:
    return " ".join(str(a) for a in argv)[:120]


__all__ = ["SmokeStep", "SmokeResult", "finding"]
