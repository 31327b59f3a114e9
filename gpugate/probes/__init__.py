"""Collect a node's facts for one mode, within the mode's time budget.

Commands run concurrently (a hung ``dcgmi`` must not starve the others) and
NVML runs in a thread the collector can abandon.  Whatever has not answered
by the deadline is recorded as a timeout.

May import: gpugate.core, gpugate.safety, gpugate.model, gpugate.parsers,
and the vendors' probes (gpugate.vendors.<vendor>.probe_*, NVIDIA's nvmlread)."""

from __future__ import annotations

import os
import time

from gpugate.model.facts import NodeFacts, ProbeFailure, failed
from gpugate.vendors.nvidia import probe_nvml

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Any, Callable, Dict, Optional, Sequence

MODES = ("healthcheck", "prolog", "epilog", "verify")
_COMMAND_CAP = 15.0  # no single ordinary tool deserves more


class Budget:
    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.deadline = clock() + seconds

    def left(self, cap: Optional[float] = None) -> float:
        left = max(self.deadline - self.clock(), 0.0)
        return min(left, cap) if cap is not None else left


def nvml_module(settings, node: str):
    """pynvml, or the simulated node's stand-in for it."""
    from gpugate.vendors.nvidia.nvmlread import binding

    return binding(settings.sim_fleet, node)


def collect(settings, baseline, node: str, mode: str, budget: Budget, xid_after: int = -1,
            gpus: Optional[Sequence[int]] = None, processes: bool = False, nvml_started=None,
            job: Optional[str] = None) -> NodeFacts:
    """nvml_started: the NVML reader, already forked (gpugate.safety.forked) with
    nvml.reader (the prolog starts it first thing); job: the job an epilog
    ends (SLURM_JOB_ID: a process in another running job is not its leftover)."""
    from gpugate.probes import files
    from gpugate.probes import kernlog  # here: the forked NVML reader needs neither

    durations: Dict[str, float] = {}
    root = settings.node_root(node)
    started = time.monotonic()
    amd = baseline.vendor_for(node) == "amd"  # the vendor seam: AMD nodes have no NVML
    pending, nvml = None, None
    if amd:
        if nvml_started is not None:
            nvml_started.cancel()  # the prolog forks its reader before it knows the vendor
    else:
        # NVML first, in a forked child that also loads the binding (pynvml, or
        # a simulated node's): the files below are read meanwhile.  Forked
        # before any thread starts: a fork inherits no lock another thread holds.
        try:
            pending = probe_nvml.Pending(gpus=gpus, processes=processes, started=nvml_started,
                                         loader=lambda: nvml_module(settings, node))
        except OSError as exc:  # no fork (out of processes or memory)
            nvml = ProbeFailure("nvml", "missing", "%s: %s" % (type(exc).__name__, exc))
    values: Dict[str, Any] = {
        "kernel_release": files.kernel_release(root),
        "boot_id": files.boot_id(root),
        "boot_time": files.boot_time(root),
    }
    kmsg_text, kmsg_overwritten = kernlog.read_kmsg(os.path.join(root, settings.kernel_log.lstrip("/")))
    ring_text = kmsg_text
    if isinstance(kmsg_text, str):  # the follower's journal: the GPU records a flood pushed out of the ring
        kmsg_text = kernlog.merge(kmsg_text, kernlog.read_events(settings.state_dir(node), values["boot_id"]))
    if amd:
        from gpugate.vendors.amd import probe_sysfs  # the kernel's files only: the prolog's too

        values["amd"] = probe_sysfs.read(root, firmware=mode != "prolog")  # the firmware set: not before every job
        if gpus:  # the epilog: only the job's GPUs' KFD processes (another job may be running beside it)
            values["amd"] = _job_processes(values["amd"], gpus)
        values["pci_gpus"] = getattr(values["amd"], "pci_functions", values["amd"])
    durations["files"] = time.monotonic() - started

    jobs = (_amd_jobs if amd else _command_jobs)(settings, baseline, node, mode, budget, gpus)
    pool = None
    if jobs:
        from concurrent.futures import ThreadPoolExecutor

        pool = ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="probe")
        futures = {name: pool.submit(_timed, fn) for name, fn in jobs.items()}

    if pending is not None:
        nvml = pending.result(budget.left())
    if not amd:
        durations["nvml"] = time.monotonic() - started

    if pool is not None:
        from concurrent.futures import TimeoutError as FutureTimeout

        for name, future in futures.items():
            try:
                values[name], durations[name] = future.result(timeout=budget.left())
            except FutureTimeout:
                values[name] = ProbeFailure(name, "timeout", "no answer within the budget")
                durations[name] = time.monotonic() - started
        pool.shutdown(wait=False)

    pci = values.pop("pci", None)
    if pci is not None:
        values["pci_gpus"], values["pci_nvswitches"] = (pci, pci) if isinstance(pci, ProbeFailure) else pci
    elif not amd and _no_library(nvml):
        # The prolog and epilog read no bus; where libnvidia-ml is missing they
        # must (one sysfs walk, on this failure path only): no NVIDIA GPU there
        # either is an AMD node whose nodeset lacks vendor = "amd", a budgeted
        # probe finding in every mode (judges.stack), never a broken stack.
        from gpugate.probes import commands

        pci = _pci(root, lambda: commands.lspci(settings.command("lspci", node), budget.left(_COMMAND_CAP)))
        values["pci_gpus"], values["pci_nvswitches"] = (pci, pci) if isinstance(pci, ProbeFailure) else pci
    if amd:
        values["amd"] = _amd_merge(values)
    values["xids"] = _xids(kmsg_text, values["boot_time"], xid_after, baseline, nvml, values.get("amd"))
    if amd and isinstance(values["xids"], tuple):
        values["xids"] = _after_own_reset(settings, node, values["boot_id"], values["xids"])
    if isinstance(kmsg_text, str):
        values["kernel_log_seq"] = kernlog.last_seq(kmsg_text)
        values["kernel_log_lost"] = kernlog.lost_records(ring_text, xid_after, kmsg_overwritten)
        values["kernel_log_follower"] = kernlog.coverage(
            kernlog.read_heartbeat(settings.state_dir(node)), values["boot_id"], values["kernel_log_lost"],
            time.time(), kernlog.STALE)
    if mode in ("healthcheck", "verify"):
        if not amd:  # NVIDIA's module (/proc/driver/nvidia/version); amdgpu's is in the AMD facts
            values["module_resident"] = files.module_resident(root)
        values["image"] = files.image(root)
        from gpugate.probes.ib import read_hcas  # the health check's and verification's: not the prolog's

        t0 = time.monotonic()
        values["hcas"] = read_hcas(root)
        durations["hca"] = time.monotonic() - t0
        from gpugate.probes.install_trust import fact  # the code this runs as root (~3 ms); not the prolog's

        t0 = time.monotonic()
        values["install"] = fact()
        durations["install"] = time.monotonic() - t0
    if mode in ("healthcheck", "epilog"):
        from gpugate.probes import owners  # whose the GPUs' processes are; whether Slurm confines jobs to their GPUs

        values.update(owners.node_facts(root, mode, nvml, values.get("amd"), job))
    return NodeFacts(node=node, mode=mode, collected_at=time.time(), nvml=nvml, durations=durations,
                     **values)


def _timed(fn):
    t0 = time.monotonic()
    value = fn()
    return value, time.monotonic() - t0


def _command_jobs(settings, baseline, node, mode, budget, gpus=None) -> Dict[str, Callable[[], Any]]:
    level = baseline.health.dcgm_diag.get(mode, 0)
    if mode not in ("healthcheck", "verify") and not level:
        return {}  # the prolog runs no tool: not even their module is loaded
    cmd = lambda name: settings.command(name, node)  # noqa: E731 - short alias
    cap = lambda: budget.left(_COMMAND_CAP)  # noqa: E731
    from gpugate.probes import commands

    jobs: Dict[str, Callable[[], Any]] = {}
    uses_dcgm = baseline.pin.dcgm is not None
    if mode in ("healthcheck", "verify"):
        jobs["module_on_disk"] = lambda: commands.module_on_disk(cmd("modinfo"), cap())
        jobs["dkms"] = lambda: commands.dkms_status(cmd("dkms"), cap())
        root = settings.node_root(node)
        jobs["pci"] = lambda: _pci(root, lambda: commands.lspci(cmd("lspci"), cap()))
        jobs["packages"] = lambda: commands.packages(settings.packages, cmd("dpkg-query"), cmd("rpm"), cap())
        from gpugate.probes import services

        jobs["services"] = lambda: services.read(settings.services, root,
                                                 lambda unit: commands.service_state(cmd("systemctl"), unit, cap()))
        if baseline.expect_for(node).imex:  # IMEX domain members only
            jobs["imex"] = lambda: commands.imex_status(cmd("nvidia-imex-ctl"), cap())
        if uses_dcgm:
            jobs["dcgm_version"] = lambda: commands.dcgm_version(cmd("dcgmi"), cap())
            jobs["dcgm_health"] = lambda: commands.dcgm_health(cmd("dcgmi"), cap())
    if level:
        # The diagnostic may take the whole budget; leave a moment to act.
        levels = tuple(level) if isinstance(level, (list, tuple)) else (level,)
        jobs["dcgm_diag"] = lambda: commands.dcgm_diag_staged(cmd("dcgmi"), levels,
                                                              lambda: max(budget.left() - 2.0, 0.1), gpus)
    return jobs


def _no_library(nvml) -> bool:
    """NVML's init said its library is missing (NVML_ERROR_LIBRARY_NOT_FOUND)."""
    return isinstance(nvml, ProbeFailure) and nvml.kind == "nvml" and nvml.code == 12


def _pci(root, lspci):
    """The kernel's sysfs; lspci (which reads the same files) only where
    /sys/bus/pci/devices is absent."""
    from gpugate.probes.files import pci_counts

    counts = pci_counts(root)
    return lspci() if counts is None else counts


def _amd_jobs(settings, baseline, node, mode, budget, gpus=None) -> Dict[str, Callable[[], Any]]:
    """An AMD node's tools: amd-smi (health check, verify) and the ROCm
    Validation Suite where a level is set for the mode (verify: (1, 2))."""
    jobs: Dict[str, Callable[[], Any]] = {}
    cmd = lambda name: settings.command(name, node)  # noqa: E731 - short alias
    if mode in ("healthcheck", "verify"):
        from gpugate.vendors.amd import probe_smi

        jobs.update(probe_smi.jobs(cmd("amd-smi"), lambda: budget.left(_COMMAND_CAP)))
    level = baseline.health.rvs.get(mode, 0)
    if level:
        from gpugate.probes import rvs

        levels = tuple(level) if isinstance(level, (list, tuple)) else (level,)
        jobs["rvs"] = lambda: rvs.staged(cmd("rvs"), levels, lambda: max(budget.left() - 2.0, 0.1))
    return jobs


def _job_processes(amd, gpus) -> Any:
    """The node's KFD processes narrowed to those on the job's GPUs (each
    GPU's own list; one it could not read makes the whole answer unknown).
    An index that names no GPU here (a CPX-partitioned node numbers more
    logical GPUs than it has physical ones) means every GPU's, never none's
    (gpugate.node.jobenv; nvmlread does the same on NVIDIA)."""
    if failed(amd) or failed(amd.kfd_processes):
        return amd
    from gpugate.core.record import replace

    if not set(gpus) <= {g.index for g in amd.gpus}:
        return amd
    mine = [g for g in amd.gpus if g.index in set(gpus)]
    unreadable = next((g.processes for g in mine if failed(g.processes)), None)
    pids = unreadable if unreadable is not None else tuple(sorted({p for g in mine for p in g.processes or ()}))
    return replace(amd, kfd_processes=pids)


def _after_own_reset(settings, node, boot_id, events):
    """amdgpu's events up to the sweep's last GPU reset of this boot are
    left out, the older ones kept for a rate included: the reset's own
    "GPU reset begin!" is no fault, and what came before it was what the
    reset repaired (its verification judged the node after it)."""
    from gpugate.probes.reuse import reset_cursor

    floor = reset_cursor(settings, node, boot_id)
    if floor < 0:
        return events
    return tuple(e for e in events if e.kind != "amdgpu" or e.seq is None or e.seq > floor)


def _amd_merge(values: Dict[str, Any]) -> Any:
    """The sysfs facts with what amd-smi and RVS answered."""
    amd = values["amd"]
    static, xgmi, version = (values.pop(k, None) for k in ("amd_smi_static", "amd_smi_xgmi", "amd_smi_version"))
    rvs = values.pop("rvs", None)
    if failed(amd):
        return amd
    if static is not None or xgmi is not None or version is not None:
        from gpugate.vendors.amd.probe_smi import merge

        amd = merge(amd, static, xgmi, version)
    if rvs is not None:
        from gpugate.core.record import replace

        amd = replace(amd, rvs=rvs)
    return amd


def _xids(kmsg_text, boot_time, after, baseline, nvml, amd=None):
    from gpugate.probes import kernlog

    if isinstance(kmsg_text, ProbeFailure):
        return kmsg_text
    bus_to_gpu = {}
    if nvml is not None and not failed(nvml):
        for gpu in nvml.gpus:
            if isinstance(gpu.pci_bus_id, str):
                bus_to_gpu[kernlog.bus_key(gpu.pci_bus_id)] = gpu.index
    if amd is not None and not failed(amd):
        for gpu in amd.gpus:
            bus_to_gpu[kernlog.bus_key(gpu.bdf)] = gpu.index
    bt = boot_time if isinstance(boot_time, float) else None
    return kernlog.fresh_xids(kmsg_text, bt, after, baseline.health.xid_window_seconds, time.time(), bus_to_gpu)


__all__ = ["collect", "Budget", "MODES"]
