"""Which nodes a baseline's [nodes."..."] sections cover, before it reaches
the fleet: a node no section names reads `probe uncovered=...` on every
check, a budgeted finding, so a baseline captured from one node and pushed
as it is would have the drain budget keeper drain a share of every
partition on the first night.  `gpugate baseline capture --nodes` writes the
section for a hostlist; `gpugate baseline check` refuses a baseline that
leaves audited nodes uncovered.  Pure, but for ClusterShell's NodeSet."""

from typing import List, Mapping, Optional, Sequence, Tuple

from gpugate.errors import ConfigError

EXAMPLE = "gpugate baseline capture --node gpu001 --nodes 'gpu[001-200]' -o new-baseline.toml"


def section_key(expr: str) -> str:
    """The [nodes."..."] key for a hostlist an admin typed (--nodes), folded
    as ClusterShell writes it ("gpu001,gpu002" -> "gpu[001-002]"); a
    ConfigError naming the option when the baseline would refuse it."""
    from ClusterShell.NodeSet import NodeSet

    from gpugate.core.hostlists import _hostlist

    why = _hostlist(expr or "")
    if why is not None:
        raise ConfigError("--nodes %r: %s" % (expr, why))
    return str(NodeSet(expr))


def capture_notes(node: str, key: Optional[str]) -> List[str]:
    """What `baseline capture` says on stderr about the nodes its section
    covers: one node only (no --nodes), or a hostlist without the node the
    facts came from."""
    if key is None:
        return ["gpugate baseline capture: the [nodes.\"%s\"] section covers %s only: every other node will read "
                "`probe uncovered=NODE` (a budgeted finding: the drain budget keeper drains them within the "
                "budget) until a section names it.  For the whole fleet give the hostlist: %s"
                % (node, node, EXAMPLE)]
    from ClusterShell.NodeSet import NodeSet

    if node not in NodeSet(key):
        return ["gpugate baseline capture: warning: --nodes %s does not name %s (the node captured from): it "
                "will read `probe uncovered=%s` unless another section names it" % (key, node, node)]
    return []


def host_notes(node: str, host: Optional[str]) -> List[str]:
    """What `baseline capture` says on stderr when it reads this machine's
    facts (``host``: this machine's name, socket.gethostname(); None when
    the facts come from a simulated fleet, --sim or gpugate.toml's [sim])
    and --node names another machine.  --node only names the result: run
    on the controller, the capture pins the controller's stack (no GPUs, no
    driver) for every node of the hostlist.  Said before the facts are
    read, so it stands beside the error a machine without a driver gives."""
    if host is None:
        return []
    short = host.split(".")[0]
    if node.lower() in (host.lower(), short.lower()):
        return []
    return ["gpugate baseline capture: warning: --node %s is not this host (%s): the facts are read from this "
            "machine, --node only names the result.  Run it on %s itself (through ssh from the controller: "
            "`ssh %s /opt/gpugate/bin/gpugate baseline capture --node %s ...`)" % (node, short, node, node, node)]


def uncovered_audited(baseline, facts: Mapping[str, object]) -> Tuple[Sequence[str], Sequence[str]]:
    """(refused, unreached): the audited nodes no [nodes] section of
    ``baseline`` names.  Refused: gpugate answered the audit there, so it
    judges them and they would read `probe uncovered`.  Unreached: the
    audit has no facts of theirs (down, or no gpugate there): named, not
    refused."""
    refused, unreached = [], []
    for name in sorted(facts):
        if baseline.covers(name):
            continue
        (refused if isinstance(facts[name], Mapping) else unreached).append(name)
    return refused, unreached


def refusal(new_path: str, refused: Sequence[str], unreached: Sequence[str]) -> List[str]:
    """The lines `baseline check` prints when it refuses for coverage."""
    from gpugate.fleet.audit import hostlist

    lines = ["gpugate baseline check: %s leaves %d audited node%s uncovered: %s.  No [nodes.\"...\"] section names "
             "them, so each would read `probe uncovered=NODE` and be drained within the drain budget.  Add a "
             "section for them (e.g. `%s`, or write [nodes.\"HOSTLIST\"] by hand), then check again."
             % (new_path, len(refused), "" if len(refused) == 1 else "s", hostlist(refused), EXAMPLE)]
    if unreached:
        lines.append("gpugate baseline check: also uncovered, but the audit did not reach them (not refused for "
                     "them): %s" % hostlist(unreached))
    return lines
