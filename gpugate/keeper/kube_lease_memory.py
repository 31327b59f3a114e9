"""The keeper's memory kept on its Lease (gpugate.kube.lease): the spans it
drained (gpugate.budget.memory) and the pools each held node counts in
(gpugate.budget.pools), written only while this keeper holds the Lease."""

from __future__ import annotations

from gpugate.kube.client import KubeError
from gpugate.kube.lease import MEMORY, MEMORY_CAP, NAME, RELEASED, STATUS, STATUS_KEYS, annotate, annotation, held_by, lease_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional


def read_memory(client, namespace: str, name: str = NAME):
    """The memory the leader kept on the Lease (a gpugate.budget.memory.Memory,
    its pools included; empty when none, or not gpugate's shape)."""
    from gpugate.budget.memory import Memory, parse
    from gpugate.budget.pools import decode

    data = annotation(client.get(lease_path(namespace, name)), MEMORY)
    return Memory(parse(data), decode(data.get("pools")))



def write_memory(client, namespace: str, identity: str, memory: Optional[dict], name: str = NAME,
                 status: Optional[dict] = None) -> None:
    """Kept on the Lease while ``identity`` still holds it (a keeper that lost
    it writes nothing); the write carries the resourceVersion read.  The
    pools are kept whole (a held node not counted could take the budget
    twice): more than fit is an error; the spans fill what is left, the
    most recent kept.  status: the run's (STATUS), written with it."""
    import json

    from gpugate.budget.memory import newest
    from gpugate.budget.pools import encode

    lease = held_by(client, namespace, identity, name)
    values = {RELEASED: None}
    if memory is not None:  # None: only the status (a run that decided nothing keeps the memory as it is)
        stored = {"pools": encode(getattr(memory, "pools", None) or {})}
        room = MEMORY_CAP - len(json.dumps(stored, sort_keys=True, separators=(",", ":"))) - 12  # ,"nodes":{}
        if room < 0:
            raise KubeError("the keeper's memory of held nodes' pools is over %d KiB: not written (the keeper's "
                            "Lease %s/%s keeps the last one)" % (MEMORY_CAP >> 10, namespace, name))
        stored["nodes"] = newest(memory, room)
        values[MEMORY] = stored
    if status is not None:
        values[STATUS] = {k: v for k, v in status.items() if k in STATUS_KEYS}
    annotate(lease, values)
    client.replace(lease_path(namespace, name), lease)
