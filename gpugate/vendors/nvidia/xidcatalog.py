"""The default Xid policy, as one table checked against NVIDIA's Xid catalog.

Source: NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors, "Analyzing
Xid Errors with the Xid Catalog": the "Resolution Bucket (Immediate Action)"
column, Ampere and newer) and the GB200 Health Validation Xid checks
(docs.nvidia.com/health-validation/reference/checks/xid).  The baseline's
``drain_xids`` / ``xid_actions`` defaults are generated from this table, and
tests/test_xid_policy.py checks that the example baselines say the same.

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
own word.

Compared code by code with the peers (issue 27): NVSentinel's recommended
action per Xid and gpud's event type (only "Fatal" makes its node unhealthy)
and repair action, recorded with their sources in tests/test_xid_peers.py.
PEERS says, per Xid where gpugate's default differs from either, what each
peer does and why gpugate does what it does; NVLINK_PEERS the same per
NVLink5 sub-event.  The test fails on a difference with no entry here.
"""

CATALOG = {
    13: ("ignore", "RESTART_APP", ""),
    31: ("ignore", "RESTART_APP", ""),
    43: ("ignore", "IGNORE", ""),
    45: ("ignore", "WORKFLOW_XID_45", "cleanup after another Xid, which is judged on its own"),
    46: ("reset_gpu", "RESET_GPU", ""),
    48: ("reset_gpu", "WORKFLOW_XID_48", ""),
    # Auxiliary power not connected: no reset or reboot fixes a cable, so a human looks.
    54: ("investigate", "CHECK_MECHANICALS", "no mechanical check in gpugate: drains for a human (no auto-repair)"),
    62: ("reset_gpu", "RESET_GPU", ""),
    63: ("ignore", "IGNORE", ""),
    64: ("reset_gpu", "RESET_GPU", ""),
    74: ("reset_gpu", "WORKFLOW_NVLINK_ERR", ""),
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
    lines = ["# Xid policy (gpugate.vendors.nvidia.xidcatalog; NVIDIA's Xid catalog, immediate action).",
             "#   code  gpugate     catalog                         why gpugate deviates"]
    for code, (ours, theirs, why) in sorted(CATALOG.items()):
        lines.append(("#   %-5d %-11s %-31s %s" % (code, ours, theirs, why)).rstrip())
    lines.append("# Not listed: never drains (add it to drain_xids to drain).")
    lines.append("drain_xids = [%s]" % ", ".join(str(c) for c in default_drain_xids()))
    return "\n".join(lines) + "\n"


# Why gpugate differs from its peers (tests/test_xid_peers.py holds their tables).
_UNUSED = ("NVSentinel: CONTACT_SUPPORT (catalog: unused on Ampere and newer, report to NVIDIA); gpud: Fatal "
           "(reboot or hardware inspection) for some, its table predates the catalog; gpugate: the driver does not "
           "raise it on the GPUs gpugate gates, so it stays out of drain_xids (a site that sees one adds it)")
_APP = ("NVSentinel: NONE; gpud: Fatal, RebootSystem (its hand table, older than the catalog); gpugate follows "
        "the catalog's %s: the application's or the driver's, not the node's")
_NO_RESET = ("NVSentinel: COMPONENT_RESET; gpud: Fatal, RebootSystem (gpud has no GPU-reset action); gpugate follows "
             "the catalog: a GPU reset first, and the sweep goes on to a reboot if the reset does not hold")
_WARNING = ("NVSentinel: COMPONENT_RESET; gpud: Warning (never unhealthy); gpugate follows the catalog's RESET_GPU "
            "and drains: a GPU the catalog says to reset should not take the next job")
_NVLINK = ("NVSentinel: COMPONENT_RESET for a fatal sub-event, NONE for an ignorable one (the catalog's decode); "
           "gpud: Fatal sub-events RebootSystem (no reset action; 149 sub-codes 4 and 10 HardwareInspection), "
           "Nonfatal ones stay Warnings; gpugate: a Fatal line drains for the catalog's reset (the sweep goes on to "
           "reboot), Nonfatal ones drain at xid_nonfatal_max per window (per sub-event: NVLINK_PEERS)")
PEERS = {code: _UNUSED for code in (1, 2, 3, 4, 5, 6, 7, 9, 10, 12, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 26, 27,
                                    28, 29, 30, 33, 34, 35, 36, 42, 47, 49, 50, 51, 52, 53, 55, 56, 57, 58, 59, 61,
                                    65, 73, 81, 87, 90, 91, 108, 111, 112, 113, 114, 115, 116, 117, 118, 122, 123,
                                    124, 125, 138, 142)}
PEERS.update({code: _APP % "RESTART_APP" for code in (32, 60, 68, 69)})
PEERS.update({code: _APP % "IGNORE" for code in (38, 44, 121)})
PEERS.update({code: _NO_RESET for code in (46, 62, 64, 95, 110, 140)})
PEERS.update({code: _WARNING for code in (109, 136, 155, 156, 158)})
PEERS.update({code: _NVLINK for code in NVLINK_XIDS})
PEERS.update({
    45: "NVSentinel: CONTACT_SUPPORT (no case for the WORKFLOW_XID_45 bucket in its mapper: the default); gpud: "
        "Warning, no action (catalog: WORKFLOW_XID_45); gpugate as gpud: 45 "
        "cleans up after another Xid, which is judged on its own",
    48: _NO_RESET + " (catalog: WORKFLOW_XID_48; NVSentinel maps it to COMPONENT_RESET)",
    54: "NVSentinel: CONTACT_SUPPORT; gpud: Warning, no action; gpugate drains for a human as NVSentinel: a GPU "
        "without auxiliary power runs slowed, and no reset or reboot connects a cable",
    63: "NVSentinel: NONE (catalog copies: IGNORE); gpud: Fatal, RebootSystem; gpugate ignores the line as the "
        "copies do and drains on NVML's row_remap_pending until a reset applies the remap (gpud's reboot does too)",
    74: "NVSentinel: CONTACT_SUPPORT (WORKFLOW_NVLINK_ERR: its analyzer rules read the link registers); gpud: "
        "Fatal, RebootSystem; gpugate: drains at once, remedy a GPU reset (the sweep goes on to reboot, then rma)",
    78: "NVSentinel: CONTACT_SUPPORT; gpud: Fatal, RebootSystem; gpugate drains for a human as NVSentinel: a reboot "
        "brings back the same driver, versions change through the baseline",
    94: _APP % "RESTART_APP" + " (a contained error; the same GPU in xid_app_jobs_max jobs drains, judges.apprepeat)",
    119: "NVSentinel: COMPONENT_RESET (the catalog's RESET_GPU); gpud: Fatal, RebootSystem; gpugate reboots as gpud: "
         "after a GSP timeout a GPU reset often hangs",
    120: "NVSentinel: COMPONENT_RESET; gpud: Fatal, RebootSystem; gpugate reboots as gpud (GSP error, as 119)",
    143: "NVSentinel: COMPONENT_RESET; gpud: Fatal, HardwareInspection; gpugate follows the catalog's RESET_GPU: "
         "a GPU that fails to initialise again after the reset and a reboot becomes rma (the sweep's repeat rule)",
    151: "NVSentinel: RESTART_VM; gpud: Warning, RebootSystem (never unhealthy); gpugate drains and reboots: on bare "
         "metal the VM is the node",
    154: "NVSentinel: the action the line names (reset, reboot, none, else CONTACT_SUPPORT), as gpugate; gpud: "
         "Warning whatever the target; gpugate drains for the target, because NVML now asks for that action",
    159: "NVSentinel: CONTACT_SUPPORT (CHECK_UVM); gpud: Warning; gpugate's table stops at 158: newer rows stay "
         "out of drain_xids until NVIDIA's catalog copies agree",
    160: "NVSentinel: RESTART_BM (its CSV); gpud: Warning (its catalog copy: IGNORE); gpugate: the copies disagree, "
         "so 160 stays out of drain_xids, as 159",
    162: "NVSentinel: COMPONENT_RESET (its CSV); gpud: Info (its catalog copy: no action); gpugate: as 160",
})
# NVLink5 sub-events (xid, unit, error status) where a peer drains and gpugate does not, or the other way.
_EVAL = ("NVSentinel: CONTACT_SUPPORT (the decode's XID_154_EVAL has no case in its mapper); gpud: Warning; "
         "gpugate counts the Nonfatal line and judges the Xid 154 that follows, which names the action")
_TLW = ("NVSentinel: COMPONENT_RESET (decode: Fatal, RESET_GPU); gpud: Warning (its unit pattern has no digits, "
        "so the PIPE0/PIPE1 line falls back to 146's Warning); gpugate drains on the line's Fatal, as the catalog")
NVLINK_PEERS = {(145, "RLW_REMAP", 0x1): _EVAL, (145, "RLW_SRC_TRACK", 0x4): _EVAL}
NVLINK_PEERS.update({(146, unit, 0x4): _TLW for unit in ("TLW_RX/TLW_RX_PIPE0", "TLW_RX/TLW_RX_PIPE1",
                                                         "TLW_TX/TLW_TX_PIPE0", "TLW_TX/TLW_TX_PIPE1")})
