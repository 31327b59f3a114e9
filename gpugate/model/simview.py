"""The files of a simulated node a gpugate run reads: one whole change.

``gpugate.sim.fleet.save`` makes each change as a new generation of the node's
files (FLEET/.gens/NODE/GEN) and points FLEET/NODE at it with one rename.
A node-side run (gpugate.node.entry) pins the generation it began with and
reads only that one, so a change saved while it runs is seen whole by the
next run and not at all by this one, as on a real node whose change is made
at once (a reboot into another driver).  A change this run made itself (a
GPU reset or a service stopped by the simulated tools it ran) is followed:
each generation names the processes that saved it.

Stdlib only, and read by the prolog: a pin costs one readlink a lookup."""

import os

GENS = ".gens"  # FLEET/.gens/NODE/GEN: a node's generations
SAVED_BY = ".saved-by"  # in a generation: the pids of the process that saved it and its parents

_PINNED = {}  # (fleet, node): the generation's directory this run reads


def node_dir(fleet: str, node: str) -> str:
    """The directory to read the node's files from: its pinned generation,
    else FLEET/NODE (whatever generation it points at when each file is opened)."""
    pinned = _PINNED.get((fleet, node))
    if pinned is None:
        return os.path.join(fleet, node)
    now = generation(fleet, node)
    if now and now != pinned and os.getpid() in saved_by(now):
        _PINNED[(fleet, node)] = pinned = now  # this run's own change (its tool reset a GPU)
    return pinned


def generation(fleet: str, node: str) -> str:
    """The generation FLEET/NODE points at ("" for a node kept in place, as
    a fleet made before generations, or none)."""
    try:
        target = os.readlink(os.path.join(fleet, node))
    except OSError:
        return ""
    return os.path.normpath(os.path.join(fleet, target))


def saved_by(directory: str) -> frozenset:
    try:
        with open(os.path.join(directory, SAVED_BY)) as handle:
            return frozenset(int(word) for word in handle.read().split())
    except (OSError, ValueError):
        return frozenset()


def pin(fleet: str, node: str, directory: str = "") -> None:
    """From now on this process reads the node's current generation (or
    ``directory``, one a parent pinned); a node kept in place stays unpinned."""
    directory = directory or generation(fleet, node)
    if directory:
        _PINNED[(fleet, node)] = directory


def unpin(fleet: str, node: str) -> None:
    _PINNED.pop((fleet, node), None)

