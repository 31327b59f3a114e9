"""Parsers for InfiniBand/RoCE HCAs: the values of /sys/class/infiniband
files, and `ibstat` output (used to turn real captures into sysfs trees).

sysfs formats (drivers/infiniband/core/sysfs.c): ports/N/state "4: ACTIVE",
phys_state "5: LinkUp", rate "400 Gb/sec (4X NDR)", link_layer "InfiniBand"
or "Ethernet"; counters are decimal integers."""

from gpugate.errors import ParseError
from gpugate.core.lazyre import Lazy

# "4: ACTIVE", "1: DOWN", "5: LinkUp", "3: Disabled"
_NUMBERED = Lazy(r"^\s*(\d+):\s*(\S.*?)\s*$")
# "400 Gb/sec (4X NDR)", "200 Gb/sec (2X NDR)", "2.5 Gb/sec (1X SDR)", "40 Gb/sec (4X QDR)"
_RATE = Lazy(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec\b")
_CA = Lazy(r"^CA '([^']+)'\s*$")
_PORT = Lazy(r"^\s+Port (\d+):\s*$")
_FIELD = Lazy(r"^\s+([A-Za-z][A-Za-z ]*?):\s*(.*?)\s*$")
# ibstat prints the same names the sysfs files use, in other spelling.
IBSTAT_STATE = {"Active": "ACTIVE", "Down": "DOWN", "Initializing": "INIT", "Armed": "ARMED"}
IBSTAT_PHYS = {"LinkUp": "LinkUp", "Disabled": "Disabled", "Polling": "Polling", "Sleep": "Sleep",
               "PortConfigurationTraining": "PortConfigurationTraining",
               "LinkErrorRecovery": "LinkErrorRecovery", "Phy Test": "Phy Test"}
STATE_NUMBERS = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5}
PHYS_NUMBERS = {"Sleep": 1, "Polling": 2, "Disabled": 3, "PortConfigurationTraining": 4, "LinkUp": 5,
                "LinkErrorRecovery": 6, "Phy Test": 7}


def parse_numbered(text: str, what: str) -> str:
    """"4: ACTIVE" -> "ACTIVE" (ports/N/state and phys_state)."""
    match = _NUMBERED.match(text.strip())
    if not match:
        raise ParseError("%s: expected 'N: NAME', got %r" % (what, text.strip()[:60]))
    return match.group(2)


def parse_rate(text: str) -> float:
    """"400 Gb/sec (4X NDR)" -> 400.0"""
    match = _RATE.match(text)
    if not match:
        raise ParseError("rate: expected 'N Gb/sec (...)', got %r" % text.strip()[:60])
    return float(match.group(1))


def parse_counter(text: str, name: str) -> int:
    value = text.strip()
    if not value.isdigit():
        raise ParseError("counter %s: expected a non-negative integer, got %r" % (name, value[:40]))
    return int(value)


def parse_ibstat(text: str):
    """ibstat -> [{"name", "hca_type", "fw_ver", "ports": [{"port", "state",
    "phys_state", "rate", "link_layer"}]}] with sysfs's names for states."""
    cas, port = [], None
    for line in text.splitlines():
        ca = _CA.match(line)
        if ca:
            cas.append({"name": ca.group(1), "hca_type": None, "fw_ver": None, "ports": []})
            port = None
            continue
        if not cas or not line.strip():
            continue
        pm = _PORT.match(line)
        if pm:
            port = {"port": int(pm.group(1))}
            cas[-1]["ports"].append(port)
            continue
        field = _FIELD.match(line)
        if not field:
            raise ParseError("ibstat: unexpected line %r" % line.strip()[:60])
        key, value = field.groups()
        if port is None:
            if key == "CA type":
                cas[-1]["hca_type"] = value
            elif key == "Firmware version":
                cas[-1]["fw_ver"] = value
        elif key == "State":
            port["state"] = IBSTAT_STATE.get(value, value.upper())
        elif key == "Physical state":
            port["phys_state"] = IBSTAT_PHYS.get(value, value)
        elif key == "Rate":
            port["rate"] = float(value)
        elif key == "Link layer":
            port["link_layer"] = value
    if not cas:
        raise ParseError("ibstat: no CA found")
    return cas
