"""The AMD Instinct part of baseline.toml: pins, nodeset keys and [health]
keys, and the rules that keep one baseline file right for a mixed fleet.

A nodeset says its vendor (``vendor = "amd"``; NVIDIA when left out, so no
NVIDIA baseline changes).  A key that means nothing for the nodeset's vendor
is refused (exit 2), and so is a pin no nodeset can use: a baseline with a
typo'd vendor must not pass a fleet on nothing.
"""

from __future__ import annotations

from gpugate.model.baseline_keys import AMDGPU_EVENTS
from gpugate.errors import ConfigError
from gpugate.model.schema import AnyOf, Bool, Choice, Int, ListOf, MapOf, Str, Table

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Any, Dict, Mapping

# Pinned versions of the AMD stack: the amdgpu module (/sys/module/amdgpu/version
# of the DKMS driver; "inbox" for the kernel's own, which has no such file),
# ROCm (/opt/rocm/.info/version) and amd-smi's library (amd-smi version).
AMD_PIN_COMPONENTS = ("amdgpu", "rocm", "amd_smi")
NVIDIA_ONLY_PINS = ("driver", "gsp_firmware", "cuda_driver", "fabricmanager", "container_toolkit", "dcgm")
COMPUTE_PARTITIONS = ("SPX", "DPX", "TPX", "QPX", "CPX")
MEMORY_PARTITIONS = ("NPS1", "NPS2", "NPS4", "NPS8")
# The kernel-log events of gpugate.vendors.amd.parse_kernlog that drain (the rest are recorded).
DEFAULT_AMDGPU_EVENTS = AMDGPU_EVENTS
MODES = ("healthcheck", "prolog", "epilog", "verify")


def pin_fields(version) -> Dict[str, tuple]:
    """[pin] / [previous] keys for AMD (version: the version-string spec)."""
    fields = {name: (version, None) for name in AMD_PIN_COMPONENTS}
    fields["ifwi"] = (MapOf(version), dict)  # per product: amd-smi static ifwi.version
    # per product: fw_version/<id>_fw_version values, only the ids listed
    fields["amdgpu_firmware"] = (MapOf(MapOf(Str("0x0000001c"))), dict)
    return fields


NODESET_FIELDS = {
    "vendor": (Choice("nvidia", "amd"), None),
    "device_id": (Str("0x74a1", lambda v: None if _hex_id(v) else "expected a PCI device id such as 0x74a1"), None),
    "compute_partition": (Choice(*COMPUTE_PARTITIONS), None),
    "memory_partition": (Choice(*MEMORY_PARTITIONS), None),
}
NVIDIA_ONLY_NODESET = ("nvswitch", "mig", "persistence", "compute_mode", "ecc", "imex")
AMD_ONLY_NODESET = ("device_id", "compute_partition", "memory_partition")



HEALTH_KEYS = {
    # Blocks whose uncorrectable RAS count drains (the per-GPU sum is also
    # held to the shared ecc_uncorrected_volatile_max).
    "ras_uncorrected_blocks": (ListOf(Str("umc")), lambda: ("umc", "xgmi_wafl", "gfx", "sdma", "mmhub", "hdp",
                                                            "pcie_bif", "athub")),
    "ras_deferred_max": (Int(0), 0),  # UMC "de": poison created, consumed later
    "bad_pages_pending": (Bool(), True),  # a page waiting to be retired: a reset retires it
    "bad_pages_unreservable": (Bool(), True),  # a page that could not be retired: RMA
    # "threshold": the driver's own (amd-smi bad_page_threshold_exceeded, the kernel's
    # "reaches threshold" line); a number is a site's lower limit of retired pages.
    "bad_pages_retired_max": (AnyOf(Int(0), Choice("threshold")), "threshold"),
    "xgmi_links_down_max": (AnyOf(Int(0), Choice("ignore")), 0),
    "amdgpu_events": (ListOf(Choice(*AMDGPU_EVENTS)), lambda: DEFAULT_AMDGPU_EVENTS),
    "ring_timeout_max": (Int(1, 100), 3),  # ring timeouts (not soft-recovered) per GPU in the window
    "gpu_reset_events_max": (Int(1, 100), 1),  # "GPU reset begin!" per GPU in the window, succeeded or not
    # The ROCm Validation Suite's levels (rvs -r N), like dcgm_diag: verify runs them in order.
    "rvs": (Table(dict({m: (Int(0, 5), 0) for m in MODES},
                       verify=(AnyOf(Int(0, 5), ListOf(Int(1, 5))), (1, 2)))),
            lambda: {"healthcheck": 0, "prolog": 0, "epilog": 0, "verify": (1, 2)}),
}
def _hex_id(value: str) -> bool:
    text = value.lower()
    return text.startswith("0x") and 3 <= len(text) <= 6 and all(c in "0123456789abcdef" for c in text[2:])


def normalize_health(health: Dict[str, Any]) -> None:
    """Lists to tuples (the cache round trip and the judges compare tuples)."""
    health["ras_uncorrected_blocks"] = tuple(b.lower() for b in health["ras_uncorrected_blocks"])
    health["amdgpu_events"] = tuple(health["amdgpu_events"])
    verify = health["rvs"]["verify"]
    health["rvs"] = dict(health["rvs"], verify=tuple(verify) if isinstance(verify, (list, tuple))
                         else ((verify,) if verify else ()))


def check_vendors(raw: Mapping[str, Any], source: str) -> None:
    """Each nodeset's keys fit its vendor; each vendor's pins have a nodeset
    that uses them, and the pins a vendor needs are there."""
    vendors = set()
    for pattern, values in raw["nodes"].items():
        vendor = values.get("vendor") or "nvidia"
        vendors.add(vendor)
        wrong = NVIDIA_ONLY_NODESET if vendor == "amd" else AMD_ONLY_NODESET
        for key in wrong:
            if values.get(key) is not None:
                hint = ('set vendor = "amd" in it' if vendor == "nvidia"
                        else "an AMD nodeset pins compute_partition, memory_partition, power_limit_watts")
                raise ConfigError('%s: nodes."%s".%s: not a key for a %s nodeset (%s)'
                                  % (source, pattern, key, vendor.upper() if vendor == "amd" else "NVIDIA", hint))
    if not raw["nodes"]:
        vendors.add("nvidia")  # a baseline of pins alone: NVIDIA's, as it always was
    if len(vendors) > 1:
        _no_node_of_two_vendors(raw["nodes"], source)
    for where in ("pin", "previous"):
        pins = raw.get(where)
        if pins is None:
            continue
        if "amd" not in vendors:
            for key in AMD_PIN_COMPONENTS + ("ifwi", "amdgpu_firmware"):
                if pins.get(key):
                    raise ConfigError('%s: %s.%s: no nodeset has vendor = "amd", so nothing uses this pin'
                                      % (source, where, key))
        if "nvidia" not in vendors:
            for key in NVIDIA_ONLY_PINS:
                if pins.get(key) and not (key == "gsp_firmware" and pins.get(key) == pins.get("driver")):
                    raise ConfigError('%s: %s.%s: every nodeset has vendor = "amd", so nothing uses this pin'
                                      % (source, where, key))
    if "nvidia" in vendors and not raw["pin"].get("driver"):
        raise ConfigError("%s: pin.driver: required key is missing (a version string such as 580.65.06): "
                          "a nodeset is NVIDIA's" % source)


def _no_node_of_two_vendors(nodes: Mapping[str, Any], source: str) -> None:
    """Sections merge per node (a later match overrides): one naming a node
    NVIDIA's and another naming it AMD's would judge it against a mix of
    both.  Refused, naming the nodes."""
    from ClusterShell.NodeSet import NodeSet

    sets = [(pattern, values.get("vendor") or "nvidia", NodeSet(pattern)) for pattern, values in nodes.items()]
    for i, (pattern, vendor, names) in enumerate(sets):
        for other, other_vendor, other_names in sets[i + 1:]:
            both = names & other_names
            if vendor != other_vendor and len(both):
                raise ConfigError('%s: nodes."%s" (%s) and nodes."%s" (%s) both name %s: a node has one vendor '
                                  '(narrow one of the two hostlists)'
                                  % (source, pattern, vendor, other, other_vendor, both))
