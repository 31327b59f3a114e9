"""The Kubernetes sweep's reboot and its proof (mixed into
gpugate.sweep.kube_sweeper.KubeSweeper):

- reboot: the site's [kubernetes] reboot command; the Node's bootID and
  the GPUs it offered before are journaled first, so a sweeper killed in
  between proves the reboot after;
- wait_up: the Node Ready with a new bootID (reboot_timeout), then its GPUs
  allocatable again ([kubernetes] gpus_allocatable_timeout, counted from
  Ready): the device plugin registers only after the driver loads, on a GPU
  operator's node minutes after Ready.  Verify and the smoke Pod come after
  both.  GPUs that never come back are the node's: the attempt fails, held,
  "its GPUs did not come back" said (then the ladder: a retry, then rma)."""

from __future__ import annotations

import time

from gpugate.model import reason as reasons
from gpugate.errors import CommandError
from gpugate.model.findings import RMA, Finding
from gpugate.safety.runner import run
from gpugate.sweep import journal as jr
from gpugate.sweep.steps import hostlist
from gpugate.node.transport import expand
from gpugate.kube import gpus as gp
from gpugate.kube.client import KubeError, node_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict


class KubeRebootSteps:
    """Needs the sweeper's slurm (KubeNodes), journal, cfg, settings, baseline, say and the engine's helpers."""

    def _gpu_resource(self, name: str) -> str:
        return gp.resource_for(self.settings.kubernetes, self.baseline, name)

    def _offered(self, name: str) -> int:
        """The GPUs the Node offers now (capacity or allocatable), journaled before its reboot; 0 when unread."""
        try:
            return gp.before_reboot(self.slurm.client.get(node_path(name)), self._gpu_resource(name))
        except KubeError:
            return 0

    # --------------------------------------------------------------- reboot
    def _step_reboot(self, nodes, records) -> None:
        template_ = list(self.settings.kubernetes.get("reboot") or [])
        if not template_:
            for name in nodes:
                self.journal.record(name, "reboot", jr.STARTED, detail="no [kubernetes] reboot command")
            self.report.stopped = ("%s need a reboot and gpugate.toml sets no [kubernetes] reboot command (the site's "
                                   "own: a BMC tool, or ssh {node} systemctl reboot): they stay held; set it, then run "
                                   "gpugate sweep again" % hostlist(nodes))
            return
        ready = []
        for name in self._still_held(nodes, "the reboot"):
            before = self._boot_before(name) if records[name].step == "reboot" else ""
            now = self.slurm.boot_id(name)
            if before and now and now != before:
                self._done(name, "reboot", "boot_id=%s gpus=%s (rebooted before the sweeper was interrupted)"
                           % (before, self._gpus_before(name)))
            elif not now:
                self._leave(name, "the Node reports no bootID (status.nodeInfo.bootID): its reboot could not be "
                                  "proven; held")
            else:
                ready.append(name)
        ready = self._evict_again(ready, "the reboot")
        for (_, reason_text), group in self._work_groups(ready, records).items():
            self.slurm.drain(hostlist(group), reason_text)  # the sweep's work reason while it has the node
        timeout = float(self.cfg["converge_timeout"])
        for name in ready:
            # The most it offered, this attempt or an earlier one's (a retry after GPUs that did not come back).
            boot = "boot_id=%s gpus=%d" % (self.slurm.boot_id(name), max(self._offered(name), self._gpus_before(name)))
            self.journal.record(name, "reboot", jr.STARTED, detail=boot)
            try:
                run(expand(template_, [name]), timeout)
            except CommandError as exc:
                self.failures.add(name)
                self.journal.record(name, "reboot", jr.FAILED, detail="%s %s" % (boot, exc))
                self._attempt_failed(name, records[name], "the reboot command failed: %s" % exc)
                continue
            self._done(name, "reboot", boot)

    def _reboot_detail(self, name: str) -> str:
        """The detail journaled when this attempt's reboot was issued."""
        for event in reversed(self.journal.events(name)):
            if event[2] == "reboot" and gp.word(event[6] or "", "boot_id"):
                return event[6]
            if event[2] == "planned":
                break
        return ""

    def _boot_before(self, name: str) -> str:
        return gp.word(self._reboot_detail(name), "boot_id")

    def _gpus_before(self, name: str) -> int:
        value = gp.word(self._reboot_detail(name), "gpus")
        return int(value) if value.isdigit() else 0

    # --------------------------------------------------------------- wait_up
    def _step_wait_up(self, nodes, records) -> None:
        before = {name: self._boot_before(name) for name in nodes}
        self._begin(nodes, "wait_up")
        up_at: Dict[str, float] = {}  # when each node was first seen Ready with a new bootID
        gpu_wait = float(self.settings.kubernetes.get("gpus_allocatable_timeout") or 600.0)
        reboot_wait, began = float(self.cfg["reboot_timeout"]), time.monotonic()
        lost: Dict[str, str] = {}
        said: set = set()  # the nodes whose wait for GPUs was said

        def settle(states, waiting):
            back = []
            for name in sorted(waiting):
                if name in up_at:
                    continue
                st = states.get(name)
                if st is None or st.state != "IDLE" or not st.responding:
                    if time.monotonic() - began >= reboot_wait:
                        lost[name] = "up"
                        yield name
                    continue  # not Ready (yet)
                if st.reason and reasons.parse(st.reason, self.tag) is None:
                    self._leave(name, "its hold changed during the reboot: %r" % st.reason)
                    yield name
                    continue
                now = self.slurm.boot_id(name)
                if now and before[name] and now != before[name]:
                    back.append(name)
                elif time.monotonic() - began >= reboot_wait:
                    lost[name] = "up"
                    yield name
            for (_, reason_text), group in self._work_groups(back, records).items():
                # Held again (a Node registered anew has lost gpugate's taint): out until proven.
                self._hold_again(group, reason_text)
                for name in group:
                    up_at[name] = time.monotonic()
            for name in sorted(n for n in waiting if n in up_at):
                got = self._gpus_back(name, up_at[name], gpu_wait, said)
                if got is None:
                    continue
                if got:
                    lost[name] = got
                else:
                    self._done(name, "wait_up", "boot_id %s -> %s" % (before[name], self.slurm.boot_id(name)))
                yield name

        late = self._wait(nodes, settle, reboot_wait + gpu_wait + float(self.cfg["poll_seconds"]))
        for name in sorted(late):
            got = self._gpus_back(name, up_at[name], 0.0, said) if name in up_at else "up"
            if got:
                lost[name] = got
            else:
                self._done(name, "wait_up", "boot_id %s -> %s" % (before[name], self.slurm.boot_id(name)))
        for name in sorted(lost):
            self.failures.add(name)
            if lost[name] == "up":
                self.journal.record(name, "wait_up", jr.FAILED, detail="no new bootID with Ready=True in time")
                self._attempt_failed(name, records[name], "did not come back from the reboot (no new bootID, Ready)")
                continue
            self.journal.record(name, "wait_up", jr.FAILED, detail=lost[name])
            self._attempt_failed(name, records[name], lost[name])

    def _hold_again(self, group, reason_text: str) -> None:
        """The hold written on Nodes whose kubelet has just started: it writes their status too (its
        conditions, the device plugin's resources), so a write on the Node as read a poll ago may meet
        a conflict; once more on the Node read afresh (KubeNodes drops a Node it could not write)."""
        try:
            self.slurm.drain(hostlist(group), reason_text)
        except KubeError:
            self.slurm.drain(hostlist(group), reason_text)

    def _gpus_back(self, name: str, up_at: float, patience: float, said: set):
        """None while the node's GPUs are awaited; "" once they are back (journaled); why not, once
        ``patience`` seconds past Ready have gone by without them (the node's: a finding)."""
        resource = self._gpu_resource(name)
        try:
            node = self.slurm.client.get(node_path(name))
        except KubeError as exc:
            node, unread = {}, str(exc)[:200]
        else:
            unread = ""
        want = gp.expected(self._gpus_before(name), node, resource, self.baseline.expect_for(name).gpus)
        have = gp.count(node, resource)
        waited = time.monotonic() - up_at
        if not want:
            self.journal.stage(name, "gpus", jr.DONE, "no %s on the Node before or after its reboot, none in the "
                                                      "baseline: none waited for" % resource)
            return ""
        if not unread and have is not None and have >= want:
            self.journal.stage(name, "gpus", jr.DONE, "%d of %d %s allocatable %.0f s after Ready"
                               % (have, want, resource, waited))
            self.say("  %s: %d of %d %s allocatable %.0f s after Ready" % (name, have, want, resource, waited))
            return ""
        now = "unread: " + unread if unread else "%s allocatable" % ("?" if have is None else have)
        if waited < patience:
            if name not in said:
                said.add(name)
                self.say("  %s: Ready with a new bootID; waiting up to %.0f s for its %d %s to be allocatable "
                         "(%s now: the device plugin registers once the driver is loaded)"
                         % (name, patience, want, resource, now))
            return None
        self.last_findings[name] = [Finding(RMA, "allocatable", "%s/%d %s" % (
            "?" if have is None or unread else have, want, resource), "%d" % want, "rma")]
        return ("its GPUs did not come back: %s of %d %s allocatable %.0f s after Ready "
                "([kubernetes] gpus_allocatable_timeout)" % ("?" if have is None or unread else have, want, resource,
                                                             waited))
