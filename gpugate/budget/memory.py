"""The keeper's memory of the spans it drained (budget-keeper-drained.json,
controller state beside its status), so that a RESUME is respected.

Issue 33: an admin RESUMEd a node the keeper had drained for ``xid_repeat``;
the keeper (every 30 s) drained it again from the comment the node had not
yet cleared: the node sees the RESUME, and clears its Xid history and its
comment, only at its next health check (minutes).  Slurm keeps no trace of
a RESUME (the reason and its time are cleared), so the keeper remembers
what it drained: a published span (node, first published time) that it
drained and later sees in service was returned by someone (an admin, the
sweep) and is not drained again until the node signs it after that moment.
A node re-signs a standing finding every 30 min (gpugate.node.hold), so a
drift the admin did not fix drains again within that; an ``xid_repeat``,
whose history the RESUME clears, is unpublished by the node's next check
and never drains again.  Waiting costs no budget and no place in the queue.

The memory holds only published nodes' spans (an entry goes with its span),
so it grows with the unfit nodes, never with the fleet.  Lost or garbled,
it is empty: the keeper then behaves as before (it may drain a RESUMEd span
once more), never worse.  Pure apart from load/save.

On Kubernetes the memory lives on the keeper's Lease (gpugate.kube.lease, gpugate.keeper.kube_lease_memory),
so the replica that takes over after a failover has it; on Slurm, in this
file beside the keeper's status."""

import os

FILE = "budget-keeper-drained.json"


class Memory(dict):
    """The spans (node -> entry), and on Kubernetes ``pools``: node -> the
    pools a held node was counted in (gpugate.budget.pools; None: none kept,
    Slurm's partitions being slurm.conf's)."""

    def __init__(self, spans=(), pools=None):
        super().__init__(spans)
        self.pools = pools
_CAP = 64 << 20


def path(status_path: str) -> str:
    return os.path.join(os.path.dirname(status_path), FILE)


def load(status_path: str) -> dict:
    from gpugate.safety.state import read_json

    return parse(read_json(path(status_path), _CAP))


def parse(data) -> dict:
    """The valid entries of a stored memory ({"nodes": {...}}); {} for anything else."""
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(nodes, dict):
        return {}
    return {str(n): e for n, e in nodes.items() if _entry(e)}


def newest(memory: dict, cap: int) -> dict:
    """The memory cut to at most ``cap`` bytes of JSON, the most recently
    drained spans kept (what is dropped may drain once more, as before)."""
    import json

    kept: dict = {}
    size = 2  # "{}"
    for name, entry in sorted(memory.items(), key=lambda item: -float(item[1]["drained"])):
        cost = len(json.dumps({name: entry}, separators=(",", ":"))) - 2 + (1 if kept else 0)  # the pair, a comma
        if size + cost > cap:
            break
        kept[name], size = entry, size + cost
    return kept


def save(status_path: str, memory: dict) -> None:
    from gpugate.safety.state import write_json

    write_json(path(status_path), {"nodes": memory}, durable=False)


def _entry(e) -> bool:
    return (isinstance(e, dict) and isinstance(e.get("since"), int) and not isinstance(e.get("since"), bool)
            and isinstance(e.get("drained"), (int, float))
            and (e.get("returned") is None or isinstance(e.get("returned"), (int, float))))


def review(memory: dict, states, tag: str, now: float):
    """(the memory brought up to date with this read, {node: why} for the
    published nodes that wait for their node to sign again).  ``states``:
    the screened states (each comment the node's own verified span, or none)."""
    from gpugate.budget.rules import published

    kept, waiting = {}, {}
    for name, entry in memory.items():
        state = states.get(name)
        seen = published(state, tag) if state is not None else None
        if seen is None or seen.since != entry["since"]:
            continue  # its span is gone (fit again, cleared, or a new finding): forget it
        entry = dict(entry)
        if state.drain:
            entry["returned"] = None  # drained again (by the keeper after a new signature, or acute)
        elif entry.get("returned") is None:
            entry["returned"] = now
        kept[name] = entry
        if not state.drain and int(seen.seen or 0) <= entry["returned"]:
            waiting[name] = ("returned to service since gpugate drained it: not drained again until the node "
                             "signs its finding again (a standing one within 30 min; an xid_repeat the RESUME "
                             "cleared never)")
    return kept, waiting


def drained(memory: dict, names, states, tag: str, now: float) -> dict:
    """The memory with the spans drained by this run."""
    from gpugate.budget.rules import published

    out = dict(memory)
    for name in names:
        seen = published(states[name], tag) if name in states else None
        if seen is not None:
            out[name] = {"since": int(seen.since), "drained": round(now, 3), "returned": None}
    return out


__all__ = ["FILE", "Memory", "load", "save", "parse", "newest", "review", "drained"]
