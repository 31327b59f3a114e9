"""`health`: the GPUs themselves (count, Xid, ECC, remap, PCIe, clocks,
NVLink, fabric, recovery action), plus per-GPU settings the nodeset expects."""

from __future__ import annotations


from gpugate.model.facts import ProbeFailure, failed
from gpugate.model.findings import BROKEN, HEALTH, INVESTIGATE, REBOOT, RELOAD_OR_REBOOT, RESET_GPU, RMA_ACTION, Finding
from gpugate.core.record import fields
from gpugate.judges import settings
from gpugate.judges import xids
from gpugate.judges.common import nvswitch, probe_finding

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import List

# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION values -> (what it says, action)
_RECOVERY = {1: ("gpu reset", RESET_GPU), 2: ("node reboot", REBOOT),
             3: ("drain p2p", INVESTIGATE), 4: ("drain and reset", RESET_GPU)}
_FABRIC_COMPLETED = 3
_GPU_LOST = 15
_RESET_REQUIRED = 16


def judge(baseline, expect, facts) -> List[Finding]:
    out: List[Finding] = []
    out += xids.judge(baseline.health, facts)
    nvml = facts.nvml
    if nvml is None or failed(nvml):
        return out
    if isinstance(nvml.gpu_count, ProbeFailure):
        return out + [probe_finding("gpu_count", nvml.gpu_count)]
    if expect.gpus is not None and nvml.gpu_count != expect.gpus:
        out.append(Finding(HEALTH, "gpu_count", str(nvml.gpu_count), str(expect.gpus), REBOOT))
    for gpu in nvml.gpus:
        out += _gpu(baseline.health, expect, facts, gpu)
    return out


def _gpu(policy, expect, facts, gpu) -> List[Finding]:
    i = gpu.index
    out: List[Finding] = []
    lost = [v for v in _values(gpu) if isinstance(v, ProbeFailure) and v.code in (_GPU_LOST, _RESET_REQUIRED)]
    if lost:
        # Every other reading of a lost GPU is noise: one finding says it all.
        code = lost[0].code
        return [Finding(HEALTH, "gpu", "lost" if code == _GPU_LOST else "reset required", "present",
                        REBOOT if code == _GPU_LOST else RESET_GPU, gpu=i, detail=lost[0].describe())]
    for name in ("name", "ecc_uncorrected_volatile", "remapped_rows", "pcie", "clock_event_reasons",
                 "nvlink_up", "recovery_action", "retired_pages_pending", "fabric_state", "persistence_mode",
                 "mig_enabled", "vbios", "gsp_firmware", "ecc_uncorrected_aggregate"):
        value = getattr(gpu, name)
        if isinstance(value, ProbeFailure):
            out.append(probe_finding(name, value, i))
    if expect.product and isinstance(gpu.name, str) and gpu.name != expect.product:
        out.append(Finding(HEALTH, "product", gpu.name, expect.product, INVESTIGATE, gpu=i))
    vol = gpu.ecc_uncorrected_volatile
    if isinstance(vol, int) and vol > policy.ecc_uncorrected_volatile_max:
        out.append(Finding(HEALTH, "ecc", "%d uncorrected" % vol, "<= %d" % policy.ecc_uncorrected_volatile_max,
                           RESET_GPU, gpu=i))
    agg, agg_max = gpu.ecc_uncorrected_aggregate, policy.ecc_uncorrected_aggregate_max
    if isinstance(agg, int) and agg_max != "ignore" and agg > agg_max:
        out.append(Finding(HEALTH, "ecc_aggregate", "%d uncorrected" % agg, "<= %d" % agg_max, RMA_ACTION, gpu=i))
    if gpu.retired_pages_pending is True and policy.retired_pages_pending:
        out.append(Finding(HEALTH, "retired_pages", "pending", "none", RESET_GPU, gpu=i))
    rows = gpu.remapped_rows
    if rows is not None and not failed(rows):
        if rows.failure and policy.row_remap_failure:
            out.append(Finding(HEALTH, "row_remap", "failure", "none", RMA_ACTION, gpu=i))
        elif rows.pending and policy.row_remap_pending:
            out.append(Finding(HEALTH, "row_remap", "pending", "none", RESET_GPU, gpu=i))
    out += _pcie(policy, gpu)
    # Clock events are judged by time, between two health checks, from
    # NVML's counters (judges.throttle): one sample of the reasons is a
    # moment (a burst of heat, a power brake) and never drains.
    links = gpu.nvlink_up
    if isinstance(links, tuple) and links and policy.nvlink_down_max != "ignore":
        down = sum(1 for up in links if not up)
        if down > policy.nvlink_down_max:
            out.append(Finding(HEALTH, "nvlink", "%d of %d down" % (down, len(links)),
                               "<= %d down" % policy.nvlink_down_max, RESET_GPU, gpu=i))
    fabric = gpu.fabric_state
    if policy.fabric_completed and nvswitch(expect, facts) and isinstance(fabric, int) and fabric != _FABRIC_COMPLETED:
        out.append(Finding(BROKEN, "fabric", "state %d" % fabric, "completed", RELOAD_OR_REBOOT, gpu=i))
    action = gpu.recovery_action
    if policy.recovery_action and isinstance(action, int) and action in _RECOVERY:
        said, todo = _RECOVERY[action]
        out.append(Finding(HEALTH, "recovery", said, "none", todo, gpu=i))
    out += settings.judge(expect, gpu)
    procs = gpu.processes
    if policy.leftover_processes == "drain" and facts.mode == "epilog" and isinstance(procs, tuple) and procs:
        from gpugate.judges.leftover import leftovers  # the epilog's alone: not loaded before every job

        procs, unknown = leftovers(procs, getattr(facts, "gpu_processes", None))  # another running job's: not left
        if procs:
            out.append(Finding(BROKEN, "processes", "%d left (pid %s)" % (len(procs), procs[0]), "none", REBOOT, gpu=i))
        elif unknown is not None:
            out.append(probe_finding("processes", unknown, i))
    return out


def _pcie(policy, gpu):
    """A link trained below what it can do is the hardware's fault (acute);
    one at its own maximum but below the policy's minimum is a baseline that
    does not fit this node (budgeted: pcie_max_gen / pcie_max_width)."""
    link = gpu.pcie
    if link is None or failed(link):
        return []
    out = []
    for name, now, best, floor, unit in (("gen", link.gen, link.max_gen, policy.pcie_min_gen, "gen%d"),
                                         ("width", link.width, link.max_width, policy.pcie_min_width, "x%d")):
        wanted = best if floor == "max" else floor
        if not wanted or now >= wanted:
            continue
        if best and now >= best:
            out.append(Finding(HEALTH, "pcie_max_" + name, (unit + " max") % best, unit % wanted, INVESTIGATE,
                               gpu=gpu.index))
        else:
            out.append(Finding(HEALTH, "pcie_" + name, unit % now, unit % wanted, INVESTIGATE, gpu=gpu.index))
    return out


def _values(gpu):
    return [getattr(gpu, f.name) for f in fields(gpu)]
