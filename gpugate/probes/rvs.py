"""The ROCm Validation Suite on an AMD node: `rvs -r LEVEL` (its predefined
levels for the detected platform: 1 package check and 2 PCIe/HBM/XGMI
capability take seconds, 3 basic performance minutes), the verification
proof of a repaired AMD node as `dcgmi diag` is NVIDIA's.  Its verdict is
read from its result lines (gpugate.parsers.rvs), never from its exit code
alone, in DCGM's DcgmDiag shape so the shared judge reads it."""

from __future__ import annotations

from gpugate.core.record import replace
from gpugate.model.toolfacts import DcgmDiag
from gpugate.probes.commands import _run

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only
    from typing import Any, Callable


def diag(rvs: str, level: int, timeout: float) -> Any:
    from gpugate.parsers import rvs as parser

    def read(result):
        # RVS names GPUs by their KFD gpu_id; its summary maps each to its
        # index in BDF order, which is gpugate's (PCI order).
        ids = {gpu_id: index for gpu_id, index, _, _, _ in parser.summary_gpus(result.stdout)}
        return parser.parse(result.stdout + result.stderr, result.rc, level, ids)

    return _run("rvs", [rvs, "-r", str(level)], timeout, read, ok_codes=range(256))


def staged(rvs: str, levels, time_left: Callable[[], float]) -> Any:
    """The levels in order, cheapest first; the first that does not pass
    cleanly is the result (gpugate.probes.commands.dcgm_diag_staged)."""
    passed = []
    for i, level in enumerate(levels):
        result = diag(rvs, level, time_left())
        clean = (isinstance(result, DcgmDiag) and result.exit_code == 0 and not result.failures
                 and any(r.status == "Pass" for r in result.results))
        if not clean or i == len(levels) - 1:
            return replace(result, passed_levels=tuple(passed)) if isinstance(result, DcgmDiag) else result
        passed.append(level)
    return None
