"""The stand-in NVML, proven against the real pynvml (nvidia-ml-py).

Faithfulness is checked by introspection, never against a hand-kept list of
names: every public function SimNvml defines must exist in pynvml with the same
parameters, raise the real error classes, and return what the real wrapper
returns -- the latter by running the real pynvml wrappers over a stub C library
that answers "success" (so no GPU is needed).
"""

import ctypes
import inspect
import json
import subprocess
import sys
import threading

import pynvml
import pytest

from gpugate.vendors.nvidia import nvml_sim as sim
from gpugate.vendors.nvidia.nvml_sim import SimNvml

INIT_FUNCTIONS = ("nvmlInit", "nvmlInitWithFlags")
HANDLE_PARAMS = ("handle", "device")


def sim_functions():
    """Names of the public functions the stand-in defines (introspected)."""
    names = [name for name, value in vars(SimNvml).items()
             if inspect.isfunction(value) and not name.startswith("_")]
    assert names
    return sorted(names)


def required_params(fn):
    return [p for p in inspect.signature(fn).parameters.values() if p.default is p.empty]


def is_device_function(name):
    params = list(inspect.signature(getattr(SimNvml, name)).parameters)[1:]  # drop self
    return name == "nvmlDeviceGetHandleByIndex" or (params and params[0] in HANDLE_PARAMS)


def arguments(fn, handle):
    """Arguments for the required parameters of fn, chosen by parameter name.

    An unknown parameter name fails here on purpose: a new function needs a look.
    """
    values = {
        "index": lambda: 0,
        "flags": lambda: 0,
        "handle": lambda: handle,
        "device": lambda: handle,
        "errorType": lambda: pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        "counterType": lambda: pynvml.NVML_VOLATILE_ECC,
        "link": lambda: 0,
        "fieldIds": lambda: [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION],
        "gpuFabricInfo": lambda: ctypes.byref(pynvml.c_nvmlGpuFabricInfoV_t()),
        "perfPolicyType": lambda: pynvml.NVML_PERF_POLICY_POWER,
    }
    return [values[p.name]() for p in required_params(fn)]


def gpu_state(index=0, **changes):
    gpu = {
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-6a1e0c1e-0000-4000-8000-00000000000%d" % index,
        "serial": "165222000000%d" % index,
        "pci_bus_id": "00000000:%02x:00.0" % (0x18 + 0x20 * index),
        "vbios": "96.00.99.00.01",
        "gsp": "580.65.06",
        "ecc_mode": [1, 1],
        "ecc_uncorrected": {"volatile": 0, "aggregate": 0},
        "retired_pages_pending": None,
        "remapped_rows": [0, 0, 0, 0],
        "nvlink": [1] * 18,
        "pcie": {"gen": 5, "width": 16, "max_gen": 5, "max_width": 16},
        "clock_event_reasons": 0,
        "clock_event_ns": {"sw_power_cap": 0, "sync_boost": 0, "sw_thermal": 0, "hw_thermal": 0, "power_brake": 0},
        "persistence": 1,
        "compute_mode": 0,
        "power_limit_mw": 700000,
        "power_limits_mw": [200000, 700000, 700000],
        "mig": [0, 0],
        "fabric_state": 3,
        "recovery_action": 0,
        "processes": [],
        "lost": False,
        "errors": {},
    }
    gpu.update(changes)
    return gpu


def node_state(gpus=2, **changes):
    state = {
        "init_error": None,
        "hang": None,
        "driver": "580.65.06",
        "cuda": 13000,
        "gpus": [gpu_state(i) for i in range(gpus)],
        "errors": {},
    }
    state.update(changes)
    return state


def started(state):
    nv = sim.load(state)
    nv.nvmlInit()
    return nv


def raises_code(code, fn, *args, **kwargs):
    """Call fn; it must raise exactly the real pynvml class for ``code``."""
    with pytest.raises(pynvml.NVMLError) as info:
        fn(*args, **kwargs)
    assert type(info.value) is pynvml.nvmlExceptionClass(code), info.value
    assert info.value.value == code
    return info.value


def outcome(fn, *args):
    """A call's value, or ("error", code) for an NVMLError."""
    try:
        return fn(*args)
    except pynvml.NVMLError as err:
        assert type(err) is pynvml.nvmlExceptionClass(err.value)
        return ("error", err.value)


@pytest.fixture
def real_library_absent():
    if pynvml.nvmlLib is not None:
        pytest.skip("a real libnvidia-ml is loaded in this process")


@pytest.fixture
def stub_c_library(monkeypatch):
    """Run the real pynvml wrappers over a C library that always answers success.

    Output arguments are left zeroed, so the wrappers return zeros of the real
    types.  The running-processes call reports one process, as a driver would.
    """
    def lookup(name):
        if name.startswith("nvmlDeviceGetComputeRunningProcesses"):
            return processes
        return lambda *args: pynvml.NVML_SUCCESS

    def processes(handle, count, infos):
        count._obj.value = 1
        if infos is None:
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        return pynvml.NVML_SUCCESS

    monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer", lookup)
    monkeypatch.setattr(pynvml, "_LoadNvmlLibrary", lambda: None)
    monkeypatch.setattr(pynvml, "_nvmlLib_refcount", 0)


# -- faithfulness: names and signatures -------------------------------------------


def test_stand_in_covers_the_calls_the_probes_use():
    # A floor, not the list the faithfulness tests run over.
    wanted = {
        "nvmlInit", "nvmlInitWithFlags", "nvmlShutdown", "nvmlSystemGetDriverVersion",
        "nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2",
        "nvmlSystemGetNVMLVersion", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetSerial", "nvmlDeviceGetPciInfo",
        "nvmlDeviceGetIndex", "nvmlDeviceGetVbiosVersion", "nvmlDeviceGetGspFirmwareVersion",
        "nvmlDeviceGetGspFirmwareMode", "nvmlDeviceGetEccMode", "nvmlDeviceGetTotalEccErrors",
        "nvmlDeviceGetRetiredPagesPendingStatus", "nvmlDeviceGetRemappedRows",
        "nvmlDeviceGetNvLinkState", "nvmlDeviceGetCurrPcieLinkGeneration",
        "nvmlDeviceGetCurrPcieLinkWidth", "nvmlDeviceGetMaxPcieLinkGeneration",
        "nvmlDeviceGetMaxPcieLinkWidth", "nvmlDeviceGetCurrentClocksEventReasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons", "nvmlDeviceGetPersistenceMode",
        "nvmlDeviceGetMigMode", "nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetFieldValues",
        "nvmlDeviceGetComputeRunningProcesses",
    }
    assert wanted <= set(sim_functions())


def same_default(ours, theirs):
    if ours == theirs:
        return True
    # ctypes output-buffer defaults (c_uint() in nvmlDeviceGetGspFirmwareMode) do
    # not compare equal even to themselves: compare their type and value instead.
    return (isinstance(theirs, ctypes._SimpleCData) and type(ours) is type(theirs)
            and ours.value == theirs.value)


@pytest.mark.parametrize("name", sim_functions())
def test_signature_matches_real_pynvml(name):
    real = getattr(pynvml, name, None)
    assert inspect.isfunction(real), "pynvml has no function %s" % name
    ours = list(inspect.signature(getattr(sim.load({}), name)).parameters.values())
    theirs = list(inspect.signature(real).parameters.values())
    assert [(p.name, p.kind) for p in ours] == [(p.name, p.kind) for p in theirs]
    for mine, real_param in zip(ours, theirs):
        assert same_default(mine.default, real_param.default), (name, mine.name)


def test_constants_are_the_real_objects():
    nv = sim.load({})
    own = set(sim_functions())
    copied = [n for n in dir(nv) if not n.startswith("_") and n not in own]
    assert len(copied) > 1000
    for name in copied:
        assert getattr(nv, name) is getattr(pynvml, name), name
    for name in ("NVMLError", "NVMLError_GpuIsLost", "NVMLError_LibRmVersionMismatch",
                 "NVMLError_NotSupported", "NVML_SUCCESS", "NVML_ERROR_NOT_SUPPORTED",
                 "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC", "NVML_AGGREGATE_ECC",
                 "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", "NVML_GPU_FABRIC_STATE_COMPLETED",
                 "nvmlGpuFabricInfo_v2", "c_nvmlGpuFabricInfoV_t", "NVML_NVLINK_MAX_LINKS",
                 "NVML_FEATURE_ENABLED", "NVML_FEATURE_DISABLED", "nvmlClocksEventReasonHwSlowdown",
                 "nvmlClocksThrottleReasonHwThermalSlowdown", "c_nvmlFieldValue_t"):
        assert getattr(nv, name) is getattr(pynvml, name)


def test_no_real_pynvml_function_is_exposed():
    # A call the stand-in lacks must be an AttributeError, not the real library.
    nv = sim.load({})
    for name in dir(nv):
        if inspect.isfunction(getattr(pynvml, name, None)):
            assert name in sim_functions(), name
    with pytest.raises(AttributeError):
        nv.nvmlDeviceGetTemperature


# -- faithfulness: errors ---------------------------------------------------------


@pytest.mark.parametrize("name", [n for n in sim_functions() if n not in INIT_FUNCTIONS])
def test_calls_before_init_raise_uninitialized_like_the_real_module(name, real_library_absent):
    nv = sim.load(node_state())
    fn = getattr(nv, name)
    raises_code(pynvml.NVML_ERROR_UNINITIALIZED, fn, *arguments(fn, object()))
    # The real pynvml, with no library loaded, says the same.
    real = getattr(pynvml, name)
    raises_code(pynvml.NVML_ERROR_UNINITIALIZED, real, *arguments(real, pynvml.c_nvmlDevice_t()))


def test_init_without_a_library_matches_the_real_module(real_library_absent):
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        real_class = type(err)
    else:
        pynvml.nvmlShutdown()
        pytest.skip("a real libnvidia-ml is installed")
    nv = sim.load(node_state(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    with pytest.raises(pynvml.NVMLError) as info:
        nv.nvmlInit()
    assert type(info.value) is real_class


@pytest.mark.parametrize("code", [3, 9, 15, 16, 18, 999])
@pytest.mark.parametrize("name", [n for n in sim_functions() if n not in INIT_FUNCTIONS])
def test_injected_errors_are_the_real_classes(name, code):
    state = node_state()
    where = state["gpus"][0] if is_device_function(name) else state
    where["errors"] = {name: code}
    nv = started(state)
    handle = nv.nvmlDeviceGetHandleByIndex(0) if name != "nvmlDeviceGetHandleByIndex" else None
    fn = getattr(nv, name)
    err = raises_code(code, fn, *arguments(fn, handle))
    assert isinstance(err, pynvml.NVMLError)


@pytest.mark.parametrize("code, cls", [
    (9, pynvml.NVMLError_DriverNotLoaded),
    (12, pynvml.NVMLError_LibraryNotFound),
    (18, pynvml.NVMLError_LibRmVersionMismatch),
])
@pytest.mark.parametrize("init", INIT_FUNCTIONS)
def test_init_error(code, cls, init):
    nv = sim.load(node_state(init_error=code))
    fn = getattr(nv, init)
    with pytest.raises(cls):
        fn(*arguments(fn, None))
    # Still not initialised afterwards.
    raises_code(pynvml.NVML_ERROR_UNINITIALIZED, nv.nvmlDeviceGetCount)


def test_version_mismatch_reads_as_the_real_message():
    nv = sim.load(node_state(init_error=18))
    with pytest.raises(pynvml.NVMLError_LibRmVersionMismatch) as info:
        nv.nvmlInit()
    assert "mismatch" in str(info.value)


def test_shutdown_balances_init():
    nv = started(node_state())
    nv.nvmlInit()
    nv.nvmlShutdown()
    assert nv.nvmlDeviceGetCount() == 2
    nv.nvmlShutdown()
    raises_code(pynvml.NVML_ERROR_UNINITIALIZED, nv.nvmlDeviceGetCount)
    raises_code(pynvml.NVML_ERROR_UNINITIALIZED, nv.nvmlShutdown)


# -- faithfulness: return types ---------------------------------------------------


def shape(value):
    """What a caller can rely on: types, lengths, field types -- not values."""
    if isinstance(value, ctypes.Array):
        return ("array", value._type_, len(value))
    if isinstance(value, (list, tuple)):
        return (type(value), [shape(v) for v in value])
    if isinstance(value, pynvml.nvmlFriendlyObject):
        return (type(value), {k: type(v) for k, v in vars(value).items()})
    if isinstance(value, ctypes.Structure):
        return (type(value), {f[0]: type(getattr(value, f[0])) for f in value._fields_})
    return type(value)


@pytest.mark.parametrize("name", sim_functions())
def test_return_types_match_the_real_wrappers(name, stub_c_library):
    real = getattr(pynvml, name)
    real_value = real(*arguments(real, pynvml.c_nvmlDevice_t()))

    state = node_state(gpus=1)
    state["gpus"][0].update(processes=[4242],  # the stub library reports one process too
                            retired_pages_pending=0)
    nv = started(state)
    ours = getattr(nv, name)
    our_value = ours(*arguments(ours, nv.nvmlDeviceGetHandleByIndex(0)))

    if name == "nvmlDeviceGetHandleByIndex":
        # The one deliberate difference: handles are opaque, ours are not pointers.
        assert isinstance(real_value, pynvml.c_nvmlDevice_t)
        assert type(our_value).__name__ == "_Handle"
    else:
        assert shape(our_value) == shape(real_value)


def test_documented_return_types():
    nv = started(node_state())
    h = nv.nvmlDeviceGetHandleByIndex(0)
    for fn in (nv.nvmlDeviceGetName, nv.nvmlDeviceGetUUID, nv.nvmlDeviceGetSerial,
               nv.nvmlDeviceGetVbiosVersion):
        assert type(fn(h)) is str
    assert type(nv.nvmlSystemGetDriverVersion()) is str
    assert nv.nvmlDeviceGetGspFirmwareVersion(h) == b"580.65.06"
    assert nv.nvmlDeviceGetRemappedRows(h) == (0, 0, 0, 0)
    assert nv.nvmlDeviceGetEccMode(h) == [1, 1]
    assert nv.nvmlDeviceGetMigMode(h) == [0, 0]
    assert nv.nvmlSystemGetCudaDriverVersion_v2() == 13000
    pci = nv.nvmlDeviceGetPciInfo(h)
    assert type(pci) is pynvml.nvmlPciInfo_t
    assert pci.busId == "00000000:18:00.0" and type(pci.busId) is str
    values = nv.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
    assert isinstance(values[0], pynvml.c_nvmlFieldValue_t)


# -- behaviour: every state key ---------------------------------------------------


def gpu0(nv):
    return nv.nvmlDeviceGetHandleByIndex(0)


NS = ("error", pynvml.NVML_ERROR_NOT_SUPPORTED)

# (gpu key or top-level key, new value, call, result before, result after)
KEY_CASES = [
    ("driver", "570.86.15", lambda nv: nv.nvmlSystemGetDriverVersion(), "580.65.06", "570.86.15"),
    ("cuda", 12080, lambda nv: nv.nvmlSystemGetCudaDriverVersion_v2(), 13000, 12080),
    ("cuda", 12080, lambda nv: nv.nvmlSystemGetCudaDriverVersion(), 13000, 12080),
    ("cuda", 12080, lambda nv: nv.nvmlSystemGetNVMLVersion(), "13.580.65.06", "12.580.65.06"),
    ("nvml_version", "12.999", lambda nv: nv.nvmlSystemGetNVMLVersion(), "13.580.65.06", "12.999"),
    ("gpus", [gpu_state(0)] * 8, lambda nv: nv.nvmlDeviceGetCount(), 2, 8),
    ("gpu.name", "NVIDIA A100-SXM4-80GB", lambda nv: nv.nvmlDeviceGetName(gpu0(nv)),
     "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"),
    ("gpu.uuid", "GPU-x", lambda nv: nv.nvmlDeviceGetUUID(gpu0(nv)),
     "GPU-6a1e0c1e-0000-4000-8000-000000000000", "GPU-x"),
    ("gpu.serial", "999", lambda nv: nv.nvmlDeviceGetSerial(gpu0(nv)), "1652220000000", "999"),
    ("gpu.pci_bus_id", "0000:b5:00.0", lambda nv: nv.nvmlDeviceGetPciInfo(gpu0(nv)).busId,
     "00000000:18:00.0", "00000000:B5:00.0"),
    ("gpu.vbios", "96.00.AB.00.01", lambda nv: nv.nvmlDeviceGetVbiosVersion(gpu0(nv)),
     "96.00.99.00.01", "96.00.AB.00.01"),
    ("gpu.gsp", None, lambda nv: nv.nvmlDeviceGetGspFirmwareVersion(gpu0(nv)), b"580.65.06", NS),
    ("gpu.gsp", None, lambda nv: nv.nvmlDeviceGetGspFirmwareMode(gpu0(nv)), [1, 1], [0, 0]),
    ("gpu.ecc_mode", [0, 1], lambda nv: nv.nvmlDeviceGetEccMode(gpu0(nv)), [1, 1], [0, 1]),
    ("gpu.ecc_mode", None, lambda nv: nv.nvmlDeviceGetEccMode(gpu0(nv)), [1, 1], NS),
    ("gpu.ecc_mode", [0, 0], lambda nv: nv.nvmlDeviceGetTotalEccErrors(
        gpu0(nv), pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC), 0, NS),
    ("gpu.ecc_uncorrected", {"volatile": 2, "aggregate": 7}, lambda nv: [
        nv.nvmlDeviceGetTotalEccErrors(gpu0(nv), pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, counter)
        for counter in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC)], [0, 0], [2, 7]),
    ("gpu.ecc_corrected", {"volatile": 5, "aggregate": 9}, lambda nv: nv.nvmlDeviceGetTotalEccErrors(
        gpu0(nv), pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC), 0, 9),
    ("gpu.retired_pages_pending", 1,
     lambda nv: nv.nvmlDeviceGetRetiredPagesPendingStatus(gpu0(nv)), NS, 1),
    ("gpu.remapped_rows", [1, 2, 1, 0], lambda nv: nv.nvmlDeviceGetRemappedRows(gpu0(nv)),
     (0, 0, 0, 0), (1, 2, 1, 0)),
    ("gpu.remapped_rows", None, lambda nv: nv.nvmlDeviceGetRemappedRows(gpu0(nv)), (0, 0, 0, 0), NS),
    ("gpu.nvlink", [1, 0, 1], lambda nv: [nv.nvmlDeviceGetNvLinkState(gpu0(nv), link)
                                         for link in range(3)], [1, 1, 1], [1, 0, 1]),
    ("gpu.nvlink", [], lambda nv: nv.nvmlDeviceGetNvLinkState(gpu0(nv), 0), 1, NS),
    ("gpu.nvlink", [1, 1], lambda nv: nv.nvmlDeviceGetNvLinkState(gpu0(nv), 2),
     1, ("error", pynvml.NVML_ERROR_INVALID_ARGUMENT)),
    ("gpu.pcie", {"gen": 3, "width": 8, "max_gen": 5, "max_width": 16}, lambda nv: [
        f(gpu0(nv)) for f in (nv.nvmlDeviceGetCurrPcieLinkGeneration, nv.nvmlDeviceGetCurrPcieLinkWidth,
                              nv.nvmlDeviceGetMaxPcieLinkGeneration, nv.nvmlDeviceGetMaxPcieLinkWidth)],
     [5, 16, 5, 16], [3, 8, 5, 16]),
    ("gpu.clock_event_reasons", 0x48, lambda nv: nv.nvmlDeviceGetCurrentClocksEventReasons(gpu0(nv)),
     0, 0x48),
    ("gpu.clock_event_reasons", 0x80,
     lambda nv: nv.nvmlDeviceGetCurrentClocksThrottleReasons(gpu0(nv)), 0, 0x80),
    ("gpu.persistence", 0, lambda nv: nv.nvmlDeviceGetPersistenceMode(gpu0(nv)), 1, 0),
    ("gpu.mig", [0, 1], lambda nv: nv.nvmlDeviceGetMigMode(gpu0(nv)), [0, 0], [0, 1]),
    ("gpu.mig", None, lambda nv: nv.nvmlDeviceGetMigMode(gpu0(nv)), [0, 0], NS),
    ("gpu.fabric_state", 1, lambda nv: fabric_state(nv), 3, 1),
    ("gpu.fabric_state", None, lambda nv: fabric_state(nv), 3, NS),
    ("gpu.recovery_action", 2, lambda nv: recovery(nv), (pynvml.NVML_SUCCESS, 0),
     (pynvml.NVML_SUCCESS, 2)),
    ("gpu.recovery_action", None, lambda nv: recovery(nv), (pynvml.NVML_SUCCESS, 0),
     (pynvml.NVML_ERROR_NOT_SUPPORTED, 0)),
    ("gpu.processes", [1234, {"pid": 99, "used_gpu_memory": 4096}],
     lambda nv: [(p.pid, p.usedGpuMemory) for p in nv.nvmlDeviceGetComputeRunningProcesses(gpu0(nv))],
     [], [(1234, 0), (99, 4096)]),
    ("gpu.errors", {"nvmlDeviceGetVbiosVersion": 3}, lambda nv: nv.nvmlDeviceGetVbiosVersion(gpu0(nv)),
     "96.00.99.00.01", NS),
    ("errors", {"nvmlSystemGetDriverVersion": 999}, lambda nv: nv.nvmlSystemGetDriverVersion(),
     "580.65.06", ("error", 999)),
]


def fabric_state(nv):
    info = pynvml.c_nvmlGpuFabricInfoV_t()
    assert nv.nvmlDeviceGetGpuFabricInfoV(gpu0(nv), ctypes.byref(info)) == pynvml.NVML_SUCCESS
    return info.state


def recovery(nv):
    value = nv.nvmlDeviceGetFieldValues(gpu0(nv), [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])[0]
    return (value.nvmlReturn, value.value.uiVal)


@pytest.mark.parametrize("key, value, call, before, after", KEY_CASES,
                         ids=["%s=%s" % (c[0], c[1]) for c in KEY_CASES])
def test_each_state_key_changes_what_nvml_says(key, value, call, before, after):
    state = node_state()
    assert outcome(call, started(state)) == before
    if key.startswith("gpu."):
        state["gpus"][0][key[4:]] = value
    else:
        state[key] = value
    assert outcome(call, started(state)) == after


def test_state_is_read_live():
    state = node_state()
    nv = started(state)
    h = gpu0(nv)
    assert nv.nvmlDeviceGetPersistenceMode(h) == 1
    state["gpus"][0]["lost"] = True
    raises_code(pynvml.NVML_ERROR_GPU_IS_LOST, nv.nvmlDeviceGetPersistenceMode, h)


def test_absent_keys_read_as_not_supported():
    nv = started({"gpus": [{}]})
    h = gpu0(nv)
    raises_code(pynvml.NVML_ERROR_NOT_SUPPORTED, nv.nvmlDeviceGetName, h)
    raises_code(pynvml.NVML_ERROR_NOT_SUPPORTED, nv.nvmlDeviceGetCurrPcieLinkWidth, h)
    raises_code(pynvml.NVML_ERROR_NOT_SUPPORTED, nv.nvmlSystemGetDriverVersion)
    assert nv.nvmlDeviceGetComputeRunningProcesses(h) == []


def test_lost_gpu():
    state = node_state()
    state["gpus"][0]["retired_pages_pending"] = 0  # so every call succeeds on GPU 0
    state["gpus"][1]["lost"] = True
    nv = started(state)
    assert nv.nvmlDeviceGetCount() == 2
    lost = nv.nvmlDeviceGetHandleByIndex(1)  # still works on a real node
    for name in sim_functions():
        if is_device_function(name) and name != "nvmlDeviceGetHandleByIndex":
            fn = getattr(nv, name)
            raises_code(pynvml.NVML_ERROR_GPU_IS_LOST, fn, *arguments(fn, lost))
            fn(*arguments(fn, gpu0(nv)))  # the other GPU is fine


def test_gpu_error_injection_is_per_gpu_and_top_level_applies_to_all():
    state = node_state()
    state["gpus"][1]["errors"] = {"nvmlDeviceGetSerial": 14}
    nv = started(state)
    assert nv.nvmlDeviceGetSerial(gpu0(nv)) == "1652220000000"
    raises_code(14, nv.nvmlDeviceGetSerial, nv.nvmlDeviceGetHandleByIndex(1))
    state["errors"] = {"nvmlDeviceGetSerial": 16}
    raises_code(16, nv.nvmlDeviceGetSerial, gpu0(nv))
    raises_code(14, nv.nvmlDeviceGetSerial, nv.nvmlDeviceGetHandleByIndex(1))  # GPU's own wins


# -- handles and arguments --------------------------------------------------------


@pytest.mark.parametrize("index", [2, 99, -1])
def test_out_of_range_index(index):
    raises_code(pynvml.NVML_ERROR_INVALID_ARGUMENT, started(node_state()).nvmlDeviceGetHandleByIndex, index)


def test_foreign_handles_are_invalid_arguments():
    nv, other = started(node_state()), started(node_state())
    for handle in (gpu0(other), pynvml.c_nvmlDevice_t(), None, 0):
        raises_code(pynvml.NVML_ERROR_INVALID_ARGUMENT, nv.nvmlDeviceGetName, handle)
    assert nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetHandleByIndex(1)) == 1


def test_pci_info_fields():
    state = node_state()
    state["gpus"][0].update(pci_bus_id="00000001:b5:1f.0", pci_device_id=0x233010DE)
    nv = started(state)
    pci = nv.nvmlDeviceGetPciInfo(gpu0(nv))
    assert (pci.busId, pci.busIdLegacy) == ("00000001:B5:1F.0", "0001:B5:1F.0")
    assert (pci.domain, pci.bus, pci.device, pci.pciDeviceId) == (1, 0xB5, 0x1F, 0x233010DE)


def test_fabric_info_accepts_byref_and_pointer_not_a_bare_struct():
    nv = started(node_state())
    info = pynvml.c_nvmlGpuFabricInfoV_t()
    nv.nvmlDeviceGetGpuFabricInfoV(gpu0(nv), ctypes.pointer(info))
    assert (info.state, info.status) == (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_SUCCESS)
    # ctypes would pass a bare struct to C by value: the driver could not fill it.
    with pytest.raises(TypeError, match="byref"):
        nv.nvmlDeviceGetGpuFabricInfoV(gpu0(nv), pynvml.c_nvmlGpuFabricInfoV_t())
    v3 = pynvml.c_nvmlGpuFabricInfo_v3_t()
    nv.nvmlDeviceGetGpuFabricInfoV(gpu0(nv), ctypes.byref(v3))
    assert v3.state == 3
    unversioned = pynvml.c_nvmlGpuFabricInfoV_t()
    unversioned.version = 0
    raises_code(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
                nv.nvmlDeviceGetGpuFabricInfoV, gpu0(nv), ctypes.byref(unversioned))


def test_field_values_with_scopes_and_unknown_fields():
    state = node_state()
    state["gpus"][0]["recovery_action"] = pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT
    nv = started(state)
    values = nv.nvmlDeviceGetFieldValues(
        gpu0(nv), [(pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, 0), pynvml.NVML_FI_DEV_ECC_CURRENT])
    assert isinstance(values, ctypes.Array) and len(values) == 2
    assert (values[0].fieldId, values[0].nvmlReturn, values[0].value.uiVal) == (
        pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, pynvml.NVML_SUCCESS, 2)
    assert values[0].valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert values[1].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_gsp_calls_with_caller_buffers():
    nv = started(node_state())
    buf = ctypes.create_string_buffer(pynvml.NVML_GSP_FIRMWARE_VERSION_BUF_SIZE)
    assert nv.nvmlDeviceGetGspFirmwareVersion(gpu0(nv), buf) == pynvml.NVML_SUCCESS
    assert buf.value == b"580.65.06"
    enabled, default = ctypes.c_uint(9), ctypes.c_uint(9)
    assert nv.nvmlDeviceGetGspFirmwareMode(
        gpu0(nv), ctypes.byref(enabled), ctypes.byref(default)) == pynvml.NVML_SUCCESS
    assert (enabled.value, default.value) == (1, 1)


# -- hangs ------------------------------------------------------------------------


def finishes_within(fn, seconds=0.5):
    thread = threading.Thread(target=fn, daemon=True)  # a hung one dies with pytest
    thread.start()
    thread.join(seconds)
    return not thread.is_alive()


@pytest.mark.parametrize("init", INIT_FUNCTIONS)
def test_hang_in_init(init):
    nv = sim.load(node_state(hang="init"))
    fn = getattr(nv, init)
    assert not finishes_within(lambda: fn(*arguments(fn, None)))


def test_hang_in_one_function_only():
    nv = started(node_state(hang="nvmlDeviceGetRemappedRows"))
    h = gpu0(nv)
    assert not finishes_within(lambda: nv.nvmlDeviceGetRemappedRows(h))
    assert finishes_within(lambda: nv.nvmlDeviceGetName(h))


def test_hang_on_one_gpu():
    state = node_state()
    state["gpus"][1]["hang"] = "nvmlDeviceGetUUID"
    nv = started(state)
    assert finishes_within(lambda: nv.nvmlDeviceGetUUID(gpu0(nv)))
    assert not finishes_within(lambda: nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(1)))


# -- loading ----------------------------------------------------------------------


def test_load_file(tmp_path):
    path = tmp_path / "model.json"
    path.write_text(json.dumps({"node": "gpu017", "nvml": node_state(gpus=3)}))
    nv = sim.load_file(str(path))
    nv.nvmlInit()
    assert nv.nvmlDeviceGetCount() == 3
    path.write_text(json.dumps({"node": "gpu017"}))
    with pytest.raises(ValueError, match="nvml"):
        sim.load_file(path)


def test_import_is_light():
    # Probes load a node per short-lived process: nothing beyond what pynvml loads.
    code = ("import sys, json; import pynvml; before = set(sys.modules); "
            "import gpugate.vendors.nvidia.nvml_sim; print(json.dumps(sorted(set(sys.modules) - before)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    # The stand-in's own two modules (the surface and its state/rules) and the
    # JSON reader of the prolog's files (no json package: re and enum) with its
    # lazily compiled patterns (lazyre imports nothing), nothing else.
    # The packages on the way are docstrings only.
    assert json.loads(out.stdout) == ["gpugate", "gpugate.core", "gpugate.core.jsontext", "gpugate.core.lazyre",
                                      "gpugate.vendors", "gpugate.vendors.nvidia",
                                      "gpugate.vendors.nvidia.nvml_sim", "gpugate.vendors.nvidia.nvml_sim_state"]


def test_runtime_settings_read_as_the_real_calls_return_them():
    state = node_state()
    state["gpus"][0].update(compute_mode=pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS, power_limit_mw=500000,
                            ecc_mode=[1, 0], mig=[0, 1])
    nv = started(state)
    h = gpu0(nv)
    assert nv.nvmlDeviceGetComputeMode(h) == nv.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS == 3
    assert nv.nvmlDeviceGetPowerManagementLimit(h) == 500000  # milliwatts
    assert nv.nvmlDeviceGetEnforcedPowerLimit(h) == 500000
    assert nv.nvmlDeviceGetPowerManagementLimitConstraints(h) == [200000, 700000]
    assert nv.nvmlDeviceGetPowerManagementDefaultLimit(h) == 700000
    assert nv.nvmlDeviceGetEccMode(h) == [1, 0] and nv.nvmlDeviceGetMigMode(h) == [0, 1]  # [current, pending]
    state["gpus"][0]["enforced_power_limit_mw"] = 450000  # an out-of-band cap
    assert nv.nvmlDeviceGetEnforcedPowerLimit(h) == 450000
    # A GPU without the feature says NotSupported, as the real driver does.
    state["gpus"][1].update(compute_mode=None, power_limit_mw=None, power_limits_mw=None)
    other = nv.nvmlDeviceGetHandleByIndex(1)
    for fn in (nv.nvmlDeviceGetComputeMode, nv.nvmlDeviceGetPowerManagementLimit,
               nv.nvmlDeviceGetEnforcedPowerLimit, nv.nvmlDeviceGetPowerManagementLimitConstraints):
        raises_code(pynvml.NVML_ERROR_NOT_SUPPORTED, fn, other)
