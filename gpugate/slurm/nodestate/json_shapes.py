"""Slurm node JSON of every release (the shapes are listed in the package doc):
22.05 sinfo, 23.02+ scontrol (times wrapped from 23.11 on), 23.02+ sinfo."""

import json
from typing import Dict, List, Optional, Tuple

from gpugate.errors import ParseError

from gpugate.slurm.nodestate.fields import _epoch, _name, _opt_str, _partitions, _type
from gpugate.slurm.nodestate.record import NodeState, _guarded, _merge, _parse_state


def parse_nodes_json(text: str) -> Dict[str, NodeState]:
    """Nodes from sinfo/scontrol JSON of Slurm 22.05 .. 26.05 (see module doc)."""
    return _guarded(_parse_json, text, "Slurm node JSON")


def _parse_json(text: str) -> Dict[str, NodeState]:
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ParseError(f"Slurm node JSON: not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ParseError(f"Slurm node JSON: top level must be an object, got {_type(doc)}")
    _check_errors(doc)
    if "nodes" not in doc and "sinfo" not in doc:
        raise ParseError("Slurm node JSON: neither a 'nodes' nor a 'sinfo' key")
    records: List[NodeState] = []
    for i, entry in enumerate(_list_at(doc, "nodes")):
        records.append(_node_entry(entry, f"nodes[{i}]"))
    for i, entry in enumerate(_list_at(doc, "sinfo")):
        records.extend(_sinfo_entry(entry, f"sinfo[{i}]"))
    return _merge(records)


def _list_at(doc: dict, key: str) -> list:
    value = doc.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ParseError(f"Slurm node JSON: '{key}' must be a list, got {_type(value)}")
    return value


def _check_errors(doc: dict) -> None:
    """Slurm reports failures in "errors" and may still exit 0 (22.05 sinfo
    --json without a controller prints no nodes and "Unspecified error")."""
    errors = doc.get("errors")
    if not errors:
        return
    if not isinstance(errors, list):
        raise ParseError(f"Slurm node JSON: 'errors' must be a list, got {_type(errors)}")
    texts = []
    for err in errors[:5]:
        if isinstance(err, dict):
            msg = err.get("description") or err.get("error") or err
            texts.append(str(msg)[:200])
        else:
            texts.append(str(err)[:200])
    raise ParseError("Slurm reported errors: " + "; ".join(texts))


def _node_entry(entry: object, where: str) -> NodeState:
    """One node of the "nodes" list (22.05 sinfo, 23.02+ scontrol)."""
    if not isinstance(entry, dict):
        raise ParseError(f"{where}: expected an object, got {_type(entry)}")
    name = _name(entry.get("name"), where)
    where = f"{where} ({name})"
    if "state" not in entry:
        raise ParseError(f"{where}: no 'state'")
    state, flags = _parse_state(entry["state"], entry.get("state_flags"), where)
    return NodeState(
        name=name,
        state=state,
        flags=flags,
        reason=_opt_str(entry, "reason", where),
        reason_time=_epoch(entry.get("reason_changed_at"), where),
        reason_user=_opt_str(entry, "reason_set_by_user", where),
        partitions=_partitions(entry.get("partitions"), where),
        comment=_opt_str(entry, "comment", where),
    )


def _sinfo_entry(entry: object, where: str) -> List[NodeState]:
    """One (partition, node group) entry of 23.02+ sinfo --json."""
    if not isinstance(entry, dict):
        raise ParseError(f"{where}: expected an object, got {_type(entry)}")
    names = _sinfo_names(entry, where)
    node = entry.get("node")
    if not isinstance(node, dict) or "state" not in node:
        raise ParseError(f"{where}: no 'node.state'")
    state, flags = _parse_state(node["state"], None, where)
    reason, when, user = _sinfo_reason(entry.get("reason"), where)
    if len(names) > 1 and reason:
        # sinfo gives a group the reason of one member only.
        raise ParseError(
            f"{where}: sinfo grouped {len(names)} nodes under one reason; "
            "reasons are not per node, read `scontrol --json show node` instead")
    if len(names) > 1:
        when, user = None, ""
    partition = entry.get("partition")
    parts: Tuple[str, ...] = ()
    if partition is not None:
        if not isinstance(partition, dict):
            raise ParseError(f"{where}: 'partition' must be an object, got {_type(partition)}")
        if partition.get("name") is not None:
            parts = (_name(partition.get("name"), where, "partition name"),)
    return [NodeState(n, state, flags, reason, when, user, parts) for n in names]


def _sinfo_names(entry: dict, where: str) -> List[str]:
    nodes = entry.get("nodes")
    listed = nodes.get("nodes") if isinstance(nodes, dict) else None
    if isinstance(listed, str) and listed:
        listed = [listed]  # a single name; hostlist ranges are refused by _name
    if not isinstance(listed, list):
        raise ParseError(f"{where}: 'nodes.nodes' must be a list of node names")
    return [_name(n, where) for n in listed]


def _sinfo_reason(value: object, where: str) -> Tuple[str, Optional[int], str]:
    if value is None:
        return "", None, ""
    if isinstance(value, str):
        return value, None, ""
    if not isinstance(value, dict):
        raise ParseError(f"{where}: 'reason' must be an object, got {_type(value)}")
    return (_opt_str(value, "description", where),
            _epoch(value.get("time"), where),
            _opt_str(value, "user", where))
