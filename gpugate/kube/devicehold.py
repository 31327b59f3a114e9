"""Which findings hold one GPU rather than its Node (pure), and with which
DeviceTaintRule effect ([kubernetes] device_holds, docs/explanation/kubernetes.md).

A finding is one GPU's when it names a GPU, its component is that GPU's
own (its memory, its ECC or RAS counts, its own Xid, its applications'
Xids coming back, a diagnostic that failed on it) and its remedy is the
GPU's (a reset, an RMA), never the node's (a reboot, a reload, a
reconverge).  A verdict is held per device only when every finding in it
is one GPU's: one node-wide finding (driver drift, a GPU fallen off the
bus, a fatal SXid, the fabric) holds the Node, as it always did.

Effects: NoSchedule (no new claim gets the GPU); NoExecute (the pods
using it evicted) only where the site asked ([kubernetes] no_execute) and
the finding is acute, so never for anything a job's user can cause
(gpugate.model.findings.USER_CAUSED); None (shown, not enforced) for a
GPU that still computes right but slower (a PCIe link trained low)."""

from __future__ import annotations

from gpugate.model.findings import REBOOT, RECONVERGE, RELOAD_OR_REBOOT, USER_CAUSED

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Sequence, Tuple

NO_SCHEDULE, NO_EXECUTE, NONE = "NoSchedule", "NoExecute", "None"
_STRENGTH = {NONE: 0, NO_SCHEDULE: 1, NO_EXECUTE: 2}

# A GPU's own components.  "xid" only for the codes below; the rest stay Node holds.
GPU_OWN = frozenset({
    "row_remap", "retired_pages", "ecc", "ecc_aggregate", "ecc_during_job", "remap_during_job",
    "xid_repeat", "amdgpu_repeat",  # its applications' Xids, back in jobs of several users
    "dcgm_diag", "rvs",  # a diagnostic that failed on this GPU
    "ras", "ras_deferred", "bad_pages",  # an AMD GPU's own RAS counts and retired pages
    "pcie_gen", "pcie_width",  # degraded, usable: effect None
})
# Xids contained in one GPU's memory: 48 (double-bit ECC), 63/64 (a row remap
# recorded, or failed), 92 (a high single-bit ECC rate), 94/95 (a contained or
# uncontained ECC error).  NVLink (74, 144-150), fallen off the bus (79), GSP and
# the driver's own recovery (119, 120, 154) involve peers or the node.
GPU_OWN_XIDS = frozenset({"48", "63", "64", "92", "94", "95"})
DEGRADED = frozenset({"pcie_gen", "pcie_width"})
NODE_REMEDIES = frozenset({REBOOT, RELOAD_OR_REBOOT, RECONVERGE})


def granular(finding) -> str:
    """"" when the finding is one GPU's; else why it holds the Node."""
    if finding.gpu is None:
        return "%s names no GPU" % finding.component
    if finding.component not in GPU_OWN and finding.component != "xid":
        return "%s is not one GPU's own finding" % finding.component
    if finding.component == "xid" and str(finding.observed).strip() not in GPU_OWN_XIDS:
        return "Xid %s involves more than its GPU" % str(finding.observed)[:16]
    if finding.action in NODE_REMEDIES:
        return "%s on gpu%d calls for the node's remedy (%s)" % (finding.component, finding.gpu, finding.action)
    return ""


def effect(finding, no_execute: bool) -> str:
    """The DeviceTaintRule effect for one GPU's finding."""
    if finding.component in DEGRADED:
        return NONE
    if no_execute and finding.acute and finding.component not in USER_CAUSED:
        return NO_EXECUTE
    return NO_SCHEDULE


def plan(findings: Sequence, no_execute: bool) -> Tuple[Dict[int, str], str]:
    """({gpu index: effect}, "") when every finding is one GPU's; ({}, why)
    when the Node is held (no findings, or one that is not one GPU's).  A
    GPU with several findings takes the strongest effect."""
    if not findings:
        return {}, "no findings"
    held: Dict[int, str] = {}
    for finding in findings:
        why = granular(finding)
        if why:
            return {}, why
        held[finding.gpu] = max(effect(finding, no_execute), held.get(finding.gpu, NONE), key=_STRENGTH.__getitem__)
    return held, ""
