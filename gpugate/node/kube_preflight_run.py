"""One Pod's preflight on Kubernetes, as the node agent runs it for the
Pod's init container (gpugate.node.kube_preflight): the same proof as the
Slurm prolog's (gpugate.preflight), held to the same rules.

- This node's own proof (gpugate.preflight.node.prove) on the node's GPUs,
  only where the Pod holds every GPU of the node alone
  (gpugate.node.kube_preflight_pod): a proof on shared GPUs would judge
  another Pod's load.  Any other Pod is "not run" (undecided: it starts).
- Its gang (gpugate.kube.gangs): the Pods that start together, found
  through the objects their controllers write.  Once every one is bound,
  the proof across their nodes (gpugate.preflight.cross.prove_across),
  rank 0 the first of the sorted Node names, the meeting's id the gang's
  key and its Pods' uids (a Pod recreated elsewhere makes a new meeting).
  A gang that has started already (a peer past its preflight: this Pod
  replaces a culprit's) runs no proof across: this node's own decides.
- The outcome acts as the prolog's does (gpugate.node.act): an acute
  finding holds the Node; a budgeted one (a pin across nodes: a job's user
  can slow a shared link) is published for the keeper, which holds it
  within the budget and ``[preflight] pins_per_hour``.  The Pod fails
  ("failed": its controller recreates it elsewhere) where this node was
  found unfit; every other outcome, undecided included, lets it start.
  Nothing is acted on where the Pod left its preflight before the verdict."""

from __future__ import annotations

import hashlib
import os
import time

from gpugate.errors import GpugateError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, List, Tuple

PASSED, FAILED, UNDECIDED = "passed", "failed", "undecided"
GANG_POLL = 1.0  # seconds between reads of the gang's Pods while it is being bound
GANG_POLL_ALL = 3.0  # ... where the gang's Pods have no label to select them by (its namespace listed)
PINNED_SECONDS = 3600.0  # a gang's Pod made anew is refused once where that gang pinned the node, this long


def gang_job(gang, pods: List[dict]) -> str:
    """The meeting's id: the gang and exactly these Pods (uids), so a gang
    whose culprit's Pod was recreated meets anew, never with a stale run."""
    uids = sorted(str((p.get("metadata") or {}).get("uid") or "") for p in pods)
    digest = hashlib.sha256(("\n".join([gang.key] + uids)).encode()).hexdigest()[:24]
    return "kube-%s" % digest


def started_already(pod: dict, container: str) -> bool:
    """The Pod is past its preflight: running, or its preflight container ended."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Running", "Succeeded"):
        return True
    for item in status.get("initContainerStatuses") or []:
        if (item or {}).get("name") == container and ((item.get("state") or {}).get("terminated")):
            return (item["state"]["terminated"] or {}).get("exitCode") == 0
    return False


def bound_gang(list_pods: Callable[[], List[dict]], gang, me_uid: str, container: str, until: float,
               sleep=time.sleep) -> Tuple[List[dict], str]:
    """The gang's Pods once ``gang.size`` of them are bound to Nodes; ([], why) where
    the gang started already, or is not bound in time (undecided)."""
    from gpugate.kube.gangs import in_gang, members

    while True:
        listed = list_pods()
        # A peer past its preflight (running, or finished already) means the gang has started.
        if any(in_gang(gang, p) and (p.get("metadata") or {}).get("uid") != me_uid and started_already(p, container)
               for p in listed if isinstance(p, dict)):
            return [], "the gang has started (this Pod replaces one of it): no proof across its nodes"
        pods = members(gang, listed)
        bound = [p for p in pods if (p.get("spec") or {}).get("nodeName")]
        if len(bound) >= gang.size:
            return bound, ""
        every = GANG_POLL if gang.selector else GANG_POLL_ALL
        if time.monotonic() + every > until:
            return [], "undecided: %d of the gang's %d Pods bound in time" % (len(bound), gang.size)
        sleep(every)


def run_pod(settings, node: str, kube_node: str, client, pod: dict, progress: Callable[[str], None],
            pinned: Dict[str, list], still_here: Callable[[], str]) -> Tuple[str, str, Dict[str, object]]:
    """(verdict, why, the log record's preflight part) for one Pod.  pinned:
    the gangs (keys) this node was found the culprit of: [when, refused];
    a Pod of such a gang made anew and placed here again fails once within
    the hour (its gang's evidence: no other workload is refused for it; as
    Slurm requeues a job once).  still_here(): why the Pod is no longer in
    its preflight ("" while it is): read before acting, so a Pod whose own
    containers started meanwhile never has the node judged under its load."""
    from gpugate.kube.client import node_path
    from gpugate.node.lastgood import load_baseline
    from gpugate.node.kube_preflight_pod import CLAIMED, claimed_gpus, pod_gpus
    from gpugate.preflight.node import prove

    started = time.monotonic()
    cfg = settings.preflight
    record: Dict[str, object] = {}
    baseline = load_baseline(settings, record, node)
    whole = baseline.expect_for(node).gpus
    resource = str(settings.kubernetes.get("smoke_resource_amd" if baseline.vendor_for(node) == "amd"
                                           else "smoke_resource"))
    try:
        offered = ((client.get(node_path(kube_node)).get("status") or {}).get("capacity") or {}).get(resource)
        gpus, why = pod_gpus(pod, whole, resource, offered)
        if why == CLAIMED:
            gpus, why = claimed_gpus(client, pod, kube_node, int(whole))
    except GpugateError as exc:
        gpus, why = [], "the Node or the Pod's ResourceClaims cannot be read: %s (not run)" % str(exc)[:200]
    if not gpus:
        return UNDECIDED, why, dict(record, why=why)
    found: Dict[str, object] = dict(record)
    gang = _gang(settings, client, pod, found)
    seen = pinned.get(gang.key) if gang is not None else None
    if seen is not None and time.time() - seen[0] < PINNED_SECONDS and not seen[1]:
        seen[1] = True
        return FAILED, "this node was found the culprit of this Pod's gang %.0fs ago: its Pod made anew is not " \
                       "run here (once)" % (time.time() - seen[0]), dict(found, why="pinned for this gang")
    progress("this node's own proof (%d GPUs)" % len(gpus))
    proof = prove(settings, baseline, node, gpus, started + float(cfg["timeout_seconds"]))
    pf: Dict[str, object] = dict(proof.to_json(), passed=not proof.findings and not proof.undecided, **found)
    try:
        across = _across(settings, baseline, node, kube_node, client, pod, gang, gpus, proof, started, pf, progress)
    except Exception as exc:  # noqa: BLE001 - the run across cannot decide; the node's own proof still acts
        across, pf["across_error"] = None, "%s: %s" % (type(exc).__name__, str(exc)[:200])
    if across is not None:
        pf["across"] = across.to_json()
        if across.finding is not None:
            proof.findings.append(across.finding)
    pf["undecided"] = list(proof.undecided)  # its environment's too, where it failed
    pf["seconds_total"] = round(time.monotonic() - started, 3)
    gone = still_here() if proof.findings else ""
    if gone:  # its own containers may have run beside the proof: nothing it found is acted on
        pf["not_acted"] = gone
        return UNDECIDED, "the Pod left its preflight before the verdict (%s): nothing acted on" % gone[:200], pf
    acted = _settle(settings, node, proof, across, pf)
    # The Pod fails where this node is held (an acute finding) or is the gang's culprit (its pin is
    # budgeted: published for the keeper), so its controller recreates it elsewhere, as Slurm requeues
    # the job; a budgeted finding of its own lets it start, as the prolog does.
    if across is not None and across.finding is not None:
        pinned[gang.key] = [time.time(), False]
        return FAILED, "this node is the gang's culprit: %s" % acted, pf
    if any(f.acute for f in proof.findings):
        return FAILED, acted, pf
    if proof.findings:
        return PASSED, "a budgeted finding, published for the keeper: %s" % acted, pf
    if proof.undecided:
        return UNDECIDED, "; ".join(proof.undecided + ([across.why] if across is not None else []))[:300], pf
    if across is not None and across.ran:
        return PASSED, str(across.why)[:300], pf
    return PASSED, "this node's own proof passed" + (" (%s)" % across.why[:200] if across is not None else ""), pf


def _gang(settings, client, pod: dict, pf: Dict[str, object]):
    """The Pod's gang where a proof across nodes is configured (None: none,
    or one that cannot be told: said in ``pf``)."""
    from gpugate.kube.gangs import GangError, of_pod

    if not settings.preflight["allreduce_multi"]:
        return None
    try:
        gang = of_pod(pod, client.get, tuple(settings.preflight["gangs"]))
    except (GangError, GpugateError) as exc:
        pf["gang"] = "undecided: %s" % str(exc)[:200]
        return None
    if gang is not None:
        pf["gang"] = gang.key
    return gang


def _across(settings, baseline, node, kube_node, client, pod, gang, gpus, proof, started, pf, progress):
    """The proof across the gang's nodes, or None where there is none to run."""
    from gpugate.node.kube_preflight_pod import CONTAINER
    from gpugate.preflight import memory
    from gpugate.preflight.cross import Member, prove_across, run_rank_command
    from gpugate.preflight.environment import UNFIT

    cfg = settings.preflight
    if gang is None or gang.size < 2:
        return None
    progress("waiting for the gang %s (%d Pods) to be bound" % (gang.key, gang.size))
    until = started + float(cfg["timeout_seconds"])
    meta = pod.get("metadata") or {}
    pods, why = bound_gang(lambda: _list(client, gang), gang, str(meta.get("uid") or ""), CONTAINER, until)
    nodes = sorted({str(p["spec"]["nodeName"]) for p in pods})
    if why or len(nodes) < 2 or kube_node not in nodes:
        pf["gang_why"] = why or "the gang's Pods are on %d node(s)" % len(nodes)
        return None
    own = memory.outcome(proof.findings, proof.undecided)
    unfit = _environment(settings, node, client, kube_node, pods) if own != "acute" else ""
    if unfit:
        proof.undecided.append("environment: %s" % unfit)
        own = UNFIT
    me = Member(kube_node, own, True, baseline.expect_for(node).product or "")
    progress("the proof across %d nodes" % len(nodes))
    return prove_across(settings, baseline, gang_job(gang, pods), nodes, me,
                        run_rank_command(settings, node, gpus, baseline.vendor_for(node) == "amd"), started)


def _list(client, gang) -> List[dict]:
    from urllib.parse import quote

    path = "/api/v1/namespaces/%s/pods" % quote(gang.namespace, safe="")
    if gang.selector:
        path += "?labelSelector=" + quote(gang.selector, safe="")
    return list(client.get(path).get("items") or [])


def _environment(settings, node: str, client, kube_node: str, gang_pods: List[dict]) -> str:
    """This node's environment as the run needs it (gpugate.preflight.environment.judge):
    no Pod on the Node but the gang's (a DaemonSet's or a static Pod aside: the
    node's own agents), as Slurm wants no other job's slurmstepd; free /dev/shm and /tmp."""
    from urllib.parse import quote

    from gpugate.model.facts import ProbeFailure
    from gpugate.preflight.environment import _free, judge

    ours = {str((p.get("metadata") or {}).get("uid")) for p in gang_pods}
    try:
        items = client.get("/api/v1/pods?fieldSelector=" + quote("spec.nodeName=%s" % kube_node, safe="")
                           ).get("items") or []
        others = sorted("%s/%s" % (p["metadata"].get("namespace"), p["metadata"].get("name")) for p in items
                        if str(p["metadata"].get("uid")) not in ours and not _the_nodes_own(p)
                        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"))
    except (GpugateError, KeyError, TypeError, AttributeError) as exc:
        others = ProbeFailure("environment", "error", "the Node's Pods: %s" % str(exc)[:160])
    root, cfg = settings.node_root(node), settings.preflight
    free = [(path, _free(os.path.join(root, path.lstrip("/"))), int(cfg[key]))
            for path, key in (("/dev/shm", "shm_free_mb"), ("/tmp", "tmp_free_mb")) if int(cfg[key]) > 0]
    return judge((None, ""), others, "", free)


def _the_nodes_own(pod: dict) -> bool:
    """A DaemonSet's Pod or a static (mirror) Pod: the node's own agents, not a tenant's."""
    meta = pod.get("metadata") or {}
    if "kubernetes.io/config.mirror" in (meta.get("annotations") or {}):
        return True
    return any(isinstance(o, dict) and o.get("kind") == "DaemonSet" for o in meta.get("ownerReferences") or [])


def _settle(settings, node: str, proof, across, pf: Dict[str, object]) -> str:
    """Remember and count the outcome as the prolog does, and act on its
    findings (gpugate.node.act): why this Pod fails ("" where it starts)."""
    from gpugate.model.verdict import decide
    from gpugate.node.act import act
    from gpugate.node.check import ACT_RESERVE
    from gpugate.preflight import memory
    from gpugate.probes import files

    boot_id = files.boot_id(settings.node_root(node))
    try:  # the health check judges a budgeted finding again, and writes the counts
        memory.remember(settings, node, [f for f in proof.findings if not f.acute],
                        bool(pf.get("passed")) and proof.floor_judged, boot_id if isinstance(boot_id, str) else None)
        memory.count(settings, node, memory.outcome(proof.findings, proof.undecided), float(pf["seconds_total"]),
                     across=across.counted() if across is not None else "")
    except OSError as exc:
        pf["state_error"] = str(exc)[:200]
    if not proof.findings:
        return ""
    verdict = decide(proof.findings, settings.reason_tag)
    outcome = act(settings, node, verdict, deadline=time.monotonic() + ACT_RESERVE["prolog"])
    pf["action"], pf["reason"] = outcome.get("action"), verdict.reason
    if not outcome.get("ok"):
        pf["act_error"] = str(outcome.get("error") or "")[:200]
    return "%s (%s)" % (verdict.reason[:200], outcome.get("action"))
