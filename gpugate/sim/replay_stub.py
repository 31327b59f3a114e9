# Replaying executable of a simulated node (gpugate sim).  Installed as
# FLEET/NODE/bin/<tool> with a "#!python -I -S" line; stdlib only, so it
# starts fast.  It looks its argv up in FLEET/NODE/replay.json: the exact
# "tool arg ..." key first, then the longest "tool prefix *" key.
import json
import os
import sys
import time


def main():
    me = _me()
    here = os.path.dirname(me)
    table_path = os.path.join(os.path.dirname(here), "replay.json")  # of the generation run (gpugate.model.simview)
    live = _live(os.path.dirname(here))  # FLEET/NODE, whichever generation it is at
    key = " ".join([os.path.basename(me)] + sys.argv[1:])
    try:
        with open(table_path) as handle:
            table = json.load(handle)
    except (OSError, ValueError) as exc:
        sys.stderr.write("sim: cannot read %s: %s\n" % (table_path, exc))
        return 125
    entry = table.get(key)
    if entry is None:
        best = ""
        for pattern in table:
            if pattern.endswith(" *") and key.startswith(pattern[:-1]) and len(pattern) > len(best):
                best = pattern
        entry = table.get(best)
    if entry is None:
        sys.stderr.write("sim: no recording for: %s\n" % key)
        return 127
    if entry.get("exec"):
        # A tool that changes the node (gpugate.sim.gpureset): its name, the node's directory, its arguments.
        argv = list(entry["exec"]) + [os.path.basename(me), live] + sys.argv[1:]
        os.execv(argv[0], argv)
    if entry.get("multinode") and _job_nodes():
        entry = _worst(entry["multinode"], key, live)
    if entry.get("hang"):
        while True:  # a wedged tool: only a kill ends it
            time.sleep(3600)
    if entry.get("sleep"):
        time.sleep(float(entry["sleep"]))
    sys.stdout.write(entry.get("stdout", ""))
    sys.stderr.write(entry.get("stderr", ""))
    sys.stdout.flush()
    return int(entry.get("rc", 0))


def _me():
    """This file's path.  gpugate runs the checked file as /proc/self/fd/N:
    that fd names the file opened, in the generation of the node's files the
    run reads; run by its path, the path (the installer writes SELF, the
    path under FLEET/NODE, above this text)."""
    if sys.argv[0].startswith("/proc/self/fd/"):
        try:
            path = os.readlink(sys.argv[0])
            if path.startswith("/") and not path.endswith(" (deleted)"):
                return path
        except OSError:
            pass
    return globals().get("SELF") or os.path.abspath(sys.argv[0])


def _live(directory):
    """FLEET/NODE of a generation FLEET/.gens/NODE/GEN (as gpugate.sim.generations makes them); else itself."""
    gens = os.path.dirname(os.path.dirname(directory))
    if os.path.basename(gens) != ".gens":
        return directory
    return os.path.join(os.path.dirname(gens), os.path.basename(os.path.dirname(directory)))


def _job_nodes():
    """The nodes of a multi-node run: a preflight's collective across a
    job's nodes (GPUGATE_PREFLIGHT_NODES, "a,b,c", gpugate.preflight.cross)
    or a multi-node Slurm job this runs in (the batch script's
    SLURM_JOB_NODELIST, e.g. "gpu[01-02]" or "gpu01,gpu03"), else []."""
    ranks = os.environ.get("GPUGATE_PREFLIGHT_NODES")
    if ranks is not None:
        names = [n for n in ranks.split(",") if n]
        return names if len(names) >= 2 else []
    try:
        if int(os.environ.get("SLURM_JOB_NUM_NODES", "1")) < 2:
            return []
    except ValueError:
        return []
    names, depth, word = [], 0, ""
    for char in os.environ.get("SLURM_JOB_NODELIST", "") + ",":
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            names += _expand(word)
            word = ""
        else:
            word += char
    return [n for n in names if n]


def _expand(word):
    if "[" not in word:
        return [word]
    head, _, rest = word.partition("[")
    ranges, _, tail = rest.partition("]")
    out = []
    for part in ranges.split(","):
        low, _, high = part.partition("-")
        for i in range(int(low), int(high or low) + 1):
            out.append("%s%0*d%s" % (head, len(low), i, tail))
    return out


def _worst(mine, key, live):
    """A multi-node run shows its worst node: each node of the job brings
    its own recording (FLEET/NODE/replay.json, "multinode"), the most
    severe one plays."""
    fleet = os.path.dirname(live)
    best = mine
    for node in _job_nodes():
        try:
            with open(os.path.join(fleet, node, "replay.json")) as handle:
                table = json.load(handle)
        except (OSError, ValueError):
            continue
        entries = [v for k, v in table.items() if k == key or (k.endswith(" *") and key.startswith(k[:-1]))]
        for entry in entries:
            theirs = entry.get("multinode")
            if theirs and theirs.get("severity", 0) > best.get("severity", 0):
                best = theirs
    return best


if __name__ == "__main__":
    sys.exit(main())
