"""What SchedMD's Slinky slurm-operator does to a Slurm node when its
Kubernetes Node is cordoned, for the tests of Slurm on Kubernetes (no
operator runs here).  As its NodeSet documentation says (slurm-operator
docs/usage/nodeset-operations.md, DaemonSet mode: a Slurm node has its
Node's name):

- a cordoned Node: its Slurm node is drained, with the reason it has
  if it has one (any: the operator keeps it, MakeNodeDrain), else one
  prefixed "slurm-operator:";
- an uncordoned Node: a drain whose reason is the operator's (or none) is
  lifted; any other is left (external drains are preserved).

Every drain and undrain it makes is kept in ``actions``, so a test can
say whose reason each carried."""

from __future__ import annotations

import re
import subprocess
import threading
from typing import List, Tuple

PREFIX = "slurm-operator:"


class NodeSetController:
    def __init__(self, admin, cluster, names, poll: float = 0.2):
        self.admin, self.cluster, self.names, self.poll = admin, cluster, list(names), poll
        self.actions: List[Tuple[str, str, str]] = []  # (node, drain|undrain, the reason)
        self.errors: List[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="slinky-nodeset", daemon=True)

    def start(self) -> "NodeSetController":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                self.reconcile()
            except Exception as exc:  # said in the test's failure, never silent
                self.errors.append(str(exc)[:300])

    def _slurm(self, name: str) -> Tuple[bool, str]:
        text = self.cluster.scontrol("show", "node", name)
        drained = re.search(r"State=\S*DRAIN", text) is not None
        found = re.search(r"^\s*Reason=(.*?)(?: \[[^\]]*\])?$", text, re.M)
        return drained, found.group(1).strip() if found else ""

    def reconcile(self) -> None:
        from gpugate.kube.client import node_path

        for name in self.names:
            node = self.admin.get(node_path(name))
            cordoned = bool((node.get("spec") or {}).get("unschedulable"))
            drained, reason = self._slurm(name)
            if cordoned and not drained:
                reason = reason or PREFIX + " Kubernetes node cordoned"
                self._update(name, "State=DRAIN", "Reason=" + reason)
                self.actions.append((name, "drain", reason))
            elif not cordoned and drained and (reason.startswith(PREFIX) or not reason):
                self._update(name, "State=RESUME")
                self.actions.append((name, "undrain", reason))

    def _update(self, name: str, *args: str) -> None:
        # As the operator does through slurmrestd: straight to slurmctld, not gpugate's logged shims.
        subprocess.run(["/usr/bin/scontrol", "update", "NodeName=" + name] + list(args), env=self.cluster.env,
                       capture_output=True, text=True, timeout=30, check=True)
