"""The pieces gpugate.vendors.amd.parse_smi is built from: finding amd-smi's JSON
after a banner, reading its human-readable form into the same tree, finding
the per-GPU records, and turning each leaf into a value or a ProbeFailure.

How amd-smi prints (ROCm/amdsmi ``amdsmi_cli/amdsmi_logger.py``, the newer
copy in ROCm/rocm-systems ``projects/amdsmi``):
- JSON: ROCm 6.x prints a list of per-device objects (``[{"gpu": 0, ...}]``);
  ``static``/``metric``/``xgmi`` of ROCm 7.x wrap them (``{"gpu_data": [...]}``,
  ``{"link_status": [...]}``: ``combine_arrays_to_json``).  A 6.x node with
  amd_hsmp loaded prints a CPU list, then a GPU list: two documents.
- Text: the same keys upper-cased, YAML-like, one ``GPU: N`` block per GPU; a
  list of objects is printed as repeated keys under one section.
- What a library call could not give is the string ``"N/A"``; a few fields
  carry the library's error text instead (``"AMDSMI_STATUS_FILE_ERROR - ..."``).

Pure functions: no I/O.
"""

from __future__ import annotations

import json
import math
import re

from gpugate.model.facts import ProbeFailure

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only
    from typing import Any, Dict, List, Tuple

SOURCE = "amd_smi"
_MAX_DETAIL = 160
_JSON_START = re.compile(r"^[ \t]*[\[{]", re.M)
_GPU_HEAD = re.compile(r"(GPU|CPU|CORE|NIC)\s*:\s*(\d{1,6})\s*$")
_NUMBER = re.compile(r"\s*(-?(?:0[xX][0-9a-fA-F]+|\d+(?:\.\d+)?))(?:\s|$|[A-Za-z%°/])")
_XGMI_ROW = re.compile(r"GPU(\d{1,5})\s+([0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.\d)\s+(.*)$")
_BDF = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")


def short(text: Any, limit: int = _MAX_DETAIL) -> str:
    """One line of at most ``limit`` characters (a detail, never a dump)."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def banner_note(banner: str) -> str:
    """The suffix every N/A of this run carries: amd-smi prints its
    permission banner before the JSON when it cannot open the device nodes
    (samples/amd/amd-smi-static-json-nonroot-permdenied-...), and then every
    ioctl-backed field is N/A for that reason, not for the GPU's."""
    if "/dev/kfd" in banner:
        return " (no /dev/kfd access)"
    if "/dev/dri" in banner and "ermission" in banner:
        return " (no /dev/dri access)"
    return ""


def na(field: str, note: str = "") -> ProbeFailure:
    return ProbeFailure(SOURCE, "na", "%s: N/A%s" % (field, note))


def absent(field: str, note: str = "") -> ProbeFailure:
    # Absent where the release should print it reads like N/A: not a value.
    return ProbeFailure(SOURCE, "na", "%s: absent%s" % (field, note))


def failed(field: str, text: Any, note: str = "") -> ProbeFailure:
    return ProbeFailure(SOURCE, "error", "%s: %s%s" % (field, short(text, 100), note))


def relabel(failure: ProbeFailure, field: str) -> ProbeFailure:
    """A section's failure, named after the field that needed it."""
    detail = failure.detail.split(": ", 1)[-1]
    return ProbeFailure(failure.source, failure.kind, "%s: %s" % (field, detail))


# ---- finding the JSON ---------------------------------------------------


def json_payload(stdout: str) -> Tuple[str, Any]:
    """(banner text printed before the JSON, the parsed JSON).  Several
    documents one after the other (6.x: CPU list then GPU list) come back
    as one list.  ValueError when no line starts a JSON document."""
    text = stdout if isinstance(stdout, str) else ""
    decoder = json.JSONDecoder()
    for match in _JSON_START.finditer(text):
        start = match.end() - 1
        try:
            first, end = decoder.raw_decode(text, start)
        except (ValueError, RecursionError):
            continue  # a banner line such as "[WARNING] ..." starts with "["
        docs = [first]
        while True:
            nxt = len(text) - len(text[end:].lstrip())
            if nxt >= len(text) or text[nxt] not in "[{":
                break
            try:
                doc, end = decoder.raw_decode(text, nxt)
            except (ValueError, RecursionError):
                break  # trailing text (a legend) after the JSON
            docs.append(doc)
        return text[: match.start()].strip(), _merge(docs)
    raise ValueError("no JSON in amd-smi output")


def _merge(docs: List[Any]) -> Any:
    if len(docs) == 1:
        return docs[0]
    merged = []  # type: List[Any]
    for doc in docs:
        merged.extend(doc if isinstance(doc, list) else [doc])
    return merged


# ---- the human-readable form ---------------------------------------------


def text_records(text: str) -> Tuple[str, List[Dict[str, Any]]]:
    """(banner, one tree per ``GPU: N`` block) of amd-smi's text output, keys
    lower-cased as in its JSON.  A key repeated within a section starts the
    next object of a list (bad pages with several pages)."""
    records = []  # type: List[Dict[str, Any]]
    banner = []  # type: List[str]
    stack = None  # [(indent, items)]: items is the list of objects of a section
    for raw in text.splitlines():
        body = raw.strip()
        if not body:
            continue
        indent = len(raw) - len(raw.lstrip())
        if indent == 0:
            head = _GPU_HEAD.match(body)
            if head and head.group(1) == "GPU":
                items = [{"gpu": int(head.group(2))}]  # type: List[Dict[str, Any]]
                records.append(items[0])
                stack = [(-1, items)]
            else:
                if not records:
                    banner.append(body)
                stack = None  # CPU blocks, tables, legends: not a GPU's
            continue
        if stack is None:
            if not records:
                banner.append(body)
            continue
        if body.endswith(":") and ": " not in body:
            key, value, section = body[:-1], None, True
        else:
            key, sep, value = body.partition(": ")
            if not sep:
                continue  # "..." or "[output truncated]"
            section = False
        while stack[-1][0] >= indent and len(stack) > 1:
            stack.pop()
        items = stack[-1][1]
        key = key.strip().lower()
        if key in items[-1]:
            items.append({})
        if section:
            child = [{}]  # type: List[Dict[str, Any]]
            items[-1][key] = child
            stack.append((indent, child))
        else:
            items[-1][key] = value.strip()
    return "\n".join(banner), [_closed(r) for r in records]


def _closed(node: Any) -> Any:
    """Sections were built as lists of objects: one object stays an object."""
    if isinstance(node, list):
        items = [_closed(x) for x in node]
        if not items or items == [{}]:
            return "N/A"  # an empty section prints as "KEY:" alone
        return items[0] if len(items) == 1 else items
    if isinstance(node, dict):
        return {k: _closed(v) for k, v in node.items()}
    return node


# ---- per-GPU records -------------------------------------------------------


def index_of(value: Any) -> Any:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and 0 <= value < 100000:
        return value
    if isinstance(value, str) and value.strip().isdigit() and len(value.strip()) < 6:
        return int(value.strip())
    return None


def gpu_records(payload: Any) -> Dict[int, Dict[str, Any]]:
    """gpu index -> its object, wherever the release put the list."""
    out = {}  # type: Dict[int, Dict[str, Any]]
    todo = [(payload, 0)]
    while todo:
        node, depth = todo.pop(0)
        if depth > 4:
            continue
        if isinstance(node, list):
            todo.extend((x, depth + 1) for x in node)
        elif isinstance(node, dict):
            if "gpu" in node:
                idx = index_of(node["gpu"])
                if idx is not None and idx not in out:
                    out[idx] = node
            elif isinstance(node.get("gpu_data"), list):
                todo.append((node["gpu_data"], depth + 1))
    return out


def records(stdout: str) -> Tuple[str, Dict[int, Dict[str, Any]]]:
    """(N/A note, gpu index -> object) from the JSON or the text form."""
    try:
        banner, payload = json_payload(stdout)
        return banner_note(banner), gpu_records(payload)
    except ValueError:
        banner, recs = text_records(stdout if isinstance(stdout, str) else "")
        return banner_note(banner), gpu_records(recs)


# ---- leaves ---------------------------------------------------------------


def get(node: Any, path: Tuple[str, ...], field: str, note: str = "") -> Any:
    """The raw leaf at ``path``, or why there is none."""
    for key in path:
        if isinstance(node, ProbeFailure):
            return relabel(node, field)
        if isinstance(node, dict):
            if key not in node:
                return absent(field, note)
            node = node[key]
        elif is_na(node):
            return na(field, note)
        else:
            return failed(field, "unexpected %s" % type(node).__name__, note)
    return node


def is_na(value: Any) -> bool:
    return isinstance(value, str) and value.strip().upper() in ("N/A", "NA", "")


def _unwrap(value: Any) -> Any:
    # Numbers with units are {"value": N, "unit": "W"}; N may itself be "N/A".
    if isinstance(value, dict) and "value" in value:
        return value["value"]
    return value


def text(value: Any, field: str, note: str = "") -> Any:
    """A non-empty string, or why not."""
    value = _unwrap(value)
    if isinstance(value, ProbeFailure):
        return value
    if value is None:
        return absent(field, note)
    if isinstance(value, str):
        if is_na(value):
            return na(field, note)
        if value.strip().lstrip("[").startswith("AMDSMI_STATUS"):
            return failed(field, value, note)  # the library's error text, printed as the value
        return value.strip()
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # fw versions and ids are sometimes printed as numbers
    return failed(field, "unexpected %s" % type(value).__name__, note)


def number(value: Any, field: str, note: str = "") -> Any:
    """An int or a finite float ("750 W" and "0x1000" read too), or why not."""
    value = _unwrap(value)
    if isinstance(value, bool):
        return failed(field, "a boolean, not a number", note)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else failed(field, "not finite", note)
    got = text(value, field, note)
    if isinstance(got, ProbeFailure):
        return got
    match = _NUMBER.match(got + " ")
    if not match or len(match.group(1)) > 24:
        return failed(field, "not a number: %s" % got, note)
    digits = match.group(1)
    if "x" in digits.lower():
        return int(digits, 16)
    return float(digits) if "." in digits else int(digits)


def count(value: Any, field: str, note: str = "") -> Any:
    """A count: an int >= 0, or why not."""
    got = number(value, field, note)
    if isinstance(got, ProbeFailure):
        return got
    if isinstance(got, float):
        if not got.is_integer():
            return failed(field, "not a whole number: %s" % got, note)
        got = int(got)
    if got < 0:
        return failed(field, "negative: %d" % got, note)
    return got


def bdf(value: Any, field: str = "bdf", note: str = "") -> Any:
    got = text(value, field, note)
    if isinstance(got, ProbeFailure):
        return got
    got = got.lower()
    return got if _BDF.fullmatch(got) else failed(field, "not a PCI address: %s" % got, note)


def first_failure(*values: Any) -> Any:
    for value in values:
        if isinstance(value, ProbeFailure):
            return value
    return None


# ---- sections shared by the parsers ------------------------------------------


def section(rec: Any, key: str, field: str, note: str) -> Any:
    node = get(rec, (key,), field, note)
    if isinstance(node, (dict, ProbeFailure)):
        return node
    got = text(node, field, note)
    return got if isinstance(got, ProbeFailure) else failed(field, got, note)


def triple(node: Any, prefix: str, field: str, note: str) -> Any:
    """(ue, ce, de or None): de is None where the release prints no deferred count."""
    if not isinstance(node, dict):
        return section({"x": node}, "x", field, note)
    ue = count(get(node, (prefix + "uncorrectable_count",), field + " ue", note), field + " ue", note)
    ce = count(get(node, (prefix + "correctable_count",), field + " ce", note), field + " ce", note)
    de = None
    if prefix + "deferred_count" in node:
        de = count(node[prefix + "deferred_count"], field + " de", note)
    return first_failure(ue, ce, de) or (ue, ce, de)


def xgmi_rows_json(payload: Any) -> Dict[int, Any]:
    if isinstance(payload, dict):  # 7.x: {"link_status": [...]} beside "xgmi_metric" etc.
        payload = payload.get("link_status", [])
    rows = {}  # type: Dict[int, Any]
    for entry in payload if isinstance(payload, list) else []:
        if isinstance(entry, dict) and "link_status" in entry:
            gpu = entry.get("gpu")
            if isinstance(gpu, str) and gpu.upper().startswith("GPU"):
                gpu = gpu[3:]
            idx = index_of(gpu)
            if idx is not None:
                rows.setdefault(idx, entry["link_status"])
    return rows


def links(statuses: Any, note: str) -> Any:
    # Per link "U"/"D"/"X" (25.3), or per peer GPU "SELF", "U", "U/D" (one per
    # link to it), "N/A" (no link, or not readable).  All N/A is what mVF
    # setups print for NOT_SUPPORTED (CHANGELOG) and what any library error
    # prints too: the output cannot tell them apart, so it is not a value.
    if not isinstance(statuses, list):
        return text(statuses, "xgmi link_status", note) if is_na(statuses) else \
            failed("xgmi link_status", "unexpected %s" % type(statuses).__name__, note)
    tally = {"U": 0, "D": 0, "X": 0, "SELF": 0, "N/A": 0}
    for status in statuses:
        said = str(status).strip().upper() if isinstance(status, str) else None
        for token in ([said] if said in ("N/A", None) else said.split("/")):
            if token not in tally:
                return failed("xgmi link_status", "unknown status %r" % short(status, 20), note)
            tally[token] += 1
    if tally["U"] + tally["D"] + tally["X"]:
        return (tally["U"], tally["D"], tally["X"])
    if tally["N/A"]:
        return ProbeFailure(SOURCE, "na", "xgmi link_status: N/A for every link (not supported or"
                                          " unreadable)" + note)
    return None  # no links at all, or only itself: a GPU outside any XGMI hive


def xgmi_rows_text(stdout: str) -> Dict[int, Any]:
    rows, table = {}, False  # type: Dict[int, Any], bool
    for line in (stdout if isinstance(stdout, str) else "").splitlines():
        if line.strip().endswith(":"):  # a table's title: only "XGMI LINK STATUS:" is read
            table = line.strip().startswith("XGMI LINK STATUS")
        match = _XGMI_ROW.match(line.strip()) if table else None
        if match:
            rows.setdefault(int(match.group(1)), match.group(3).split())
    return rows
