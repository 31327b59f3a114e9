"""gpugate's default Xid policy against its peers', code by code (issue 27).

The peers' actions are recorded here as data, read from their sources (not
imported, not copied code):

NVSentinel (github.com/NVIDIA/NVSentinel):
  - the catalog bucket per Xid: distros/kubernetes/nvsentinel/charts/
    gpu-health-monitor/xiderrorsmapping.csv @ 6f8b0fcfa8e502bdda78fabf96facef729a9285b
    (NVIDIA's "Resolution Bucket (Immediate Action)", Xid 1-162);
  - bucket -> recommended action: health-monitors/syslog-health-monitor/pkg/
    common/common.go MapActionStringToProto @ 1275b0c3056758f30326b162f6a1b27dc10a867c
    (RESTART_APP/IGNORE -> NONE; RESET_GPU/WORKFLOW_XID_48 -> COMPONENT_RESET;
    a name of the RecommendedAction enum (data-models/protobufs/health_event.proto)
    as itself; anything else -> CONTACT_SUPPORT), and its common_test.go
    (RESTART_APP -> NONE); an event is fatal (the node is cordoned) unless NONE
    (pkg/xid/xid_handler.go determineFatality);
  - Xid 144-150 per sub-event from the catalog's "Xid 144-150 Decode" sheet
    (pkg/xid/parser/csv.go @ 1d55560e047d32f2ed0140036cddf67b234b1b6a), Xid 154
    from the target named in the line (a later csv.go getRecommendedActionForXid).
gpud (github.com/leptonai/gpud @ 4a8de33a3f02e207f39e9023d67125592d599731):
  - components/accelerator/nvidia/xid/xid.go `details`: the event type per Xid
    (only "Fatal" makes the component Unhealthy, health_state.go) and the first
    suggested repair action;
  - NVLink5 (144-150) event types: xid.go detailFromNVLinkInfo (the decode rule's
    severity in catalog_generated.go, max'd with the line's Fatal/Nonfatal, and
    applyOperationalOverrides for 149 sub-codes 4 and 10) and the cases of
    nvlink_logs_test.go Test_NVLinkLogCoverage.

Each peer action is put in gpugate's words (ignore / reset_gpu / reboot /
investigate).  Every Xid where gpugate's default differs from a peer must
have an entry in gpugate.vendors.nvidia.xidcatalog.PEERS (NVLink5 sub-events:
NVLINK_PEERS) naming that peer; an entry with no difference behind it fails
too, so the table cannot go stale.
"""

import pytest

from gpugate.vendors.nvidia import xidcatalog
from test_xid_policy import judge


def _codes(spec):
    out = set()
    for part in spec.split():
        low, _, high = part.partition("-")
        out.update(range(int(low), int(high or low) + 1))
    return frozenset(out)


# NVSentinel: NVIDIA's catalog bucket per Xid (the CSV above, 1-162).
NVSENTINEL_BUCKETS = {
    "UNEXPECTED_ERR_REPORT_ISSUE": _codes("1-7 9 10 12 15-24 26-30 33-36 42 47 49-53 55-59 61 65 73 81 87 90 91 "
                                          "108 111-118 122-125 138 142"),
    "RESTART_APP": _codes("8 11 13 25 31 32 39-41 60 68-72 75-77 80 82-86 88 89 94 96-105 126-135 139"),
    "IGNORE": _codes("14 37 38 43 44 63 66 67 92 93 106 107 121 137 141 152 153 157 161"),
    "RESET_GPU": _codes("46 62 64 95 109 110 119 120 136 140 143 155 156 158 162"),
    "WORKFLOW_XID_45": _codes("45"), "WORKFLOW_XID_48": _codes("48"), "CHECK_MECHANICALS": _codes("54"),
    "WORKFLOW_NVLINK_ERR": _codes("74"), "UPDATE_SWFW": _codes("78"), "RESTART_BM": _codes("79 160"),
    "WORKFLOW_NVLINK5_ERR": _codes("144-150"), "RESTART_VM": _codes("151"), "XID_154": _codes("154"),
    "CHECK_UVM": _codes("159"),
}
# common.go's MapActionStringToProto, then in gpugate's words (COMPONENT_RESET
# is a GPU reset; RESTART_BM / RESTART_VM a reboot; CONTACT_SUPPORT a human).
NVSENTINEL_ACTION = {"RESTART_APP": "NONE", "IGNORE": "NONE", "RESET_GPU": "COMPONENT_RESET",
                     "WORKFLOW_XID_48": "COMPONENT_RESET", "RESTART_BM": "RESTART_BM", "RESTART_VM": "RESTART_VM"}
NVSENTINEL_WORDS = {"NONE": "ignore", "COMPONENT_RESET": "reset_gpu", "RESTART_BM": "reboot",
                    "RESTART_VM": "reboot", "CONTACT_SUPPORT": "investigate"}

# gpud: the Xids whose event type is Fatal, by first suggested repair action.
# Every other Xid in `details` (1-173) is Warning or Info: it never makes the
# node unhealthy.
GPUD_FATAL = {
    "RebootSystem": _codes("9 12 16 18 19 26-30 32-36 38 42 44 46-48 59-65 68 69 74 78 79 94 95 110 119 120 121 "
                           "123 140"),
    "HardwareInspection": _codes("81 143"),
}
GPUD_WORDS = {"RebootSystem": "reboot", "HardwareInspection": "investigate"}
GPUD_RANGE = range(1, 174)

# Judged below per sub-event or per target, not per code.
PER_EVENT = set(xidcatalog.NVLINK_XIDS) | {xidcatalog.RECOVERY_XID}


def nvsentinel(code):
    (bucket,) = [b for b, codes in NVSENTINEL_BUCKETS.items() if code in codes]
    return NVSENTINEL_WORDS[NVSENTINEL_ACTION.get(bucket, "CONTACT_SUPPORT")]


def gpud(code):
    for action, codes in GPUD_FATAL.items():
        if code in codes:
            return GPUD_WORDS[action]
    return "ignore"


def gpugate(code):
    action = xidcatalog.CATALOG.get(code, ("ignore",))[0]
    return "investigate" if action == "rma" else action


def differences():
    """{code: [peer, ...]} where gpugate's default differs from a peer."""
    out = {}
    for code in sorted(set(range(1, 163)) | set(GPUD_RANGE)):
        if code in PER_EVENT:
            continue
        for peer, theirs in (("NVSentinel", nvsentinel if code <= 162 else None), ("gpud", gpud)):
            if theirs is not None and theirs(code) != gpugate(code):
                out.setdefault(code, []).append(peer)
    return out


def test_the_recorded_nvsentinel_table_covers_each_code_once():
    seen = [code for codes in NVSENTINEL_BUCKETS.values() for code in codes]
    assert sorted(seen) == list(range(1, 163))


# gpugate's catalog column names the bucket both peers' copies of the
# catalog carry (NVSentinel's CSV, gpud's catalog_generated.go) for every
# code; it said IGNORE, RESET_GPU, RESET_GPU, RESET_GPU for 45, 48, 63, 74
# (WORKFLOW_XID_45, WORKFLOW_XID_48, IGNORE, WORKFLOW_NVLINK_ERR) until this
# comparison found it.
CATALOG_COLUMN_DIFFERS = set()


def test_the_recorded_tables_agree_with_gpugates_catalog_column():
    differs = {code for code, (_, catalog, _) in xidcatalog.CATALOG.items()
               if code not in PER_EVENT and catalog in NVSENTINEL_BUCKETS and code not in NVSENTINEL_BUCKETS[catalog]}
    assert differs == CATALOG_COLUMN_DIFFERS
    assert all(code in xidcatalog.PEERS for code in differs)


def test_every_difference_from_a_peer_is_explained():
    found = differences()
    unexplained = {code: peers for code, peers in found.items() if code not in xidcatalog.PEERS}
    assert not unexplained, "explain in gpugate.vendors.nvidia.xidcatalog.PEERS: %s" % unexplained
    for code, peers in found.items():
        for peer in peers:
            assert peer + ":" in xidcatalog.PEERS[code], (code, peer)


def test_no_explanation_without_a_difference():
    stale = set(xidcatalog.PEERS) - set(differences()) - PER_EVENT
    assert not stale, "no peer differs any more: drop %s from PEERS" % sorted(stale)


# --------------------------------------------------------------------------
# NVLink5 (Xid 144-150): what drains at once, per sub-event.  gpugate drains a
# line that says Fatal and counts a Nonfatal one (xid_nonfatal_max).  Rows:
# (xid, unit, the line's word, intrinfo, error status, the catalog decode's
# resolution (NVSentinel's action), gpud's event type).  The gpud rows are its
# Test_NVLinkLogCoverage cases plus 149 sub-codes 4 and 10 (its operational
# overrides: Fatal, HardwareInspection).

NVLINK5 = [
    (144, "SAW_MVB", "Nonfatal", 0x1, 0x1, "IGNORE", "Warning"),
    (144, "SAW_MVB", "Fatal", 0x1, 0x2, "RESET_GPU", "Fatal"),
    (145, "RLW_CTRL", "Nonfatal", 0x3, 0x80000000, "IGNORE", "Warning"),
    (145, "RLW_REMAP", "Nonfatal", 0x4, 0x1, "XID_154_EVAL", "Warning"),
    (145, "RLW_REMAP", "Fatal", 0x4, 0x40, "RESET_GPU", "Fatal"),
    (145, "RLW_REMAP", "Nonfatal", 0x4, 0x100, "IGNORE", "Warning"),
    (145, "RLW_RSPCOL", "Nonfatal", 0x5, 0x1, "IGNORE", "Warning"),
    (145, "RLW_RSPCOL", "Fatal", 0x5, 0x2, "RESET_GPU", "Fatal"),
    (145, "RLW_RXPIPE", "Nonfatal", 0x6, 0x1, "IGNORE", "Warning"),
    (145, "RLW_SRC_TRACK", "Fatal", 0x7, 0x1, "RESET_GPU", "Fatal"),
    (145, "RLW_SRC_TRACK", "Nonfatal", 0x7, 0x2, "IGNORE", "Warning"),
    (145, "RLW_SRC_TRACK", "Nonfatal", 0x7, 0x4, "XID_154_EVAL", "Warning"),
    (145, "RLW_TAGSTATE", "Nonfatal", 0x8, 0x1, "IGNORE", "Warning"),
    (145, "RLW_TAGSTATE", "Fatal", 0x8, 0x2, "RESET_GPU", "Fatal"),
    (146, "TLW_CTRL", "Nonfatal", 0x9, 0x1, "IGNORE", "Warning"),
    (146, "TLW_CTRL", "Fatal", 0x9, 0x4, "RESET_GPU", "Fatal"),
    (146, "TLW_RX/TLW_RX_PIPE0", "Nonfatal", 0xa, 0x1, "IGNORE", "Warning"),
    (146, "TLW_RX/TLW_RX_PIPE0", "Fatal", 0xa, 0x4, "RESET_GPU", "Warning"),
    (146, "TLW_RX/TLW_RX_PIPE1", "Nonfatal", 0xb, 0x1, "IGNORE", "Warning"),
    (146, "TLW_RX/TLW_RX_PIPE1", "Fatal", 0xb, 0x4, "RESET_GPU", "Warning"),
    (146, "TLW_TX/TLW_TX_PIPE0", "Nonfatal", 0xc, 0x1, "IGNORE", "Warning"),
    (146, "TLW_TX/TLW_TX_PIPE0", "Fatal", 0xc, 0x4, "RESET_GPU", "Warning"),
    (146, "TLW_TX/TLW_TX_PIPE1", "Nonfatal", 0xd, 0x1, "IGNORE", "Warning"),
    (146, "TLW_TX/TLW_TX_PIPE1", "Fatal", 0xd, 0x4, "RESET_GPU", "Warning"),
    (147, "TREX", "Nonfatal", 0xe, 0x1, "IGNORE", "Warning"),
    (148, "NVLPW_CTRL/NVLPW", "Nonfatal", 0xf, 0x80000000, "IGNORE", "Warning"),
    (149, "NETIR/NETIR_INT", "Fatal", 0x18, 0x0, "RESET_GPU", "Fatal"),
    (149, "NETIR_BER_EVENT", "Nonfatal", 0x13, 0x0, "IGNORE", "Warning"),
    (149, "NETIR_BER_EVENT", "Nonfatal", 0x13, 0x1, "IGNORE", "Warning"),
    (149, "NETIR_MFDE_EVENT", "Fatal", 0x14, 0x1, "RESET_GPU", "Fatal"),
    (149, "NETIR_MFDE_EVENT", "Nonfatal", 0x14, 0x3, "IGNORE", "Warning"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "Fatal", 0x11, 0x0, "RESET_GPU", "Fatal"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "Fatal", 0x00400011, 0x0, "RESET_GPU", "Fatal"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "Fatal", 0x00a00011, 0x0, "RESET_GPU", "Fatal"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "Fatal", 0x01000011, 0x0, "RESET_GPU", "Fatal"),
    (149, "NETIR_LINK_EVT/NETIR_LINK_DOWN", "Fatal", 0x02500011, 0x0, "RESET_GPU", "Fatal"),
    (150, "MSE_WATCHDOG", "Fatal", 0x0, 0x0, "RESET_GPU", "Fatal"),
]
# The decode sheet's resolution in NVSentinel's mapper: XID_154_EVAL has no case there (default).
NVL5_DRAINS = {"RESET_GPU": True, "IGNORE": False, "XID_154_EVAL": True}


def _nvl5_line(xid, unit, word, intrinfo, status):
    return "NVRM: Xid (PCI:0000:04:00): %d, %s %s XC0 i0 Link 00 (0x%08x 0x%08x 0x00000000 0x00000000)" % (
        xid, unit, word, intrinfo, status)


def nvlink_differences():
    out = {}
    for xid, unit, word, intrinfo, status, resolution, gpud_type in NVLINK5:
        drains = bool(judge([_nvl5_line(xid, unit, word, intrinfo, status)]))
        assert drains == (word == "Fatal"), (xid, unit, word)  # gpugate: the line's own word
        for peer, theirs in (("NVSentinel", NVL5_DRAINS[resolution]), ("gpud", gpud_type == "Fatal")):
            if theirs != drains:
                out.setdefault((xid, unit, status), []).append(peer)
    return out


def test_every_nvlink5_sub_event_difference_is_explained():
    found = nvlink_differences()
    for key, peers in found.items():
        assert key in xidcatalog.NVLINK_PEERS, "explain in gpugate.vendors.nvidia.xidcatalog.NVLINK_PEERS: %s %s" % (key, peers)
        for peer in peers:
            assert peer + ":" in xidcatalog.NVLINK_PEERS[key], (key, peer)
    assert not set(xidcatalog.NVLINK_PEERS) - set(found), "stale NVLINK_PEERS entries"


@pytest.mark.parametrize("xid", sorted(xidcatalog.NVLINK_XIDS))
def test_nvlink5_codes_say_how_gpugates_remedy_differs(xid):
    # Fatal sub-events: the catalog and NVSentinel reset the GPU (gpugate too); gpud reboots.
    assert "gpud:" in xidcatalog.PEERS[xid] and gpugate(xid) == "nvlink"


# Xid 154 by the target in the line: NVSentinel's getRecommendedActionForXid
# ("GPU Reset Required" / "Drain and Reset" -> COMPONENT_RESET, "Node Reboot
# Required" -> RESTART_BM, "None" -> NONE, any other -> CONTACT_SUPPORT);
# gpud's 154 is a Warning whatever the target (never unhealthy).
XID154 = [(0, "None", "NONE"), (1, "GPU Reset Required", "COMPONENT_RESET"),
          (2, "Node Reboot Required", "RESTART_BM"), (4, "Drain and Reset", "COMPONENT_RESET")]


@pytest.mark.parametrize("target,name,action", XID154)
def test_xid_154_targets_agree_with_nvsentinel(target, name, action):
    assert (xidcatalog.RECOVERY_TARGETS[target] or "ignore") == NVSENTINEL_WORDS[action]


def test_xid_154_difference_from_gpud_is_explained():
    assert any(xidcatalog.RECOVERY_TARGETS.values()) and "gpud:" in xidcatalog.PEERS[154]
