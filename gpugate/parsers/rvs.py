"""The ROCm Validation Suite's verdict (`rvs -r LEVEL`, its console output,
or the `-j` JSON file) in DCGM's DcgmDiag shape, so the shared diagnostic
judge (gpugate.judges.dcgm.diagnostic) reads AMD's proof as it reads NVIDIA's.

Pure: text in, DcgmDiag or ProbeFailure out, never an exception.  What RVS
prints (ROCm/ROCmValidationSuite @21584e14, the lines cited):

- every console line is ``[LEVEL ] [secs.usecs] message`` (src/rvsliblogger.cpp
  LogExt, "%6d.%-6d"); the verdicts are RESULT lines:
  ``[action] smqt 3254 pass: false`` (smqt), ``[action] [GPU:: 42583] pass:
  TRUE`` (iet, tst, "%5d" pads the id), ``[action] [GPU:: 42583] GFLOPS N
  Target GFLOPS: T met: TRUE`` (gst), ``[action] peqt true`` (peqt, node-wide);
  babel, pebb, pbqt and rcqt print measurements and no per-line verdict;
- from ROCm 7.1 (commit 0592d756) every run ends with a summary table, one row
  an action: ``| name | MODULE | PASS |`` (FAIL in red; ANSI colours, and under
  ``-q`` a spinner redrawn with ``\\r``), closed by a ``+---...---+`` line
  (rvs/src/rvsexec_do_yaml.cpp).  The row is the action's own return code;
- rcqt (level 1) returns success even with packages missing (rcqt.so/src/
  packageHandler.cpp): its "Missing packages : N" and "Version mismatch
  packages : N" lines are read as a failure when N > 0.

The GPU id RVS prints is the KFD topology ``gpu_id`` (/sys/class/kfd/kfd/
topology/nodes/N/gpu_id, src/gpu_util.cpp gpu_get_all_gpu_id; ``amd-smi list``
prints it as KFD_ID), not an index: ``gpu_ids`` maps it ("42583") to the
index gpugate uses; an id it does not map gives gpu=None.

The exit code is no verdict (rvs/src/rvs.cpp returns exec::run's status):
since ROCm 7.0 (commit 38a9deab) a failed action is logged ("RVS-ERROR [module]
[action] Action failed to run successfully." on stderr), the next action runs,
and rvs exits 0; up to ROCm 6.4 the first failed action ended the run with its
status (-1: exit 255).  255 (-1) is also every command-line or configuration
error, including "No test levels support for the detected GPU or no GPU
detected !" for ``-r`` (levels exist from ROCm 7.2, for MI300X and later only:
rvs/src/rvsexec.cpp), 1 a module that failed to load (or the count of
properties an action refused), 25 (-999) an exception while reading the
configuration.  So: a failed verdict line fails the run
whatever the exit code; no verdict line at all is a ProbeFailure ("error"),
never a pass; and a run whose summary table did not close did not finish:
with no failure seen, a ProbeFailure too (``rvs -r`` always prints one).
"""

from __future__ import annotations

import json
from types import MappingProxyType

from gpugate.model.facts import ProbeFailure
from gpugate.core.lazyre import IGNORECASE, Lazy
from gpugate.model.toolfacts import DcgmDiag, DcgmTestResult

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only
    from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

EXIT_ACTION_FAILED_OLD = 255  # ROCm <= 6.4: the first failed action's -1 ends the run
EXIT_USAGE = 255  # -1: command line, configuration, no level config for this GPU
EXIT_MODULES = 1  # a module library failed to initialize
EXIT_CONFIG_EXCEPTION = 25  # -999 & 0xff: an exception while processing the configuration
_NO_IDS = MappingProxyType({})  # type: Mapping[str, int]
_MAX_LINE = 4096
_MAX_MESSAGE = 200
_MAX_RESULTS = 4096  # Pass results kept; every Fail is kept

_ANSI = Lazy(r"\x1b\[[0-9;]*[A-Za-z]")
_PREFIX = Lazy(r"^\[(RESULT|ERROR |INFO  |DEBUG |TRACE |NONE  )\]\s*\[\s*[0-9]+\.[0-9 ]*\]\s?")
# [action] [GPU:: 42583] ... pass: TRUE | met: TRUE ; [action] smqt 3254 pass: false
_VERDICT = Lazy(r"^\[(?P<action>[^\]]{1,128})\]\s+"
                r"(?:\[GPU::\s*(?P<gpu>[0-9]{1,10})\s*\]|(?P<module>[A-Za-z][A-Za-z0-9_.-]{0,31})\s+(?P<id>[0-9]{1,10})\b)?"
                r".*?\b(?:pass|met)\s*:\s*(?P<verdict>true|false)\s*$", IGNORECASE)
_PEQT = Lazy(r"^\[(?P<action>[^\]]{1,128})\]\s+peqt\s+(?P<verdict>true|false)\s*$")
_ACTION_NAME = Lazy(r"^Action name\s*:\s*(?P<action>\S.{0,127}?)\s*$")
_RCQT_COUNT = Lazy(r"^\s*(?P<what>Missing packages|Version mismatch packages)\s*:\s*(?P<n>[0-9]{1,9})\s*$")
_SUMMARY_HEADER = Lazy(r"^\|\s*Action Name\s*\|\s*Module\s*\|\s*Result\s*\|$")
_SUMMARY_ROW = Lazy(r"^\|\s*(?P<action>[^|]*?)\s*\|\s*(?P<module>[A-Z0-9_]{1,32})\s*\|\s*(?P<verdict>PASS|FAIL)\s*\|$")
_BOUNDARY = Lazy(r"^\+-{20,}\+$")
_ACTION_FAILED = Lazy(r"RVS-ERROR(?:\s*\[(?P<module>[^\]]*)\])?(?:\s*\[(?P<action>[^\]]*)\])?\s*Action failed to run")
_RVS_ERROR = Lazy(r"RVS-ERROR\b.*")
# The summary's GPU cells: "AMD Instinct MI355X - 42583" over "0 - 2 - 0000:05:00.0".
_GPU_NAME_CELL = Lazy(r"^(?P<name>.*\S)\s+-\s+(?P<id>[0-9]{1,10})$")
_GPU_PLACE_CELL = Lazy(r"^(?P<index>[0-9]{1,4})\s+-\s+(?P<node>[0-9]{1,5})\s+-\s+"
                       r"(?P<bdf>[0-9a-fA-F]{4}:[0-9a-fA-F:.]{7,16})$")


def _source(level: int) -> str:
    return "rvs -r %d" % level


def _words(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _MAX_MESSAGE else text[:_MAX_MESSAGE] + "..."


def _gpu(token: Optional[str], gpu_ids: Mapping[str, int]) -> Optional[int]:
    """gpugate's index of an RVS GPU id (the KFD gpu_id), via ``gpu_ids``."""
    if not token:
        return None
    key = str(int(token))
    index = gpu_ids.get(key)
    if index is None:
        index = gpu_ids.get(int(key))  # type: ignore[call-overload]
    return index if isinstance(index, int) and not isinstance(index, bool) else None


def _clean(raw: str) -> str:
    """A console line as it last stood: after the last carriage return (the
    -q spinner redraws its row), colours removed."""
    line = raw.rsplit("\r", 1)[-1]
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    return line.rstrip()


class _Reading:
    """What the console lines say, line by line."""

    def __init__(self, gpu_ids: Mapping[str, int]):
        self.gpu_ids = gpu_ids
        self.results = []  # type: List[DcgmTestResult]
        self.passes = 0
        self.action = None  # type: Optional[str]
        self.in_summary = False
        self.summary_closed = False
        self.errors = []  # type: List[str]

    def add(self, test: str, passed: bool, gpu: Optional[int], line: str) -> None:
        if passed:
            self.passes += 1
            if self.passes > _MAX_RESULTS:
                return
        self.results.append(DcgmTestResult(test=test[:128], status="Pass" if passed else "Fail", gpu=gpu,
                                           message=_words(line)))

    def line(self, raw: str) -> None:
        if len(raw) > _MAX_LINE:
            return
        line = _clean(raw)
        if not line.strip():
            return
        if "RVS-ERROR" in line:
            self._error(line)
            return
        if self.in_summary and self._summary(line.strip()):
            return  # under -q the table opens before the first action: other lines still count
        if _SUMMARY_HEADER.match(line.strip()):
            self.in_summary = True
            return
        prefix = _PREFIX.match(line)
        body = line[prefix.end():] if prefix else line
        if prefix and prefix.group(1) == "RESULT":
            self._result(body.strip(), line)
            return
        match = _RCQT_COUNT.match(line)
        if match and int(match.group("n")) > 0:
            self.add(self.action or "rcqt", False, None, line)

    def _result(self, body: str, line: str) -> None:
        match = _ACTION_NAME.match(body)
        if match:
            self.action = match.group("action")
            return
        match = _VERDICT.match(body) or _PEQT.match(body)
        if match:
            groups = match.groupdict()
            gpu = _gpu(groups.get("gpu") or groups.get("id"), self.gpu_ids)
            self.add(match.group("action"), match.group("verdict").lower() == "true", gpu, line)

    def _summary(self, text: str) -> bool:
        match = _SUMMARY_ROW.match(text)
        if match:
            self.add(match.group("action") or match.group("module"), match.group("verdict") == "PASS", None, text)
            return True
        if _BOUNDARY.match(text):
            self.in_summary = False
            self.summary_closed = True
            return True
        return False

    def _error(self, line: str) -> None:
        match = _ACTION_FAILED.search(line)
        if match:
            self.add(match.group("action") or match.group("module") or "rvs", False, None, line)
            return
        found = _RVS_ERROR.search(line)
        if found and len(self.errors) < 10:
            self.errors.append(_words(found.group(0)))


def parse(stdout: str, rc: int, level: int, gpu_ids: Mapping[str, int] = _NO_IDS) -> Union[DcgmDiag, ProbeFailure]:
    """`rvs -r LEVEL` console output (stdout; stderr appended is read too:
    its RVS-ERROR lines) and exit code -> the run's results.

    A result per verdict: per GPU (``[GPU:: id] pass: TRUE``, ``met:``,
    ``<module> <id> pass:``), per action (the summary row, ``peqt true``,
    rcqt's missing packages, "Action failed to run successfully")."""
    reading = _Reading(gpu_ids if gpu_ids is not None else _NO_IDS)
    for raw in str(stdout).split("\n"):
        reading.line(raw)
    results = tuple(reading.results)
    failed = any(r.status == "Fail" for r in results)
    if not results:
        said = reading.errors[0] if reading.errors else _first_words(stdout)
        return ProbeFailure(_source(level), "error", "no result line (exit %s)%s" % (rc, ": " + said if said else ""))
    if not failed and not reading.summary_closed:
        return ProbeFailure(_source(level), "error",
                            "the run did not finish: %d result(s), no closed summary table (exit %s)"
                            % (len(results), rc))
    return DcgmDiag(level=level, exit_code=rc, results=results)


def _first_words(text: str) -> str:
    for raw in str(text).split("\n")[:200]:
        line = _clean(raw[:_MAX_LINE])
        if line.strip():
            return _words(line)
    return ""


def summary_gpus(stdout: str) -> Tuple[Tuple[str, int, int, str, str], ...]:
    """The summary's System Overview GPUs, in RVS's order (sorted by BDF, src/
    rvs_util.cpp get_gpu_info): (gpu_id, RVS index, KFD node id, BDF, name),
    e.g. ("42583", 0, 2, "0000:05:00.0", "AMD Instinct MI355X").  Names longer
    than 24 characters are cut by RVS ("...").  A caller can map gpu_id to its
    own index through the BDF."""
    names = []  # type: List[Tuple[str, str]]
    found = []  # type: List[Tuple[str, int, int, str, str]]
    for raw in str(stdout).split("\n"):
        line = _clean(raw[:_MAX_LINE]).strip()
        if not (line.startswith("|") and line.endswith("|")):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        places = [_GPU_PLACE_CELL.match(c) for c in cells]
        if any(places):
            for place in places:
                if place and names:
                    gpu_id, name = names.pop(0)
                    found.append((gpu_id, int(place.group("index")), int(place.group("node")),
                                  place.group("bdf"), name))
            names = []
            continue
        names = []
        for cell in cells:
            match = _GPU_NAME_CELL.match(cell)
            if match and match.group("name") not in ("GPU Name", "ID"):
                names.append((str(int(match.group("id"))), match.group("name")))
    return tuple(found)


# -- the -j JSON file -------------------------------------------------------
# {"version": "1.0", "<module>": {"<action>": [{"gpu_id": "42583", "gpu_index":
# "0", "pass": "true", ...}, ...], ...}} (docs/schemas/*.schema; the logger
# opens one module node for the whole run, so later modules' actions sit under
# the first module's key).  smqt writes its pass as std::to_string(bool): "1"/
# "0".  RVS can leave extra closing braces at the end (AMD's own reader,
# ROCm/device-metrics-exporter pkg/testrunner/rvs.go, trims up to 10).

_JSON_TRUE = ("true", "1")
_JSON_FALSE = ("false", "0")
_MAX_DEPTH = 6


def parse_json(text: str, rc: int, level: int, gpu_ids: Mapping[str, int] = _NO_IDS) -> Union[DcgmDiag, ProbeFailure]:
    """The file `rvs -r LEVEL -j FILE` writes -> the run's results, one per
    record with a "pass" (test: the action).  A file that does not parse (a
    run cut short leaves it unclosed) or holds no "pass" is a ProbeFailure."""
    ids = gpu_ids if gpu_ids is not None else _NO_IDS
    body = str(text).strip()
    try:
        doc, end = json.JSONDecoder(object_pairs_hook=_merged).raw_decode(body)
    except (ValueError, RecursionError) as err:
        return ProbeFailure(_source(level), "error", "rvs -j: not JSON (%s) (exit %s)" % (str(err)[:80], rc))
    if body[end:].replace("}", "").strip() or not isinstance(doc, dict):
        return ProbeFailure(_source(level), "error", "rvs -j: expected one JSON object (exit %s)" % rc)
    found = []  # type: List[DcgmTestResult]
    for module, actions in doc.items():
        if module == "version" or not isinstance(actions, dict):
            continue
        for action, records in actions.items():
            _json_records(str(action), records, None, ids, found, 0)
    if not found:
        return ProbeFailure(_source(level), "error", "rvs -j: no record with a \"pass\" (exit %s)" % rc)
    return DcgmDiag(level=level, exit_code=rc, results=tuple(found[:_MAX_RESULTS * 2]))


def _merged(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    """A JSON object whose repeated keys (an action run twice: -n) keep every
    record: lists join, another value takes a numbered key."""
    out = {}  # type: Dict[str, Any]
    for key, value in pairs:
        if key in out and isinstance(out[key], list) and isinstance(value, list):
            out[key] = out[key] + value
        elif key in out:
            out["%s#%d" % (key, len(out))] = value
        else:
            out[key] = value
    return out


def _json_records(action: str, node: Any, gpu: Optional[str], ids: Mapping[str, int], found: List[DcgmTestResult],
                  depth: int) -> None:
    if depth > _MAX_DEPTH:
        return
    if isinstance(node, list):
        for item in node:
            _json_records(action, item, gpu, ids, found, depth + 1)
        return
    if not isinstance(node, dict):
        return
    own = node.get("gpu_id", node.get("gpu"))
    if isinstance(own, (str, int)) and not isinstance(own, bool) and str(own).strip().isdigit():
        gpu = str(own).strip()
    verdict = node.get("pass")
    if isinstance(verdict, (str, bool)):
        word = str(verdict).strip().lower()
        if word in _JSON_TRUE or word in _JSON_FALSE:
            shown = ", ".join("%s=%s" % (k, node[k]) for k in list(node)[:8] if isinstance(node[k], (str, int)))
            found.append(DcgmTestResult(test=action[:128], status="Pass" if word in _JSON_TRUE else "Fail",
                                        gpu=_gpu(gpu, ids), message=_words(shown)))
        elif word:  # a value we cannot read is not a pass
            found.append(DcgmTestResult(test=action[:128], status="Fail", gpu=_gpu(gpu, ids),
                                        message=_words("pass=%r" % verdict)))
    for value in node.values():
        if isinstance(value, (list, dict)):
            _json_records(action, value, gpu, ids, found, depth + 1)
