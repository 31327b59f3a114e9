"""The labels a Kubernetes GPU operator published on this node's own Node
(one GET, bounded), for gpugate.judges.operator.  A Slurm node has none.
A read that fails is said (the judge makes it a probe finding where the
baseline requires the labels), never taken for labels that agree."""

from __future__ import annotations

from ..errors import GpugateError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, Optional, Tuple


def read(settings, node: str, timeout: float = 5.0) -> Tuple[Optional[Dict[str, str]], str]:
    """(labels, "") or (None, why); (None, "") off Kubernetes.  Under
    Slurm on Kubernetes, the labels of the Node that runs this Slurm node."""
    if getattr(settings, "scheduler", "slurm") not in ("kubernetes", "slurm+kubernetes"):
        return None, ""
    from ..kube.nodes import connect
    from ..kube.paired import node_name

    node = node_name(settings, node)
    try:
        backend = connect(settings, timeout=timeout)
    except GpugateError as exc:
        return None, str(exc)
    try:
        if backend.own_record(node) is None:
            return None, "no Node named %s" % node
        labels = (backend.node_object(node).get("metadata") or {}).get("labels") or {}
        return {str(k): str(v) for k, v in labels.items()}, ""
    except GpugateError as exc:
        return None, str(exc)
    finally:
        backend.close()
