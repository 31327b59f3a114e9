"""Node names gpugate puts into paths and command lines.

Slurm accepts almost any word as a NodeName; gpugate uses the name in the
state directory path ({node}) and in the sweep's commands ({node}, {nodes},
ssh targets).  A name like "../etc", "-oProxyCommand=..." or one with shell
or hostlist characters must never get there: host names only."""

from gpugate.errors import ConfigError

# RFC 1123 labels (plus '_', which some sites use), dot-separated; no leading
# '-' or '.', so never an option nor a relative path.  What the pattern
# [A-Za-z0-9_][A-Za-z0-9_-]{0,62}(\.[A-Za-z0-9_][A-Za-z0-9_-]{0,62})* matches,
# checked without re (the prolog checks its node's name before every job).
_FIRST = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_REST = _FIRST | {"-"}
MAX_NODE_NAME = 253


def is_node_name(name: object) -> bool:
    if not isinstance(name, str) or len(name) > MAX_NODE_NAME:
        return False
    for label in name.split("."):
        if not 0 < len(label) <= 63 or label[0] not in _FIRST or not _REST.issuperset(label):
            return False
    return True


def check_node_name(name: object, where: str = "node name") -> str:
    if not is_node_name(name):
        raise ConfigError("%s %r is not a plain host name (letters, digits, '-', '_', '.'; not starting "
                          "with '-' or '.'): gpugate will not put it in a path or a command line"
                          % (where, str(name)[:80]))
    return name


def parse_hostlist(expr: str, option: str = "--nodes"):
    """A hostlist an admin typed (-w): a NodeSet, or a ConfigError that says
    which option and why.  ClusterShell groups (@name) resolve as the admin's
    groups.conf says: this runs on the admin's command, never on a node check."""
    from ClusterShell.NodeSet import NodeSet, NodeSetException
    from ClusterShell.NodeUtils import GroupResolverError

    try:
        return NodeSet(expr)
    except (NodeSetException, GroupResolverError, ValueError, RecursionError) as exc:
        raise ConfigError("%s %r is not a hostlist: %s" % (option, expr, exc)) from None
