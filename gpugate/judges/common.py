"""Helpers shared by the judges."""

from gpugate.model.facts import ProbeFailure
from gpugate.model.findings import INVESTIGATE, PROBE, Finding


def probe_finding(component: str, failure: ProbeFailure, gpu=None) -> Finding:
    """We could not tell: say what failed, never guess healthy."""
    observed = failure.kind if failure.kind != "nvml" else "nvml error %s" % failure.code
    return Finding(PROBE, component, observed, "answer", INVESTIGATE, gpu=gpu,
                   detail=failure.describe())


def show(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def nvswitch(expect, facts) -> bool:
    """Does this node have NVSwitches?  The baseline says; else the PCI bus."""
    if expect.nvswitch is not None:
        return expect.nvswitch
    return isinstance(facts.pci_nvswitches, int) and facts.pci_nvswitches > 0
