"""The keeper's record of the preflight pins it drained
(budget-keeper-pins.json, controller state beside its status), so that
``[preflight] pins_per_hour`` counts every pin drained in the last hour,
whatever became of the node since: the sweep rewrites the reason of a node
it works on (``sweep=...``), and a RESUME clears it, so Slurm's view alone
would free the allowance at once.

Each entry is a node, when the keeper drained it for a pin, and its
partitions then; entries older than the window are dropped when written, so
the record grows with the pins of one hour, never with the fleet.  Missing,
it is empty (a first run).  Unreadable or garbled, it is None: every pin
then waits (held and said) until it is readable again or removed; a
component that cannot count never drains past its bound."""

import os
from typing import Iterable, List, Mapping, Optional

FILE = "budget-keeper-pins.json"
WINDOW = 3600.0
_CAP = 1 << 20


def path(status_path: str) -> str:
    return os.path.join(os.path.dirname(status_path), FILE)


def load(status_path: str) -> Optional[List[dict]]:
    from gpugate.safety.state import read_json

    where = path(status_path)
    if not os.path.exists(where):
        return []
    return parse(read_json(where, _CAP))


def parse(data) -> Optional[List[dict]]:
    """The entries of a stored record, or None when it is not one."""
    entries = data.get("pins") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not all(_entry(e) for e in entries):
        return None
    return entries


def _entry(e) -> bool:
    return (isinstance(e, dict) and isinstance(e.get("node"), str) and isinstance(e.get("at"), (int, float))
            and not isinstance(e.get("at"), bool) and isinstance(e.get("partitions"), list)
            and all(isinstance(p, str) for p in e["partitions"]))


def noted(entries: Optional[List[dict]], drained: Iterable[str], reasons: Mapping[str, str],
          partitions: Mapping[str, Iterable[str]], tag: str, now: float) -> List[dict]:
    """The record with this run's pin drains added (``reasons``: the reason
    each drained node was drained with) and those past the window dropped."""
    from gpugate.budget.pins import pin_only

    out = [e for e in (entries or []) if now - WINDOW <= float(e["at"]) <= now + 60]
    for name in sorted(drained):
        if pin_only(reasons.get(name, ""), tag):
            out.append({"node": name, "at": round(now, 3), "partitions": sorted(partitions.get(name, ()))})
    return out


def save(status_path: str, entries: List[dict]) -> None:
    from gpugate.safety.state import write_json

    write_json(path(status_path), {"pins": entries}, durable=False)


__all__ = ["FILE", "WINDOW", "load", "parse", "noted", "save"]
