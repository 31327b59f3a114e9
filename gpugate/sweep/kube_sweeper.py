"""`gpugate sweep` on Kubernetes: the Slurm sweep's planner, journal,
ladder, verification, escalation and history (gpugate.sweep.engine), with
the steps that are Slurm's done the Kubernetes way:

- wait_drained: the node's pods leave through the Eviction API
  (gpugate.kube.evict); a PodDisruptionBudget that refuses is asked again
  each poll until drain_timeout, then the node is deferred, held, with the
  budget named.  Never bypassed: --force is refused on Kubernetes.  The
  pods are listed again before each GPU reset, reboot and smoke Pod (a pod
  bound by spec.nodeName, or tolerating everything, passes the cordon and
  the taint): what came since is evicted the same way, or the node deferred.
  Only gpugate's own smoke Pod is spared (evict.OwnSmoke), never a pod
  because of its label, and a DaemonSet's pod only while it requests no
  GPU (evict.gpus_requested): one that does is evicted, and if its
  DaemonSet makes it again the node is deferred with it named;
- reboot / wait_up (gpugate.sweep.kube_reboot): the site's [kubernetes]
  reboot command; the reboot is proven by a new bootID in the Node's status
  and Ready again (the bootID before it is journaled, so a sweeper killed
  in between proves it after), then its GPUs allocatable again;
- smoke: a Pod bound to the node (gpugate.kube.smokepod), judged as the
  Slurm job is; a Pod the kubelet refused, or not started by smoke_deadline
  (its image not pulled, not scheduled: the site's), proves nothing: the
  node is deferred, held, the reason said, never failed; except a refusal
  for GPUs the Node counts but does not offer (its device plugin reports
  them unhealthy): the node's; and a container that could not be made
  or started (CreateContainerError, StartError) where the same image
  started on another node in this sweep: the node's (_start_errors);
- reservations: none; gpugate's taint and cordon keep every pod off while
  the sweep has the node, and resume lifts only those (KubeNodes.resume).

Verification, evidence and GPU resets go through the same transport as on
Slurm ([sweep] transport: gpugate on the node over ssh, or local)."""

from __future__ import annotations

from gpugate.model import reason as reasons
from gpugate.model.findings import RMA, Finding
from gpugate.sweep import journal as jr
from gpugate.sweep.engine import Sweeper
from gpugate.judges.smoke import template
from gpugate.sweep.smoke import SmokeResult, _command_key, _want, finding
from gpugate.sweep.steps import hostlist
from gpugate.kube import evict
from gpugate.kube import gpus
from gpugate.kube.client import KubeError, node_path
from gpugate.kube.gpus import resource_for
from gpugate.sweep.kube_gpu_repair import KubeGpuRepair
from gpugate.sweep.kube_reboot import KubeRebootSteps
from gpugate.kube.smokepod import SmokePods, nonce, pod_name, pod_spec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict

# A Pod that never started for these reasons says nothing of the node, and no node would do better:
# the site's image name; the sweep stops.  (An image that pulls slowly or not at all, from a registry
# that may answer later, defers the node instead: smokepod.site_wait; a container that could not be
# made or started is compared with the other nodes': _start_errors.)
_SITE_WAITING = ("InvalidImageName", "ErrImageNeverPull")
# The kubelet ends the Pod only well after the sweep's two clocks (start, then run) have run out.
_ACTIVE_MARGIN = 30


class NodeSweeper(KubeRebootSteps, Sweeper):
    """Sweeper with slurm = gpugate.kube.nodes.KubeNodes (its reboot and wait_up: gpugate.sweep.kube_reboot),
    a node at a time."""

    smoke_unit = "pod"

    # ------------------------------------------------------- no reservations
    def cleanup_reservations(self) -> None:
        """Smoke Pods an interrupted sweeper left behind go first (they hold GPUs)."""
        pods = SmokePods(self.slurm.client, self._namespace())
        left = pods.leftovers()
        if left:
            self.say("deleting %d smoke Pod(s) an interrupted sweep left: %s" % (len(left), ", ".join(left)))
            pods.delete(left)

    def _reserve(self, nodes) -> None:
        return None

    def _release_reservations(self, nodes) -> None:
        return None

    def _namespace(self) -> str:
        return str(self.settings.kubernetes.get("smoke_namespace") or "gpugate-smoke")

    def _key(self):
        """The drain budget key, which signs the smoke Pods (None where this sweeper cannot read it:
        then only the Pods this run made are its own)."""
        if not hasattr(self, "_smoke_key"):
            from gpugate.safety import budgetkey

            try:
                self._smoke_key = budgetkey.load(self.settings)
            except budgetkey.KeyUnavailable:
                self._smoke_key = None
        return self._smoke_key

    def _own(self) -> evict.OwnSmoke:
        return evict.OwnSmoke(self._namespace(), self._key(), getattr(self, "_made", ()))

    def _gpus(self) -> tuple:
        """The site's GPU resources ([kubernetes] smoke_resource, smoke_resource_amd): a DaemonSet's pod
        that requests one is evicted (evict.gpu_resource adds nvidia.com/gpu, amd.com/gpu, .../gpu)."""
        kube = self.settings.kubernetes
        return tuple(str(kube.get(k)) for k in ("smoke_resource", "smoke_resource_amd") if kube.get(k))

    # ------------------------------------------------------------- evictions
    def _step_wait_drained(self, nodes, records) -> None:
        self._begin(nodes, "wait_drained")
        for name, why in sorted(self._evict_wait(
                nodes, lambda name, found: self._done(name, "wait_drained", "no pod left to evict")).items()):
            self._defer_held(name, why)

    def _evict_again(self, nodes, before: str) -> list:
        """The nodes' pods listed again before ``before``: what came since the
        drain (bound by spec.nodeName, or tolerating the cordon and the taint)
        goes the same way; a node that still has pods at drain_timeout is
        deferred, held.  Returns the nodes clear to go on."""
        def cleared(name, found):
            if found:
                what = "%d pod(s) came since the drain, evicted before %s: %s" % (len(found), before,
                                                                                 ", ".join(found[:3]))
                self.journal.stage(name, "evict", jr.DONE, what)
                self.say("  %s: %s" % (name, what))

        late = self._evict_wait(nodes, cleared)
        for name, why in sorted(late.items()):
            self._defer_held(name, "before %s: %s" % (before, why))
        return [n for n in nodes if n not in late and n not in self.handled]

    def _defer_held(self, name, why) -> None:
        self.journal.record(name, "deferred", jr.DONE, detail=why)
        self._finish(name, "deferred", why + "; held for the next run")
        self.say("  %s: deferred: %s" % (name, why))

    def _lost(self, name, st) -> bool:
        """Left when gpugate's hold on it is gone (someone else's now, or no Node)."""
        if st is None or not st.drain or reasons.parse(st.reason, self.tag) is None:
            self._leave(name, "its hold is no longer gpugate's: %r" % (st.reason if st else "gone"))
            return True
        return False

    def _evict_wait(self, nodes, cleared) -> Dict[str, str]:
        """Evict until no pod that must go is left (cleared(node, the pods the first round found)) or
        drain_timeout: {node: why} of those with pods left then."""
        refused: Dict[str, str] = {}
        still: Dict[str, list] = {}
        found: Dict[str, list] = {}
        own, gpus = self._own(), self._gpus()

        def settle(states, waiting):
            for name in sorted(waiting):
                if self._lost(name, states.get(name)):
                    yield name
                    continue
                left, why = evict.evict_round(self.slurm.client, name, own, gpus)
                found.setdefault(name, list(left))
                if not left:
                    cleared(name, found[name])
                    yield name
                    continue
                still[name] = left
                if why:
                    refused[name] = "; ".join("%s: %s" % item for item in sorted(why.items())[:2])
                else:
                    refused.pop(name, None)

        return {name: ("eviction refused at the drain timeout (PodDisruptionBudgets are respected, never "
                       "bypassed): " + refused[name]) if name in refused else (
            "pods still on the node at the drain timeout (terminating, or made again by their DaemonSet): "
            + ", ".join(still.get(name, [])[:3]))
            for name in self._wait(nodes, settle, float(self.cfg["drain_timeout"]))}

    def _step_reset(self, nodes, records) -> None:
        nodes = self._evict_again(nodes, "the GPU reset")
        if nodes:
            super()._step_reset(nodes, records)

    def _still_held(self, nodes, before: str) -> list:
        """The nodes gpugate still holds; any other is left (its hold is someone else's now)."""
        states, out = self._states(nodes), []
        for name in nodes:
            st = states.get(name)
            if st is None or reasons.parse(st.reason, self.tag) is None:
                self._leave(name, "its hold changed before %s: %r" % (before, st.reason if st else "gone"))
            else:
                out.append(name)
        return out

    # ---------------------------------------------------------------- smoke
    def _smoke_nodes(self, nodes, records) -> None:
        kube = self.settings.kubernetes
        if not kube.get("smoke_image"):
            return self._smoke_cannot_run(nodes, "[sweep] smoke is set but [kubernetes] smoke_image is not")
        group = self._still_held(nodes, "the smoke Pod")
        uncounted = [n for n in group if not self.baseline.expect_for(n).gpus]
        if uncounted:  # a Pod asking for no GPUs would fail the node for the baseline's gap
            return self._smoke_cannot_run(group, "the baseline names no GPU count for %s: the smoke Pod cannot "
                                                 "ask for the node's GPUs" % hostlist(uncounted))
        group = self._evict_again(group, "the smoke Pod") if group else group
        if not group:
            return
        deadline = float(self.cfg["smoke_deadline"])
        specs, argvs = {}, {}
        self._made = set()
        for name in group:
            argvs[name] = self.cfg[_command_key(self.baseline, name, False)]
            gpus = self.baseline.expect_for(name).gpus
            specs[name] = pod_spec(pod_name(name, nonce()), name, self._namespace(), str(kube["smoke_image"]),
                                   template(argvs[name], name, gpus), gpus, resource_for(kube, self.baseline, name),
                                   int(2 * deadline) + _ACTIVE_MARGIN, self._key())
            self._made.add(specs[name]["metadata"]["name"])
            self.say("  %s: smoke Pod %s" % (name, specs[name]["metadata"]["name"]))
        try:
            answers = SmokePods(self.slurm.client, self._namespace(), self.sleep).run(
                specs, deadline, float(self.cfg["poll_seconds"]))
        except KubeError as exc:
            return self._smoke_cannot_run(group, "the smoke Pod cannot be made or read: %s" % exc)
        self._smoke_started = getattr(self, "_smoke_started", set()) | {n for n in group if answers[n]["started"]}
        broke = {n: answers[n]["start_error"] for n in group if answers[n]["start_error"]}
        rest = [n for n in group if n not in broke]
        results = {name: self._judge(name, answers[name], deadline, argvs[name]) for name in rest}
        not_run = {n: answers[n].get("not_run") for n in rest if answers[n].get("not_run") and not results[n].site}
        site = self._journal_smoke([n for n in rest if n not in not_run], results, [], {})
        if site:
            return self._smoke_cannot_run(group, site)
        self._start_errors(broke, answers, records)
        for name in sorted(not_run):
            bad = self._unhealthy(name, answers[name])
            if bad is not None:  # the node's own GPUs, not the site's or another pod's: a finding
                why = "the kubelet refused the smoke Pod: %d of %d %s healthy (the device plugin's count)" % bad
                self._smoke_failed(name, records[name], Finding(RMA, "allocatable", "%d/%d %s" % bad, str(bad[1]),
                                                                "rma"), "pod %s: %s" % (answers[name]["pod"], why), why)
                continue
            self._smoke_not_run(name, answers[name]["pod"], not_run[name])
        for name in rest:
            if name in not_run:
                continue
            res = results[name]
            detail = "pod %s %s in %.0fs" % (res.job, "passed" if res.passed else res.problem, res.seconds)
            if res.passed:
                self._done(name, "smoke", detail)
                continue
            self._smoke_failed(name, records[name], finding(res.problem), detail, "smoke all_reduce " + res.problem)

    def _smoke_failed(self, name, rec, found: Finding, detail: str, why: str) -> None:
        """The node's own failure: its finding, journaled, the sweep's ladder (a retry, then escalation)."""
        self.failures.add(name)
        self.last_findings[name] = [found]
        self.journal.record(name, "smoke", jr.FAILED, detail=detail)
        self._attempt_failed(name, rec, why)

    def _start_errors(self, broke: Dict[str, str], answers, records) -> None:
        """Smoke containers that could not be made or started (CreateContainerError, StartError, ...: the
        runtime, the NVIDIA container toolkit's hook): the node's where the same image started on another
        node in this sweep (a finding, the ladder); the site's where it started on none (deferred, held)."""
        for name in sorted(broke):
            pod, peers = answers[name]["pod"], sorted(self._smoke_started - {name})
            if not peers:
                self._smoke_not_run(name, pod, "the site's: its container could not be made or started and the "
                                               "smoke image started on no node of this sweep (%s)" % broke[name])
                continue
            why = "smoke container not started here (%s) while the same image started on %s" % (
                broke[name], hostlist(peers))
            reason = broke[name].partition(":")[0]
            self._smoke_failed(name, records[name], Finding(RMA, "smoke", "container " + reason, "started", "rma"),
                               "pod %s: %s" % (pod, why), why)

    def _unhealthy(self, name: str, answer: dict):
        """A refusal for want of GPUs the Node counts but does not offer (capacity >= asked > allocatable:
        its device plugin reports them unhealthy) is the node's: (allocatable, capacity, resource); else
        None (another pod holding them leaves allocatable as it is: deferred)."""
        resource = resource_for(self.settings.kubernetes, self.baseline, name)
        asked = self.baseline.expect_for(name).gpus or 0
        if answer.get("why") != "OutOf" + resource or not asked:
            return None
        try:
            node = self.slurm.client.get(node_path(name))
        except KubeError:
            return None
        cap, have = gpus.count(node, resource, "capacity"), gpus.count(node, resource)
        if cap is None or have is None or cap < asked or have >= asked:
            return None
        return have, cap, resource

    def _smoke_not_run(self, name: str, pod: str, why: str) -> None:
        """A smoke Pod that never ran proves nothing about the node: deferred, held, never a finding."""
        try:
            own, gpus = self._own(), self._gpus()
            there = [evict.label_of(p) for p in evict.pods_on(self.slurm.client, name) if evict.must_go(p, own, gpus)]
        except KubeError:
            there = []
        self._defer_held(name, "the smoke Pod %s could not run, %s: not a finding against the node%s" % (
            pod, why, "; pods on the node now: " + ", ".join(there[:3]) if there else ""))

    def _judge(self, name: str, answer: dict, deadline: float, argv) -> SmokeResult:
        import os

        from gpugate.judges.smoke import cannot_run, judge_smoke
        from gpugate.parsers.nccl import parse_nccl_tests

        res = SmokeResult(name, answer["pod"], seconds=answer["seconds"])
        want = _want(self.baseline, [name])
        if answer["late"] and answer["why"] in _SITE_WAITING:
            res.problem = res.site = "the smoke Pod never started: %s (the image [kubernetes] smoke_image)" % (
                answer["why"])
            return res
        if answer["late"] or answer["why"] == "DeadlineExceeded":
            res.problem = judge_smoke(None, None, True, want, deadline_s=deadline).problem
            return res
        text, code = answer["message"], answer["exit"]
        parsed = parse_nccl_tests(text)
        site = cannot_run(parsed, code, text)
        if site:
            res.problem, res.site = "cannot run: " + site, site
            return res
        nccl_tests = any(os.path.basename(str(word)).endswith("_perf") for word in argv)
        verdict = judge_smoke(parsed, code, False, want, require_result=nccl_tests)
        res.passed, res.problem = verdict.passed, verdict.problem
        return res


class KubeSweeper(KubeGpuRepair, NodeSweeper):
    """The Kubernetes sweep: a node whose GPUs gpugate holds alone is repaired GPU by GPU, the Node
    serving (gpugate.sweep.kube_gpu_repair); any other node whole (NodeSweeper)."""
