"""The smoke proof's verdict: a parsed nccl-tests run, its exit code and
deadline -> passed, or the one problem that says most.

Pure.  When several things are wrong, the most telling comes first:

1. timeout          "timeout after 600s": nothing after it is trustworthy
2. error / abort    "nccl error: <the first NCCL WARN, else Test NCCL/CUDA
                    failure, else other failure line>": the cause, by host
3. wrong values     "wrong=12" (sum of #wrong), else "out_of_bounds=3"
4. no result        "no result" (no table, no average), or which half is missing
5. exit code        "exit 1", "signal 9", "exit unknown"
6. unchecked        "unchecked: #wrong N/A (run without -c 0)": correctness unproven
7. low busbw        "busbw=23.4GB/s (want >= 350)", or NCCL_TESTS_MIN_BW's FAILED

A pass needs, with ``require_result`` (the default): a table row and an
average, exit code 0, no error line, #wrong all 0 (the older "error" column:
out of bounds 0), and the average at least ``want_busbw_gbps`` when given.

``require_result=False`` is for a site command that is not nccl-tests: the
exit code decides, but whatever nccl-tests-like text the output does hold
still counts (an NCCL WARN, wrong values, a FAILED).  A wanted busbw needs
an average to compare, so it brings the result requirement back.
"""

from __future__ import annotations

import math

from gpugate.core.record import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only
    from typing import List, Optional, Tuple

    from gpugate.parsers.nccl import NcclRun

_ERROR_CHARS = 80


@dataclass(frozen=True)
class SmokeVerdict:
    passed: bool
    problem: str  # "" when passed; else reason-ready, e.g. "busbw=23.4GB/s (want >= 350)"
    busbw_gbps: Optional[float]  # the run's average bus bandwidth, when it printed one
    # The problem as a finding's parts (component=observed (want expected)),
    # empty when passed: "busbw", "23.4GB/s", ">= 350".
    component: str = ""
    observed: str = ""
    expected: str = ""


def gbps(value: float, down: bool = False) -> str:
    """350.0 -> "350", 23.45 -> "23.45".  ``down`` (an observed value) cuts
    to 0.1 (0.01 below 10) instead of rounding, so 349.96 never reads "350"."""
    if not down:
        return ("%.4f" % value).rstrip("0").rstrip(".") or "0"
    scale = 100 if value < 10 else 10
    shown = math.floor(value * scale) / scale
    if shown > value:  # value * scale rounded up to a whole number
        shown = (math.floor(value * scale) - 1) / scale
    return ("%.2f" % shown).rstrip("0").rstrip(".") or "0"


def first_error(errors: Tuple[str, ...]) -> str:
    """The most telling error line, shortened: an NCCL WARN carries the cause,
    "Test NCCL failure" the error name, "Test failure" only a source line."""
    for marker in ("NCCL WARN", "Test NCCL failure", "Test CUDA failure", "Test timeout", "NCCL failure",
                   "CUDA failure", "Cuda failure"):
        for line in errors:
            at = line.find(marker)
            if at >= 0:
                return _shorten(_host(line) + line[at:])
    return _shorten(errors[0]) if errors else ""


def _host(line: str) -> str:
    """"h100-4: " from "h100-4:739787:739914 [1] ... NCCL WARN" or "h100-4: Test ..."."""
    head = line.split(":", 1)[0]
    if head and head != line and " " not in head and len(head) <= 64:
        return head + ": "
    return ""


def _shorten(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _ERROR_CHARS else text[:_ERROR_CHARS - 2] + ".."


def _fail(problem: str, busbw: Optional[float], component: str, observed: str, expected: str) -> SmokeVerdict:
    return SmokeVerdict(False, problem, busbw, component, observed, expected)


def judge_smoke(run: Optional[NcclRun], exit_code: Optional[int], timed_out: bool,
                want_busbw_gbps: Optional[float], require_result: bool = True,
                deadline_s: Optional[float] = None) -> SmokeVerdict:
    """``run``: the parse of the command's output (None: no output read);
    ``exit_code``: negative for a signal, None when unknown; ``deadline_s``
    only words the timeout."""
    busbw = run.avg_busbw_gbps if run is not None else None
    if timed_out:
        after = "%ds" % deadline_s if deadline_s is not None else "the deadline"
        return _fail("timeout after %s" % after, busbw, "timeout", after, "done")
    if run is not None and run.errors:
        error = first_error(run.errors)
        return _fail("nccl error: %s" % error, busbw, "nccl_error", error, "none")
    if run is not None and run.wrong_total:
        return _fail("wrong=%d" % run.wrong_total, busbw, "wrong", str(run.wrong_total), "0")
    if run is not None and run.out_of_bounds:
        return _fail("out_of_bounds=%d" % run.out_of_bounds, busbw, "out_of_bounds", str(run.out_of_bounds), "0")
    need_result = require_result or want_busbw_gbps is not None
    missing = _missing(run) if need_result else ""
    if missing:
        return _fail(missing, busbw, "result", missing.partition(": ")[2] or "none", "table and avg busbw")
    if exit_code is None:
        return _fail("exit unknown", busbw, "exit", "unknown", "0")
    if exit_code < 0:
        return _fail("signal %d" % -exit_code, busbw, "exit", "signal %d" % -exit_code, "0")
    if exit_code != 0:
        return _fail("exit %d" % exit_code, busbw, "exit", str(exit_code), "0")
    if require_result and not _checked(run):
        return _fail("unchecked: #wrong N/A (run without -c 0)", busbw, "wrong", "N/A", "0")
    if want_busbw_gbps is not None and busbw < want_busbw_gbps:
        shown, want = "%sGB/s" % gbps(busbw, down=True), ">= %s" % gbps(want_busbw_gbps)
        return _fail("busbw=%s (want %s)" % (shown, want), busbw, "busbw", shown, want)
    if run is not None and run.min_bw_verdict is False:
        shown = "%sGB/s" % gbps(busbw, down=True) if busbw is not None else "?"
        return _fail("busbw=%s (NCCL_TESTS_MIN_BW FAILED)" % shown, busbw, "busbw", shown, "NCCL_TESTS_MIN_BW")
    return SmokeVerdict(True, "", busbw)


def _missing(run: Optional[NcclRun]) -> str:
    if run is None or (not run.rows and run.avg_busbw_gbps is None):
        return "no result"
    if not run.rows:
        return "no result: no table"
    if run.avg_busbw_gbps is None:
        return "no result: no avg busbw"
    return ""


def _checked(run: Optional[NcclRun]) -> bool:
    """Did the run check its results?  #wrong counted (wrong_total 0 here),
    or the older error column with "Out of bounds values : 0"."""
    if run is None or not run.rows:
        return False
    if run.wrong_total == 0:
        return True
    old = all(r.oop_max_error is not None and r.ip_max_error is not None for r in run.rows)
    return old and run.out_of_bounds == 0


# What a shell or launcher prints when the program itself is not there or not
# executable: `sh: 1: exec: /opt/x: not found`, bash's `No such file or
# directory`, `command not found`, `Permission denied`.
_CANNOT_RUN = ("command not found", "No such file or directory", ": not found", "Permission denied",
               "cannot execute")


def cannot_run(run: Optional[NcclRun], exit_code: Optional[int], text: str) -> str:
    """Why the command never ran on the node ("" when it did): the site's
    configuration (a wrong path, nccl-tests not installed), not the node.
    Only without any result or NCCL/CUDA error line: a run that got that far
    was started, and what it printed is the node's."""
    if run is not None and (run.rows or run.avg_busbw_gbps is not None or run.errors):
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    said = next((line for line in lines if any(m in line for m in _CANNOT_RUN)), "")
    said = said or (lines[-1] if lines and exit_code in (126, 127) else "")
    if exit_code in (126, 127) or (exit_code and said):
        # The end says most ("...: not found"); the start is Slurm's spool path.
        said = " ".join(said.split()) or "no output"
        head = "exit %d: " % exit_code
        room = _ERROR_CHARS - len(head)
        return head + (said if len(said) <= room else ".." + said[-(room - 2):])
    return ""


def template(argv, node: str, gpus: Optional[int], nodes: Optional[str] = None) -> List[str]:
    """{node}, {nodes} ("a,b" of a pair; the node alone) and {gpus} in the
    command; an unknown GPU count leaves the tool's own default
    (all_reduce_perf -g {gpus} needs a number)."""
    out = []
    for word in argv:
        if "{gpus}" in word and gpus is None:
            if out and out[-1] in ("-g", "--ngpus"):
                out.pop()
            continue
        out.append(word.replace("{nodes}", nodes or node).replace("{node}", node).replace("{gpus}", str(gpus)))
    return out
