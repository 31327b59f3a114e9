"""The names baseline.toml's keys are made of (pinned components, clock
reasons, amdgpu events, what a version string is): a leaf module, so the
schema (gpugate.model.baseline_schema, gpugate.vendors.amd.baseline) and the records
(gpugate.model.baseline) share them without importing each other."""

from __future__ import annotations

from gpugate.core.lazyre import Lazy

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Optional

VERSION_RE = Lazy(r"^[A-Za-z0-9][A-Za-z0-9.+_~:-]{0,63}$")


def _version(value: str) -> Optional[str]:
    if not VERSION_RE.match(value):
        return ("expected a version string of letters, digits and . + _ ~ : - (at most 64), got %r"
                % value[:80])
    return None


# Component names as they appear in findings, reasons, the audit and sim keys.
PIN_COMPONENTS = ("kernel", "driver", "gsp_firmware", "cuda_driver", "fabricmanager",
                  "container_toolkit", "dcgm", "image")


CLOCK_REASONS = {"hw_slowdown": 0x8, "hw_thermal": 0x40, "power_brake": 0x80,
                 "sw_thermal": 0x20, "sw_power_cap": 0x4}
# The kernel-log events of gpugate.vendors.amd.parse_kernlog that drain by default.
AMDGPU_EVENTS = ("ue", "de", "ue_event", "poison", "reset_failed", "ring_timeout", "ring_reset_failed",
                 "bad_page_threshold", "init_failed", "gpu_reset")
AMD_NODESET_KEYS = ("vendor", "device_id", "compute_partition", "memory_partition")
