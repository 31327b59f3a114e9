"""Reusing the last health check on the prolog/epilog path: its resolved
baseline (no TOML, no hostlists) and kernel-log cursor, while fresh."""

from __future__ import annotations

import os
import time

from gpugate.safety import state as st

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Optional, Tuple


def fresh_baseline(settings, node: str, last: Optional[dict], boot_id) -> Tuple[Optional[object], int]:
    """(baseline from the cache or None, kernel-log cursor).  The cache is
    used only when the last health check was fit, recent, of this boot, and
    neither gpugate.toml nor the baseline file changed since."""
    if not last:
        return None, -1
    cursor = last.get("kmsg_cursor", -1) if last.get("boot_id") == boot_id else -1
    age = time.time() - float(last.get("at", 0) or 0)
    # A negative age (the clock was stepped back) is not "fresh": without
    # the bound a verdict from the "future" would be reused until then.
    if not (last.get("fit") and last.get("boot_id") == boot_id
            and 0 <= age <= settings.verdict_max_age_seconds
            and last.get("baseline_sig") == st.file_signature(settings.baseline)
            and last.get("config_sig") == st.file_signature(settings.source)):
        return None, cursor
    try:
        from gpugate.model.baseline import from_resolved

        return from_resolved(last["resolved"]), cursor
    except (KeyError, TypeError, ValueError):
        return None, cursor  # a cache written by another version: load the TOML


RESET_MARKER = "gpu-reset.json"  # `gpugate reset-gpus` (gpugate.node.gpureset.mark) writes it at the end


def reset_cursor(settings, node: str, boot_id) -> int:
    """The kernel log's newest record when the sweep last reset this node's
    GPUs in this boot, else -1.  What came before it (the fault that called
    for the reset, amdgpu's own "GPU reset begin!") was judged by the
    verification after the reset, which starts there: no later run judges
    it again."""
    mark = st.read_json(os.path.join(settings.state_dir(node), RESET_MARKER))
    if not mark or not isinstance(boot_id, str) or mark.get("boot_id") != boot_id:
        return -1
    seq = mark.get("kmsg_seq")
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else -1


def last_state(settings, node: str) -> Optional[dict]:
    return st.read_json(os.path.join(settings.state_dir(node), st.LAST))
