"""Per-GPU runtime settings a nodeset pins: persistence, MIG, ECC, compute
mode and power limit.

They are set at run time (nvidia-smi -pm/-mig/-e/-c/-pl) and a reset or
reboot can lose them, so a fleet's config management re-applies them; a GPU
that differs is ``drift``.  Drift compares the node with the baseline, so it
is budgeted: a wrong pin on every node drains at most the drain budget.

Rules (every one judged only when the nodeset pins the setting):
- a setting the GPU does not support (NVML_ERROR_NOT_SUPPORTED) is a finding
  ("not supported"), never a pass -- except MIG or ECC pinned *off*: a GPU
  without the feature cannot have it on;
- a setting NVML could not read is a ``probe`` finding;
- ECC and MIG changes wait for a GPU reset: a pending mode other than the
  current one is reported with both, and the action says whether a reset
  alone fixes it (pending = pin) or the converge must (pending != pin);
- the power limit is compared in whole watts: NVML reports milliwatts, and
  a limit within 1 W of the pin matches (nvidia-smi -pl takes watts).
"""

from __future__ import annotations

from gpugate.model.facts import failed, unchecked
from gpugate.model.findings import DRIFT, RECONVERGE, RESET_GPU, Finding
from gpugate.judges.common import probe_finding, show

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import List

# NVML_COMPUTEMODE_*; 1 (EXCLUSIVE_THREAD) was removed from CUDA but may be read.
COMPUTE_MODE_NAMES = {0: "default", 1: "exclusive_thread", 2: "prohibited", 3: "exclusive_process"}
NOT_SUPPORTED = "not supported"


def judge(expect, gpu) -> List[Finding]:
    out: List[Finding] = []
    i = gpu.index
    if expect.persistence and gpu.persistence_mode is False:
        out.append(Finding(DRIFT, "persistence", "off", "on", RECONVERGE, gpu=i))
    out += _reset_mode("mig", expect.mig, gpu.mig_enabled, gpu.mig_pending, i)
    out += _reset_mode("ecc_mode", expect.ecc, gpu.ecc_enabled, gpu.ecc_pending, i)
    if expect.compute_mode is not None:
        out += _compute_mode(expect.compute_mode, gpu.compute_mode, i)
    if expect.power_limit_watts is not None:
        out += _power_limit(expect.power_limit_watts, gpu.power_limit_mw, i)
    return out


def _unreadable(component, value, gpu, expected):
    """Findings for a pinned setting without a value (None when it has one)."""
    if unchecked(value):  # facts from before the setting was read: not judged
        return []
    if failed(value):
        return [probe_finding(component, value, gpu)]
    if value is None:
        return [Finding(DRIFT, component, NOT_SUPPORTED, expected, RECONVERGE, gpu=gpu,
                        detail="NVML: NOT_SUPPORTED on this GPU")]
    return None


def _reset_mode(component, pin, current, pending, gpu):
    """MIG or ECC: the mode now, and the mode the next GPU reset applies."""
    if pin is None:
        return []
    if current is None and not pin:
        return []  # no such feature: it cannot be on
    if failed(current) and component == "mig":
        return []  # gpus.judge reports an unreadable MIG mode whether pinned or not
    bad = _unreadable(component, current, gpu, show(pin))
    if bad is not None:
        return bad
    if not isinstance(pending, bool):
        pending = current  # pending unreadable: judge the current mode alone
    if current == pin and pending == pin:
        return []
    observed = show(current) if pending == current else "%s, pending %s" % (show(current), show(pending))
    # Pending = pin: a reset applies it.  Otherwise the converge must set it (and a reset then).
    action = RESET_GPU if pending == pin else RECONVERGE
    return [Finding(DRIFT, component, observed, show(pin), action, gpu=gpu)]


def _compute_mode(pin, value, gpu):
    bad = _unreadable("compute_mode", value, gpu, pin)
    if bad is not None:
        return bad
    name = COMPUTE_MODE_NAMES.get(value, "mode %s" % value)
    if name == pin:
        return []
    return [Finding(DRIFT, "compute_mode", name, pin, RECONVERGE, gpu=gpu)]


def _power_limit(watts, value, gpu):
    bad = _unreadable("power_limit", value, gpu, "%d W" % watts)
    if bad is not None:
        return bad
    if abs(value - watts * 1000) < 1000:
        return []
    return [Finding(DRIFT, "power_limit", "%g W" % (value / 1000.0), "%d W" % watts, RECONVERGE, gpu=gpu)]

