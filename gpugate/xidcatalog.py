"""The default Xid policy, as one table checked against NVIDIA's Xid catalog.

Source: NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors, "Analyzing
Xid Errors with the Xid Catalog": the "Resolution Bucket (Immediate Action)"
column, Ampere and newer) and the GB200 Health Validation Xid checks
(docs.nvidia.com/health-validation/reference/checks/xid).  The baseline's
``drain_xids`` / ``xid_actions`` defaults are generated from this table, and
tests/test_xidcatalog.py checks that the example baselines say the same.

Columns: code -> (what gpugate does, the catalog's immediate action, why
gpugate deviates; empty when it follows the catalog).  gpugate actions:
"ignore" (never drains), "reset_gpu" / "reboot" / "rma" / "investigate"
(drains at once, the remedy the sweep takes), "nvlink" (144-150: the
sub-event's Fatal/Nonfatal word decides: fatal drains, non-fatal ones are
counted), "recovery" (154: judged by the recovery action it changed *to*).

Decided for issue 27 (the catalog's actions gpugate has no remedy of its
own for): 54 CHECK_MECHANICALS and 78 UPDATE_SWFW drain for a human
("investigate": the sweep escalates, no reboot fixes a cable or chooses a
driver); 109 follows the catalog's RESET_GPU; 151 RESTART_VM is a reboot
on bare metal.  The why column says where an action is not the catalog's
own word.  Not yet compared code by code: NVSentinel's recommended actions
and gpud's NVLink5 event types (their tables were not at hand).
"""

CATALOG = {
    13: ("ignore", "RESTART_APP", ""),
    31: ("ignore", "RESTART_APP", ""),
    43: ("ignore", "IGNORE", ""),
    45: ("ignore", "IGNORE", ""),
    46: ("reset_gpu", "RESET_GPU", ""),
    48: ("reset_gpu", "RESET_GPU", ""),
    # Auxiliary power not connected: no reset or reboot fixes a cable, so a human looks.
    54: ("investigate", "CHECK_MECHANICALS", "no mechanical check in gpugate: drains for a human (no auto-repair)"),
    62: ("reset_gpu", "RESET_GPU", ""),
    63: ("ignore", "RESET_GPU", "NVML's row_remap_pending drains until a reset applies the remap"),
    64: ("reset_gpu", "RESET_GPU", ""),
    74: ("reset_gpu", "RESET_GPU", ""),
    # The driver/firmware the GPU runs must change: a pin change is a human's (baseline review).
    78: ("investigate", "UPDATE_SWFW", "drains for a human: versions change through the baseline"),
    79: ("reboot", "RESTART_BM", ""),
    92: ("ignore", "IGNORE", ""),
    94: ("ignore", "RESTART_APP", ""),
    95: ("reset_gpu", "RESET_GPU", ""),
    # Context-switch timeout: the catalog resets the GPU (an earlier copy said RESTART_APP).
    109: ("reset_gpu", "RESET_GPU", ""),
    110: ("reset_gpu", "RESET_GPU", ""),
    119: ("reboot", "RESET_GPU", "GSP timeout: a GPU reset often hangs; reboot"),
    120: ("reboot", "RESET_GPU", "GSP error: as 119"),
    136: ("reset_gpu", "RESET_GPU", ""),
    140: ("reset_gpu", "RESET_GPU", ""),
    143: ("reset_gpu", "RESET_GPU", ""),
    144: ("nvlink", "RESET_GPU Fatal/IGNORE Nonfatal", "non-fatal: xid_nonfatal_max per window drains"),
    145: ("nvlink", "RESET_GPU Fatal/IGNORE Nonfatal", "as 144"),
    146: ("nvlink", "RESET_GPU Fatal/IGNORE Nonfatal", "as 144"),
    147: ("nvlink", "RESET_GPU Fatal/IGNORE Nonfatal", "as 144"),
    148: ("nvlink", "RESET_GPU Fatal/IGNORE Nonfatal", "as 144"),
    149: ("nvlink", "RESET_GPU Fatal/IGNORE Nonfatal", "as 144"),
    150: ("nvlink", "RESET_GPU Fatal/IGNORE Nonfatal", "as 144"),
    # Confidential-computing key rotation failed: the catalog restarts the VM, on bare metal the node.
    151: ("reboot", "RESTART_VM", "bare metal: the VM is the node, so reboot"),
    154: ("recovery", "per the action named", ""),
    155: ("reset_gpu", "RESET_GPU", ""),
    156: ("reset_gpu", "RESET_GPU", ""),
    158: ("reset_gpu", "RESET_GPU", ""),
}
# The Xids the catalog blames on the application (RESTART_APP, and 43, a
# GPU stopped processing for the app's fault): never drain on their own,
# but the same GPU showing them in xid_app_jobs_max different jobs does
# (judges.apprepeat, as NVSentinel's design 007): a bad GPU hides there.
APP_XIDS = frozenset({13, 31, 43, 94})
NVLINK_XIDS = frozenset(code for code, row in CATALOG.items() if row[0] == "nvlink")
RECOVERY_XID = 154
# Xid 154's "changed from 0x.. (..) to 0xN (..)": what the target asks for.
# 0 (None) means the GPU recovered; NVML's nvmlDeviceGpuRecoveryAction_t.
RECOVERY_TARGETS = {0: None, 1: "reset_gpu", 2: "reboot", 3: "investigate", 4: "reset_gpu",
                    6: "reset_gpu", 7: "reboot"}
_DRAINING = ("reset_gpu", "reboot", "rma", "investigate", "nvlink", "recovery")


def default_drain_xids():
    """Codes that drain by default, ascending."""
    return tuple(sorted(code for code, row in CATALOG.items() if row[0] in _DRAINING))


def default_xid_actions():
    """Remedy per code where it is not the default reset_gpu."""
    return {str(code): row[0] for code, row in sorted(CATALOG.items())
            if row[0] in ("reboot", "rma", "investigate")}


def deviations():
    """(code, gpugate action, catalog action, why) where gpugate does not follow the catalog."""
    return [(code,) + row for code, row in sorted(CATALOG.items()) if row[2]]


def baseline_block():
    """The example baselines' [health] Xid lines (tests check they are this, verbatim)."""
    lines = ["# Xid policy (gpugate.xidcatalog; NVIDIA's Xid catalog, immediate action).",
             "#   code  gpugate     catalog                         why gpugate deviates"]
    for code, (ours, theirs, why) in sorted(CATALOG.items()):
        lines.append(("#   %-5d %-11s %-31s %s" % (code, ours, theirs, why)).rstrip())
    lines.append("# Not listed: never drains (add it to drain_xids to drain).")
    lines.append("drain_xids = [%s]" % ", ".join(str(c) for c in default_drain_xids()))
    return "\n".join(lines) + "\n"
