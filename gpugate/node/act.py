"""Act on a verdict in Slurm: read the node's state, apply the ownership
rules, then drain / update / undrain.  Never on the healthy path unless our
own record says we have a drain to look after."""

from typing import Any, Dict

from ..errors import GpugateError
from ..slurm import connect, ownership


def act(settings, node: str, verdict, drained_by_us: bool) -> Dict[str, Any]:
    """Returns what happened: action, why, ok (False: Slurm did not answer;
    the caller keeps what it needs to try again next run)."""
    if verdict.fit and not drained_by_us:
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
    ours_now = decision.kind in (ownership.DRAIN, ownership.UPDATE) or (
        decision.kind in (ownership.KEEP, ownership.NONE) and state is not None and state.drain)
    return {"action": decision.kind, "why": decision.why, "ok": True, "rpc": True, "drained_by_us": ours_now}
