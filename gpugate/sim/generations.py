"""A simulated node's generations of files (gpugate.model.simview): each change
made beside the last, then FLEET/NODE pointed at it in one rename."""

import os
import shutil
import stat
import time
import uuid

from gpugate.model import simview
from gpugate.sim.sysroot import SHARED_DIRS

# A run pinned to a generation reads it until it ends, after it was replaced: a check ends within its
# own time budget, a hung one is killed by slurmd's; ten minutes on it is long done.
KEPT_SECONDS = 600.0
SHARED = ".shared"  # FLEET/.shared/NODE: what all of a node's generations share


def begin(fleet: str, node: str):
    """(a new generation's directory, holding the current one's files; the
    current one's, "" for none): the change is written into the new one."""
    gens = os.path.join(fleet, simview.GENS, node)
    os.makedirs(gens, mode=0o755, exist_ok=True)
    new = os.path.join(gens, "%020d-%s" % (time.time_ns(), uuid.uuid4().hex[:8]))
    os.mkdir(new, 0o755)
    live = os.path.join(fleet, node)
    now = simview.generation(fleet, node) or (live if os.path.isdir(live) else "")
    if now:
        os.chmod(new, stat.S_IMODE(os.stat(now).st_mode))  # as the one before, whatever this umask (the CLI's: 077)
        _clone(now, new)
    return new, now


def publish(fleet: str, node: str, new: str, before: str) -> None:
    """FLEET/NODE at ``new`` in one rename; generations no run still reads forgotten."""
    _share(fleet, node, new)
    live, gens = os.path.join(fleet, node), os.path.dirname(new)
    if before == live:
        # A node made before generations: its directory becomes the first.  Once, and not whole for
        # a run reading it at that instant (a directory cannot be swapped for a link in one rename).
        before = os.path.join(gens, "%020d-before" % 0)
        os.rename(live, before)
    link = os.path.join(fleet, ".%s.%s" % (node, uuid.uuid4().hex[:8]))  # a dot: never a node (fleet.nodes)
    os.symlink(os.path.relpath(new, fleet), link)
    os.replace(link, live)
    if before:
        os.utime(before)  # when it stopped being the current one: a run begun before reads it from then on
    _forget(gens, keep=(before, new))


def _share(fleet: str, node: str, new: str) -> None:
    """The node's directories every user writes (sysroot.SHARED_DIRS: what a job's user
    left in /dev/shm, a tmpfs mounted there) are one for all its generations:
    FLEET/.shared/NODE/root/..., linked from each (a clone copies the link)."""
    for rel in SHARED_DIRS:
        path = os.path.join(new, "root", rel)
        if os.path.islink(path) or not os.path.isdir(path):
            continue
        shared = os.path.join(fleet, SHARED, node, "root", rel)
        if os.path.isdir(shared):
            shutil.rmtree(path)  # this generation's own, made empty by the render
        else:
            os.makedirs(os.path.dirname(shared), mode=0o755, exist_ok=True)
            os.rename(path, shared)  # the first one's (its mode: 1777)
        os.symlink(os.path.relpath(shared, os.path.dirname(path)), path)


def _clone(source: str, target: str) -> None:
    """``target`` as ``source``: its files hard-linked (a change replaces a file, never
    writes into it: the old generation keeps what it had), its directories and links made."""
    for entry in os.scandir(source):
        path = os.path.join(target, entry.name)
        if entry.name == simview.SAVED_BY:
            continue
        if entry.is_symlink():
            os.symlink(os.readlink(entry.path), path)
        elif entry.is_dir():
            os.mkdir(path)
            os.chmod(path, stat.S_IMODE(entry.stat(follow_symlinks=False).st_mode))  # exactly: the umask aside
            _clone(entry.path, path)
        else:
            os.link(entry.path, path)


def _forget(gens: str, keep) -> None:
    """Generations replaced over KEPT_SECONDS ago (their mtime: publish touches the one it
    replaces), never the one just made nor the one before it."""
    old, keep = time.time() - KEPT_SECONDS, {os.path.normpath(path) for path in keep if path}
    for entry in os.scandir(gens):
        try:
            if os.path.normpath(entry.path) not in keep and entry.stat(follow_symlinks=False).st_mtime < old:
                shutil.rmtree(entry.path, ignore_errors=True)
        except OSError:
            continue  # another save forgot it first
