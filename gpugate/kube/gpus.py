"""The GPUs a Node offers pods (pure): the device plugin's resource in
``status.capacity`` and ``status.allocatable``.  A kubelet that starts
after a reboot reports none of a device plugin's resource until the plugin
registers again, and on a GPU operator's node the plugin waits for the
driver container, minutes after Ready: the sweep waits for the count the
Node had before its reboot (journaled with the bootID) or its capacity now,
whichever is more, before it verifies and runs the smoke Pod."""

from __future__ import annotations

import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

_WHOLE = re.compile(r"[0-9]{1,6}")  # an extended resource is a whole number (no "500m", no "1Ki")


def resource_for(kube, baseline, node: str) -> str:
    """The device plugin's resource for the node's GPUs, by its vendor in the baseline."""
    vendor_for = getattr(baseline, "vendor_for", None)
    amd = vendor_for is not None and vendor_for(node) == "amd"
    return str(kube.get("smoke_resource_amd" if amd else "smoke_resource") or "")


def count(node: dict, resource: str, field: str = "allocatable") -> Optional[int]:
    """The Node's ``status.<field>[resource]`` as a whole number: 0 when the
    resource is absent, None when it is there but not a count gpugate reads."""
    table = (node.get("status") or {}).get(field) if isinstance(node, dict) else None
    value = table.get(resource) if isinstance(table, dict) else None
    if value is None:
        return 0
    if not isinstance(value, str) or not _WHOLE.fullmatch(value):
        return None
    return int(value)


def before_reboot(node: dict, resource: str) -> int:
    """What to journal before a reboot: the most the Node offered (capacity or allocatable; 0: none or unreadable)."""
    return max(count(node, resource, "capacity") or 0, count(node, resource) or 0)


def expected(before: int, node: dict, resource: str, baseline_gpus: Optional[int]) -> int:
    """The count to wait for after a reboot: the Node's before it, or its
    capacity now, whichever is more; the baseline's GPU count only when the
    Node never said (a journal from before the count was kept).  0: none to
    wait for."""
    want = max(before, count(node, resource, "capacity") or 0)
    return want or int(baseline_gpus or 0)


def word(detail: str, key: str) -> str:
    """``key=VALUE`` of a journal detail ("boot_id=... gpus=8")."""
    for part in (detail or "").split():
        if part.startswith(key + "="):
            return part[len(key) + 1:]
    return ""
