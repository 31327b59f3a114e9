"""Hostlist expressions of baseline.toml's [nodes."..."] sections, checked
before ClusterShell expands them (a huge range must not take minutes)."""

from __future__ import annotations

from gpugate.core.lazyre import Lazy

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Optional

# Node names are letters, digits, '.', '_' and '-'; brackets, ',' and the
# ClusterShell operators ! & ^ build sets of them.  '@' (a group) and '*' (all
# nodes) are refused: ClusterShell resolves them by running the commands of its
# groups.conf through a shell, on every node, on every check.
_HOSTLIST_RE = Lazy(r"^[A-Za-z0-9._\-\[\],/!&^]+$")
_RANGE_RE = Lazy(r"^([0-9]+)(?:-([0-9]+))?(?:/([0-9]+))?$")
_HOSTLIST_SPLIT = Lazy(r"[,!&^](?![^\[]*\])")
_HOSTLIST_GROUP = Lazy(r"\[([^\[\]]*)\]")
MAX_NODESET = 100000  # names one expression may expand to (expanding is linear in them)


def _hostlist_size(value: str) -> float:
    """An upper bound of the names ``value`` expands to, found without
    expanding it (NodeSet builds every name: "gpu[0-99999999]" would take
    minutes and gigabytes).  Unreadable ranges count 0: NodeSet reports them."""
    total = 0.0
    for element in _HOSTLIST_SPLIT.split(value):
        size = 1.0
        for group in _HOSTLIST_GROUP.findall(element):
            count = 0.0
            for item in group.split(","):
                match = _RANGE_RE.match(item)
                if not match:
                    continue
                low, high, step = match.groups()
                if max(len(low), len(high or "")) > 18:
                    return float("inf")
                span = int(high) - int(low) if high else 0
                count += max(span, 0) // max(int(step or 1), 1) + 1
            size *= count
        total += size
    return total


def _hostlist(value: str) -> Optional[str]:
    from ClusterShell.NodeSet import NodeSet, NodeSetException  # only when loading

    if not value:
        return "empty hostlist expression ''"
    if not _HOSTLIST_RE.match(value):
        bad = sorted({c for c in value if not _HOSTLIST_RE.match(c)})
        return ("not a hostlist expression: %s not allowed (node names are ASCII letters, digits, "
                "'.', '_' and '-'; groups '@' and '*' are not supported)" % ", ".join(repr(c) for c in bad[:5]))
    if _hostlist_size(value) > MAX_NODESET:
        return "hostlist expression names more than %d nodes: %r" % (MAX_NODESET, value[:80])
    try:
        if len(NodeSet(value)) == 0:
            return "empty hostlist expression %r" % value
    except (NodeSetException, ValueError, TypeError, OverflowError, RecursionError) as exc:
        return "not a hostlist expression (%s)" % exc
    return None
