"""IMEX (NVLink multi-node domains, GB200 NVL72): judged only on nodes whose
nodeset says ``imex = true``; other nodes are never asked.

A domain that is not UP is reported on every member, but it is budgeted
(not in findings.ACUTE): one peer's failure takes the domain DOWN or
DEGRADED on all its members, and draining all 18 trays of a rack for one
bad tray is the false alarm to avoid.  The drain budget lets the first few
members drain (the jobs of that domain cannot use MNNVL anyway) and holds
the rest; the finding names the peers that are not READY, which is where
the admin looks.  This node's own IMEX service not READY is likewise
budgeted: its config file (the peer list) is the usual cause."""

from __future__ import annotations

from gpugate.model.facts import failed
from gpugate.model.findings import BROKEN, HEALTH, INVESTIGATE, Finding
from gpugate.judges.common import probe_finding

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import List


def judge(baseline, expect, facts) -> List[Finding]:
    status = facts.imex
    if not expect.imex or status is None:
        return []
    if failed(status):
        return [probe_finding("imex", status)]
    out: List[Finding] = []
    if status.service != "READY":
        out.append(Finding(BROKEN, "imex_service", status.service, "READY", INVESTIGATE,
                           detail="nvidia-imex-ctl -q: this node's IMEX service"))
    if status.domain != "UP":
        peers = ["%s %s" % node for node in status.nodes if node[1] != "READY"]
        out.append(Finding(HEALTH, "imex_domain", status.domain, "UP", INVESTIGATE,
                           detail="not READY: %s" % (", ".join(peers) or "none listed")))
    return out
