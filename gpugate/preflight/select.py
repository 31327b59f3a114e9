"""Which jobs get a preflight.  Pure: the job's prolog environment in, a
decision and why out.

A job gets one when its partition is one the site listed in ``[preflight]
partitions``, or when it asks with ``[preflight] job_word`` as a word of its
``--comment`` or ``--extra`` (a user or a submit filter sets them); never on
fewer nodes than ``min_nodes``.  The comment and extra are the user's: read
as words, they can switch the preflight on and nothing else; what runs, at
which level, against which floor, comes from gpugate's configuration only."""

import re
from typing import List, Mapping, Optional, Tuple

# slurmd's prolog environment (src/plugins/prep/script/prep_script_slurmd.c):
# SLURM_JOB_PARTITION, _NUM_NODES and _COMMENT from 22.05, _EXTRA from 23.02,
# SLURM_JOB_NODELIST from 23.02.6 (SLURM_NODELIST before).
_WORDS = re.compile(r"[\s,;]+")


def job_nodes(env: Mapping[str, str]) -> List[str]:
    """The job's nodes in Slurm's order (the same list on every node of it),
    or [] when the list is missing or unreadable."""
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    if not nodelist:
        return []
    from ClusterShell.NodeSet import NodeSet, NodeSetException, RESOLVER_NOGROUP

    try:
        return list(NodeSet(nodelist, resolver=RESOLVER_NOGROUP))  # Slurm's list: no @groups
    except (NodeSetException, ValueError, RecursionError):
        return []


def node_count(env: Mapping[str, str]) -> Optional[int]:
    """SLURM_JOB_NUM_NODES, else the node list's length; None when unknown."""
    raw = env.get("SLURM_JOB_NUM_NODES", "")
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    return len(job_nodes(env)) or None


def asked(cfg: Mapping[str, object], env: Mapping[str, str]) -> str:
    """Who asked for this job's preflight: "partition P", "job" (its word),
    or "" (nobody)."""
    listed = set(cfg.get("partitions") or ())
    for part in (env.get("SLURM_JOB_PARTITION") or "").split(","):
        if part and part in listed:
            return "partition " + part
    word = str(cfg.get("job_word") or "")
    for field in ("SLURM_JOB_COMMENT", "SLURM_JOB_EXTRA"):
        if word and word in _WORDS.split(env.get(field) or ""):
            return "job"
    return ""


def wanted(cfg: Mapping[str, object], env: Mapping[str, str]) -> Tuple[bool, str]:
    """(run it?, why) for the log line."""
    who = asked(cfg, env)
    if not who:
        return False, ""
    count = node_count(env)
    if count is None:
        return False, "asked by %s; the job's node count is unknown: not run" % who
    least = int(cfg.get("min_nodes") or 1)
    if count < least:
        return False, "asked by %s; %d node%s, under min_nodes = %d" % (who, count, "" if count == 1 else "s", least)
    return True, "asked by %s, %d nodes" % (who, count)


def exclusive(env: Mapping[str, str]) -> Tuple[Optional[bool], str]:
    """Slurm's own word on whether the job has its nodes alone, and the
    variable that said it; None where slurmd says nothing (22.05).
    26.05+ says it in SLURM_JOB_EXCLUSIVE (NO, NODE, USER, MCS, TOPO), and
    its SLURM_JOB_OVERSUBSCRIBE is NO for any job that does not share CPUs;
    23.02 to 25.11 say NO there only for ``--exclusive`` (or a partition's
    OverSubscribe=EXCLUSIVE).  ``--exclusive=user`` lets the same user's
    other jobs in: not alone."""
    said = env.get("SLURM_JOB_EXCLUSIVE")
    if said is not None:
        return said in ("NODE", "TOPO"), "SLURM_JOB_EXCLUSIVE=%s" % said[:16]
    said = env.get("SLURM_JOB_OVERSUBSCRIBE")
    if said is not None:
        return said in ("NO", "TOPO"), "SLURM_JOB_OVERSUBSCRIBE=%s" % said[:16]
    return None, ""


def exclusive_gpus(env: Mapping[str, str], count: Optional[int]) -> Optional[List[int]]:
    """Every GPU of the node for a job that holds the whole node in Slurm's
    word (``--exclusive``: exclusive()) where Slurm names no GPU GRES; None
    otherwise (the baseline pins no count, another job may share the node,
    or slurmd does not say)."""
    if exclusive(env)[0] is not True or not count:
        return None
    return list(range(count))
