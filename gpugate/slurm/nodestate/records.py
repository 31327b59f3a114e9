"""Node records as the pyslurm worker sends them (gpugate.slurm.pyslurm_worker):
plain dicts read from libslurm's node_info_t, one per node.

``state`` is slurm_node_state_string_complete() ("IDLE+DRAIN",
"DOWN+NOT_RESPONDING"), the same words as sinfo's StateComplete; times are
epoch seconds (0 or None: unset).  The same contract as the other readers:
ParseError and nothing else, one record per node, a reason left on a node
in service read as none."""

from typing import Dict

from gpugate.errors import ParseError

from gpugate.slurm.nodestate.fields import _epoch, _expect_str, _name, _opt_str, _show, _type
from gpugate.slurm.nodestate.record import NodeState, _parse_state, _without_stale_reason


def parse_node_records(records: object) -> Dict[str, NodeState]:
    if not isinstance(records, list):
        raise ParseError("pyslurm nodes: expected a list, got %s" % _type(records))
    found: Dict[str, NodeState] = {}
    for i, entry in enumerate(records):
        where = "pyslurm nodes[%d]" % i
        try:
            state = _record(entry, where)
        except ParseError:
            raise
        except Exception as exc:  # noqa: BLE001 - the contract: ParseError only
            raise ParseError("%s: unreadable record (%s: %s)" % (where, type(exc).__name__, str(exc)[:200])) from exc
        if state.name in found:
            raise ParseError("%s: node %s reported twice" % (where, state.name))
        found[state.name] = _without_stale_reason(state)
    return found


def _record(entry: object, where: str) -> NodeState:
    if not isinstance(entry, dict):
        raise ParseError("%s: expected a record, got %s" % (where, _type(entry)))
    name = _name(entry.get("name"), where)
    where = "%s (%s)" % (where, name)
    base, flags = _parse_state(_expect_str(entry.get("state"), where + ".state"), None, where)
    parts = entry.get("partitions") or []
    if not isinstance(parts, list):
        raise ParseError("%s: 'partitions' must be a list, got %s" % (where, _show(parts)))
    return NodeState(
        name=name, state=base, flags=flags,
        reason=_opt_str(entry, "reason", where),
        reason_time=_epoch(entry.get("reason_time"), where + ".reason_time"),
        reason_user=_opt_str(entry, "reason_user", where),
        partitions=tuple(sorted({_name(p, where, "partition name") for p in parts})),
        comment=_opt_str(entry, "comment", where))
