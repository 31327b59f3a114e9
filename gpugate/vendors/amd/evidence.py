"""The evidence bundle's AMD parts (gpugate.node.evidence): what AMD's RMA
process and an admin ask for, read before a reset clears it.

- ``amd-smi-static.json``, ``amd-smi-metric.json`` (ECC totals and per
  block, PCIe counters), ``amd-smi-bad-pages.json``: amd-smi's own answers,
  whatever it printed (its failure is evidence too: "driver not loaded");
- ``amdgpu-ras.txt``: every GPU's /sys/class/drm/cardN/device/ras/*_err_count
  and gpu_vram_bad_pages as the driver shows them (a reset clears the counts).
"""

import os
import time

from gpugate.errors import CommandError
from gpugate.probes.commands import ENV  # amd-smi is Python run as root: none of the caller's PYTHON* variables
from gpugate.safety.runner import run

SMI_TIMEOUT = 60.0
COMMANDS = (("amd-smi-static.json", ("static", "--json")),
            ("amd-smi-metric.json", ("metric", "--ecc", "--ecc-blocks", "--pcie", "--json")),
            ("amd-smi-bad-pages.json", ("bad-pages", "--json")))
_RAS_CAP = 1 << 20


def amd_parts(settings, node: str, add, parts: list, timing: dict, error, options=None) -> None:
    """add(name, data[, cap]) keeps a part; error(name, why) says one could not be read
    (options: NVIDIA's bug-report limits, nothing of AMD's)."""
    t0 = time.monotonic()
    smi = settings.command("amd-smi", node)
    for name, args in COMMANDS:
        try:
            out = run([smi] + list(args), SMI_TIMEOUT, env=ENV, ok_codes=range(256))
            add(name, (out.stdout + (("\n# stderr (exit %d):\n" % out.rc) + out.stderr
                                     if out.rc or out.stderr else "")).encode())
        except CommandError as exc:
            parts.append(error(name, exc))
    timing["amd-smi"] = time.monotonic() - t0
    t0 = time.monotonic()
    add("amdgpu-ras.txt", _ras_text(settings.node_root(node)).encode(), _RAS_CAP)
    timing["ras"] = time.monotonic() - t0


def _ras_text(root: str) -> str:
    """Every RAS file of every AMD GPU, "== PATH" then its text (bounded reads)."""
    from gpugate.safety.safeio import read_capped

    lines = []
    drm = os.path.join(root, "sys/class/drm")
    try:
        cards = sorted(n for n in os.listdir(drm) if n.startswith("card") and n[4:].isdigit())
    except OSError as exc:
        return "# %s: %s\n" % (drm, exc.strerror or exc)
    for card in cards:
        ras = os.path.join(drm, card, "device", "ras")
        try:
            names = sorted(os.listdir(ras))
        except OSError:
            continue  # not an AMD GPU, or RAS off
        for name in names:
            if not (name.endswith("_err_count") or name == "gpu_vram_bad_pages"):
                continue
            path = os.path.join(ras, name)
            try:
                text = read_capped(path, 64 << 10).decode("utf-8", "replace")
            except OSError as exc:
                text = "(unreadable: %s)\n" % (exc.strerror or exc)
            lines.append("== %s/device/ras/%s\n%s" % (card, name, text if text.endswith("\n") else text + "\n"))
    return "".join(lines) or "# no AMD GPU with RAS under /sys/class/drm\n"
