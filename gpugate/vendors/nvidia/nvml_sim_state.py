"""The simulated node's NVML state and the rules every stand-in call
follows (gpugate.vendors.nvidia.nvml_sim is the pynvml-compatible surface over it).

State (the "nvml" part of a node's model; JSON types only)::

    {
      "init_error": null | int,     # NVML error code raised by nvmlInit (9 DriverNotLoaded,
                                    #   12 LibraryNotFound, 18 LibRmVersionMismatch, ...)
      "hang": null | "init" | "<function name>",  # that call never returns (a wedged GPU)
      "driver": "580.65.06",
      "cuda": 13000,                # nvmlSystemGetCudaDriverVersion[_v2]: major*1000 + minor*10
      "nvml_version": "13.580.65.06",  # optional; default "<cuda major>.<driver>"
      "gpus": [ {
          "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-...", "serial": "1652...",
          "pci_bus_id": "00000000:18:00.0",   # reported upper-case, 8-digit domain, as NVML does
          "pci_device_id": 0x233010DE,        # optional (also "pci_subsystem_id"), default 0
          "vbios": "96.00.99.00.01",
          "gsp": "580.65.06" | null,          # null: GetGspFirmwareVersion NotSupported, mode [0, 0]
          "ecc_mode": [1, 1] | null,          # [current, pending]
          "ecc_uncorrected": {"volatile": 0, "aggregate": 0},  # NotSupported while ECC is off
          "ecc_corrected": {"volatile": 0, "aggregate": 0},    # optional, default zeros
          "retired_pages_pending": 0 | 1 | null,
          "remapped_rows": [corr, unc, pending, failure] | null,
          "nvlink": [1, 1, ...],              # per link: 1 up, 0 down; [] means no NVLink
          "pcie": {"gen": 5, "width": 16, "max_gen": 5, "max_width": 16},
          "clock_event_reasons": 0,           # bitmask, e.g. 0x8 HW slowdown
          "clock_event_ns": {"hw_thermal": 0, "power_brake": 0, ...} | null,  # cumulative ns per
                                              #   reason (field values 74, 76, 269-271; absent: NotSupported)
          "persistence": 1,
          "compute_mode": 0 | null,           # NVML_COMPUTEMODE_* (0 default, 2 prohibited, 3 exclusive process)
          "power_limit_mw": 700000 | null,    # nvmlDeviceGetPowerManagementLimit (what `nvidia-smi -pl` set)
          "power_limits_mw": [200000, 700000, 700000] | null,  # [min, max, default]
          "enforced_power_limit_mw": null,    # optional: an out-of-band cap below the limit
          "mig": [0, 0] | null,               # [current, pending]
          "fabric_state": 3 | null,           # NVML_GPU_FABRIC_STATE_*
          "recovery_action": 0 | null,        # field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
          "processes": [1234, {"pid": 99, "used_gpu_memory": 1048576}, ...],
          "lost": false,                      # every per-device call raises GpuIsLost (15)
          "hang": null | "<function name>",   # optional: only this GPU's call hangs
          "errors": {"nvmlDeviceGetVbiosVersion": 3, ...}   # injected error codes
      }, ... ],
      "errors": {"nvmlSystemGetDriverVersion": 999, ...},   # injected; also apply to every GPU
      "clock_offset_s": 0                   # optional: the node's clock moved on (field value timestamps)
    }

Rules that hold for every call, in this order (the real library's order):

1. Before ``nvmlInit`` (or after the matching ``nvmlShutdown``) every call raises
   NVML_ERROR_UNINITIALIZED.
2. A handle not made by this stand-in, or an out-of-range index, raises
   NVML_ERROR_INVALID_ARGUMENT.
3. A hanging call sleeps forever.
4. An injected error code (the GPU's ``errors``, then the top-level ``errors``) is
   raised.
5. A lost GPU raises NVML_ERROR_GPU_IS_LOST (``nvmlDeviceGetHandleByIndex`` still
   works, as it does on a real node).
6. A key that is absent or null reads as NVML_ERROR_NOT_SUPPORTED: that is how
   NVML says "this GPU has no such thing", which is a fact, not a failure.
"""

import ctypes
import time

import pynvml as _real

NVMLError = _real.NVMLError

# byref(x) gives a CArgObject; its _obj is x.  There is no public name for the type.
_CArgObject = type(ctypes.byref(ctypes.c_int()))


def _error(code):
    # The real constructor picks the subclass (NVMLError_GpuIsLost for 15, ...).
    return NVMLError(int(code))


def _not_supported():
    return _error(_real.NVML_ERROR_NOT_SUPPORTED)


def _hang():
    # A wedged GPU: the call never returns.  Sleep in a loop rather than block on
    # a lock, so a daemon thread running it dies quietly with the interpreter.
    while True:
        time.sleep(3600)


def _target(arg, what):
    """The ctypes object behind byref(x) or pointer(x).

    The real pynvml hands output arguments of this kind to C unchanged, and ctypes
    passes a bare Structure *by value*: the driver would write through garbage.
    Refuse it here so a probe that forgets byref() fails in tests, not on a node.
    """
    if isinstance(arg, _CArgObject):
        return arg._obj
    if isinstance(arg, ctypes._Pointer):
        return arg.contents
    raise TypeError("%s: pass ctypes.byref(...) (the real pynvml passes it to C as is), got %r"
                    % (what, type(arg).__name__))


def _pci_bus_id(text):
    """(domain, bus, device) from "00000000:18:00.0" or "0000:18:00.0"."""
    try:
        domain, bus, rest = text.split(":")
        return int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)
    except (AttributeError, ValueError):
        raise ValueError("simulated GPU has a bad pci_bus_id: %r" % (text,))


class _Handle:
    """Opaque device handle: valid only with the stand-in that made it."""

    __slots__ = ("owner", "index")

    def __init__(self, owner, index):
        self.owner = owner
        self.index = index

    def __repr__(self):
        return "<simulated nvmlDevice_t %d>" % self.index


class StateAccess:
    """The checks every call makes (the rules above), over the state dict."""

    def __init__(self, state):
        self._state = state
        self._refcount = 0  # like pynvml: each nvmlInit needs an nvmlShutdown

    # -- plumbing ---------------------------------------------------------------

    def _gpus(self):
        return self._state.get("gpus") or []

    def _check_init(self):
        if self._refcount == 0:
            raise _error(_real.NVML_ERROR_UNINITIALIZED)

    def _system(self, name):
        """Checks for a system-level call; returns the state."""
        self._check_init()
        if self._state.get("hang") == name:
            _hang()
        code = (self._state.get("errors") or {}).get(name)
        if code is not None:
            raise _error(code)
        return self._state

    def _gpu_at(self, name, index, lost_ok=False):
        gpus = self._gpus()
        if not (0 <= index < len(gpus)):
            raise _error(_real.NVML_ERROR_INVALID_ARGUMENT)
        gpu = gpus[index]
        if name in (self._state.get("hang"), gpu.get("hang")):
            _hang()
        for errors in (gpu.get("errors"), self._state.get("errors")):
            code = (errors or {}).get(name)
            if code is not None:
                raise _error(code)
        if gpu.get("lost") and not lost_ok:
            raise _error(_real.NVML_ERROR_GPU_IS_LOST)
        return gpu

    def _gpu(self, name, handle):
        """Checks for a per-device call; returns that GPU's state."""
        self._check_init()
        if not isinstance(handle, _Handle) or handle.owner is not self:
            raise _error(_real.NVML_ERROR_INVALID_ARGUMENT)
        return self._gpu_at(name, handle.index)

    @staticmethod
    def _get(mapping, key):
        value = mapping.get(key)
        if value is None:
            raise _not_supported()
        return value
