"""Evidence before loss: before the sweep resets a node's GPUs or reboots it,
it keeps what the node knows about the fault, which the reset or the reboot
wipes (issue 28).

One bundle per node per attempt, ``<node>-<UTC time>-a<attempt>.tar.gz`` in
``[sweep] evidence_dir`` (default: evidence/ next to the journal) on the
controller, root's alone (the trust walk on the directory, which is made and
kept 0700; each file created O_EXCL|O_NOFOLLOW, 0600, via gpugate.safety.safeio).
It holds the node's parts (gpugate.node.evidence: the kernel log since boot,
``nvidia-smi -q``, ``nvidia-bug-report.sh``'s log where installed, gpugate's
last facts and verdict), what the controller has (the failed verification's
DCGM run, the newest smoke job output of the node) and MANIFEST.json (what
each part is, what could not be read and why).  At most
``evidence_max_bytes`` each; the newest ``evidence_keep`` per node are kept.

A collection that fails or times out is recorded (the bundle then holds the
controller's parts and says why the node's are missing) and never stops the
repair: every error here ends as a text in the journal.
"""

import base64
import io
import json
import os
import re
import tarfile
import time
from typing import Dict, List, Optional, Set, Tuple

from gpugate.safety import safeio
from gpugate.core.names import is_node_name

_BUNDLE = re.compile(r"^(?P<node>.+)-(?P<at>\d{8}T\d{6}Z)-a(?P<attempt>\d+)(?:-(?P<n>\d+))?\.tar\.gz$")
PART_CAP = 8 << 20  # a controller-side part (a DCGM JSON, a smoke output)


def directory(cfg) -> str:
    return str(cfg["evidence_dir"]) or os.path.join(os.path.dirname(os.path.abspath(str(cfg["journal"]))),
                                                    "evidence")


def with_id(reason_text: str, bundle: Optional[str], limit: int = 255) -> str:
    """The rma reason with ``evidence=<id>`` at its end, where it fits."""
    if not bundle:
        return reason_text
    tail = "; evidence=%s" % bundle
    return reason_text + tail if len(reason_text) + len(tail) <= limit else reason_text


def bundle_id(node: str, attempt: int, at: float) -> str:
    return "%s-%s-a%d" % (node, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(at)), attempt)


class Store:
    """The evidence directory: checked, created 0700, written 0600."""

    def __init__(self, path: str):
        self.path = path

    def save(self, node: str, attempt: int, parts: List[Tuple[str, bytes]], manifest: dict, max_bytes: int,
             keep: int, at: Optional[float] = None) -> Tuple[str, int]:
        """(bundle id, bytes written).  OSError (trust.Untrusted included) when it cannot be kept."""
        if not is_node_name(node):
            raise OSError("unsafe node name for a file name: %r" % node)
        at = time.time() if at is None else at
        data, manifest = _tar(parts, manifest, max_bytes)
        dir_fd = safeio.open_checked_dir(self.path, "[sweep] evidence_dir", create_mode=0o700)
        try:
            if os.fstat(dir_fd).st_mode & 0o077:
                os.fchmod(dir_fd, 0o700)  # root's alone: a bundle holds a node's whole state
            base = bundle_id(node, attempt, at)
            for n in range(100):
                name = base if n == 0 else "%s-%d" % (base, n)
                try:
                    safeio.write_atomic(name + ".tar.gz", data, mode=0o600, durable=True, dir_fd=dir_fd,
                                        exact_mode=True, replace=False)
                    break
                except FileExistsError:
                    continue
            else:
                raise OSError("%s: every bundle name for %s is taken" % (self.path, base))
            self._prune(dir_fd, node, keep)
        finally:
            os.close(dir_fd)
        return name, len(data)

    def _prune(self, dir_fd: int, node: str, keep: int) -> None:
        mine = sorted((m.group("at"), int(m.group("n") or 0), name) for name in os.listdir(dir_fd)
                      for m in [_BUNDLE.match(name)] if m and m.group("node") == node)
        for _, _, name in mine[:max(len(mine) - keep, 0)]:
            try:
                os.unlink(name, dir_fd=dir_fd)
            except OSError:
                pass

    def list(self, node: Optional[str] = None) -> List[dict]:
        try:
            names = os.listdir(self.path)
        except OSError:
            return []
        out = []
        for name in sorted(names):
            m = _BUNDLE.match(name)
            if m and (node is None or m.group("node") == node):
                out.append({"id": name[:-len(".tar.gz")], "node": m.group("node"),
                            "path": os.path.join(self.path, name)})
        return out


def _tar(parts: List[Tuple[str, bytes]], manifest: dict, max_bytes: int) -> Tuple[bytes, dict]:
    """A gzip tar of the parts in order, within max_bytes: a part that would
    not fit is left out and said in the manifest."""
    budget = max_bytes - 64 * 1024  # the manifest, tar headers, gzip
    kept, left_out = [], []
    taken = {MANIFEST.casefold()}  # no member shares a name with another, or the manifest (node_parts named them)
    for name, data in ((part_name(n, taken), d) for n, d in parts):
        if len(data) <= budget:
            kept.append((name, data))
            budget -= len(data) + 512
        else:
            left_out.append({"name": name, "bytes": len(data), "why": "over evidence_max_bytes"})
    manifest = dict(manifest, left_out=manifest.get("left_out", []) + left_out)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in [(MANIFEST, json.dumps(manifest, indent=1, sort_keys=True).encode())] + kept:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), int(manifest.get("at", time.time())), 0o600
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue(), manifest


MANIFEST = "MANIFEST.json"
_NOT_NAME = re.compile(r"[^A-Za-z0-9._+-]")
_NAME_MAX = 100


def part_name(raw: str, taken: Set[str]) -> str:
    """A node's name for its part, as a member name the controller's own
    cannot share: its last path element in safe characters, no leading dot
    or dash, prefixed ``node-`` where it would be a name in ``taken``
    (MANIFEST.json, the controller's parts, the node's earlier parts) in any
    case (a case-insensitive file system extracts MANIFEST.JSON over it),
    numbered where still taken.  Adds the name to ``taken`` (casefolded)."""
    base = _NOT_NAME.sub("_", os.path.basename(str(raw).replace("\\", "/").rstrip("/. ")))
    name = base.lstrip(".-")[:_NAME_MAX].rstrip(".") or "part"
    if name.casefold() in taken:
        name = ("node-" + name)[:_NAME_MAX].rstrip(".")
    stem, n = name, 1
    while name.casefold() in taken:
        n += 1
        suffix = "-%d" % n
        name = stem[:_NAME_MAX - len(suffix)] + suffix
    # At most _NAME_MAX characters, prefix and number included: the bundle
    # (_tar) names each part again, and must find the name the manifest has.
    taken.add(name.casefold())
    return name


def node_parts(answer, reserved=()) -> Tuple[List[Tuple[str, bytes]], List[dict], str]:
    """(parts, their manifest rows, error) from the node's `gpugate evidence`
    answer; ``reserved``: the controller's part names (MANIFEST.json always)."""
    if not isinstance(answer, dict):
        return [], [], str(answer or "no answer")[:500]
    parts, rows = [], []
    taken = {MANIFEST.casefold()} | {r.casefold() for r in reserved}
    for part in answer.get("parts") or ():
        if not isinstance(part, dict) or not isinstance(part.get("name"), str):
            continue
        name = part_name(part["name"], taken)
        if "error" in part:
            rows.append({"name": name, "error": str(part["error"])[:500]})
            continue
        try:
            data = base64.b64decode(part.get("data") or "", validate=True)
        except ValueError:
            rows.append({"name": name, "error": "undecodable in the node's answer"})
            continue
        parts.append((name, data))
        rows.append({"name": name, "bytes": len(data), "truncated": bool(part.get("truncated"))})
    return parts, rows, ""


def controller_parts(sweeper, name: str) -> Tuple[List[Tuple[str, bytes]], List[dict]]:
    """What the controller holds about the node: the failed verification's
    answer (its DCGM run) and the newest smoke job output."""
    parts, rows = [], []
    answer = getattr(sweeper, "last_answers", {}).get(name)
    if isinstance(answer, dict):
        facts = answer.get("facts") if isinstance(answer.get("facts"), dict) else {}
        amd = facts.get("amd") if isinstance(facts.get("amd"), dict) else {}
        for part, diag in (("dcgm-diag.json", facts.get("dcgm_diag")), ("rvs.json", amd.get("rvs"))):
            if diag is not None:  # the diagnostic's answer: DCGM's, or the ROCm Validation Suite's on AMD
                parts.append((part, json.dumps(diag, indent=1, sort_keys=True).encode()[:PART_CAP]))
        verify = {k: answer.get(k) for k in ("node", "fit", "reason", "findings", "mode") if k in answer}
        parts.append(("verify-answer.json", json.dumps(verify, indent=1, sort_keys=True).encode()[:PART_CAP]))
    smoke = _newest_smoke(str(sweeper.cfg.get("smoke_output_dir") or ""), name)
    if smoke is not None:
        parts.append(smoke)
    for part, data in parts:
        rows.append({"name": part, "bytes": len(data), "from": "controller"})
    return parts, rows


def _newest_smoke(outdir: str, node: str) -> Optional[Tuple[str, bytes]]:
    from gpugate.sweep.smoke_output import JOB_NAME, _read_bounded

    try:
        names = [n for n in os.listdir(outdir) if n.startswith("%s-%s-" % (JOB_NAME, node)) and n.endswith(".out")]
        newest = max(names, key=lambda n: os.stat(os.path.join(outdir, n), follow_symlinks=False).st_mtime)
        return "smoke-" + newest, _read_bounded(os.path.join(outdir, newest)).encode()[-PART_CAP:]
    except (OSError, ValueError):
        return None


def collect(sweeper, nodes: List[str], records) -> Dict[str, Tuple[bool, str, str]]:
    """Collect and keep a bundle per node: {node: (complete, bundle id or "", detail)}.
    Never raises: a failure is the detail the journal records."""
    cfg = sweeper.cfg
    max_bytes, keep = int(cfg["evidence_max_bytes"]), int(cfg["evidence_keep"])
    try:
        answers = sweeper.transport.run(
            nodes, ["evidence", "--max-bytes", str(max_bytes), "--bug-report-timeout",
                    "%g" % float(cfg["bug_report_timeout"])], float(cfg["evidence_timeout"]),
            max_stdout=2 * max_bytes + (1 << 20))
    except Exception as exc:  # a transport that cannot even start: the repair goes on
        answers = {n: "collection failed: %s" % exc for n in nodes}
    store = Store(directory(cfg))
    out = {}
    for name in nodes:
        try:
            mine, my_rows = controller_parts(sweeper, name)
            parts, rows, error = node_parts(answers.get(name, "no answer"), [p for p, _ in mine])
            rec = records.get(name)
            manifest = {"node": name, "at": time.time(), "attempt": rec.attempt if rec else 1,
                        "remedy": rec.remedy if rec else "", "reason": rec.reason if rec else "",
                        "parts": rows + my_rows, "node_error": error or None,
                        "seconds": answers[name].get("seconds") if isinstance(answers.get(name), dict) else None}
            bundle, size = store.save(name, manifest["attempt"], parts + mine, manifest, max_bytes, keep)
            missing = [r["name"] for r in rows if "error" in r and "not installed" not in r["error"]]
            detail = "id=%s bytes=%d parts=%d" % (bundle, size, len(parts) + len(mine))
            if error:
                detail += "; the node's parts are missing: %s" % error[:200]
            elif missing:
                detail += "; unreadable: %s" % ", ".join(missing)
            out[name] = (not error, bundle, detail)
        except Exception as exc:  # never blocks the repair
            out[name] = (False, "", "not kept: %s" % (getattr(exc, "strerror", None) or exc))
    return out
