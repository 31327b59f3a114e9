"""Facts read from files under the node's root ('/' or a simulated sysroot)."""

from __future__ import annotations

import os

from gpugate.core import jsontext
from gpugate.errors import ParseError
from gpugate.model.facts import ProbeFailure
from gpugate.core.lazyre import Lazy

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Any

_MAX_FILE = 1 << 20
_VERSION = Lazy(r"^[0-9]+(\.[0-9]+){1,3}$")  # 580.159.04


def _path(root: str, rel: str) -> str:
    return os.path.join(root, rel.lstrip("/"))


def read_text(root: str, rel: str, source: str) -> Any:
    from gpugate.safety.safeio import read_capped

    try:  # a regular file (never a FIFO or device: no wait), at most _MAX_FILE bytes, else an error saying so
        return read_capped(_path(root, rel), _MAX_FILE).decode("utf-8", "replace")
    except FileNotFoundError:
        return ProbeFailure(source, "missing", rel)
    except OSError as exc:
        return ProbeFailure(source, "error", "%s: %s" % (rel, exc.strerror or exc))


def kernel_release(root: str) -> Any:
    text = read_text(root, "/proc/sys/kernel/osrelease", "kernel")
    return text.strip() or ProbeFailure("kernel", "error", "empty osrelease") if isinstance(text, str) else text


def boot_id(root: str) -> Any:
    text = read_text(root, "/proc/sys/kernel/random/boot_id", "boot_id")
    return text.strip() if isinstance(text, str) else text


def boot_time(root: str) -> Any:
    text = read_text(root, "/proc/stat", "boot_time")
    if not isinstance(text, str):
        return text
    for line in text.splitlines():
        if line.startswith("btime "):
            try:
                return float(line.split()[1])
            except (IndexError, ValueError):
                break
    return ProbeFailure("boot_time", "error", "no btime in /proc/stat")


def module_resident(root: str) -> Any:
    """The loaded kernel module's version; 'missing' when no module is loaded.
    The kernel's own record first: /sys/module/nvidia/version is the
    MODULE_VERSION of the module loaded now (what modinfo would say of the
    .ko on disk, which may be newer); /proc/driver/nvidia/version, the
    driver's banner, where sysfs has no such file."""
    from gpugate.parsers.system import parse_proc_driver_version  # its regexes: health check only

    text = read_text(root, "/sys/module/nvidia/version", "module")
    if isinstance(text, str):
        version = text.strip()
        if _VERSION.match(version):
            return version
        return ProbeFailure("module", "error", "/sys/module/nvidia/version: expected a version, saw %r" % version[:40])
    text = read_text(root, "/proc/driver/nvidia/version", "module")
    if not isinstance(text, str):
        return text
    try:
        return parse_proc_driver_version(text)
    except ParseError as exc:
        return ProbeFailure("module", "error", str(exc)[:200])


def image(root: str) -> Any:
    """/etc/cluster-image.json: the golden image the node booted."""
    text = read_text(root, "/etc/cluster-image.json", "image")
    if not isinstance(text, str):
        return text
    try:
        data = jsontext.loads(text)
    except ValueError as exc:
        return ProbeFailure("image", "error", "cluster-image.json: %s" % exc)
    if not isinstance(data, dict) or not isinstance(data.get("version"), str):
        return ProbeFailure("image", "error", 'cluster-image.json has no string "version"')
    return data


# PCI class codes (class and subclass: the upper 16 of the 24 bits in
# /sys/bus/pci/devices/*/class, "0x030200").  NVSwitches show as "bridge,
# other" (lspci: "Bridge [0680]: NVIDIA Corporation GH100 [H100 NVSwitch]").
_GPU_CLASSES = (0x0300, 0x0302)  # VGA compatible controller, 3D controller
_NVSWITCH_CLASS = 0x0680
_PCI_DEVICES = "/sys/bus/pci/devices"


def pci_counts(root: str) -> Any:
    """(NVIDIA GPUs, NVIDIA NVSwitches) on the PCI bus, from the kernel's own
    sysfs (vendor 0x10de and the class of each device): lspci reads the same
    files, so it is run only where /sys/bus/pci/devices is absent (None)."""
    directory = _path(root, _PCI_DEVICES)
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return None
    except OSError as exc:
        return ProbeFailure("pci", "error", "%s: %s" % (_PCI_DEVICES, exc.strerror or exc))
    gpus = switches = 0
    for name in names:
        rel = "%s/%s/" % (_PCI_DEVICES, name)
        vendor = read_text(root, rel + "vendor", "pci")
        if isinstance(vendor, ProbeFailure) and vendor.kind == "missing":
            continue  # removed while we read: not on the bus
        cls = read_text(root, rel + "class", "pci") if isinstance(vendor, str) and vendor.strip() == "0x10de" else ""
        if isinstance(vendor, ProbeFailure) or isinstance(cls, ProbeFailure):
            return vendor if isinstance(vendor, ProbeFailure) else cls
        if not cls:
            continue
        try:
            code = int(cls.strip(), 16) >> 8
        except ValueError:
            return ProbeFailure("pci", "error", "%sclass: expected like 0x030200, saw %r" % (rel, cls.strip()[:20]))
        gpus += code in _GPU_CLASSES
        switches += code == _NVSWITCH_CLASS
    return gpus, switches
