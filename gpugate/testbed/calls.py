"""What a line of the test cluster's Slurm call log (the scontrol/sinfo
shims, and GPUGATE_SLURM_TRACE of the pyslurm backend) costs slurmctld:

- ``full``: a whole node-table read (REQUEST_NODE_INFO): ``sinfo --json``,
  ``sinfo`` without ``-n``, ``scontrol --json show node [HOSTLIST]``
  (scontrol loads every node and filters itself), and the pyslurm worker's
  ``scontrol show node`` without one plain name;
- ``single``: the single-node read (REQUEST_NODE_INFO_SINGLE): ``sinfo -n
  NODE``, the pyslurm worker's ``scontrol show node NODE``, and
  ``libslurm show node NODE`` (gpugate.slurm.libslurm: that RPC alone, a
  node's own read with either backend);
- ``update``: ``scontrol update`` (a drain, an undrain, a comment);
- ``other``: anything else (``sinfo --version``, jobs, reservations)."""


def split(line: str):
    """(SLURMD_NODENAME of the caller, "" when it had none; tool; arguments).
    gpugate runs Slurm's tools with a clean environment, so a node-side
    call says which node it is about, not who made it: see ``about``."""
    words = line.split(" ")
    node, rest = words[0], words[1:]
    return node, (rest[0] if rest else ""), rest[1:]


def about(line: str) -> str:
    """The one node a call reads or updates (``-n X``, ``NodeName=X``, the
    pyslurm worker's ``show node X``), or "" (the fleet, or none)."""
    _node, _tool, args = split(line)
    for i, arg in enumerate(args):
        if arg == "-n" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("NodeName="):
            return arg[len("NodeName="):]
    if "show" in args and "node" in args and "--json" not in args:
        names = args[args.index("node") + 1:]
        return names[0] if names else ""
    return ""


def kind(line: str) -> str:
    _node, tool, args = split(line)
    if tool == "libslurm":
        return "single"
    if tool == "sinfo":
        if "--version" in args:
            return "other"
        return "single" if "-n" in args else "full"
    if tool == "scontrol":
        if args[:1] == ["update"] and any(a.startswith("NodeName=") for a in args):
            return "update"
        if "show" in args and "node" in args:
            names = args[args.index("node") + 1:]
            if "--json" in args or not names:
                return "full"
            return "single" if not any(c in names[0] for c in "[],") else "full"
    return "other"
