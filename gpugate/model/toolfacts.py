"""Facts read from the node's tools (the package manager, dkms, DCGM): the
health check's and the verification's, never the prolog's, so they load
only when a tool's output is parsed (gpugate.model.facts names them too)."""

from __future__ import annotations

from gpugate.core.record import dataclass

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


@dataclass(frozen=True)
class HcaPort:
    """One port of an InfiniBand/RoCE HCA, as /sys/class/infiniband shows it.
    Each field is a value or a ProbeFailure (the file could not be read)."""

    port: int
    state: object  # "ACTIVE", "DOWN", "INIT", "ARMED" (sysfs "4: ACTIVE")
    phys_state: object  # "LinkUp", "Disabled", "Polling" (sysfs "5: LinkUp")
    rate: object  # Gb/s as a number (sysfs "400 Gb/sec (4X NDR)")
    link_layer: object  # "InfiniBand" | "Ethernet"
    counters: object = None  # error counter name -> int (ports/N/counters/*)


@dataclass(frozen=True)
class Hca:
    """One HCA (mlx5_0, ...): type, firmware and ports."""

    name: str
    hca_type: object  # "MT4129" (ConnectX-7)
    fw_ver: object  # "28.41.1000"
    board_id: object = None
    ports: Tuple[HcaPort, ...] = ()


@dataclass(frozen=True)
class ImexStatus:
    """nvidia-imex-ctl -q (this node's IMEX service) and -N (the domain)."""

    service: str  # "READY", ...
    domain: str  # "UP" | "DOWN" | "DEGRADED"
    nodes: Tuple[Tuple[str, str], ...] = ()  # (address, state) per domain member
