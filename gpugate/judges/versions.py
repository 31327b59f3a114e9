"""`drift`: a working stack on versions other than the pin.

While a planned rollout is in progress, a component still on the `previous`
pin is `pending` (reported, never drained): the sweep moves it on purpose.
"""

from __future__ import annotations


from gpugate.model.facts import ProbeFailure, failed, unchecked
from gpugate.model.findings import DRIFT, PENDING, RECONVERGE, Finding
from gpugate.judges.common import nvswitch, probe_finding

# A pending finding's detail (here and gpugate.judges.operator's labels).
ON_PREVIOUS = "on the previous baseline; rollout in progress"

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Callable, List, Optional


def comparer(baseline, out: List[Finding], gpu_name: Callable[[Optional[int]], Optional[str]]):
    """compare(component, observed, gpu=None, expected=None): a drift (or,
    during a rollout, pending) finding into ``out`` when the observed version
    is not the pin.  gpu_name(index): the product, for per-product pins."""
    pin = baseline.pin

    def compare(component, observed, gpu=None, expected=None):
        expected = pin.get(component) if expected is None else expected
        if expected is None or observed is None:
            return
        if isinstance(observed, ProbeFailure):
            if not unchecked(observed):  # configured off: no finding, and no value either
                out.append(probe_finding(component, observed, gpu))
            return
        if observed == expected:
            return
        if _on_previous(baseline, component, observed, gpu_name=gpu_name(gpu)):
            out.append(Finding(PENDING, component, observed, expected, RECONVERGE, gpu=gpu, detail=ON_PREVIOUS))
            return
        out.append(Finding(DRIFT, component, str(observed), expected, RECONVERGE, gpu=gpu))
    return compare


def judge(baseline, expect, facts) -> List[Finding]:
    pin = baseline.pin
    out: List[Finding] = []
    compare = comparer(baseline, out, lambda gpu: _gpu_name(facts, gpu))

    compare("kernel", facts.kernel_release)
    compare("image", facts.image_version if facts.image is not None else None)
    nvml = facts.nvml
    if nvml is not None and not failed(nvml):
        compare("driver", nvml.driver_version)
        compare("cuda_driver", nvml.cuda_driver_version)
        for gpu in nvml.gpus:
            if gpu.gsp_firmware is not None:
                compare("gsp_firmware", gpu.gsp_firmware, gpu.index)
            if isinstance(gpu.name, str) and gpu.name in pin.vbios:
                compare("vbios", gpu.vbios, gpu.index, expected=pin.vbios[gpu.name])
    packages = facts.packages  # None: not collected in this mode
    if failed(packages):  # the whole probe gave up (budget): every role is unknown
        packages = {role: packages for role in ("container_toolkit", "fabricmanager")}
    if packages is not None:
        compare("container_toolkit", _package_version(packages.get("container_toolkit"), pin.container_toolkit))
    if packages is not None and nvswitch(expect, facts):
        fm = _package_version(packages.get("fabricmanager"), pin.fabricmanager)
        before = len(out)
        compare("fabricmanager", fm)
        if len(out) == before:  # on the pin, but is the driver?
            out += _fabricmanager_matches_driver(fm, nvml, pin.fabricmanager)
    compare("dcgm", facts.dcgm_version)
    if pin.require_hold and packages:
        out += _holds(packages)
    return out


def _package_version(pkg, pinned: Optional[str]):
    if pinned is None:
        return None
    if pkg is None:
        return "absent"  # pinned but not installed: that is drift
    if isinstance(pkg, ProbeFailure):
        return pkg
    return pkg.version


def _fabricmanager_matches_driver(fm, nvml, fm_pin):
    """Fabric Manager refuses to start against a driver of another version."""
    if not isinstance(fm, str) or fm == "absent" or nvml is None or failed(nvml):
        return []
    driver = nvml.driver_version
    if not isinstance(driver, str) or fm == driver or fm_pin is None:
        return []
    return [Finding(DRIFT, "fabricmanager", fm, "driver %s" % driver, RECONVERGE,
                    detail="Fabric Manager must equal the running driver")]


def _holds(packages):
    out = []
    for role, pkg in sorted(packages.items()):
        if pkg is not None and not failed(pkg) and not pkg.held:
            out.append(Finding(DRIFT, "hold", "%s not held" % pkg.name, "held", RECONVERGE))
    return out


def previous_pin(baseline, component: str) -> Optional[str]:
    """[previous]'s version of a component while a rollout is in progress
    (None: no rollout, no [previous], or it names none)."""
    prev = baseline.previous
    if not baseline.rollout_in_progress or prev is None:
        return None
    return prev.get(component)


def _on_previous(baseline, component, observed, gpu_name=None) -> bool:
    if component in ("vbios", "ifwi"):  # per product
        prev = baseline.previous if baseline.rollout_in_progress else None
        return prev is not None and gpu_name is not None and getattr(prev, component).get(gpu_name) == observed
    was = previous_pin(baseline, component)
    return was is not None and was == observed


def _gpu_name(facts, index):
    if index is None or facts.nvml is None or failed(facts.nvml):
        return None
    for gpu in facts.nvml.gpus:
        if gpu.index == index and isinstance(gpu.name, str):
            return gpu.name
    return None
