"""InfiniBand/RoCE HCAs from /sys/class/infiniband under the node's root.

No HCA directory is a fact (zero HCAs: the judge compares it with the
nodeset), not a failure; a file that cannot be read or parsed becomes a
ProbeFailure in its field, never a healthy-looking value."""

import os

from gpugate.model.iblimits import IB_COUNTERS
from gpugate.errors import ParseError
from gpugate.model.facts import ProbeFailure
from gpugate.parsers import ib as parse
from gpugate.model.toolfacts import Hca, HcaPort
from gpugate.probes.files import read_text

CLASS_DIR = "/sys/class/infiniband"
ERROR_COUNTERS = IB_COUNTERS  # only these are kept: data and packet counters would bloat the state file


def _value(root: str, rel: str, source: str, convert):
    text = read_text(root, rel, source)
    if isinstance(text, ProbeFailure):
        return text
    try:
        return convert(text.strip())
    except ParseError as exc:
        return ProbeFailure(source, "error", str(exc)[:200])


def _port(root: str, base: str, number: int, source: str) -> HcaPort:
    where = "%s/ports/%d" % (base, number)
    counters = {}
    for name in ERROR_COUNTERS:
        value = _value(root, "%s/counters/%s" % (where, name), source, lambda t, n=name: parse.parse_counter(t, n))
        if not (isinstance(value, ProbeFailure) and value.kind == "missing"):
            counters[name] = value  # a counter this driver does not have is left out
    return HcaPort(
        port=number,
        state=_value(root, where + "/state", source, lambda t: parse.parse_numbered(t, "state")),
        phys_state=_value(root, where + "/phys_state", source, lambda t: parse.parse_numbered(t, "phys_state")),
        rate=_value(root, where + "/rate", source, parse.parse_rate),
        link_layer=_value(root, where + "/link_layer", source, lambda t: t),
        counters=counters)


def read_hcas(root: str):
    """tuple of Hca, sorted by name; a ProbeFailure when the class directory
    exists but cannot be listed."""
    directory = os.path.join(root, CLASS_DIR.lstrip("/"))
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return ()  # no RDMA driver loaded or no HCA: zero HCAs
    except OSError as exc:
        return ProbeFailure("hca", "error", "%s: %s" % (CLASS_DIR, exc.strerror or exc))
    hcas = []
    for name in names:
        base = "%s/%s" % (CLASS_DIR, name)
        source = "hca %s" % name
        try:
            numbers = sorted(int(p) for p in os.listdir(os.path.join(directory, name, "ports")) if p.isdigit())
        except OSError as exc:
            numbers, ports = [], (ProbeFailure(source, "error", "ports: %s" % (exc.strerror or exc)),)
        else:
            ports = ()
        text = lambda rel: _value(root, "%s/%s" % (base, rel), source, lambda t: t)  # noqa: E731
        hcas.append(Hca(name=name, hca_type=text("hca_type"), fw_ver=text("fw_ver"), board_id=text("board_id"),
                        ports=ports or tuple(_port(root, base, n, source) for n in numbers)))
    return tuple(hcas)
