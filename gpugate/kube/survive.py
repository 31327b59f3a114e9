"""A hold survives the Node object (node side, Kubernetes).

On Slurm a drain lives in slurmctld's state; on Kubernetes gpugate's hold
lives on the Node object, and `kubectl delete node` (or a cloud node
controller replacing it) followed by the kubelet registering again leaves
a clean Node.  For a one-time event (an Xid 79, seen once in the kernel
log) the next check is fit: without a memory of its own the node would be
back in service without the sweep's proof.  So the node keeps its hold in
its state directory (``FILE``: the reason and the Node's uid it was seen
on), and that record, not the Node, is the authority:

- the Node carries gpugate's hold: the record follows it (reason, uid;
  the node agent follows it too, from every read of its Node, so a hold
  the sweep wrote again on a Node registered during its reboot is known
  before the sweep returns it);
- the Node carries none, and it is the very Node object the hold was on
  (same uid): the hold was lifted there, by the sweep's return after its
  proof (or the keeper's give-back, a probe that cleared, an admin's own
  lift, as an admin's RESUME on Slurm): forgotten;
- a Node registered anew (another uid) without gpugate's hold: held
  again, with the same reason, by the next health check (the node agent
  runs one at once when it sees this);
- someone else holds it (an admin's cordon): nothing written; the record
  stays, and the hold comes back once theirs is lifted.

Where the agent was down through all of a re-registration, the sweep's
hold on the new Node and its return, the node is held again after that
proof, with the reason it had: the safe side (an admin's lift or the next
sweep returns it).

Pure decision (``decide``) apart from the file's I/O."""

from __future__ import annotations

import os
import time

from gpugate.model import reason as reasons
from gpugate.safety.state import KUBE_HOLD
from gpugate.kube import nodeview as nv

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Optional, Tuple

FILE = KUBE_HOLD  # act reads the Node on a fit run while it is there
REMEMBER, FORGET, RESTORE, NOTHING = "remember", "forget", "restore", ""


def _uid(node: Dict[str, Any]) -> str:
    return str((node.get("metadata") or {}).get("uid") or "")


def decide(record: Optional[Dict[str, Any]], node: Dict[str, Any], tag: str) -> Tuple[str, str]:
    """(what to do, the reason): REMEMBER the Node's hold, FORGET the
    record, RESTORE the record's hold on this Node, or NOTHING."""
    held = ((nv.our_taints(node) or nv.devices_held(node))  # (its GPUs held alone: restored as a Node hold)
            and reasons.parse(nv.owned(node).get("reason"), tag) is not None)
    if held:
        reason = nv.owned(node)["reason"]
        if record and record.get("reason") == reason and record.get("uid") == _uid(node):
            return NOTHING, reason
        return REMEMBER, reason
    if not record or not isinstance(record.get("reason"), str) or reasons.parse(record["reason"], tag) is None:
        return (FORGET, "") if record is not None else (NOTHING, "")
    if record.get("uid") == _uid(node) or not _uid(node):  # (a Node read without its uid proves nothing anew)
        return FORGET, ""
    if nv.state_of(node).reason:  # someone else's cordon or taint: theirs stands, ours waits
        return NOTHING, record["reason"]
    return RESTORE, record["reason"]


def path(state_dir: str) -> str:
    return os.path.join(state_dir, FILE)


def read(state_dir: str) -> Optional[Dict[str, Any]]:
    from gpugate.safety.state import read_json

    return read_json(path(state_dir))


def settle(state_dir: str, action: str, reason: str, node: Dict[str, Any]) -> None:
    """The record after ``decide``: written durably (it is the authority
    for a hold the Node lost), removed once the hold is lifted."""
    from gpugate.safety.state import write_json

    if action == REMEMBER:
        write_json(path(state_dir), {"reason": reason, "uid": _uid(node), "at": int(time.time())})
    elif action == FORGET:
        try:
            os.unlink(path(state_dir))
        except FileNotFoundError:
            pass
