"""`health` of AMD GPUs: count and product, RAS errors per block, bad
pages, XGMI links, PCIe, and the settings a nodeset pins (partitions,
power cap).  Component names are NVIDIA's where the meaning is the same.

RAS counts (ras/<block>_err_count) are cumulative since the driver loaded:
a GPU reset or a driver reload clears them, so an uncorrectable error drains
until the sweep's reset (or reboot) has been verified, as NVIDIA's volatile
ECC count does.
"""

from __future__ import annotations

from gpugate.model.facts import failed, unchecked
from gpugate.model.findings import BROKEN, DRIFT, HEALTH, INVESTIGATE, RECONVERGE, REBOOT, RESET_GPU, RMA_ACTION, Finding
from gpugate.judges import settings
from gpugate.judges.common import probe_finding
from gpugate.judges.gpus import _pcie

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only
    from typing import List


def judge(baseline, expect, facts, amd) -> List[Finding]:
    policy = baseline.health
    amd_expect = baseline.amd_expect_for(facts.node)
    out: List[Finding] = []
    bound = [gpu for gpu in amd.gpus if gpu.bound]
    if expect.gpus is not None and len(bound) != expect.gpus and not failed(amd.pci_functions):
        # (the bus unreadable: probe pci says so; no GPU is known missing)
        out.append(Finding(HEALTH, "gpu_count", str(len(bound)), str(expect.gpus), REBOOT))
    for gpu in bound:
        out += _identity(expect, amd_expect, gpu)
        out += _ras(policy, gpu)
        out += _bad_pages(policy, gpu)
        out += _xgmi(policy, gpu)
        if gpu.pcie is not None and not failed(gpu.pcie):
            out += _pcie(policy, gpu)
        elif failed(gpu.pcie):
            out.append(probe_finding("pcie", gpu.pcie, gpu.index))
        out += _settings(expect, amd_expect, gpu)
    out += _processes(policy, facts, amd)
    return out


def _identity(expect, amd_expect, gpu) -> List[Finding]:
    out: List[Finding] = []
    i = gpu.index
    if expect.product:
        if isinstance(gpu.product, str) and gpu.product != expect.product:
            out.append(Finding(HEALTH, "product", gpu.product, expect.product, INVESTIGATE, gpu=i))
        elif failed(gpu.product):
            out.append(probe_finding("product", gpu.product, i))
    wanted_id = amd_expect.device_id
    if wanted_id and isinstance(gpu.device_id, str) and gpu.device_id.lower() != wanted_id.lower():
        out.append(Finding(HEALTH, "device_id", gpu.device_id, wanted_id, INVESTIGATE, gpu=i))
    return out


def _ras(policy, gpu) -> List[Finding]:
    """Uncorrectable errors in the blocks the policy names, summed per GPU
    (the shared ecc_uncorrected_volatile_max), and UMC deferred errors
    (poison created, consumed later)."""
    ras = gpu.ras
    if ras is None:
        return []  # RAS not enabled on this GPU: nothing to read, a fact
    if failed(ras):
        return [probe_finding("ras", ras, gpu.index)]
    out: List[Finding] = []
    unreadable = [block for block, counts in sorted(ras.items()) if failed(counts)]
    if unreadable:
        out.append(probe_finding("ras", ras[unreadable[0]], gpu.index))
    counts = {block: c for block, c in ras.items() if not failed(c) and isinstance(c, (tuple, list))}
    hit = [(block, c[0]) for block, c in sorted(counts.items())
           if block in policy.ras_uncorrected_blocks and isinstance(c[0], int) and c[0] > 0]
    total = sum(n for _, n in hit)
    limit = policy.ecc_uncorrected_volatile_max
    if total > limit:
        out.append(Finding(HEALTH, "ras", "%s uncorrectable" % ",".join("%s=%d" % bn for bn in hit),
                           "0" if limit == 0 else "<= %d" % limit, RESET_GPU, gpu=gpu.index))
    deferred = [(block, c[2]) for block, c in sorted(counts.items())
                if len(c) > 2 and isinstance(c[2], int) and c[2] > 0]
    if sum(n for _, n in deferred) > policy.ras_deferred_max:
        out.append(Finding(HEALTH, "ras_deferred", "%s deferred" % ",".join("%s=%d" % bn for bn in deferred),
                           "<= %d" % policy.ras_deferred_max, RESET_GPU, gpu=gpu.index))
    return out


def _bad_pages(policy, gpu) -> List[Finding]:
    """Retired (R), pending (P) and unreservable (F) VRAM pages: a pending page
    is retired by a reset; one the driver could not retire is the board's end."""
    pages = gpu.bad_pages
    out: List[Finding] = []
    if failed(pages):
        out.append(probe_finding("bad_pages", pages, gpu.index))
    elif pages is not None:
        retired, pending, unreservable = pages
        if unreservable and policy.bad_pages_unreservable:
            out.append(Finding(HEALTH, "bad_pages", "%d unreservable" % unreservable, "none", RMA_ACTION,
                               gpu=gpu.index))
        elif pending and policy.bad_pages_pending:
            out.append(Finding(HEALTH, "bad_pages", "%d pending" % pending, "none", RESET_GPU, gpu=gpu.index))
        limit = policy.bad_pages_retired_max
        if isinstance(limit, int) and retired > limit:
            out.append(Finding(HEALTH, "bad_pages", "%d retired" % retired, "<= %d" % limit, RMA_ACTION,
                               gpu=gpu.index))
    exceeded = gpu.bad_page_threshold_exceeded
    if exceeded is True and policy.bad_pages_retired_max == "threshold":
        out.append(Finding(HEALTH, "bad_pages", "threshold exceeded", "under the driver's threshold",
                           RMA_ACTION, gpu=gpu.index))
    elif failed(exceeded) and not unchecked(exceeded) and policy.bad_pages_retired_max == "threshold":
        out.append(probe_finding("bad_page_threshold", exceeded, gpu.index))
    return out


def _xgmi(policy, gpu) -> List[Finding]:
    links = gpu.xgmi
    if links is None or unchecked(links) or policy.xgmi_links_down_max == "ignore":
        return []  # no XGMI links, or an amd-smi too old to say (shown as unchecked)
    if failed(links):
        return [probe_finding("xgmi", links, gpu.index)]
    up, down, disabled = links
    if down > policy.xgmi_links_down_max:
        return [Finding(HEALTH, "xgmi", "%d of %d down" % (down, up + down), "<= %d down" % policy.xgmi_links_down_max,
                        RESET_GPU, gpu=gpu.index)]
    return []


def _settings(expect, amd_expect, gpu) -> List[Finding]:
    """Partitions and the power cap: set at run time (amd-smi set), lost or
    changed by hand; a node that differs is drift (budgeted)."""
    out: List[Finding] = []
    for component, wanted, value in (("compute_partition", amd_expect.compute_partition, gpu.compute_partition),
                                     ("memory_partition", amd_expect.memory_partition, gpu.memory_partition)):
        if wanted is None:
            continue
        if failed(value):
            out.append(probe_finding(component, value, gpu.index))
        elif value is None:
            out.append(Finding(DRIFT, component, settings.NOT_SUPPORTED, wanted, RECONVERGE, gpu=gpu.index))
        elif str(value).upper() != wanted:
            out.append(Finding(DRIFT, component, str(value), wanted, RECONVERGE, gpu=gpu.index))
    cap = gpu.power_cap_w
    if expect.power_limit_watts is not None and cap is not None:  # None: a die without its own power reading
        out += settings._power_limit(expect.power_limit_watts, cap if failed(cap) else cap * 1000.0, gpu.index)
    return out


def _processes(policy, facts, amd) -> List[Finding]:
    """After a job (the epilog), a process still holding /dev/kfd is a job
    that did not end: its GPUs are not free for the next."""
    procs = amd.kfd_processes
    if policy.leftover_processes != "drain" or facts.mode != "epilog":
        return []
    if failed(procs):
        return [probe_finding("processes", procs)]  # whether the job left one is unknown: never "none"
    if not isinstance(procs, tuple) or not procs:
        return []
    from gpugate.judges.leftover import leftovers  # the epilog's alone: not loaded before every job

    procs, unknown = leftovers(procs, getattr(facts, "gpu_processes", None))  # another running job's: not left
    if not procs:
        return [probe_finding("processes", unknown)] if unknown is not None else []
    return [Finding(BROKEN, "processes", "%d left (pid %s)" % (len(procs), procs[0]), "none", REBOOT)]

