"""`gpugate sim set` keys for what a simulated AMD node's tools and kernel
log say (gpugate.vendors.amd.sim_node has the sysfs ones):

    amd.smi=ok|kfd|hang|absent|nolibdrm  amd-smi answers | no /dev/kfd access (banner,
                                    N/A fields) | hangs | is not installed | answers
                                    without libdrm (warning, IFWI name/date N/A)
    amd.amd_smi=VERSION             amd-smi's library version (version --json)
    amd.xgmi_status=0               an amd-smi before 25.3 (no xgmi --link-status)
    amd.rvs=absent|installed|nolevels  RVS installed or not; nolevels: no -r levels for this GPU
    amd.rvs.fail.LEVEL=0,3|none     GPUs that fail `rvs -r LEVEL`
    amd.gpuN.ifwi=VERSION           the IFWI amd-smi static reports
    amd.gpuN.xgmi_down=K            XGMI links down (of 7)
    amd.gpuN.threshold_exceeded=1   the driver's bad-page threshold reached
    amd.gpuN.reset_fails=1          amd-smi reset says "Failed to reset GPU"
    amd.gpuN.log=EVENT[:COUNT]      an amdgpu kernel-log record of this GPU, as
                                    the driver prints it: ue:BLOCK, ce:BLOCK,
                                    de:BLOCK, poison, reset_begin, reset_failed,
                                    ring_timeout, soft_recovered, threshold
"""

import re
from typing import Any, Dict

from gpugate.errors import ConfigError
from gpugate.sim.kmsg import append
from gpugate.sim.values import parse_flag, parse_int

KEYS = ["amd.smi=ok|kfd|hang|absent|nolibdrm", "amd.amd_smi=VERSION", "amd.xgmi_status=0|1", "amd.rvs=absent|installed|nolevels",
        "amd.rvs.fail.LEVEL=0,3|none", "amd.gpuN.ifwi=VERSION", "amd.gpuN.xgmi_down=K",
        "amd.gpuN.threshold_exceeded=0|1", "amd.gpuN.reset_fails=0|1", "amd.gpuN.log=EVENT[:COUNT]"]
_NODE = ("amd.smi", "amd.amd_smi", "amd.xgmi_status", "amd.rvs")
_GPU = re.compile(r"^amd\.gpu(\d{1,3})\.(ifwi|xgmi_down|threshold_exceeded|reset_fails|log)$")
_RVS_FAIL = re.compile(r"^amd\.rvs\.fail\.([1-5])$")
# The driver's format strings (docs/explanation/amd-design.md §4; gpugate.vendors.amd.parse_kernlog), "{N}" its event id.
_LOG = {
    "ue": "{1}socket: 0, die: 0, %(n)d new uncorrectable hardware errors detected in %(block)s block",
    "ce": "{1}socket: 0, die: 0, %(n)d new correctable hardware errors detected in %(block)s block",
    "de": "{1}socket: 0, die: 0, %(n)d new deferred hardware errors detected in %(block)s block",
    "poison": "poison is consumed by client 12, kick off gpu reset flow",
    "reset_begin": "GPU reset begin!",
    "reset_failed": "GPU reset(1) failed",
    "ring_timeout": "ring gfx_0.0.0 timeout, signaled seq=%(n)d, emitted seq=%(m)d",
    "soft_recovered": "ring gfx_0.0.0 timeout, but soft recovered",
    "threshold": "Saved bad pages %(n)d reaches threshold value 128",
    "vm_fault": "[gfxhub] page fault (src_id:0 ring:24 vmid:3 pasid:32770, for process python3 pid 1234 thread "
                "python3 pid 1234)",
}
_LEVEL = {"ue": 3, "de": 3, "poison": 3, "reset_failed": 3, "ring_timeout": 3, "threshold": 3, "vm_fault": 3}


def known(key: str) -> bool:
    return key in _NODE or bool(_GPU.match(key) or _RVS_FAIL.match(key))


def set_key(model: Dict[str, Any], key: str, value: str) -> bool:
    if not known(key):
        return False
    amd = model.get("amd")
    if amd is None:
        raise ConfigError("%s: not an AMD node (sim init --vendor amd)" % key)
    if key == "amd.smi":
        if value not in ("ok", "kfd", "hang", "absent", "nolibdrm"):
            raise ConfigError("amd.smi: expected ok, kfd, hang, absent or nolibdrm, got %r" % value)
        amd["smi"] = value
    elif key == "amd.amd_smi":
        amd["amd_smi_version"] = value
    elif key == "amd.xgmi_status":
        amd["xgmi_status"] = bool(parse_flag(value))
    elif key == "amd.rvs":
        if value not in ("absent", "installed", "nolevels"):
            raise ConfigError("amd.rvs: expected absent, installed or nolevels, got %r" % value)
        rvs = amd.setdefault("rvs", {"fail": {}})
        rvs["installed"], rvs["nolevels"] = value != "absent", value == "nolevels"
    elif _RVS_FAIL.match(key):
        level = _RVS_FAIL.match(key).group(1)
        fail = amd.setdefault("rvs", {"installed": True}).setdefault("fail", {})
        fail[level] = [] if value in ("none", "") else sorted({parse_int(v) for v in value.split(",")})
    else:
        m = _GPU.match(key)
        index, sub = int(m.group(1)), m.group(2)
        if index >= len(amd["gpus"]):
            raise ConfigError("%s: the node has %d GPUs" % (key, len(amd["gpus"])))
        gpu = amd["gpus"][index]
        if sub == "ifwi":
            gpu["ifwi"] = value
        elif sub == "xgmi_down":
            gpu["xgmi_down"] = min(max(parse_int(value), 0), 7)
        elif sub in ("threshold_exceeded", "reset_fails"):
            gpu[sub] = bool(parse_flag(value))
        else:
            _log(model, gpu, value)
    return True


def _log(model: Dict[str, Any], gpu: Dict[str, Any], value: str) -> None:
    event, _, rest = value.partition(":")
    if event not in _LOG:
        raise ConfigError("amd.gpuN.log: expected one of %s, got %r" % (", ".join(sorted(_LOG)), event))
    block, count = "umc", 1
    if event in ("ue", "ce", "de"):
        block, _, n = rest.partition(":")
        block = block or "umc"
        count = parse_int(n) if n else 1
        if not re.match(r"^[a-z0-9_]{1,20}$", block):
            raise ConfigError("amd.gpuN.log: a RAS block is a lower-case name (umc, xgmi_wafl, ...), got %r" % block)
    elif rest:
        count = parse_int(rest)
    text = _LOG[event] % {"n": count, "m": count + 3, "block": block}
    append(model, "amdgpu %s: amdgpu: %s" % (gpu["bdf"], text), pri=_LEVEL.get(event, 4))
