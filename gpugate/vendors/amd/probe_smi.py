"""What only amd-smi can say of an AMD node: the IFWI version, the driver's
own bad-page threshold verdict, the XGMI link states and amd-smi's version.

Run as a command through gpugate.safety.runner (deadline, process group, trust
walk, output cap), never as the amdsmi library in-process: the Python
binding is a ctypes file bound to one libamd_smi release, and the CLI ships
with the library it matches (docs/explanation/amd-design.md 1.3).  The health check
and verification only; the prolog reads files (gpugate.vendors.amd.probe_sysfs).

Every answer is merged into the sysfs facts by PCI address, never by index:
amd-smi numbers GPUs its own way.  A whole command that fails (driver not
loaded, no /dev/kfd access, hung) leaves its fields as that failure.
"""

from __future__ import annotations

from gpugate.errors import CommandError
from gpugate.model.facts import UNCHECKED, ProbeFailure
from gpugate.core.record import replace
from gpugate.safety.runner import run
from gpugate.probes.commands import ENV

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only
    from typing import Any, Callable, Dict, Optional, Tuple

SOURCE = "amd_smi"
# Each call is one Python start of amd-smi plus a library init: about a
# second on a real node (no amd-smi call deserves more than this).
_CAP = 15.0
STATIC = ("static", "--json")
XGMI = ("xgmi", "--link-status", "--json")
VERSION = ("version", "--json")
_ANY_EXIT = tuple(range(256))  # a death by signal (rc < 0) stays an error


def call(amd_smi: str, args: Tuple[str, ...], timeout: float, parse: Callable[[str], Any]) -> Any:
    """One amd-smi subcommand: its parsed answer, or a ProbeFailure."""
    from gpugate.vendors.amd import parse_smi as parser

    try:
        # Every exit code is read: amd-smi says "driver not loaded" with 255, and
        # "Failed to reset GPU" with 0 (gpugate.vendors.amd.parse_smi.failure decides).
        result = run((amd_smi,) + tuple(args), min(timeout, _CAP), env=ENV, ok_codes=_ANY_EXIT)
    except CommandError as exc:
        kind = ("refused" if exc.refused else "timeout" if exc.timed_out else "missing" if exc.missing
                else "overflow" if exc.overflow else "error")
        return ProbeFailure(SOURCE, kind, str(exc)[:200], exc.rc)
    if args[:2] == XGMI[:2] and result.rc != 0 and "--link-status" in (result.stderr + result.stdout) \
            and "unrecognized" in (result.stderr + result.stdout):
        # amd-smi before AMD SMI 25.3 (ROCm 6.4) has no link states to give.
        return ProbeFailure(SOURCE, UNCHECKED, "this amd-smi has no xgmi --link-status (AMD SMI 25.3+)")
    failed = parser.failure(result.rc, result.stdout, result.stderr)
    if failed is not None:
        return failed
    try:
        return parse(result.stdout)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        return ProbeFailure(SOURCE, "error", "%s: %s" % (" ".join(args[:1]), str(exc)[:160]))


def jobs(amd_smi: str, time_left: Callable[[], float]) -> Dict[str, Callable[[], Any]]:
    """The amd-smi calls the health check runs, each a job of the collector's pool."""
    from gpugate.vendors.amd import parse_smi as parser

    return {
        "amd_smi_static": lambda: call(amd_smi, STATIC, time_left(), parser.parse_static),
        "amd_smi_xgmi": lambda: call(amd_smi, XGMI, time_left(), parser.parse_xgmi_link_status),
        "amd_smi_version": lambda: call(amd_smi, VERSION, time_left(), parser.parse_version),
    }


def merge(amd: Any, static: Any, xgmi: Any, version: Any) -> Any:
    """The sysfs facts with what amd-smi added (by PCI address)."""
    if amd is None or isinstance(amd, ProbeFailure):
        return amd
    whole = _whole_failure(static, xgmi, version)
    by_bdf = _by_bdf(static)
    gpus = []
    for gpu in amd.gpus:
        values = by_bdf.get(gpu.bdf.lower()) if isinstance(by_bdf, dict) else None
        changes = {}
        if isinstance(static, ProbeFailure):
            changes.update(ifwi=static, bad_page_threshold_exceeded=static)
        elif values is None:
            missing = ProbeFailure(SOURCE, "absent", "amd-smi static names no GPU at %s" % gpu.bdf)
            changes.update(ifwi=missing, bad_page_threshold_exceeded=missing)
        else:
            changes.update(ifwi=values.get("ifwi_version", _na("ifwi")),
                           bad_page_threshold_exceeded=values.get("bad_page_threshold_exceeded",
                                                                  _na("bad_page_threshold_exceeded")))
        changes["xgmi"] = _xgmi_for(gpu, xgmi, static)
        gpus.append(replace(gpu, **changes))
    smi_version = version.get("amdsmi_library_version", _na("amdsmi_library_version")) \
        if isinstance(version, dict) else version
    return replace(amd, gpus=tuple(gpus), amd_smi_version=smi_version, smi=whole)


def _na(field: str) -> ProbeFailure:
    return ProbeFailure(SOURCE, "na", "%s: not in amd-smi's answer" % field)


def _whole_failure(*answers: Any) -> Optional[ProbeFailure]:
    """The failure that says amd-smi as a whole could not answer (driver not
    loaded, a hang, not installed): the static call's, else the first."""
    for answer in answers:
        if isinstance(answer, ProbeFailure) and answer.kind != UNCHECKED:
            return answer
    return None


def _by_bdf(static: Any) -> Any:
    if not isinstance(static, dict):
        return static
    out = {}
    for values in static.values():
        bdf = values.get("bdf") if isinstance(values, dict) else None
        if isinstance(bdf, str):
            out[bdf.lower()] = values
    return out


def _xgmi_for(gpu, xgmi: Any, static: Any) -> Any:
    """amd-smi numbers GPUs 0..N-1 in its own order: its static answer maps
    that number to a PCI address."""
    if isinstance(xgmi, ProbeFailure):
        return xgmi
    if not isinstance(static, dict) or not isinstance(xgmi, dict):
        return ProbeFailure(SOURCE, "error", "no amd-smi static answer to map XGMI links to %s" % gpu.bdf)
    for index, values in static.items():
        if isinstance(values, dict) and str(values.get("bdf", "")).lower() == gpu.bdf.lower():
            return xgmi.get(index, ProbeFailure(SOURCE, "absent", "amd-smi xgmi names no GPU %s" % index))
    return ProbeFailure(SOURCE, "absent", "amd-smi static names no GPU at %s" % gpu.bdf)
