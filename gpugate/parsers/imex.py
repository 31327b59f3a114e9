"""Parsers for nvidia-imex-ctl: -q (this node's IMEX service: "READY") and
-N (the domain: one "Node #i - <address> - <STATE>" line per member and
"Domain State: UP|DOWN|DEGRADED")."""

from gpugate.errors import ParseError
from gpugate.core.lazyre import Lazy

_NODE = Lazy(r"^Node #(\d+)\s+-\s+(\S+)(?:\s+\([^)]*\))?\s+-\s+([A-Z_]+)\s*$")
_DOMAIN = Lazy(r"^Domain State:\s*([A-Z_]+)\s*$")


def parse_query(text: str) -> str:
    """-q: the last non-empty line is the service's state."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise ParseError("nvidia-imex-ctl -q: no output")
    state = lines[-1].split()[0]
    if not state.isalpha() or not state.isupper():
        raise ParseError("nvidia-imex-ctl -q: expected a state such as READY, got %r" % lines[-1][:60])
    return state


def parse_domain(text: str):
    """-N -> (domain state, ((address, node state), ...))."""
    domain, nodes = None, []
    for line in text.splitlines():
        node = _NODE.match(line.strip())
        if node:
            nodes.append((node.group(2), node.group(3)))
            continue
        match = _DOMAIN.match(line.strip())
        if match:
            domain = match.group(1)
    if domain is None:
        raise ParseError("nvidia-imex-ctl -N: no 'Domain State:' line")
    return domain, tuple(nodes)
