"""The sweep's smoke all_reduce on a Kubernetes node: a Pod bound to the
node by name (spec.nodeName: no scheduler decides, and the node's cordon
and gpugate's taint keep every other pod off), all of the node's GPUs
through the device plugin's resource, no API token, restartPolicy Never and
activeDeadlineSeconds (one try: a retry would hide a flaky node).

A Pod rather than a Job: the sweep owns its whole life (made, waited for
within smoke_deadline, judged, deleted), and a Job's retries and controller
add nothing here.  The result comes back in the container's termination
message (the API server keeps it in the Pod's status; no kubelet log
stream is needed): a small sh wrapper runs the command and leaves the
nccl-tests table and summary there (the per-rank device lines dropped,
spaces squeezed: Kubernetes keeps 4096 bytes).  The image is the site's
(nccl-tests or rccl-tests, and a POSIX sh, grep, tr and tail).

Two clocks (SmokePods.run): a Pod has smoke_deadline to start, and once
started smoke_deadline to end.  The wait to start (scheduling, the image
pull) is the site's: a Pod not started by then proves nothing and defers
its node (``site_wait`` says why); only what the started command did is the
node's, so a slow pull never eats the command's time."""

from __future__ import annotations

import os
import time
from urllib.parse import quote

from gpugate.kube.client import KubeError
from gpugate.kube.evict import PROOF, SMOKE_LABEL, proof

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple

TERMINATION_LOG = "/dev/termination-log"
MESSAGE_BYTES = 4000  # under the kubelet's 4096
# $1: the termination message file; the rest: the command.  Its exit code is the Pod's.
WRAPPER = ('out=/dev/shm/gpugate-smoke.$$; log="$1"; shift; "$@" >"$out" 2>&1; rc=$?; '
           'grep -v "^# *Rank " "$out" | tr -s " " | tail -c %d >"$log"; cat "$out"; rm -f "$out"; exit $rc'
           % MESSAGE_BYTES)


def pod_name(node: str, nonce: str) -> str:
    """gpugate-smoke-NODE-NONCE, within a Pod name's 253 characters."""
    return ("gpugate-smoke-%s" % node)[:240].rstrip(".-") + "-" + nonce


def pod_spec(name: str, node: str, namespace: str, image: str, argv, gpus: Optional[int], resource: str,
             deadline: int, key: Optional[bytes] = None) -> dict:
    """key: the drain budget key, which signs the Pod as gpugate's own (gpugate.kube.evict.OwnSmoke)."""
    limits = {resource: str(gpus)} if gpus else {}
    annotations = {"gpugate.io/node": node}
    if key:
        annotations[PROOF] = proof(key, namespace, name, node)
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {SMOKE_LABEL: "all_reduce"},
                     "annotations": annotations},
        "spec": {
            "nodeName": node, "restartPolicy": "Never", "activeDeadlineSeconds": int(deadline),
            "automountServiceAccountToken": False, "enableServiceLinks": False,
            # Bound by name it passes no scheduler; a NoExecute taint would still evict it.
            "tolerations": [{"key": "gpugate.io/unfit", "operator": "Exists"},
                            {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}],
            "containers": [{
                "name": "smoke", "image": image, "command": ["/bin/sh", "-c", WRAPPER, "gpugate-smoke",
                                                             TERMINATION_LOG] + [str(a) for a in argv],
                "terminationMessagePath": TERMINATION_LOG, "terminationMessagePolicy": "File",
                "resources": {"limits": limits},
                "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]}],
            # NCCL's shared-memory transport needs more than a container's 64 MiB /dev/shm.
            "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}]}}


def ended(pod: dict) -> Optional[Tuple[Optional[int], str, str]]:
    """(exit code, termination message, why) once the Pod has ended, else
    None.  exit code None: it never ran its command to an end."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    if phase not in ("Succeeded", "Failed"):
        return None
    for cs in status.get("containerStatuses") or []:
        term = ((cs or {}).get("state") or {}).get("terminated") if isinstance(cs, dict) else None
        if isinstance(term, dict):
            code = term.get("exitCode")
            return (code if isinstance(code, int) else None, str(term.get("message") or ""),
                    str(term.get("reason") or phase))
    return None, "", str(status.get("reason") or phase)  # e.g. DeadlineExceeded before it started


def waiting_reason(pod: dict) -> str:
    """Why a Pod has not started: ErrImagePull, ImagePullBackOff, ... ("" when unknown)."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        wait = ((cs or {}).get("state") or {}).get("waiting") if isinstance(cs, dict) else None
        if isinstance(wait, dict) and wait.get("reason"):
            return str(wait["reason"])
    return ""


# Pod reasons the kubelet writes when it refuses a Pod at admission or stops it for its own
# reasons (besides OutOf<resource>: the GPUs another pod holds): none says the Pod's command ran.
KUBELET_REFUSED = ("UnexpectedAdmissionError", "TopologyAffinityError", "SMTAlignmentError", "NodeAffinity",
                   "NodeSelectorMismatching", "InvalidNodeInfo", "PodOSNotSupported",
                   "PodOSSelectorNodeLabelDoesNotMatch", "SysctlForbidden", "UnknownReason")
KUBELET_STOPPED = ("Evicted", "Preempting", "NodeShutdown", "Terminated", "Shutdown", "NodeLost")
# A container that ended so never ran its command.
NEVER_RAN = ("StartError", "ContainerCannotRun", "ContainerStatusUnknown")


def _started(status: dict, ended_only: bool) -> bool:
    """Did the container run its command (to an end with an exit code, or, unless ended_only, running)?"""
    for cs in status.get("containerStatuses") or []:
        state = (cs or {}).get("state") if isinstance(cs, dict) else None
        if not isinstance(state, dict):
            continue
        term = state.get("terminated")
        if isinstance(term, dict) and isinstance(term.get("exitCode"), int) and term.get("reason") not in NEVER_RAN:
            return True
        if not ended_only and isinstance(state.get("running"), dict):
            return True
    return False


# Waiting reasons while the kubelet fetches the image and makes the container: the site's
# registry, network and image size, never the node's GPUs.
PULLING = ("ContainerCreating", "PodInitializing", "ErrImagePull", "ImagePullBackOff", "RegistryUnavailable")


def _said(reason, message) -> str:
    said = " ".join(str(message or "").split())[:240]
    return "%s%s" % (reason or "?", ": " + said if said else "")


def site_wait(pod: dict, waited: float) -> str:
    """Why a smoke Pod not started after ``waited`` seconds is the site's
    ("" once its container started: then what it does is the node's):
    unscheduled (PodScheduled False), its image not pulled (ContainerCreating,
    ErrImagePull, ImagePullBackOff), or not started at all."""
    status = pod.get("status") or {}
    if _started(status, False):
        return ""
    for cond in status.get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return "the site's: not scheduled in %.0f s (%s)" % (waited, _said(cond.get("reason"), cond.get("message")))
    for cs in status.get("containerStatuses") or []:
        wait = ((cs or {}).get("state") or {}).get("waiting") if isinstance(cs, dict) else None
        if isinstance(wait, dict) and wait.get("reason") in PULLING:
            return "the site's: image not pulled in %.0f s (%s)" % (waited, _said(wait["reason"], wait.get("message")))
    return "the site's: not started in %.0f s (%s)" % (waited, waiting_reason(pod) or status.get("phase") or "Pending")


# The container could not be made or started (the runtime, the NVIDIA container toolkit's hook that
# injects the GPUs, the spec): one node's fault where the same image started on another node of the
# sweep, the site's where it started nowhere (KubeSweeper compares, _start_errors).
NOT_STARTED = ("CreateContainerError", "CreateContainerConfigError", "RunContainerError", "StartError",
               "ContainerCannotRun")


def start_error(pod: dict) -> str:
    """"REASON: message" while (or once) the container could not be made or started, else ""."""
    status = pod.get("status") or {}
    if _started(status, False):
        return ""
    for cs in status.get("containerStatuses") or []:
        state = (cs or {}).get("state") if isinstance(cs, dict) else None
        for key in ("waiting", "terminated"):
            said = state.get(key) if isinstance(state, dict) else None
            if isinstance(said, dict) and said.get("reason") in NOT_STARTED:
                return _said(said["reason"], said.get("message"))
    return ""


def could_not_run(pod: dict, late: bool = False, waited: float = 0.0) -> str:
    """Why the smoke Pod proves nothing about its node ("" when it ran, or
    is yet to be judged): the kubelet refused it (OutOfnvidia.com/gpu: the
    GPUs another pod holds; UnexpectedAdmissionError: the device plugin's
    allocation), stopped it (Evicted, NodeShutdown), it ended without its
    container having run, or (late: at the sweep's deadline, after
    ``waited`` seconds) it had not started: the site's (site_wait).  Such a
    Pod defers the node's sweep; it is never a finding."""
    status = pod.get("status") or {}
    reason = str(status.get("reason") or "")
    said = " ".join(str(status.get("message") or "").split())[:240]
    if reason.startswith("OutOf") or reason in KUBELET_REFUSED or reason in KUBELET_STOPPED:
        return "the kubelet %s it: %s%s" % ("stopped" if reason in KUBELET_STOPPED else "refused", reason,
                                            ": " + said if said else "")
    phase = status.get("phase")
    if phase in ("Succeeded", "Failed"):
        if _started(status, True):
            return ""
        wait = waiting_reason(pod)
        return "it ended (%s) without its container having run%s" % (reason or phase, " (%s)" % wait if wait else "")
    if late:
        return site_wait(pod, waited)
    return ""


class SmokePods:
    """Make, wait for and delete the smoke Pods of one batch."""

    def __init__(self, client, namespace: str, sleep=time.sleep):
        self.client, self.namespace, self.sleep = client, namespace, sleep
        self.base = "/api/v1/namespaces/%s/pods" % quote(namespace, safe="")

    def run(self, specs: Dict[str, dict], deadline: float, poll: float) -> Dict[str, dict]:
        """{node: {"exit", "message", "why", "seconds", "pod", "late", "not_run", "started", "start_error"}};
        every Pod deleted after.  Each Pod has ``deadline`` seconds to start and, once seen started,
        ``deadline`` more to end.  not_run: why the Pod proves nothing (could_not_run), else "";
        started: its container was seen running or ended having run; start_error: the last
        start_error() seen of a Pod never started ("" if none)."""
        made: Dict[str, str] = {}
        out: Dict[str, dict] = {}
        began: Dict[str, float] = {}  # when each Pod was first seen started (the sweep's clock)
        broke: Dict[str, str] = {}  # its container could not be made or started (as last seen)
        created = time.monotonic()
        try:
            for node, spec in specs.items():
                self.client.create(self.base, spec)
                made[node] = spec["metadata"]["name"]
            waiting = set(made)
            while waiting:
                for node in sorted(waiting):
                    pod = self.client.get("%s/%s" % (self.base, quote(made[node], safe="")))
                    now = time.monotonic()
                    if node not in began and _started(pod.get("status") or {}, False):
                        began[node] = now
                    broke[node] = start_error(pod) or broke.get(node, "")
                    end = ended(pod)
                    if end is not None:
                        out[node] = {"exit": end[0], "message": end[1], "why": end[2], "pod": made[node],
                                     "seconds": now - created, "late": False,
                                     "not_run": could_not_run(pod, waited=now - created)}
                        waiting.discard(node)
                        continue
                    out[node] = {"exit": None, "message": "", "pod": made[node], "seconds": now - created,
                                 "why": waiting_reason(pod) or ("running" if node in began else "not started"),
                                 "late": True, "not_run": could_not_run(pod, late=True, waited=now - created)}
                    if now >= began.get(node, created) + deadline:
                        waiting.discard(node)  # judged as it is now: never started (the site's), or hung
                if not waiting:
                    break
                left = min(began.get(n, created) + deadline for n in waiting) - time.monotonic()
                self.sleep(max(0.0, min(poll, left)))
            for node, answer in out.items():
                answer["started"] = node in began
                answer["start_error"] = "" if node in began else broke.get(node, "")
            return out
        finally:
            self.delete(made.values())

    def delete(self, names) -> None:
        for name in names:
            try:
                self.client.request("DELETE", "%s/%s" % (self.base, quote(name, safe="")),
                                    {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})
            except KubeError as exc:
                if exc.status != 404:
                    raise

    def leftovers(self) -> List[str]:
        """Smoke Pods an interrupted sweep left (they would hold GPUs)."""
        return [p["metadata"]["name"] for p in self.client.list_pages(self.base, labelSelector=SMOKE_LABEL)]


def nonce() -> str:
    return os.urandom(4).hex()
