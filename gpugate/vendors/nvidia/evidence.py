"""The evidence bundle's NVIDIA parts (gpugate.node.evidence), read before a
reset or a reboot clears them:

- ``nvidia-smi-q.txt``: ``nvidia-smi -q``, every GPU's state as the driver
  reports it now;
- ``nvidia-bug-report.log.gz``: ``nvidia-bug-report.sh`` where installed, with
  its own time limit (it can take minutes on a large node, or hang on a
  wedged GPU): NVIDIA's RMA process asks for it.
"""

import os
import shutil
import tempfile
import time

from gpugate.errors import CommandError
from gpugate.safety.runner import run

SMI_TIMEOUT = 60.0
BUG_REPORT = "nvidia-bug-report.sh"


def nvidia_parts(settings, node: str, add, parts: list, timing: dict, error, options: dict) -> None:
    """add(name, data[, cap]) keeps a part; error(name, why) says one could not be read;
    options: bug_report_timeout (seconds), room() (the bytes the bundle has left)."""
    # nvidia-smi -q: every GPU's state as the driver reports it now.
    t0 = time.monotonic()
    try:
        out = run([settings.command("nvidia-smi", node), "-q"], SMI_TIMEOUT, ok_codes=range(256))
        add("nvidia-smi-q.txt", (out.stdout + (("\n# stderr (exit %d):\n" % out.rc) + out.stderr
                                                if out.rc or out.stderr else "")).encode())
    except CommandError as exc:
        parts.append(error("nvidia-smi-q.txt", exc))
    timing["nvidia-smi"] = time.monotonic() - t0
    t0 = time.monotonic()
    parts.append(_bug_report(settings, node, options["bug_report_timeout"], add, options["room"], error))
    timing["bug_report"] = time.monotonic() - t0


def _bug_report(settings, node, timeout, add, room, error):
    """nvidia-bug-report.sh where installed: its log (gzip, as it writes it),
    read no further than the bundle has room for (``room()`` bytes; a large
    node's report is hundreds of MiB)."""
    path = settings.command(BUG_REPORT, node)
    if not os.path.exists(path):
        return error("nvidia-bug-report.log.gz", "not installed (%s)" % path)  # said, not a failure
    workdir = tempfile.mkdtemp(prefix="gpugate-bug-report-")
    try:
        target = os.path.join(workdir, "nvidia-bug-report.log")
        try:
            # --output-file: it appends .gz when it compresses.  Run in its own
            # directory: the tool writes next to its output file.
            out = run([path, "--output-file", target], timeout, ok_codes=range(256))
        except CommandError as exc:
            return error("nvidia-bug-report.log.gz", exc)
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
        return error("nvidia-bug-report.log.gz", "exit %d, no report written: %s" % (out.rc, said or "(nothing said)"))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
