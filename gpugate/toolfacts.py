"""Facts read from the node's tools (the package manager, dkms, DCGM): the
health check's and the verification's, never the prolog's, so they load
only when a tool's output is parsed (gpugate.facts names them too)."""

from __future__ import annotations

from dataclasses import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Optional, Tuple


@dataclass(frozen=True)
class Package:
    """An installed package (dpkg or rpm)."""

    name: str
    version: str  # upstream version, epoch and Debian revision removed
    held: bool
    raw_version: str = ""


@dataclass(frozen=True)
class DkmsEntry:
    """One line of `dkms status`."""

    module: str
    version: str
    kernel: str
    arch: str
    status: str  # "installed", "built", ...


@dataclass(frozen=True)
class DcgmHealth:
    """`dcgmi health -c`."""

    overall: str  # "Healthy" | "Warning" | "Failure"
    incidents: Tuple[str, ...] = ()
    watches_set: Optional[bool] = None


NOT_RUN = "NotRun"


@dataclass(frozen=True)
class DcgmTestResult:
    """One test of `dcgmi diag` on one GPU (or all)."""

    test: str
    status: str  # "Pass" | "Fail" | "Skip" | "Warn" | "NotRun" (refused on MIG; message: DCGM's words)
    gpu: Optional[int] = None
    error_id: Optional[int] = None
    severity: Optional[int] = None
    message: str = ""


@dataclass(frozen=True)
class DcgmDiag:
    """`dcgmi diag`: its level, exit code and results."""

    level: int
    exit_code: int
    results: Tuple[DcgmTestResult, ...] = ()
    passed_levels: Tuple[int, ...] = ()  # staged (verify): the cheaper levels that passed before this one

    @property
    def failures(self) -> Tuple[DcgmTestResult, ...]:
        return tuple(r for r in self.results if r.status in ("Fail", "Warn"))

    @property
    def not_run(self) -> Tuple[DcgmTestResult, ...]:
        """What DCGM refused to run on MIG: neither a failure nor a pass."""
        return tuple(r for r in self.results if r.status == NOT_RUN)
