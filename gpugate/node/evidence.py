"""The node's part of the sweep's evidence bundle (gpugate/sweep/evidence.py):
what a node knows about its fault and loses at a GPU reset or a reboot, read
just before either, bounded, printed as one JSON object the sweep's transport
carries back (`gpugate evidence --json`).

Parts, in the order they are kept when the cap is tight:

- ``gpugate-last.json``: the last health check's facts and verdict (the state dir);
- ``kernel.log``: the kernel log since boot (/dev/kmsg, the newest part kept);
- ``nvidia-smi-q.txt``: ``nvidia-smi -q``;
- ``nvidia-bug-report.log.gz``: ``nvidia-bug-report.sh`` where installed, with
  its own time limit (it can take minutes on a large node, or hang on a
  wedged GPU): NVIDIA's RMA process asks for it.

On an AMD node (vendor = "amd"), amd-smi's static, metric (ECC per block,
PCIe) and bad-pages answers and amdgpu's own RAS counters take the place of
the last two (gpugate.vendors.amd.evidence).

A part that cannot be read is said (``error``), never left out silently;
nothing here changes the node.
"""

import base64
import os
import shutil
import tempfile
import time
from typing import Dict, List

from gpugate.errors import CommandError
from gpugate.safety.runner import run

SMI_TIMEOUT = 60.0
KERNEL_CAP = 16 << 20
BUG_REPORT = "nvidia-bug-report.sh"


def _part(name: str, data: bytes, cap: int, keep: str = "head") -> dict:
    truncated = len(data) > cap
    if truncated:
        data = data[-cap:] if keep == "tail" else data[:cap]
    return {"name": name, "data": base64.b64encode(data).decode("ascii"), "bytes": len(data),
            "truncated": truncated}


def _error(name: str, why: str) -> dict:
    return {"name": name, "error": str(why)[:500]}


def collect(settings, node: str, max_bytes: int, bug_report_timeout: float) -> dict:
    """The bundle's node-side parts, within ``max_bytes`` of raw data."""
    started = time.time()
    left = [max(int(max_bytes * 3 // 4) - 4096, 4096)]  # base64 and JSON around it
    parts: List[dict] = []

    def add(name, data, cap=None, keep="head"):
        cap = min(left[0], cap or left[0])
        part = _part(name, data, max(cap, 0), keep)
        left[0] -= part["bytes"]
        parts.append(part)

    parts_timing: Dict[str, float] = {}
    # gpugate's own last facts and verdict.
    from gpugate.safety.safeio import STATE_CAP, read_capped
    from gpugate.safety.state import LAST

    t0 = time.monotonic()
    try:
        add("gpugate-last.json", read_capped(os.path.join(settings.state_dir(node), LAST), STATE_CAP))
    except OSError as exc:
        parts.append(_error("gpugate-last.json", exc.strerror or exc))
    # The kernel log since boot: what the Xid lines were, and the driver's words around them.
    from gpugate.probes.kernlog import read_kmsg

    text, _ = read_kmsg(os.path.join(settings.node_root(node), settings.kernel_log.lstrip("/")))
    if isinstance(text, str):
        add("kernel.log", text.encode("utf-8", "replace"), KERNEL_CAP, keep="tail")
    else:
        parts.append(_error("kernel.log", getattr(text, "detail", text)))
    parts_timing["files"] = time.monotonic() - t0
    from gpugate.vendors.seam import part, vendor_of

    own = part(vendor_of(settings, node), "evidence")
    if own is not None:  # the vendor's own tools' words instead (AMD: amd-smi's and amdgpu's counters)
        own(settings, node, add, parts, parts_timing, _error)
        return {"node": node, "at": started, "parts": [p for p in parts if p is not None],
                "seconds": {k: round(v, 3) for k, v in parts_timing.items()}}
    # nvidia-smi -q: every GPU's state as the driver reports it now.
    t0 = time.monotonic()
    try:
        out = run([settings.command("nvidia-smi", node), "-q"], SMI_TIMEOUT, ok_codes=range(256))
        add("nvidia-smi-q.txt", (out.stdout + (("\n# stderr (exit %d):\n" % out.rc) + out.stderr
                                                if out.rc or out.stderr else "")).encode())
    except CommandError as exc:
        parts.append(_error("nvidia-smi-q.txt", exc))
    parts_timing["nvidia-smi"] = time.monotonic() - t0
    t0 = time.monotonic()
    parts.append(_bug_report(settings, node, bug_report_timeout, add, lambda: max(left[0], 0)))
    parts_timing["bug_report"] = time.monotonic() - t0
    parts = [p for p in parts if p is not None]
    return {"node": node, "at": started, "parts": parts, "seconds": {k: round(v, 3) for k, v in parts_timing.items()}}


def _bug_report(settings, node, timeout, add, room):
    """nvidia-bug-report.sh where installed: its log (gzip, as it writes it),
    read no further than the bundle has room for (``room()`` bytes; a large
    node's report is hundreds of MiB)."""
    path = settings.command(BUG_REPORT, node)
    if not os.path.exists(path):
        return _error("nvidia-bug-report.log.gz", "not installed (%s)" % path)  # said, not a failure
    workdir = tempfile.mkdtemp(prefix="gpugate-bug-report-")
    try:
        target = os.path.join(workdir, "nvidia-bug-report.log")
        try:
            # --output-file: it appends .gz when it compresses.  Run in its own
            # directory: the tool writes next to its output file.
            out = run([path, "--output-file", target], timeout, ok_codes=range(256))
        except CommandError as exc:
            return _error("nvidia-bug-report.log.gz", exc)
        for name in ("nvidia-bug-report.log.gz", "nvidia-bug-report.log"):
            try:
                with open(os.path.join(workdir, name), "rb") as handle:
                    data = handle.read(room() + 1)  # one byte past the room: add() says truncated
            except OSError:
                continue
            add(name, data)
            return None
        # No file: what it printed is its console banner or its complaint,
        # never the report (the RMA process would get a page of "Complete.").
        said = (out.stderr.strip() or out.stdout.strip())[-300:]
        return _error("nvidia-bug-report.log.gz", "exit %d, no report written: %s" % (out.rc, said or "(nothing said)"))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
