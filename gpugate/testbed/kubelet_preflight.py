"""What a kubelet does with a Pod whose first init container is gpugate's
preflight (gpugate-preflight), on a KWOK control plane
(gpugate.testbed.kube_control): KWOK plays the kubelets of the fleet's
nodes, but its pod-ready stage waits for such a Pod until its preflight
exited 0 (kube_control.PREFLIGHT_GATE).  This runs that init container as
the kubelet would, on the machine of the test:

- its command and args as written in the Pod (`gpugate ...` runs this
  gpugate: ``python -m gpugate``), its env resolved from the Pod
  (values, and the downward API's metadata.name, .namespace, .uid,
  .labels['k'], .annotations['k'], spec.nodeName, spec.serviceAccountName),
  with the agent's address (GPUGATE_PREFLIGHT_AGENT: the chart's Service
  with internalTrafficPolicy Local, or a hostPort) mapped to the address the
  test gives for the Pod's node: the node-local agent;
- its terminationMessagePath made a file of its own here
  (GPUGATE_TERMINATION_LOG), read back as the kubelet does (4096 bytes);
- its status as the kubelet writes it: initContainerStatuses running, then
  terminated with the exit code, reason and message.  Exit 0: KWOK makes
  the Pod Running (its stage now matches).  Otherwise, restartPolicy Never:
  the Pod Failed (its controller, a Job's, makes it anew); OnFailure or
  Always: the init container runs again after a second (restartCount + 1),
  as the kubelet restarts it.

Pods of other nodes, and Pods without the preflight, are KWOK's alone."""

import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict
from urllib.parse import quote

from gpugate.testbed.kubelet import Rounds

PREFLIGHT = "gpugate-preflight"
TERMINATION_MAX = 4096


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def field(pod: dict, path: str) -> str:
    """A downward API fieldRef's value ("" for one not given here)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    plain = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
             "metadata.uid": meta.get("uid"), "spec.nodeName": spec.get("nodeName"),
             "spec.serviceAccountName": spec.get("serviceAccountName")}
    if path in plain:
        return plain[path] or ""
    for kind in ("labels", "annotations"):
        prefix = "metadata.%s['" % kind
        if path.startswith(prefix) and path.endswith("']"):
            return (meta.get(kind) or {}).get(path[len(prefix):-2], "")
    return ""


def container_env(pod: dict, container: dict, agent: str) -> Dict[str, str]:
    """The container's env as the kubelet resolves it, the agent's address mapped to ``agent``."""
    env = {}
    for item in container.get("env") or []:
        ref = ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
        env[item["name"]] = field(pod, ref) if ref else str(item.get("value", ""))
    if "GPUGATE_PREFLIGHT_AGENT" in env:
        env["GPUGATE_PREFLIGHT_AGENT"] = agent
    return env


def argv(container: dict):
    words = list(container.get("command") or []) + list(container.get("args") or [])
    return [sys.executable, "-m", "gpugate"] + words[1:] if words[:1] == ["gpugate"] else words


class PreflightKubelets(Rounds):
    def __init__(self, api, agents: Dict[str, str], interval: float = 0.2):
        """api: gpugate.testbed.kube.KubeAPI; agents: node -> HOST:PORT of its agent's preflight port
        (the nodes whose preflight init containers run here)."""
        super().__init__(api, interval)
        self.agents = dict(agents)
        self.seen = set()
        self.ran = []  # (namespace, pod, node, exit code, termination message): what the tests may assert on
        self.lock = threading.Lock()

    def start(self) -> "PreflightKubelets":
        super().start()
        return self

    def _round(self) -> None:
        for pod in self.admin.list_pages("/api/v1/pods"):
            meta, spec = pod["metadata"], pod.get("spec") or {}
            init = spec.get("initContainers") or []
            if (spec.get("nodeName") not in self.agents or meta.get("deletionTimestamp") or meta["uid"] in self.seen
                    or not init or init[0]["name"] != PREFLIGHT
                    or (pod.get("status") or {}).get("phase", "Pending") != "Pending"):
                continue
            self.seen.add(meta["uid"])
            threading.Thread(target=self._run_pod, args=(pod,), daemon=True).start()

    def _status(self, path: str, status: dict) -> bool:
        """The Pod's status written as the kubelet writes it; False once the Pod is gone or going."""
        from gpugate.kube.client import KubeError

        client = self.api.admin()  # one connection per thread
        try:
            if client.get(path)["metadata"].get("deletionTimestamp"):
                return False
            client.patch(path + "/status", {"status": status}, "strategic")
            return True
        except KubeError:
            return False

    def _run_pod(self, pod: dict) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        path = "/api/v1/namespaces/%s/pods/%s" % (quote(meta["namespace"]), quote(meta["name"]))
        container, node = spec["initContainers"][0], spec["nodeName"]
        waiting = [{"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": False, "restartCount": 0,
                    "state": {"waiting": {"reason": "PodInitializing"}}} for c in spec["containers"]]
        restarts, started_at = 0, _now()
        while not self.stopping.is_set():
            said = {"name": PREFLIGHT, "image": container.get("image", ""), "imageID": "", "ready": False,
                    "restartCount": restarts}
            if not self._status(path, {"phase": "Pending", "startTime": started_at, "containerStatuses": waiting,
                                       "initContainerStatuses": [dict(said, state={"running": {"startedAt": _now()}})]}):
                return
            began = _now()
            code, message = self._exec(pod, container, node)
            with self.lock:
                self.ran.append((meta["namespace"], meta["name"], node, code, message))
            done = dict(said, state={"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                                    "message": message, "startedAt": began, "finishedAt": _now()}})
            status = {"initContainerStatuses": [done], "containerStatuses": waiting}
            if code != 0 and spec.get("restartPolicy", "Always") == "Never":
                status["phase"] = "Failed"
                self._status(path, status)
                return
            if not self._status(path, status) or code == 0:
                return  # exit 0: KWOK's pod-ready stage takes the Pod on from here
            restarts += 1
            self.stopping.wait(1.0)  # the kubelet's back-off before it runs the init container again

    def _exec(self, pod: dict, container: dict, node: str):
        """(exit code, termination message) of one run of the init container."""
        env = container_env(pod, container, self.agents[node])
        try:
            whole = float(env.get("GPUGATE_PREFLIGHT_SECONDS") or 900)
        except ValueError:
            whole = 900.0
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        with tempfile.TemporaryDirectory() as tmp:
            log = os.path.join(tmp, "termination-log")
            open(log, "w").close()
            env.update(PATH=os.environ.get("PATH", "/usr/bin:/bin"), PYTHONPATH=root, GPUGATE_TERMINATION_LOG=log)
            try:
                code = subprocess.run(argv(container), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, timeout=whole + 60).returncode
            except subprocess.TimeoutExpired:
                code = 137
            except OSError:
                code = 128  # StartError: the command is not there
            with open(log, "rb") as handle:
                message = handle.read(TERMINATION_MAX).decode("utf-8", "replace")
        return code, message
