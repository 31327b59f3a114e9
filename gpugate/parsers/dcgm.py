"""Parsers for dcgmi output: version, `health -c -j` and `diag -r N -j`.

Pure functions: text in, facts out, ParseError for anything we cannot read.
The JSON shapes follow dcgmi's own writers (dcgmi/DcgmiOutput.cpp, Health.cpp,
Diag.cpp in NVIDIA/DCGM); notes below say which DCGM release prints what.
"""

import json
import re
from typing import Any, List, Optional, Tuple

from gpugate.errors import ParseError
from gpugate.model.toolfacts import NOT_RUN, DcgmDiag, DcgmHealth, DcgmTestResult

# dcgmi prints this on stdout (not JSON) when `dcgmi health -s` was never run.
_NO_WATCHES = re.compile(r"health watches not (?:enabled|set)", re.I)
_OVERALL = {"healthy": "Healthy", "warning": "Warning", "failure": "Failure"}
_STATUS = {"pass": "Pass", "fail": "Fail", "skip": "Skip", "warn": "Warn"}
_GPU_GROUP_ID = 1  # DCGM_FE_GPU
_MAX_INCIDENT = 200


def _excerpt(text: str, limit: int = 80) -> str:
    text = text.strip()
    return repr(text[:limit] + ("..." if len(text) > limit else ""))


def _show(value: Any) -> str:
    """A short description of a JSON value (never repr() a whole tree)."""
    if isinstance(value, dict):
        return "object with keys %s" % _excerpt(", ".join(str(k) for k in list(value)[:6]))
    if isinstance(value, list):
        return "list of %d" % len(value)
    if isinstance(value, str):
        return _excerpt(value)
    if isinstance(value, int) and not -10**12 < value < 10**12:
        return "a huge number"  # repr() of a huge int can itself raise
    return repr(value)[:40]


def _load_json(text: str, what: str) -> Any:
    """json.loads that only ever raises ParseError (deep nesting included)."""
    if not text.strip():
        raise ParseError("%s: expected JSON, got empty output" % what)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as err:
        raise ParseError("%s: expected JSON (%s), saw %s" % (what, str(err)[:60], _excerpt(text))) from None


def _small_int(value: Any) -> Optional[int]:
    """An int from a JSON int or a digit string ("3" in DCGM 2.x/3.x gpu_id)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value if 0 <= value < 2**32 else None  # ids and codes are uint32
    if isinstance(value, str) and re.fullmatch(r"[0-9]{1,9}", value.strip()):
        return int(value)
    return None


def parse_dcgmi_version(text: str) -> str:
    """`dcgmi --version` (DCGM 4: "dcgmi  version: 4.7.0") or the `dcgmi -v`
    block ("Version : 3.3.5"); the first (local build) version wins."""
    match = re.search(r"^[ \t]*(?:dcgmi[ \t]+)?version[ \t]*:[ \t]*([0-9]+(?:\.[0-9]+)+)[ \t]*$", text, re.I | re.M)
    if not match:
        raise ParseError("dcgmi version: expected 'dcgmi  version: X.Y.Z' or 'Version : X.Y.Z', saw %s"
                         % _excerpt(text))
    return match.group(1)


def _messages(node: dict) -> str:
    # Long messages are wrapped into the "overflow" list (54 characters a piece).
    parts = node.get("overflow")
    if isinstance(parts, list):
        text = " ".join(p.strip() for p in parts if isinstance(p, str))
    else:
        text = ""
    for key in ("message", "error", "msg"):
        if not text and isinstance(node.get(key), str):
            text = node[key].strip()
    if len(text) > _MAX_INCIDENT:
        text = text[:_MAX_INCIDENT] + "..."
    return text


def _incidents(body: dict) -> Tuple[str, ...]:
    """body -> <entity group> -> children -> <id> -> children -> Errors -> children
    -> <system> -> {value: Warning|Failure, overflow: [message pieces]}."""
    found: List[str] = []
    for group, group_node in body.items():
        if group == "Overall Health" or not isinstance(group_node, dict):
            continue
        entities = group_node.get("children")
        for entity, entity_node in (entities.items() if isinstance(entities, dict) else ()):
            children = entity_node.get("children") if isinstance(entity_node, dict) else None
            errors = children.get("Errors") if isinstance(children, dict) else None
            systems = errors.get("children") if isinstance(errors, dict) else None
            for system, node in (systems.items() if isinstance(systems, dict) else ()):
                if isinstance(node, dict):
                    found.append("%s %s: %s: %s" % (group, entity, system, _messages(node)))
    return tuple(found)


def parse_health_json(text: str) -> DcgmHealth:
    """`dcgmi health -c -j`.  dcgmi prints a report only when watches are set,
    so a report means watches_set=True; the "not enabled" error gives overall
    "Unknown" with watches_set=False (health cannot be judged)."""
    if _NO_WATCHES.search(text) and not text.lstrip().startswith("{"):
        return DcgmHealth(overall="Unknown", incidents=(), watches_set=False)
    doc = _load_json(text, "dcgmi health -c -j")
    body = doc.get("body") if isinstance(doc, dict) else None
    overall = body.get("Overall Health") if isinstance(body, dict) else None
    value = overall.get("value") if isinstance(overall, dict) else None
    if not isinstance(value, str) or value.strip().lower() not in _OVERALL:
        raise ParseError("dcgmi health -c -j: expected body -> 'Overall Health' -> value "
                         "Healthy/Warning/Failure, saw %s" % _excerpt(text))
    return DcgmHealth(overall=_OVERALL[value.strip().lower()], incidents=_incidents(body),
                      watches_set=True)


def _status(value: Any, test: str) -> str:
    # dcgmi prints Pass/Fail/Skip (and Warn in some releases); NOT_RUN is "" in 4.x.
    text = value.strip().lower() if isinstance(value, str) else None
    if text is not None and (text == "" or text.replace("_", " ") in ("not run", "notrun")):
        return "Skip"
    for prefix, status in _STATUS.items():
        if text is not None and text.startswith(prefix):
            return status
    raise ParseError("dcgmi diag -j: test %s: expected status Pass/Fail/Skip/Warn, saw %s"
                     % (_excerpt(test, 40), _show(value)))


def _first_warning(result: dict) -> Tuple[Optional[int], Optional[int], str]:
    """error_id, severity, message of the first warning.  2.x prints one string;
    3.x/4.x a list of {warning, error_id, error_category, error_severity}
    (3.x level-1 tests key the message "warnings"; jsoncpp pads gaps with null)."""
    warnings = result.get("warnings")
    if isinstance(warnings, str):
        return None, None, warnings.strip()
    for item in warnings if isinstance(warnings, list) else ():
        if isinstance(item, str) and item.strip():
            return None, None, item.strip()
        if isinstance(item, dict):
            message = next((item[k] for k in ("warning", "warnings", "error", "message")
                            if isinstance(item.get(k), str)), "")
            return _small_int(item.get("error_id")), _small_int(item.get("error_severity")), message.strip()
    return None, None, ""


def _gpu(result: dict) -> Optional[int]:
    # 4.x: entity_group_id/entity_group + entity_id; 3.x: gpu_id; 2.x: gpu_ids ("0").
    if "entity_id" in result:
        group = result.get("entity_group_id", _GPU_GROUP_ID)
        name = result.get("entity_group", "GPU")
        is_gpu = group == _GPU_GROUP_ID and (not isinstance(name, str) or name.upper() == "GPU")
        return _small_int(result["entity_id"]) if is_gpu else None
    return _small_int(result.get("gpu_id", result.get("gpu_ids")))


def _result(test: str, result: Any) -> DcgmTestResult:
    if not isinstance(result, dict):
        raise ParseError("dcgmi diag -j: test %s: expected a result object, saw %s"
                         % (_excerpt(test, 40), _show(result)))
    error_id, severity, message = _first_warning(result)
    return DcgmTestResult(test=test, status=_status(result.get("status"), test), gpu=_gpu(result),
                          error_id=error_id, severity=severity, message=message)


def _test_results(test: Any) -> List[DcgmTestResult]:
    if test is None:  # jsoncpp leaves null where an array slot was skipped
        return []
    name = test.get("name") if isinstance(test, dict) else None
    if not isinstance(name, str):
        raise ParseError("dcgmi diag -j: expected a test with a 'name', saw %s" % _show(test))
    results = test.get("results", [])
    if not isinstance(results, list):
        raise ParseError("dcgmi diag -j: test %s: expected a 'results' list" % _excerpt(name, 40))
    out = [_result(name, r) for r in results if r is not None]
    # 4.x test_summary holds the overall status and errors tied to no entity: keep
    # it when it is the only result, or when it reports a failure no entity shows.
    summary = test.get("test_summary")
    if isinstance(summary, dict) and "status" in summary:
        overall = _result(name, summary)
        bad = ("Fail", "Warn")
        if not out or (overall.status in bad and not any(r.status in bad for r in out)):
            out.append(overall)
    return out


# What DCGM's NVVS says when it refuses to run on MIG (NvidiaValidationSuite::
# BuildCommonGpusList, DCGM 2.x-4.x).  dcgmi prints it as a line of text, or
# as runtime_error in -j mode; it refuses the whole run, not one test.
_MIG_REFUSALS = (
    re.compile(r"^GPU ([0-9]{1,4})'s MIG configuration is incompatible with the diagnostic\b"),
    re.compile(r"^Cannot run diagnostic: CUDA does not support enumerating GPUs with MIG mode enabled"
               r"(?:, yet GPU ([0-9]{1,4}) is MIG enabled)?"),
    re.compile(r"^Cannot run diagnostic: MIG is enabled, but no compute instances are configured\b"),
    re.compile(r"^Cannot run diagnostic: CUDA does not support enumerating GPUs when one more GPUs has MIG "
               r"mode enabled\b"),
)
DIAG_EXIT_OK = (0, 205, 226)  # 226 is also DCGM_ST_NVVS_ERROR (-30): what a refusal exits with


def _mig_refusal(line: str) -> Optional[DcgmTestResult]:
    """One line of DCGM's words -> a NotRun result, or None."""
    line = line.strip()
    for pattern in _MIG_REFUSALS:
        match = pattern.match(line)
        if match:
            gpu = match.group(1) if match.groups() else None
            words = line if len(line) <= _MAX_INCIDENT else line[:_MAX_INCIDENT] + "..."
            return DcgmTestResult(test="diagnostic", status=NOT_RUN, gpu=int(gpu) if gpu else None,
                                  message="not run on MIG: " + words)
    return None


def parse_diag_refusal(text: str) -> Optional[Tuple[DcgmTestResult, ...]]:
    """The plain-text refusal (issue NVIDIA/DCGM#94 prints the line twice):
    every non-blank line must be one of DCGM's MIG refusals, else None (any
    other text is not evidence that only MIG stopped the diagnostic)."""
    lines = [line for line in text.splitlines() if line.strip()]
    found = [_mig_refusal(line) for line in lines]
    if not lines or any(r is None for r in found):
        return None
    return tuple(dict.fromkeys(found))  # the same words twice are one refusal


def parse_diag_json(text: str, level: int, exit_code: int) -> DcgmDiag:
    """`dcgmi diag -r N -j`.  Exit 0, 226 (a test failed) and 205 (isolate-class
    failure) all print the JSON report on stdout.  A refusal to run on MIG
    (runtime_error in JSON, or DCGM's plain line) gives NotRun results, any
    exit code; any other runtime_error (GPUs busy, paused DCGM...) is a
    ParseError: never a pass.  The caller refuses a report with an exit code
    outside DIAG_EXIT_OK."""
    try:
        doc = _load_json(text, "dcgmi diag -j")
    except ParseError:
        refused = parse_diag_refusal(text)
        if refused is None:
            raise
        return DcgmDiag(level=level, exit_code=exit_code, results=refused)
    # DCGM 2.x/3.x: "DCGM GPU Diagnostic"; DCGM 4.x: "DCGM Diagnostic" (+ entity_groups, metadata).
    root = None
    if isinstance(doc, dict):
        root = doc.get("DCGM Diagnostic", doc.get("DCGM GPU Diagnostic"))
    if not isinstance(root, dict):
        raise ParseError("dcgmi diag -j: expected top key 'DCGM Diagnostic' or 'DCGM GPU Diagnostic', saw %s"
                         % _show(doc))
    if root.get("runtime_error"):
        error = root["runtime_error"]
        refused = parse_diag_refusal(error) if isinstance(error, str) else None
        if refused is not None:
            return DcgmDiag(level=level, exit_code=exit_code, results=refused)
        shown = _excerpt(error, 200) if isinstance(error, str) else _show(error)
        raise ParseError("dcgmi diag did not run (exit %s): %s" % (exit_code, shown))
    categories = root.get("test_categories")
    if not isinstance(categories, list):
        raise ParseError("dcgmi diag -j: expected a 'test_categories' list, saw %s" % _show(root))
    results: List[DcgmTestResult] = []
    for category in categories:
        tests = category.get("tests", []) if isinstance(category, dict) else None
        if not isinstance(tests, list):
            raise ParseError("dcgmi diag -j: expected a category with a 'tests' list, saw %s"
                             % _show(category))
        for test in tests:
            results.extend(_test_results(test))
    # The exit code is evidence too: never let a failing run read as all-pass.
    if exit_code in (205, 226) and not any(r.status in ("Fail", "Warn") for r in results):
        results.append(DcgmTestResult(test="dcgmi diag", status="Fail",
                                      message="exit code %d but no failed test in the JSON" % exit_code))
    return DcgmDiag(level=level, exit_code=exit_code, results=tuple(results))
