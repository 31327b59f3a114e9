"""Parsers for the driver stack as the OS sees it: loaded module, module on
disk, dkms, PCI devices, installed packages, systemd units."""

import re
from typing import Dict, Tuple

from gpugate.errors import ParseError
from gpugate.model.toolfacts import DkmsEntry, Package

_VERSION = r"[0-9]+(?:\.[0-9]+)+"
# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.08  Thu Feb 22 ..." and
# "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.65.06  Release Build ..."
_NVRM = re.compile(r"^NVRM version:.*?Kernel Module(?: for \S+)?[ \t]+(%s)(?=\s|$)" % _VERSION, re.M)
# Old dkms: "nvidia, 535.161.08, 6.1.0-27-amd64, x86_64: installed"; dkms 3 joins
# module and version with "/"; "added" entries have no kernel; notes follow in ().
_DKMS = re.compile(
    r"^(?P<module>[^\s,/:]+)(?:/|,\s*)(?P<version>[^\s,:]+)"
    r"(?:,\s*(?P<kernel>[^\s,:]+),\s*(?P<arch>[^\s,:]+))?:\s*(?P<status>[A-Za-z][\w-]*)(?:\s.*)?$"
)
# lspci -n: "38:00.0 0302: 10de:2330 (rev a1)", optionally with a "0000:" domain.
_LSPCI = re.compile(
    r"^(?:[0-9a-f]{4,8}:)?[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\s+([0-9a-f]{4}):\s+([0-9a-f]{4}):[0-9a-f]{4}\b", re.I)
_GPU_CLASSES = ("0300", "0302")  # VGA and 3D controllers
_NVSWITCH_CLASS = "0680"  # "bridge: other", how NVSwitches show up
# systemd ActiveState values (maintenance: v249+, refreshing: v255+).
_UNIT_STATES = ("active", "inactive", "failed", "activating", "deactivating", "reloading",
                "unknown", "maintenance", "refreshing")


def _excerpt(text: str, limit: int = 80) -> str:
    text = text.strip()
    return repr(text[:limit] + ("..." if len(text) > limit else ""))


def _lines(text: str):
    return [line.strip() for line in text.splitlines() if line.strip()]


def parse_proc_driver_version(text: str) -> str:
    """Version of the loaded module from /proc/driver/nvidia/version."""
    match = _NVRM.search(text)
    if not match:
        raise ParseError("/proc/driver/nvidia/version: expected 'NVRM version: ... Kernel Module  X.Y.Z', saw %s"
                         % _excerpt(text))
    return match.group(1)


def parse_modinfo_version(text: str) -> str:
    """`modinfo -F version nvidia`: the version of the module on disk."""
    lines = _lines(text)
    if not lines or not re.fullmatch(_VERSION, lines[0]):
        raise ParseError("modinfo -F version nvidia: expected one version like 535.161.08, saw %s" % _excerpt(text))
    return lines[0]


def parse_dkms_status(text: str) -> Tuple[DkmsEntry, ...]:
    """`dkms status`; stray warning lines are skipped, but output with no entry
    line at all is not dkms status and is a ParseError."""
    lines = _lines(text)
    matches = [m for m in map(_DKMS.match, lines) if m]
    if lines and not matches:
        raise ParseError("dkms status: expected 'module/version, kernel, arch: status', saw %s" % _excerpt(text))
    return tuple(DkmsEntry(module=m.group("module"), version=m.group("version"), kernel=m.group("kernel") or "",
                           arch=m.group("arch") or "", status=m.group("status").lower()) for m in matches)


def parse_lspci_nvidia(text: str) -> Tuple[int, int]:
    """`lspci -n -d 10de:` -> (GPUs, NVSwitch bridges).  No output means no devices."""
    lines = _lines(text)
    matches = [m for m in map(_LSPCI.match, lines) if m]
    if lines and not matches:
        raise ParseError("lspci -n: expected 'bb:dd.f class: vendor:device', saw %s" % _excerpt(text))
    nvidia = [m.group(1) for m in matches if m.group(2).lower() == "10de"]
    return (sum(c in _GPU_CLASSES for c in nvidia), sum(c == _NVSWITCH_CLASS for c in nvidia))


def _upstream(version: str) -> str:
    # Debian "epoch:upstream-revision" -> upstream: 1:535.161.08-0ubuntu1 -> 535.161.08.
    version = re.sub(r"^[0-9]+:", "", version)
    return version.rsplit("-", 1)[0] if "-" in version else version


def parse_dpkg_query(text: str) -> Dict[str, Package]:
    """dpkg-query -W -f='${Package}\\t${Version}\\t${db:Status-Abbrev}\\t${Status}\\n'.
    Only installed packages; held when the selection state is "hold"."""
    packages = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 4 or not fields[0].strip():
            raise ParseError("dpkg-query: expected 'name<TAB>version<TAB>abbrev<TAB>status', saw %s" % _excerpt(line))
        name, version, status = fields[0].strip(), fields[1].strip(), fields[3].split()
        if not status or status[-1] != "installed" or not version:
            continue  # config-files, half-installed, not-installed ...
        packages[name] = Package(name=name, version=_upstream(version), held=status[0] == "hold",
                                 raw_version=version)
    return packages


RPM_QUERYFORMAT = "%{NAME}\t%{EPOCH}\t%{VERSION}\t%{RELEASE}\t%{ARCH}\n"
_RPM_NOT_INSTALLED = re.compile(r"^package \S+ is not installed$")
_RPM_EPOCH = re.compile(r"^(?:\(none\)|[0-9]+)$")


def parse_rpm_query(text: str) -> Dict[str, Package]:
    """rpm -qa --qf RPM_QUERYFORMAT (name, epoch, version, release, arch; the
    epoch "(none)" when unset).  The older three-field form (name, version,
    release) and `rpm -q`'s "package X is not installed" lines are read too.
    A name installed in several versions (rpm allows it) keeps them all,
    joined with ",": such a node matches no single pin."""
    found: Dict[str, list] = {}
    for line in text.splitlines():
        if not line.strip() or _RPM_NOT_INSTALLED.match(line.strip()):
            continue
        fields = [f.strip() for f in line.split("\t")]
        if len(fields) == 3:
            fields = [fields[0], "(none)"] + fields[1:] + [""]
        if (len(fields) != 5 or not all(fields[:4]) or not _RPM_EPOCH.match(fields[1])
                or any(c.isspace() or c == "," for f in fields for c in f)):
            raise ParseError("rpm -qa: expected 'name<TAB>epoch<TAB>version<TAB>release<TAB>arch', saw %s"
                             % _excerpt(line))
        name, epoch, version, release = fields[:4]
        raw = ("" if epoch == "(none)" else epoch + ":") + "%s-%s" % (version, release)
        found.setdefault(name, []).append((version, raw))
    packages = {}
    for name, installed in found.items():
        versions = sorted({v for v, _ in installed})
        raws = sorted({r for _, r in installed})
        packages[name] = Package(name=name, version=",".join(versions), held=False, raw_version=",".join(raws))
    return packages


def parse_systemctl_is_active(text: str) -> str:
    """`systemctl is-active UNIT`: the first line is the unit's state."""
    lines = text.splitlines()
    state = lines[0].strip() if lines else ""
    if state not in _UNIT_STATES:
        raise ParseError("systemctl is-active: expected one of %s, saw %s" % ("/".join(_UNIT_STATES), _excerpt(text)))
    return state
