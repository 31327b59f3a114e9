"""`broken`: the stack itself fails (stale or missing module, NVML refusing,
GPUs on the bus that the driver does not see, Fabric Manager down)."""

from __future__ import annotations


from gpugate.model.facts import DAEMONS, NOT_RUNNING, ProbeFailure, failed, unchecked
from gpugate.model.findings import BROKEN, HEALTH, INVESTIGATE, PROBE, RECONVERGE, RELOAD_OR_REBOOT, REBOOT, Finding
from gpugate.judges.common import nvswitch, probe_finding

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import List

# NVML init error code -> (what an admin reads, action).
_NVML_INIT = {
    18: ("driver/library mismatch", RELOAD_OR_REBOOT),  # userspace upgraded, old module loaded
    9: ("driver not loaded", RELOAD_OR_REBOOT),
    12: ("libnvidia-ml missing", RECONVERGE),
    15: ("GPU lost", REBOOT),
}


def judge(baseline, expect, facts) -> List[Finding]:
    out: List[Finding] = []
    out += _nvml(facts)
    if _not_nvidia(facts):  # no NVIDIA GPU and no NVIDIA library: its missing module is no broken stack
        return out + _bus(expect, facts)
    out += _module(facts)
    out += _bus(expect, facts)
    out += _services(expect, facts)
    return out


def _nvml(facts):
    nvml = facts.nvml
    if not isinstance(nvml, ProbeFailure):
        return []
    if nvml.kind != "nvml":
        return [probe_finding("nvml", nvml)]  # hung or unusable binding: we cannot tell
    if _not_nvidia(facts):
        # No libnvidia-ml and no NVIDIA GPU on the bus (sysfs, every mode):
        # not an NVIDIA node at all, whatever the baseline says (an AMD node whose
        # nodeset lacks vendor = "amd").  The file's word, so budgeted: such a
        # baseline must not drain a whole AMD fleet outside the drain budget.
        return [Finding(PROBE, "nvml", "no NVIDIA GPU or library", "nvml ok", INVESTIGATE,
                        detail='an AMD node? set vendor = "amd" in its nodeset; ' + nvml.describe())]
    observed, action = _NVML_INIT.get(nvml.code, ("nvml error %s" % nvml.code, RELOAD_OR_REBOOT))
    cls = HEALTH if nvml.code == 15 else BROKEN
    return [Finding(cls, "nvml", observed, "nvml ok", action, detail=nvml.describe())]


def _not_nvidia(facts) -> bool:
    """libnvidia-ml missing and no NVIDIA GPU on the bus (sysfs: every mode;
    the prolog and epilog read it only when the library is missing)."""
    nvml = facts.nvml
    return isinstance(nvml, ProbeFailure) and nvml.kind == "nvml" and nvml.code == 12 and facts.pci_gpus == 0


def _module(facts):
    out = []
    resident, on_disk = facts.module_resident, facts.module_on_disk
    if isinstance(resident, ProbeFailure) and resident.kind != "missing":
        out.append(probe_finding("module", resident))
    if isinstance(on_disk, ProbeFailure) and not unchecked(on_disk):  # unchecked: no modinfo, nothing pinned unread
        if on_disk.kind == "absent":  # modinfo ran and found no nvidia module for this kernel
            out.append(Finding(BROKEN, "module", "none for %s" % _kernel(facts), "nvidia module",
                               RECONVERGE, detail=on_disk.describe()))
        else:
            out.append(probe_finding("module", on_disk))
    if isinstance(resident, str) and isinstance(on_disk, str) and resident != on_disk:
        # The package was upgraded but the old module is still loaded.
        out.append(Finding(BROKEN, "module", "loaded %s" % resident, "on-disk %s" % on_disk,
                           RELOAD_OR_REBOOT))
    dkms = facts.dkms
    if isinstance(dkms, ProbeFailure):
        out.append(probe_finding("dkms", dkms))
    elif dkms and isinstance(facts.kernel_release, str):
        built = [e for e in dkms if e.module.startswith("nvidia") and e.kernel == facts.kernel_release
                 and e.status.startswith("installed")]
        if not built:
            out.append(Finding(BROKEN, "dkms", "no nvidia build for %s" % facts.kernel_release,
                               "module built for running kernel", RECONVERGE))
    return out


def _kernel(facts):
    return facts.kernel_release if isinstance(facts.kernel_release, str) else "running kernel"


def _bus(expect, facts):
    out = []
    pci = facts.pci_gpus
    if isinstance(pci, ProbeFailure):
        return [probe_finding("pci", pci)]
    if pci is None:
        return out
    if expect.gpus is not None and pci < expect.gpus:
        # A GPU fell off the bus: only a reboot (or the hardware team) brings it back.
        out.append(Finding(HEALTH, "pci_gpus", str(pci), str(expect.gpus), REBOOT))
    nvml = facts.nvml
    if pci > 0 and not failed(nvml) and nvml is not None and nvml.gpu_count == 0:
        out.append(Finding(BROKEN, "nvml_gpus", "0 of %d on bus" % pci, str(pci), RELOAD_OR_REBOOT))
    return out


def _services(expect, facts):
    """Fabric Manager on NVSwitch nodes; nvidia-persistenced where the
    nodeset requires persistence mode.  A stopped service is a broken stack."""
    required = []
    if nvswitch(expect, facts):
        required.append("fabricmanager")
    if expect.persistence:
        required.append("persistenced")
    out = []
    for role in required:
        services = facts.services
        state = services if failed(services) else (services or {}).get(role)
        if isinstance(state, ProbeFailure):
            if not unchecked(state):  # [services] ROLE = "none": the site's word, shown as unchecked
                out.append(probe_finding(role, state))
        elif state == NOT_RUNNING:  # no process, no systemd
            out.append(Finding(BROKEN, role, state, "active", RELOAD_OR_REBOOT, detail=(
                "no %s process in /proc and no systemd to ask; where it runs outside this PID namespace (slurmd "
                'in a container), set [services] %s = "none" in gpugate.toml' % (DAEMONS.get(role, role), role))))
        elif state is not None and state != "active":
            out.append(Finding(BROKEN, role, state, "active", RELOAD_OR_REBOOT))
    return out
