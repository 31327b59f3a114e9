"""Reading NVML, in the forked reader (gpugate.vendors.nvidia.probe_nvml runs it).

Every per-GPU call is read separately: one failing call is one
ProbeFailure, never a healthy-looking default.  This module loads nothing
of gpugate's: the prolog's reader is forked before gpugate's records are
defined, so it answers with stand-ins, ("\\0gpugate.facts", KIND, args,
kwargs), that gpugate.vendors.nvidia.probe_nvml makes into the records of gpugate.model.facts.
"""

import os

TAG = "\0gpugate.facts"
KINDS = ("ProbeFailure", "GpuFacts", "NvmlFacts", "Pcie", "RemappedRows")
_NOT_SUPPORTED = 3
_MAX_LINKS = 18


def _stand_in(kind):
    return lambda *args, **kwargs: (TAG, kind, args, kwargs)


ProbeFailure, GpuFacts, NvmlFacts, Pcie, RemappedRows = (_stand_in(kind) for kind in KINDS)


def binding(sim_fleet: str, node: str, sim_dir: str = ""):
    """pynvml, or a simulated node's stand-in for it (sim_dir: the node's
    files a parent's run reads, gpugate.model.simview)."""
    if sim_fleet:
        from gpugate.model.simview import node_dir
        from gpugate.vendors.nvidia import nvml_sim

        return nvml_sim.load_file(os.path.join(sim_dir or node_dir(sim_fleet, node), "node.json"))
    from gpugate.vendors.nvidia.pynvml_loader import import_pynvml

    return import_pynvml()


def reader(nvml, loader, gpus, processes):
    """What the child runs: load the binding (when a loader is given), then
    read what NVML says of the node and of the given GPUs (None: all)."""
    def read_in_child():
        module = nvml
        if loader is not None:
            try:
                module = loader()
            except Exception as exc:  # the binding itself cannot load (no libnvidia-ml), a bad sim node
                return ProbeFailure("nvml", "missing", "%s: %s" % (type(exc).__name__, exc))
        return _read(module, gpus, processes)
    return read_in_child


def _read(nvml, gpus, processes):
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return _failure("nvmlInit", nvml, exc)
    try:
        driver = _call(nvml, "driver", lambda: _text(nvml.nvmlSystemGetDriverVersion()))
        cuda = _call(nvml, "cuda", lambda: _cuda(nvml.nvmlSystemGetCudaDriverVersion_v2()))
        count = _call(nvml, "gpu_count", nvml.nvmlDeviceGetCount)
        devices = []
        if isinstance(count, int):
            if gpus is not None and any(i >= count for i in gpus):
                gpus = None  # a job GPU this node does not have: check every GPU, never none
            for index in range(count):
                if gpus is None or index in gpus:
                    devices.append(_gpu(nvml, index, processes))
        return NvmlFacts(driver, cuda, count, tuple(devices))
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


def _gpu(nvml, index, processes):
    try:
        h = nvml.nvmlDeviceGetHandleByIndex(index)
    except nvml.NVMLError as exc:
        fail = _failure("handle", nvml, exc)
        return GpuFacts(index, *([fail] * 18), processes=fail, compute_mode=fail, power_limit_mw=fail,
                        ecc_pending=fail, mig_pending=fail, clock_event_ns=fail)

    def get(name, fn, unsupported=None):
        return _call(nvml, name, fn, unsupported)

    unc = nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    ecc = get("ecc_mode", lambda: nvml.nvmlDeviceGetEccMode(h))  # [current, pending]
    mig = get("mig", lambda: nvml.nvmlDeviceGetMigMode(h))
    return GpuFacts(
        index=index,
        name=get("name", lambda: _text(nvml.nvmlDeviceGetName(h))),
        uuid=get("uuid", lambda: _text(nvml.nvmlDeviceGetUUID(h))),
        serial=get("serial", lambda: _text(nvml.nvmlDeviceGetSerial(h))),
        pci_bus_id=get("pci", lambda: _text(nvml.nvmlDeviceGetPciInfo(h).busId)),
        vbios=get("vbios", lambda: _text(nvml.nvmlDeviceGetVbiosVersion(h))),
        gsp_firmware=get("gsp", lambda: _text(nvml.nvmlDeviceGetGspFirmwareVersion(h)) or None),
        ecc_enabled=_mode(ecc, 0),
        ecc_uncorrected_volatile=get("ecc_volatile", lambda: int(
            nvml.nvmlDeviceGetTotalEccErrors(h, unc, nvml.NVML_VOLATILE_ECC))),
        ecc_uncorrected_aggregate=get("ecc_aggregate", lambda: int(
            nvml.nvmlDeviceGetTotalEccErrors(h, unc, nvml.NVML_AGGREGATE_ECC))),
        retired_pages_pending=get("retired_pages", lambda: bool(nvml.nvmlDeviceGetRetiredPagesPendingStatus(h))),
        remapped_rows=get("remapped_rows", lambda: _rows(nvml.nvmlDeviceGetRemappedRows(h))),
        nvlink_up=_links(nvml, h),
        pcie=get("pcie", lambda: Pcie(int(nvml.nvmlDeviceGetCurrPcieLinkGeneration(h)),
                                      int(nvml.nvmlDeviceGetCurrPcieLinkWidth(h)),
                                      int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(h)),
                                      int(nvml.nvmlDeviceGetMaxPcieLinkWidth(h)))),
        clock_event_reasons=get("clocks", lambda: int(nvml.nvmlDeviceGetCurrentClocksEventReasons(h))),
        persistence_mode=get("persistence", lambda: bool(nvml.nvmlDeviceGetPersistenceMode(h))),
        mig_enabled=_mode(mig, 0),
        fabric_state=get("fabric", lambda: _fabric_state(nvml, h)),
        recovery_action=get("recovery", lambda: _recovery(nvml, h)),
        processes=get("processes", lambda: tuple(p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(h)),
                      ()) if processes else (),
        # Two calls more per GPU (ECC and MIG pending come with their modes).
        compute_mode=get("compute_mode", lambda: int(nvml.nvmlDeviceGetComputeMode(h))),
        power_limit_mw=get("power_limit", lambda: int(nvml.nvmlDeviceGetPowerManagementLimit(h))),
        ecc_pending=_mode(ecc, 1),
        mig_pending=_mode(mig, 1),
        clock_event_ns=get("clock_event_ns", lambda: _clock_event_ns(nvml, h)),
    )


def _mode(pair, which):
    """Current (0) or pending (1) of an [current, pending] answer; None
    (not supported) and failures pass through."""
    return bool(pair[which]) if isinstance(pair, list) else pair


def _call(nvml, name, fn, unsupported=None):
    try:
        return fn()
    except nvml.NVMLError as exc:
        if exc.value == _NOT_SUPPORTED:
            return unsupported  # a fact: this GPU does not have it
        return _failure(name, nvml, exc)


def _failure(name, nvml, exc):
    try:
        text = str(exc)
    except Exception:  # pragma: no cover - unknown codes can fail to format
        text = "unknown"
    return ProbeFailure("nvml." + name, "nvml", text, exc.value)


def _text(value) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _cuda(value: int) -> str:
    return "%d.%d" % (value // 1000, (value % 1000) // 10)


def _rows(value):
    corr, unc, pending, failure = value
    return RemappedRows(int(corr), int(unc), bool(pending), bool(failure))


def _links(nvml, h):
    states = []
    for link in range(_MAX_LINKS):
        try:
            states.append(bool(nvml.nvmlDeviceGetNvLinkState(h, link)))
        except nvml.NVMLError as exc:
            # Past the last link the driver says NotSupported/InvalidArgument.
            if exc.value in (_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT):
                break
            return _failure("nvlink", nvml, exc)
    return tuple(states)


def _fabric_state(nvml, h) -> int:
    import ctypes  # pynvml loads it anyway; the parent of the reader need not

    info = nvml.c_nvmlGpuFabricInfoV_t()
    info.version = nvml.nvmlGpuFabricInfo_v2
    nvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info))
    return int(info.state)


# NVML's cumulative clock-event counters (ns), as `nvidia-smi -q` shows them
# under "Clocks Event Reasons Counters" (a real H200 on 580 answers all five).
CLOCK_EVENT_FIELDS = (("sw_power_cap", "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP"),
                      ("sync_boost", "NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST"),
                      ("sw_thermal", "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN"),
                      ("hw_thermal", "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN"),
                      ("power_brake", "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN"))


def _clock_event_ns(nvml, h):
    """{"t": NVML's timestamp (us), reason: ns, ...}, one call; an unchecked
    ProbeFailure when the binding or the GPU knows none of the counters
    (clock events then cannot be judged by time: said, never silent)."""
    known = [(name, getattr(nvml, const, None)) for name, const in CLOCK_EVENT_FIELDS]
    known = [(name, fid) for name, fid in known if isinstance(fid, int)]
    if not known:  # the five names came together in nvidia-ml-py 12.575; setup.cfg allows 12.535
        return ProbeFailure("nvml", "unchecked", "this nvidia-ml-py names no clock-event counter "
                            "(NVML_FI_DEV_CLOCKS_EVENT_REASON_*, nvidia-ml-py 12.575 and later)")
    values = nvml.nvmlDeviceGetFieldValues(h, [fid for _, fid in known])
    out = {}
    for (name, _), value in zip(known, values):
        if value.nvmlReturn == 0:
            out[name] = int(value.value.ullVal)
            out["t"] = max(out.get("t", 0), int(value.timestamp))
        elif value.nvmlReturn != _NOT_SUPPORTED:
            raise nvml.NVMLError(value.nvmlReturn)
    if "t" not in out:
        return ProbeFailure("nvml", "unchecked", "this GPU or driver counts no clock event "
                            "(NVML_FI_DEV_CLOCKS_EVENT_REASON_*: not supported)")
    return out


def _recovery(nvml, h):
    values = nvml.nvmlDeviceGetFieldValues(h, [nvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
    if values[0].nvmlReturn == _NOT_SUPPORTED:
        return None
    if values[0].nvmlReturn != 0:
        raise nvml.NVMLError(values[0].nvmlReturn)
    return int(values[0].value.uiVal)
