"""The node's part of the sweep's evidence bundle (gpugate/sweep/evidence.py):
what a node knows about its fault and loses at a GPU reset or a reboot, read
just before either, bounded, printed as one JSON object the sweep's transport
carries back (`gpugate evidence --json`).

Parts, in the order they are kept when the cap is tight:

- ``gpugate-last.json``: the last health check's facts and verdict (the state dir);
- ``kernel.log``: the kernel log since boot (/dev/kmsg, the newest part kept);
- the vendor's own parts, through gpugate.vendors.seam: NVIDIA's
  ``nvidia-smi -q`` and ``nvidia-bug-report.sh``'s log
  (gpugate.vendors.nvidia.evidence); AMD's amd-smi static, metric and
  bad-pages answers and amdgpu's RAS counters (gpugate.vendors.amd.evidence).

A part that cannot be read is said (``error``), never left out silently;
nothing here changes the node.
"""

import base64
import os
import time
from typing import Dict, List

KERNEL_CAP = 16 << 20


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

    # The vendor's own tools' words (NVIDIA: nvidia-smi -q and its bug report; AMD: amd-smi's and amdgpu's counters).
    part(vendor_of(settings, node), "evidence")(settings, node, add, parts, parts_timing, _error,
                                               {"bug_report_timeout": bug_report_timeout,
                                                "room": lambda: max(left[0], 0)})
    parts = [p for p in parts if p is not None]
    return {"node": node, "at": started, "parts": parts, "seconds": {k: round(v, 3) for k, v in parts_timing.items()}}
