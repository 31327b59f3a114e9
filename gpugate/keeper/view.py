"""The keeper's view: a run that drained re-reads the fleet, and the next
run on this host decides on that re-read instead of reading the fleet again,
once, while it is fresh (gpugate.keeper.run's module doc says why that is
safe).  Kept beside the keeper's status, root's."""

from __future__ import annotations

import os

VIEW_FILE = "budget-keeper-view.json"
# The last run's re-read stands in for the next run's read only this fresh
# (the timer runs every 30 s), and only once.
CACHE_SECONDS = 40.0
_VIEW_CAP = 512 << 20


def _path(settings) -> str:
    """Beside the keeper's status (gpugate.keeper.run.status_path): the controller's state directory."""
    return os.path.join(os.path.dirname(os.path.abspath(settings.sweep["journal"])), VIEW_FILE)


def save_view(settings, read_at: float, fleet) -> None:
    """The run's re-read, for the next run (see the module doc): the nodes
    that decide and every partition's size (a Fleet; or a full read)."""
    from gpugate.safety.state import write_json
    from gpugate.slurm.nodestate.lean import Fleet, of_states

    if not isinstance(fleet, Fleet):
        fleet = of_states(fleet)
    rows = [[s.name, s.state, sorted(s.flags), s.reason, s.reason_time, s.reason_user, list(s.partitions), s.comment]
            for s in fleet.states.values()]
    # Under "fleet" (an older keeper finds no "nodes": it reads the fleet, never takes these for all of it).
    write_json(_path(settings),
               {"at": read_at, "fleet": {"nodes": fleet.nodes, "sizes": fleet.sizes, "states": rows}}, durable=False)


def take_view(settings, now: float):
    """(read_at, Fleet) of the last run's re-read when fresh; removed
    either way, so that it serves one run at most."""
    from gpugate.safety.state import read_json
    from gpugate.slurm.nodestate import NodeState
    from gpugate.slurm.nodestate.lean import Fleet

    path = _path(settings)
    data = read_json(path, _VIEW_CAP)
    try:
        os.unlink(path)
    except OSError:
        pass
    try:
        at = float(data["at"])
        if not 0 <= now - at <= CACHE_SECONDS:
            return None
        saved = data["fleet"]
        sizes = {str(p): int(n) for p, n in saved["sizes"].items() if not isinstance(n, bool)}
        states, counts = {}, dict.fromkeys(sizes, 0)
        for name, state, flags, reason, when, user, parts, comment in saved["states"]:
            states[name] = NodeState(str(name), str(state), frozenset(flags), str(reason),
                                     None if when is None else int(when), str(user), tuple(parts), str(comment))
            for part in parts:
                counts[part] += 1  # KeyError: a partition without its size
        if len(sizes) != len(saved["sizes"]) or any(counts[p] > n for p, n in sizes.items()):
            return None
        return at, Fleet(states, sizes, int(saved["nodes"]))
    except (TypeError, KeyError, ValueError, AttributeError):
        return None  # absent, damaged or an older keeper's: read the fleet
