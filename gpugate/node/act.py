"""Act on a verdict in Slurm: read the node's state, apply the ownership
rules, then drain / update / undrain.

No controller RPC on the healthy path unless a marker in the state directory
says gpugate drained this node (whichever of health check, prolog or epilog
did): only then may a fit verdict have a drain to clear."""

import os
from typing import Any, Dict

from ..errors import GpugateError
from ..slurm import connect, ownership

MARKER = "drained-by-gpugate"


def marker_path(settings, node: str) -> str:
    return os.path.join(settings.state_dir(node), MARKER)


def act(settings, node: str, verdict, check_fit: bool = False) -> Dict[str, Any]:
    """Returns what happened: action, why, ok (False: Slurm did not answer;
    the caller keeps what it needs to try again next run)."""
    marker = marker_path(settings, node)
    if verdict.fit and not check_fit and not os.path.exists(marker):
        return {"action": ownership.NONE, "ok": True, "rpc": False}
    try:
        slurm = connect(settings)
        state = slurm.nodes(node).get(node)
        decision = ownership.decide(state, verdict, settings.reason_tag, settings.slurm["self_clearing"])
        if decision.kind in (ownership.DRAIN, ownership.UPDATE):
            slurm.drain(node, decision.reason)
        elif decision.kind == ownership.UNDRAIN:
            slurm.undrain(node)
    except GpugateError as exc:
        return {"action": "failed", "ok": False, "error": str(exc)[:300], "rpc": True}
    ours = decision.kind in (ownership.DRAIN, ownership.UPDATE) or (
        decision.kind in (ownership.KEEP, ownership.NONE) and state is not None and state.drain)
    _set_marker(marker, ours)
    return {"action": decision.kind, "why": decision.why, "ok": True, "rpc": True}


def _set_marker(path: str, present: bool) -> None:
    try:
        if present:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w"):
                pass
        elif os.path.exists(path):
            os.unlink(path)
    except OSError:
        pass  # worst case: one extra RPC, or a probe drain cleared by the sweep
