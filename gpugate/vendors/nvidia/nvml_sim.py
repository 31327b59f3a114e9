"""Stand-in for the ``pynvml`` module (nvidia-ml-py) on a simulated node.

A simulated node replaces NVML and nothing above it: probes call the object
returned by ``load()`` exactly as they would call ``pynvml``.  Function names,
parameter names, defaults and return types are those of the real module (a test
checks them against it), errors are the real ``pynvml.NVMLError`` subclasses
(built with ``pynvml.NVMLError(code)``), and the constants, error classes and
ctypes structs are the real module's own objects, copied by reference.

    nvml = load(state)              # or load_file("fleet/gpu017/model.json")
    nvml.nvmlInit()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlDeviceGetName(h)       # "NVIDIA H100 80GB HBM3"

The state it reads, and the rules every call follows, are described in
gpugate.vendors.nvidia.nvml_sim_state.

Calling conventions that work with both this and the real pynvml: pass output
structs with ``ctypes.byref()`` (nvmlDeviceGetGpuFabricInfoV); PCI ``busId`` reads
as str; field values come back as a ctypes array of ``c_nvmlFieldValue_t`` whose
``nvmlReturn`` must be checked per field.

The state dict is read on every call, not copied, so a test may change it
between calls (e.g. set ``"lost": True`` mid-run).

Imports stay small (json/os/time, ctypes, which pynvml loads anyway, and pynvml)
so loading a node in a short-lived probe process is cheap.
"""

import ctypes
import os
import time

import pynvml as _real

from gpugate.core import jsontext
from gpugate.vendors.nvidia.nvml_sim_state import StateAccess, _error, _Handle, _hang, _not_supported, _pci_bus_id, _target

NVMLError = _real.NVMLError

# The GpuFabricInfoV struct versions a 580 driver accepts, and their struct types.
_FABRIC_STRUCTS = {_real.nvmlGpuFabricInfo_v2: _real.c_nvmlGpuFabricInfo_v2_t}
if hasattr(_real, "c_nvmlGpuFabricInfo_v3_t"):
    _FABRIC_STRUCTS[_real.nvmlGpuFabricInfo_v3] = _real.c_nvmlGpuFabricInfo_v3_t

_INIT_NAMES = ("init", "nvmlInit", "nvmlInitWithFlags")


def load(state):
    """A pynvml-like object driven by ``state`` (see the module docstring)."""
    return SimNvml(state)


def load_file(path):
    """Load the "nvml" part of a simulated node's model file (JSON)."""
    with open(os.fspath(path), encoding="utf-8") as f:
        model = jsontext.loads(f.read())
    if not isinstance(model, dict) or not isinstance(model.get("nvml"), dict):
        raise ValueError("%s: no \"nvml\" object at the top level" % path)
    return SimNvml(model["nvml"])


class SimNvml(StateAccess):
    """The stand-in itself: attributes are pynvml's functions and constants."""

    def __repr__(self):
        return "<simulated pynvml, %d GPU(s)>" % len(self._gpus())

    def __getattr__(self, name):  # only what the class does not define
        if name.startswith(_CLOCK_PREFIX) and _older(self._state.get("binding"), (12, 575)):
            # nvidia-ml-py named these field ids first in 12.575 (setup.cfg allows 12.535).
            raise AttributeError("simulated nvidia-ml-py %s has no %r" % (self._state["binding"], name))
        return _constant(name)

    def __dir__(self):
        names = set(super().__dir__())
        return sorted(names | {n for n in dir(_real) if not n.startswith("_")
                               and isinstance(getattr(_real, n), _CONSTANT_TYPES)})

    # -- init -------------------------------------------------------------------

    def nvmlInit(self):
        self.nvmlInitWithFlags(0)  # as in pynvml
        return None

    def nvmlInitWithFlags(self, flags):
        if self._state.get("hang") in _INIT_NAMES:
            _hang()
        code = self._state.get("init_error")
        if code is not None:
            raise _error(code)
        self._refcount += 1
        return None

    def nvmlShutdown(self):
        self._system("nvmlShutdown")
        self._refcount -= 1
        return None

    # -- system -----------------------------------------------------------------

    def nvmlSystemGetDriverVersion(self):
        return str(self._get(self._system("nvmlSystemGetDriverVersion"), "driver"))

    def nvmlSystemGetCudaDriverVersion(self):
        return int(self._get(self._system("nvmlSystemGetCudaDriverVersion"), "cuda"))

    def nvmlSystemGetCudaDriverVersion_v2(self):
        return int(self._get(self._system("nvmlSystemGetCudaDriverVersion_v2"), "cuda"))

    def nvmlSystemGetNVMLVersion(self):
        state = self._system("nvmlSystemGetNVMLVersion")
        if state.get("nvml_version"):
            return str(state["nvml_version"])
        cuda = int(self._get(state, "cuda"))
        return "%d.%s" % (cuda // 1000, self._get(state, "driver"))

    def nvmlDeviceGetCount(self):
        self._system("nvmlDeviceGetCount")
        return len(self._gpus())

    def nvmlDeviceGetHandleByIndex(self, index):
        self._check_init()
        # Through c_uint() as in pynvml: a str is a TypeError, -1 wraps out of range.
        index = ctypes.c_uint(index).value
        self._gpu_at("nvmlDeviceGetHandleByIndex", index, lost_ok=True)
        return _Handle(self, index)

    # -- identity ---------------------------------------------------------------

    def nvmlDeviceGetName(self, handle):
        return str(self._get(self._gpu("nvmlDeviceGetName", handle), "name"))

    def nvmlDeviceGetUUID(self, handle):
        return str(self._get(self._gpu("nvmlDeviceGetUUID", handle), "uuid"))

    def nvmlDeviceGetSerial(self, handle):
        return str(self._get(self._gpu("nvmlDeviceGetSerial", handle), "serial"))

    def nvmlDeviceGetIndex(self, handle):
        self._gpu("nvmlDeviceGetIndex", handle)
        return handle.index

    def nvmlDeviceGetPciInfo(self, handle):
        gpu = self._gpu("nvmlDeviceGetPciInfo", handle)
        domain, bus, device = _pci_bus_id(self._get(gpu, "pci_bus_id"))
        # The struct the real call returns; its busId reads back as str.
        info = _real.nvmlPciInfo_t()
        info.busIdLegacy = _real.NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT % (domain, bus, device)
        info.busId = _real.NVML_DEVICE_PCI_BUS_ID_FMT % (domain, bus, device)
        info.domain, info.bus, info.device = domain, bus, device
        info.pciDeviceId = int(gpu.get("pci_device_id") or 0)
        info.pciSubSystemId = int(gpu.get("pci_subsystem_id") or 0)
        return info

    def nvmlDeviceGetVbiosVersion(self, handle):
        return str(self._get(self._gpu("nvmlDeviceGetVbiosVersion", handle), "vbios"))

    def nvmlDeviceGetGspFirmwareVersion(self, handle, version=None):
        gsp = self._get(self._gpu("nvmlDeviceGetGspFirmwareVersion", handle), "gsp")
        if version is None:
            return str(gsp).encode()  # the real one returns the raw buffer: bytes
        version.value = str(gsp).encode()  # a caller-supplied c_char array
        return _real.NVML_SUCCESS

    # Defaults: like the real ones, c_uint() objects, used only to choose the
    # calling convention (never written to here).
    def nvmlDeviceGetGspFirmwareMode(self, handle, isEnabled=ctypes.c_uint(), defaultMode=ctypes.c_uint()):
        gpu = self._gpu("nvmlDeviceGetGspFirmwareMode", handle)
        enabled = 1 if gpu.get("gsp") else 0
        if type(isEnabled) is not ctypes.c_uint:  # the real test for "caller passed byref()s"
            _target(isEnabled, "isEnabled").value = enabled
            _target(defaultMode, "defaultMode").value = enabled
            return _real.NVML_SUCCESS
        return [enabled, enabled]

    # -- memory -----------------------------------------------------------------

    def nvmlDeviceGetEccMode(self, handle):
        current, pending = self._get(self._gpu("nvmlDeviceGetEccMode", handle), "ecc_mode")
        return [int(current), int(pending)]

    def nvmlDeviceGetTotalEccErrors(self, handle, errorType, counterType):
        gpu = self._gpu("nvmlDeviceGetTotalEccErrors", handle)
        keys = {_real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED: "ecc_uncorrected",
                _real.NVML_MEMORY_ERROR_TYPE_CORRECTED: "ecc_corrected"}
        counters = {_real.NVML_VOLATILE_ECC: "volatile", _real.NVML_AGGREGATE_ECC: "aggregate"}
        if errorType not in keys or counterType not in counters:
            raise _error(_real.NVML_ERROR_INVALID_ARGUMENT)
        # Counters need ECC on: with ECC off (or absent) NVML reports NotSupported.
        if not (gpu.get("ecc_mode") or [0])[0]:
            raise _not_supported()
        if keys[errorType] == "ecc_corrected":
            counts = gpu.get("ecc_corrected") or {}
        else:
            counts = self._get(gpu, "ecc_uncorrected")
        return int(counts.get(counters[counterType]) or 0)

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device):
        return int(self._get(self._gpu("nvmlDeviceGetRetiredPagesPendingStatus", device),
                             "retired_pages_pending"))

    def nvmlDeviceGetRemappedRows(self, device):
        rows = self._get(self._gpu("nvmlDeviceGetRemappedRows", device), "remapped_rows")
        corr, unc, pending, failure = (int(v) for v in rows)
        return (corr, unc, pending, failure)

    # -- links ------------------------------------------------------------------

    def nvmlDeviceGetNvLinkState(self, device, link):
        links = self._gpu("nvmlDeviceGetNvLinkState", device).get("nvlink") or []
        if not links:
            raise _not_supported()
        if not (0 <= link < len(links)):
            raise _error(_real.NVML_ERROR_INVALID_ARGUMENT)
        return int(links[link])

    def _pcie(self, name, handle, key):
        return int(self._get(self._get(self._gpu(name, handle), "pcie"), key))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle):
        return self._pcie("nvmlDeviceGetCurrPcieLinkGeneration", handle, "gen")

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle):
        return self._pcie("nvmlDeviceGetCurrPcieLinkWidth", handle, "width")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle):
        return self._pcie("nvmlDeviceGetMaxPcieLinkGeneration", handle, "max_gen")

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle):
        return self._pcie("nvmlDeviceGetMaxPcieLinkWidth", handle, "max_width")

    def nvmlDeviceGetGpuFabricInfoV(self, device, gpuFabricInfo):
        gpu = self._gpu("nvmlDeviceGetGpuFabricInfoV", device)
        info = _target(gpuFabricInfo, "gpuFabricInfo")
        # The driver reads .version first and refuses a struct it does not know.
        version = getattr(info, "version", None)
        if version not in _FABRIC_STRUCTS:
            raise _error(_real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        if not isinstance(info, _FABRIC_STRUCTS[version]):
            raise TypeError("gpuFabricInfo: .version %#x does not match %s"
                            % (version, type(info).__name__))
        info.state = int(self._get(gpu, "fabric_state"))
        info.status = _real.NVML_SUCCESS
        return _real.NVML_SUCCESS

    # -- clocks, modes, fields, processes ---------------------------------------

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        gpu = self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle)
        return int(self._get(gpu, "clock_event_reasons"))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
        # The deprecated name of the same NVML call.
        gpu = self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        return int(self._get(gpu, "clock_event_reasons"))

    def nvmlDeviceGetPersistenceMode(self, handle):
        return int(self._get(self._gpu("nvmlDeviceGetPersistenceMode", handle), "persistence"))

    # Runtime settings (`nvidia-smi -c`, `-pl`): they do not survive a reset.
    def nvmlDeviceGetComputeMode(self, handle):
        return int(self._get(self._gpu("nvmlDeviceGetComputeMode", handle), "compute_mode"))

    def nvmlDeviceGetPowerManagementLimit(self, handle):
        return int(self._get(self._gpu("nvmlDeviceGetPowerManagementLimit", handle), "power_limit_mw"))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        # The lower of the limit and any out-of-band cap (e.g. the BMC's).
        gpu = self._gpu("nvmlDeviceGetEnforcedPowerLimit", handle)
        return int(gpu.get("enforced_power_limit_mw") or self._get(gpu, "power_limit_mw"))

    def _power_limits(self, name, handle):
        limits = self._get(self._gpu(name, handle), "power_limits_mw")
        return [int(v) for v in limits]  # [min, max, default]

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle):
        return self._power_limits("nvmlDeviceGetPowerManagementLimitConstraints", handle)[:2]

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle):
        return self._power_limits("nvmlDeviceGetPowerManagementDefaultLimit", handle)[2]

    def nvmlDeviceGetMigMode(self, device):
        current, pending = self._get(self._gpu("nvmlDeviceGetMigMode", device), "mig")
        return [int(current), int(pending)]

    def nvmlDeviceGetFieldValues(self, handle, fieldIds):
        gpu = self._gpu("nvmlDeviceGetFieldValues", handle)
        known = {_real.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: gpu.get("recovery_action")}
        counters = {_CLOCK_FIELDS[k]: v for k, v in (gpu.get("clock_event_ns") or {}).items() if k in _CLOCK_FIELDS}
        # The real call succeeds as a whole and reports each field's own status.
        values = (_real.c_nvmlFieldValue_t * len(fieldIds))()
        now_us = self._now_us()
        for slot, field_id in zip(values, fieldIds):
            if isinstance(field_id, (tuple, list)):
                slot.fieldId, slot.scopeId = field_id
            else:
                slot.fieldId = field_id
            slot.timestamp = now_us
            value = known.get(slot.fieldId)
            if slot.fieldId in counters:  # cumulative ns, as NVML keeps them
                slot.nvmlReturn = _real.NVML_SUCCESS
                slot.valueType = _real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                slot.value.ullVal = int(counters[slot.fieldId])
            elif value is None:
                slot.nvmlReturn = _real.NVML_ERROR_NOT_SUPPORTED
            else:
                slot.nvmlReturn = _real.NVML_SUCCESS
                slot.valueType = _real.NVML_VALUE_TYPE_UNSIGNED_INT
                slot.value.uiVal = int(value)
        return values

    def _now_us(self):
        # "clock_offset_s" moves the simulated node's clock on (gpu.N.throttle tests).
        return int((time.time() + float(self._state.get("clock_offset_s") or 0)) * 1e6)

    def nvmlDeviceGetViolationStatus(self, device, perfPolicyType):
        """The older per-policy form of the same counters (c_nvmlViolationTime_t, ns)."""
        gpu = self._gpu("nvmlDeviceGetViolationStatus", device)
        name = {_real.NVML_PERF_POLICY_POWER: "sw_power_cap", _real.NVML_PERF_POLICY_SYNC_BOOST: "sync_boost",
                _real.NVML_PERF_POLICY_THERMAL: "sw_thermal"}.get(int(perfPolicyType))
        value = (gpu.get("clock_event_ns") or {}).get(name)
        if value is None:
            raise _not_supported()
        out = _real.c_nvmlViolationTime_t()
        out.referenceTime, out.violationTime = self._now_us() * 1000, int(value)
        return out

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        gpu = self._gpu("nvmlDeviceGetComputeRunningProcesses", handle)
        procs = []
        for entry in gpu.get("processes") or []:
            if not isinstance(entry, dict):
                entry = {"pid": entry}
            info = _real.c_nvmlProcessInfo_v3_t()
            info.pid = int(entry["pid"])
            info.usedGpuMemory = int(entry.get("used_gpu_memory") or 0)
            # Not in a MIG instance: the real driver reports "not available" here.
            info.gpuInstanceId = info.computeInstanceId = _real.NVML_VALUE_NOT_AVAILABLE_uint.value
            # The same friendly object the real pynvml builds from the struct.
            procs.append(_real.nvmlStructToFriendlyObject(info))
        return procs


# gpu["clock_event_ns"] keys -> the field ids NVML answers them under.
_CLOCK_FIELDS = {"sw_power_cap": _real.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP,
                 "sync_boost": _real.NVML_FI_DEV_CLOCKS_EVENT_REASON_SYNC_BOOST,
                 "sw_thermal": _real.NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN,
                 "hw_thermal": _real.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN,
                 "power_brake": _real.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN}
_CLOCK_PREFIX = "NVML_FI_DEV_CLOCKS_EVENT_REASON_"
_CONSTANT_TYPES = (int, float, str, bytes, tuple, type, ctypes._SimpleCData)


def _older(version, than) -> bool:
    """state["binding"] ("12.535.161": the nvidia-ml-py the node has) is
    older than ``than``; none set: the installed one."""
    try:
        return isinstance(version, str) and tuple(int(x) for x in version.split(".")[:2]) < than
    except ValueError:
        return False


def _constant(name: str):
    """pynvml's constant, error class or ctypes type of that name (the same
    object, not a copy, so ``except sim.NVMLError_GpuIsLost`` and ``except
    pynvml.NVMLError_GpuIsLost`` are one clause), found when first asked
    for: copying all ~2,000 onto the class costs every probe a millisecond.
    pynvml's functions are not given: a function the stand-in lacks must fail
    loudly (AttributeError)."""
    if not name.startswith("_"):
        value = getattr(_real, name, None)
        if isinstance(value, _CONSTANT_TYPES):
            return value
    raise AttributeError("simulated pynvml has no %r" % name)

