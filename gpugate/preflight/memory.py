"""What a node's preflight found that the node keeps (``preflight.json``
in its state directory): a budgeted finding (a bus bandwidth under the
floor) that only a proof under load shows.  The health check, which runs
no such proof, judges it again from here, so the finding stays published
for the keeper instead of being cleared by the next passive check.

It is forgotten when a later preflight on the whole node passes, after
REMEMBER_SECONDS, and at the next boot (the sweep's repair reboots; its
verification and smoke job prove the node again)."""

import os
import time
from typing import List, Optional

from ..findings import Finding
from ..node import state as st

NAME = "preflight.json"
REMEMBER_SECONDS = 24 * 3600.0
_CAP = 64 << 10


def _path(settings, node: str) -> str:
    return os.path.join(settings.state_dir(node), NAME)


def remember(settings, node: str, budgeted: List[Finding], passed: bool, boot_id: Optional[str],
             now: Optional[float] = None) -> None:
    """After a preflight: keep its budgeted findings, or forget them when
    it passed; anything else (undecided, acute: drained) changes nothing."""
    path = _path(settings, node)
    if budgeted:
        st.write_json(path, {"at": time.time() if now is None else now, "boot_id": boot_id,
                             "findings": [f.to_json() for f in budgeted]})
    elif passed:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def judged(settings, node: str, boot_id: Optional[str], now: Optional[float] = None) -> List[Finding]:
    """The findings a preflight left on this boot within REMEMBER_SECONDS."""
    kept = st.read_json(_path(settings, node), _CAP)
    if not isinstance(kept, dict) or not boot_id or kept.get("boot_id") != boot_id:
        return []
    at = kept.get("at")
    now = time.time() if now is None else now
    if not isinstance(at, (int, float)) or not 0 <= now - at < REMEMBER_SECONDS:
        return []
    found = []
    for item in kept.get("findings") or []:
        try:
            finding = Finding.from_json(item)
        except (KeyError, TypeError, AttributeError):
            continue
        if finding.cls == "health" and finding.component == "preflight_busbw":  # only what it may keep
            found.append(finding)
    return found
