"""How much of its node a Kubernetes hold takes, for the drain budget
(gpugate.budget.rules.share_of).  Pure.

A Node held (gpugate's taint) counts 1.  A node whose GPUs are held alone
(DeviceTaintRules, gpugate.kube.dra) counts k/n: k GPUs held of the n its
DRA driver publishes in its ResourceSlices, both kept in gpugate's record
on the Node when the rules are written (``"gpus"``, ``"of"``).  A node
waiting for the keeper with one GPU's budgeted finding counts what its
hold would take: the GPUs its agent offers to hold alone (after its
published span in ``gpugate.io/pending``, with the count of GPUs it
read) over that count.
Never more than 1; anything not of that shape counts 1 (the safe side).

The share rides on the state's class (a NodeState subclass per share), so
it survives every ``replace`` the keeper makes of a state on its way."""

from __future__ import annotations

import json

from gpugate.slurm.nodestate.record import NodeState

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Optional

# The agent's offer, after its published span in gpugate.io/pending (an annotation its admission
# policy lets it write): " [gpugate-gpus {"of": n, "gpus": {index: {"uuid", "pci"}}}]".
OPEN = " [gpugate-gpus "
MOST = 64  # GPUs a node may say it has; more is not believed
_KINDS: Dict[float, type] = {}


def kind(share: float) -> type:
    """NodeState, or its subclass whose states count ``share`` of a node."""
    if not 0 < share < 1:
        return NodeState
    found = _KINDS.get(share)
    if found is None:
        found = _KINDS[share] = type("NodeState", (NodeState,), {"share": share, "__module__": __name__})
    return found


def fraction(gpus, of) -> float:
    """k/n for the GPU indices ``gpus`` of ``of``; 1 for anything else."""
    if not isinstance(gpus, (list, tuple, set, frozenset)) or not gpus or isinstance(of, bool):
        return 1.0
    if not all(isinstance(g, int) and not isinstance(g, bool) and 0 <= g < MOST for g in gpus):
        return 1.0
    if not isinstance(of, int) or not 0 < of <= MOST:
        return 1.0
    return min(1.0, len(set(gpus)) / max(of, max(gpus) + 1))


def held_share(record: Dict[str, Any]) -> float:
    """The share of gpugate's record of GPUs held alone (nodeview.owned)."""
    return fraction(record.get("gpus"), record.get("of"))


def split(comment: str):
    """(the published comment without the offer, the offer or None):
    {"of": n, "gpus": {index: {"uuid", "pci"}}} with int indices."""
    at = comment.rfind(OPEN) if comment else -1
    if at < 0 or not comment.endswith("]"):
        return comment, None
    text = comment[at + len(OPEN):-1]
    try:
        data = json.loads(text) if len(text) <= 16384 else None
    except ValueError:
        data = None
    gpus = data.get("gpus") if isinstance(data, dict) else None
    if not isinstance(gpus, dict) or not gpus:
        return comment[:at], None
    out = {}
    for key, ident in gpus.items():
        if not (isinstance(key, str) and key.isdigit() and isinstance(ident, dict)):
            return comment[:at], None
        out[int(key)] = {k: v for k, v in ident.items() if k in ("uuid", "pci") and isinstance(v, str)}
    return comment[:at], {"of": data.get("of"), "gpus": out}


def with_offer(comment: str, gpus: Dict[int, Dict[str, str]], held, of: int) -> str:
    """The comment with the agent's offer to hold ``held`` alone after it."""
    return comment + OPEN + json.dumps({"of": int(of), "gpus": {str(g): gpus.get(g) or {} for g in sorted(held)}},
                                       sort_keys=True, separators=(",", ":")) + "]"


def waiting_share(found: Optional[Dict[str, Any]]) -> float:
    """The share a waiting node's offer would take (1: none)."""
    return 1.0 if found is None else fraction(sorted(found["gpus"]), found["of"])
