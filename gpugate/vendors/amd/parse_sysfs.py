"""The text of amdgpu's (and the PCI core's) sysfs files, parsed strictly.

Each function takes a file's whole text and returns a value or raises
ParseError naming what it saw: a probe turns that into a ProbeFailure, never
a healthy default.  No regular expressions: the prolog parses the RAS counts
of every GPU before every job, and ``import re`` alone costs it ~4 ms.

Formats, from the kernel sources (torvalds/linux, drivers/gpu/drm/amd):

- ``ras/<block>_err_count`` and ``ras/aca_<block>``: ``"ue: %lu\\nce: %lu\\n"``,
  newer drivers add ``"de: %lu\\n"`` (amdgpu_ras.c amdgpu_ras_sysfs_read /
  amdgpu_ras_aca_sysfs_read); while a GPU reset is under way the file reads
  ``"Query currently inaccessible\\n"`` instead.
- ``ras/gpu_vram_bad_pages``: one ``"0x%08x : 0x%08x : %1s\\n"`` line per page
  (page frame, size, flag R reserved = retired, P pending, F unable to reserve:
  amdgpu_ras_sysfs_badpages_read, amdgpu_ras_badpage_flags_str).  %08x is a
  minimum width: a frame above 32 bits prints more digits.
- ``current_link_speed``/``max_link_speed``: the PCI core's pci_speed_string,
  ``"32.0 GT/s PCIe"`` (older kernels ``"8 GT/s"``), ``"Unknown"`` when the
  link is not up; ``current_link_width``/``max_link_width``: ``"%u\\n"``.
- KFD topology ``properties``: ``"name value"`` lines (kfd_topology.c
  sysfs_show_32bit_prop: ``"%s %u\\n"``).
"""

from __future__ import annotations

from gpugate.errors import ParseError

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Dict, Optional, Tuple

INACCESSIBLE = "Query currently inaccessible"
# GT/s -> PCIe generation (the PCI core's speed strings: pci_speed_string).
LINK_GENERATIONS = {"2.5": 1, "5": 2, "8": 3, "16": 4, "32": 5, "64": 6, "128": 7}
_HEX = frozenset("0123456789abcdefABCDEF")
_DIGITS = frozenset("0123456789")
BAD_PAGE_FLAGS = ("R", "P", "F")  # retired (reserved), pending, unreservable


def _show(text: str, limit: int = 60) -> str:
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def parse_uint(text: str, what: str = "value") -> int:
    """'750000000\\n' -> 750000000: decimal digits only (no sign, no blank)."""
    value = text.strip()
    if not value or len(value) > 20 or not set(value) <= _DIGITS:
        raise ParseError("%s: expected an unsigned integer, saw %s" % (what, _show(text)))
    return int(value)


def parse_ras_count(text: str) -> Tuple[int, int, Optional[int]]:
    """'ue: 2\\nce: 5\\n[de: 0\\n]' -> (ue, ce, de); de None when the driver
    prints no such line."""
    if text.strip() == INACCESSIBLE:
        raise ParseError("RAS counts: %r (a GPU reset is under way)" % INACCESSIBLE)
    counts: Dict[str, int] = {}
    for line in text.split("\n"):
        if not line.strip():
            continue
        key, sep, value = line.partition(":")
        key = key.strip()
        if not sep or key not in ("ue", "ce", "de") or key in counts:
            raise ParseError("RAS counts: expected 'ue: N', 'ce: N' [, 'de: N'] lines, saw %s" % _show(line))
        counts[key] = parse_uint(value, "RAS %s count" % key)
    if "ue" not in counts or "ce" not in counts:
        raise ParseError("RAS counts: no %s line in %s" % ("ue" if "ue" not in counts else "ce", _show(text)))
    return counts["ue"], counts["ce"], counts.get("de")


def parse_bad_page(line: str) -> Tuple[int, int, str]:
    """'0x00000001 : 0x00001000 : R' -> (page frame, size, flag)."""
    fields = [field.strip() for field in line.split(":")]
    if len(fields) != 3 or fields[2] not in BAD_PAGE_FLAGS:
        raise ParseError("gpu_vram_bad_pages: expected '0x... : 0x... : R|P|F', saw %s" % _show(line))
    numbers = []
    for field in fields[:2]:
        if not (field[:2] in ("0x", "0X") and 2 < len(field) <= 18 and set(field[2:]) <= _HEX):
            raise ParseError("gpu_vram_bad_pages: expected a hex number, saw %s in %s" % (_show(field, 20), _show(line)))
        numbers.append(int(field, 16))
    return numbers[0], numbers[1], fields[2]


def parse_bad_pages(text: str) -> Tuple[int, int, int]:
    """The whole file -> (retired, pending, unreservable) page counts."""
    counts = {flag: 0 for flag in BAD_PAGE_FLAGS}
    for line in text.split("\n"):
        if line.strip():
            counts[parse_bad_page(line)[2]] += 1
    return counts["R"], counts["P"], counts["F"]


def parse_link_speed(text: str) -> int:
    """'32.0 GT/s PCIe' (or '8 GT/s', '2.5 GT/s') -> the PCIe generation (5)."""
    words = text.split()
    if len(words) in (2, 3) and words[1] == "GT/s" and (len(words) == 2 or words[2] == "PCIe"):
        number = words[0][:-2] if words[0].endswith(".0") else words[0]
        if number in LINK_GENERATIONS:
            return LINK_GENERATIONS[number]
    if text.strip().startswith("Unknown"):
        raise ParseError("link speed: %s (the link is not up)" % _show(text.strip()))
    raise ParseError("link speed: expected like '32.0 GT/s PCIe', saw %s" % _show(text))


def parse_link_width(text: str) -> int:
    """'16\\n' -> 16 (the PCI core's "%u"; x1..x32)."""
    width = parse_uint(text, "link width")
    if not 1 <= width <= 32:
        raise ParseError("link width: expected 1..32 lanes, saw %s" % _show(text))
    return width


def parse_properties(text: str) -> Dict[str, int]:
    """KFD topology 'properties': 'location_id 6912\\ndomain 0\\n' -> a dict.
    Lines that are not 'name number' are skipped (the file grows fields
    with kernel versions); the caller asks for the keys it needs."""
    out: Dict[str, int] = {}
    for line in text.split("\n"):
        name, _, value = line.strip().partition(" ")
        value = value.strip()
        if name and value and set(value) <= _DIGITS and len(value) <= 20:
            out[name] = int(value)
    return out


def location_bdf(domain: int, location_id: int) -> str:
    """KFD's location_id is pci_dev_id(pdev) = bus << 8 | devfn (newer
    kernels put a partition's node id in bits 31:28; older ones OR'ed it into
    the low bits, the function): -> 'dddd:bb:dd', the function left out."""
    return "%04x:%02x:%02x" % (domain & 0xFFFF, (location_id >> 8) & 0xFF, (location_id >> 3) & 0x1F)


def parse_version(text: str, what: str) -> str:
    """'6.16.13\\n' -> '6.16.13': a dotted version with an optional build
    suffix ('6.3.3-74'); letters and blanks elsewhere are garbage."""
    value = text.strip()
    release, _, build = value.partition("-")
    parts = release.split(".")
    if (len(value) > 64 or len(parts) < 2 or not all(p and set(p) <= _DIGITS for p in parts)
            or build and not all(c.isalnum() or c in "._+~" for c in build)):
        raise ParseError("%s: expected a version like 6.16.13, saw %s" % (what, _show(text)))
    return value


def parse_hex(text: str, what: str) -> str:
    """'0x74a1\n' -> '0x74a1' (lower case): the PCI core's vendor, device and
    class files ("0x%04x", "0x%06x"), amdgpu's firmware versions ("0x%08x")."""
    value = text.strip()
    if not (value[:2] == "0x" and 2 < len(value) <= 18 and set(value[2:]) <= _HEX):
        raise ParseError("%s: expected a hex number like 0x74a1, saw %s" % (what, _show(text)))
    return value.lower()


def parse_fw_version(text: str) -> str:
    """fw_version/*_fw_version: '0x%08x' (amdgpu_ucode.c FW_VERSION_ATTR) -> '0x000000a6'."""
    return parse_hex(text, "firmware version")


def fru_string(text: str) -> Optional[str]:
    """A board FRU string (product_name, serial_number): '' -> None (empty
    FRU field); control characters (a corrupted FRU) are garbage."""
    value = text.strip()
    if not value:
        return None
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value) or "\ufffd" in value or len(value) > 128:
        raise ParseError("FRU string: unreadable %s (corrupted FRU?)" % _show(value))
    return value
