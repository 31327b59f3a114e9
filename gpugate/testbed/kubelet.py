"""What the kubelets of a KubeFleet would do that the sweep's tests need,
at the boundary gpugate does not cross (there is no kubelet here):

- a pod bound to a fleet node that is being deleted goes (the kubelet's
  confirmation of graceful deletion);
- gpugate's smoke Pod (in the smoke namespace, gpugate-smoke) runs: its
  container's command, as written in the Pod, with the file at its
  terminationMessagePath made here (the kubelet's mount), on the simulated
  node's executables; its status written as the kubelet would (phase,
  the container's exit code and termination message,
  truncated to 4096 bytes); or, on a node in ``reject``, it is refused at
  admission as the kubelet refuses a Pod whose GPUs another pod holds
  (phase Failed, the reason and message, no container status);
- a reboot (``python -m gpugate.testbed.kubelet reboot``: the site's reboot
  command in the tests): the simulated node reboots and its Node reports a
  new bootID and Ready again."""

import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from urllib.parse import quote

SMOKE_LABEL = "gpugate.io/smoke"


def boot(admin, name: str) -> str:
    """A (new) bootID and Ready=True on the Node, as a kubelet starting after a boot reports them."""
    from ..kube.client import node_path

    boot_id = str(uuid.uuid4())
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    admin.patch(node_path(name, "status"), {"status": {
        "nodeInfo": {"bootID": boot_id},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "gpugate testbed",
                        "lastHeartbeatTime": now, "lastTransitionTime": now}]}}, "strategic")
    return boot_id


class Kubelets(threading.Thread):
    def __init__(self, api, nodes, interval: float = 0.2):
        """api: gpugate.testbed.kube.KubeAPI (each thread here has its own client: one connection per thread)."""
        super().__init__(daemon=True)
        self.api, self.nodes, self.interval = api, set(nodes), interval
        self.admin = api.admin()
        self.stopping = threading.Event()
        self.started_pods = set()
        self.namespace = "gpugate-smoke"
        self.reject = {}  # node: (reason, message) its kubelet refuses the smoke Pods with
        self.ran = []  # (pod, node, exit code): what the tests may assert on

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=10)

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self._round()
            except Exception as exc:  # noqa: BLE001 (a test's kubelet keeps going; the test sees the outcome)
                sys.stderr.write("testbed kubelet: %s\n" % exc)
            self.stopping.wait(self.interval)

    def _round(self) -> None:
        from ..kube.client import KubeError

        for pod in self.admin.list_pages("/api/v1/pods"):
            meta, spec = pod["metadata"], pod.get("spec") or {}
            if spec.get("nodeName") not in self.nodes:
                continue
            path = "/api/v1/namespaces/%s/pods/%s" % (quote(meta["namespace"]), quote(meta["name"]))
            if meta.get("deletionTimestamp"):
                try:
                    self.admin.request("DELETE", path, {"kind": "DeleteOptions", "apiVersion": "v1",
                                                        "gracePeriodSeconds": 0})
                except KubeError:
                    pass
                continue
            if (SMOKE_LABEL in (meta.get("labels") or {}) and meta["namespace"] == self.namespace
                    and meta["uid"] not in self.started_pods):
                self.started_pods.add(meta["uid"])
                if spec["nodeName"] in self.reject:
                    reason, message = self.reject[spec["nodeName"]]
                    self.admin.patch(path + "/status", {"status": {"phase": "Failed", "reason": reason,
                                                                    "message": message}}, "strategic")
                    continue
                threading.Thread(target=self._run_pod, args=(pod, path), daemon=True).start()

    def _run_pod(self, pod, path) -> None:
        container = pod["spec"]["containers"][0]
        term_path = container.get("terminationMessagePath") or "/dev/termination-log"
        with tempfile.TemporaryDirectory() as tmp:
            mounted = os.path.join(tmp, "termination-log")
            open(mounted, "w").close()
            argv = [mounted if word == term_path else word for word in container["command"] + container.get("args", [])]
            # /dev/shm is the Pod's emptyDir: here, a directory of its own.
            argv = [w.replace("/dev/shm/", tmp + "/") for w in argv]
            deadline = float(pod["spec"].get("activeDeadlineSeconds") or 600)
            try:
                code = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, timeout=deadline).returncode
                reason = "Completed" if code == 0 else "Error"
            except subprocess.TimeoutExpired:
                code, reason = 137, "DeadlineExceeded"
            with open(mounted, "rb") as handle:
                message = handle.read(4096).decode("utf-8", "replace")
        self.ran.append((pod["metadata"]["name"], pod["spec"]["nodeName"], code))
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status = {"phase": "Succeeded" if code == 0 else "Failed", "containerStatuses": [{
            "name": container["name"], "image": container["image"], "imageID": "", "ready": False,
            "restartCount": 0, "state": {"terminated": {"exitCode": code, "reason": reason, "message": message,
                                                        "startedAt": now, "finishedAt": now}}}]}
        if reason == "DeadlineExceeded":
            status["reason"] = "DeadlineExceeded"
        try:
            self.api.admin().patch(path + "/status", {"status": status}, "strategic")
        except Exception as exc:  # noqa: BLE001 (deleted meanwhile)
            sys.stderr.write("testbed kubelet: %s: %s\n" % (path, exc))


def _reboot(argv) -> int:
    """reboot --fleet DIR --server URL --token-file F --ca-file F NODE"""
    import argparse

    from ..kube.client import KubeClient

    parser = argparse.ArgumentParser(prog="gpugate.testbed.kubelet reboot")
    for flag in ("--fleet", "--server", "--token-file", "--ca-file"):
        parser.add_argument(flag, required=True)
    parser.add_argument("node")
    args = parser.parse_args(argv)
    out = subprocess.run([sys.executable, "-m", "gpugate", "sim", "set", args.fleet, args.node, "reboot=1"],
                         capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        sys.stderr.write(out.stderr)
        return 1
    with open(args.token_file) as handle:
        client = KubeClient(args.server, handle.read().strip(), args.ca_file)
    boot(client, args.node)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["reboot"]:
        sys.exit("usage: python -m gpugate.testbed.kubelet reboot --fleet DIR --server URL --token-file F "
                 "--ca-file F NODE")
    sys.exit(_reboot(sys.argv[2:]))
