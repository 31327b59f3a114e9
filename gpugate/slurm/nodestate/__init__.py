"""Slurm node state, parsed from what sinfo/scontrol print (no subprocess here).

Two readers, each returning ``{node_name: NodeState}``:

* :func:`parse_nodes_json` reads every JSON shape Slurm 22.05 .. 26.05 prints
  for nodes:

  - 22.05 ``sinfo --json`` (openapi/v0.0.38, recorded on Debian 22.05.8):
    top key ``nodes``; ``state`` is the lower-case base (``"idle"``),
    ``state_flags`` a list (``["DRAIN"]``), ``reason_changed_at`` an int,
    ``reason_set_by_user`` a name or null, ``partitions`` a list.
  - 23.02 ``scontrol --json show node`` (data_parser/v0.0.39): same keys, but
    ``state`` is a list holding the base and the flags (``["IDLE", "DRAIN"]``).
  - 23.11 and later (data_parser/v0.0.40 ..): as 23.02, with times wrapped as
    ``{"set": true, "infinite": false, "number": 1700000000}``.
  - 23.02+ ``sinfo --json``: top key ``sinfo``, one entry per (partition,
    group of nodes) with ``nodes.nodes`` (names), ``node.state`` (list),
    ``reason.description/time/user`` and ``partition.name``.

* :func:`parse_nodes_text` reads the output of ``sinfo`` run with
  :data:`SINFO_TEXT_ARGV` and :data:`SINFO_TEXT_ENV` (works on every release).

Both raise :class:`gpugate.errors.ParseError`, and nothing else, for any input.

Which command to run (the runner lives elsewhere):

* 22.05: ``sinfo`` + :data:`SINFO_JSON_ARGV`. It always dumps every node, one
  entry per node, whatever other options are given; 22.05 scontrol has no
  ``--json``.
* 23.02+: ``scontrol`` + :data:`SCONTROL_JSON_ARGV` (top key ``nodes``, one
  entry per node). Prefer it to ``sinfo --json``, whose entries may group
  several nodes: sinfo fills a group's reason from its first node only
  (``_update_sinfo`` in src/sinfo/sinfo.c), so this parser refuses a group of
  several nodes that carries a reason.
* Any release, as a fallback: the text format below.

For readability the work is split: ``record`` (NodeState, state words, the
parse contract), ``fields`` (validators), ``json_shapes`` (every release's
JSON) and ``text`` (the sinfo text fallback); callers import from here.
The budget keeper's own read is apart: ``show_fleet`` (`scontrol show
node`'s text, SCONTROL_TEXT_ARGV, into ``lean``'s Fleet), ``show_text``
(one node's record, the one-RPC read's).

May import: gpugate.core, gpugate.model and gpugate.slurm.pending (the
published-finding format a record's comment carries)."""

from typing import Dict, List

from gpugate.slurm.nodestate.json_shapes import parse_nodes_json
from gpugate.slurm.nodestate.record import _ALIASES, BASE_STATES, KNOWN_FLAGS, NodeState  # noqa: F401 - _ALIASES: the table tests read it
from gpugate.slurm.nodestate.text import parse_nodes_text

__all__ = [
    "NodeState",
    "parse_nodes_json",
    "parse_nodes_text",
    "SINFO_JSON_ARGV",
    "SCONTROL_JSON_ARGV",
    "SCONTROL_TEXT_ARGV",
    "SCONTROL_TEXT_ENV",
    "SINFO_TEXT_FORMAT",
    "SINFO_TEXT_ARGV",
    "SINFO_TEXT_ENV",
]

# 22.05: `sinfo --json` dumps the slurmrestd v0.0.38 node list and ignores all
# other options (src/sinfo/sinfo.c exits through dump_data()).
SINFO_JSON_ARGV: List[str] = ["--json"]

# 23.02+: one entry per node. --all shows nodes whose partitions are hidden.
SCONTROL_JSON_ARGV: List[str] = ["--all", "--json", "show", "node"]

# The budget keeper's read, every release: every node's record as
# slurm_sprint_node_table prints it (gpugate.slurm.nodestate.show_fleet),
# reason times as epoch seconds.  Not sinfo --Node, whose own time grows
# with the square of the fleet (bench/bench_fleet_read.py).
SCONTROL_TEXT_ARGV: List[str] = ["--all", "show", "node"]
SCONTROL_TEXT_ENV = {"SLURM_TIME_FORMAT": "%s"}

# Text fallback. --Format fields are "Name:width suffix"; width 0 prints the
# whole value (no 20-column cut), the suffix "|" separates fields. StateComplete
# prints base+flags ("idle+drain+not_responding"), which %T ("drained*") cannot:
# %T hides DRAIN behind REBOOT/MAINT and does not say whether DRAIN sits on
# IDLE or DOWN. The reason goes last so it may contain "|". -N prints one line
# per (node, partition); --all includes hidden partitions. Nodes that belong to
# no partition are not printed by sinfo at all.
# The node's Comment comes before the reason, ended by the unit separator
# (\x1f, which no one types into a comment; gpugate.slurm.pending never writes it).
SINFO_TEXT_FORMAT = "NodeList:0|,PartitionName:0|,StateComplete:0|,TimeStamp:0|,User:0|,Comment:0\x1f,Reason:0"
SINFO_TEXT_ARGV: List[str] = ["--all", "--noheader", "--Node", "--Format=" + SINFO_TEXT_FORMAT]
# Timestamps as epoch seconds instead of local ISO time. Also run without
# SINFO_* and SLURM_CLUSTERS in the environment: they filter or reshape output.
SINFO_TEXT_ENV: Dict[str, str] = {"SLURM_TIME_FORMAT": "%s"}
