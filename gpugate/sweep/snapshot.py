"""What the sweep sees: every node's Slurm state, and for nodes gpugate
drained, their reason parsed back into class and first finding."""

from typing import Dict, Mapping, Optional, Tuple

from gpugate.model import reason as reasons
from gpugate.core.record import dataclass


@dataclass(frozen=True)
class NodeView:
    name: str
    partitions: Tuple[str, ...]
    drain: bool
    drained: bool  # DRAIN and no jobs left
    draining: bool  # DRAIN and jobs still running
    in_service: bool
    reason: str
    reason_time: Optional[int]
    ours: Optional[reasons.ParsedReason]  # None: not gpugate's drain

    @property
    def out_for_others(self) -> bool:
        """Out of service for a reason that is not gpugate's."""
        return not self.in_service and self.ours is None


@dataclass(frozen=True)
class Snapshot:
    nodes: Mapping[str, NodeView]
    taken_at: float

    def partition_members(self) -> Dict[str, Tuple[str, ...]]:
        members: Dict[str, list] = {}
        for view in self.nodes.values():
            for part in view.partitions:
                members.setdefault(part, []).append(view.name)
        return {p: tuple(sorted(names)) for p, names in members.items()}


def take(states: Mapping[str, object], tag: str, now: float) -> Snapshot:
    """states: name -> NodeState (gpugate.slurm.nodestate)."""
    views = {}
    for name, st in states.items():
        ours = reasons.parse(st.reason, tag) if st.drain else None
        views[name] = NodeView(name=name, partitions=tuple(st.partitions), drain=st.drain, drained=st.drained,
                               draining=st.draining, in_service=st.in_service, reason=st.reason,
                               reason_time=st.reason_time, ours=ours)
    return Snapshot(views, now)
