"""Facts read from files under the node's root ('/' or a simulated sysroot)."""

from __future__ import annotations

import os

from .. import jsontext
from ..errors import ParseError
from ..facts import ProbeFailure

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Any

_MAX_FILE = 1 << 20


def _path(root: str, rel: str) -> str:
    return os.path.join(root, rel.lstrip("/"))


def read_text(root: str, rel: str, source: str) -> Any:
    from ..safeio import read_capped

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
    """The loaded kernel module's version; 'missing' when no module is loaded."""
    from ..parsers.system import parse_proc_driver_version  # its regexes: health check only

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
