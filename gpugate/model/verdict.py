"""Findings -> verdict: fit or not, the class, the Reason, the exit code."""

from __future__ import annotations


from gpugate.model import reason
from gpugate.model.findings import CHECK_CLASSES, NOT_RUN, PENDING, Finding, sort_findings
from gpugate.core.record import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Optional, Sequence, Tuple

EXIT_FIT = 0
EXIT_UNFIT = 1
EXIT_USAGE = 2


@dataclass(frozen=True)
class Verdict:
    """Findings decided: fit or not, the class, the reason."""

    fit: bool
    cls: Optional[str]  # the class of the leading finding (acute first, then most severe)
    reason: Optional[str]
    findings: Tuple[Finding, ...]  # unfit findings, most severe first
    notes: Tuple[Finding, ...] = ()  # reported only (pending rollout)
    not_verified: Tuple[Finding, ...] = ()  # checks that did not run (DCGM diag on MIG): neither pass nor fail

    @property
    def exit_code(self) -> int:
        return EXIT_FIT if self.fit else EXIT_UNFIT

    @property
    def acute(self) -> bool:
        """Unfit for an intrinsic event: drains at once, outside the drain budget."""
        return any(f.acute for f in self.findings)

    @property
    def actions(self) -> Tuple[str, ...]:
        return tuple(dict.fromkeys(f.action for f in self.findings))


def decide(findings: Sequence[Finding], tag: str) -> Verdict:
    unfit = sort_findings([f for f in findings if f.cls in CHECK_CLASSES])
    notes = tuple(f for f in findings if f.cls == PENDING)
    not_verified = tuple(f for f in findings if f.cls == NOT_RUN)
    if not unfit:
        return Verdict(True, None, None, (), notes, not_verified)
    # The reason's class is its first finding's: acute first, then the most
    # severe class (so Slurm's copy tells an acute drain from a budgeted one).
    cls = unfit[0].cls
    return Verdict(False, cls, reason.render(tag, cls, unfit), tuple(unfit), notes, not_verified)
