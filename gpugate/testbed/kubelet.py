"""What the kubelets of a KubeFleet would do that the sweep's tests need,
at the boundary gpugate does not cross (there is no kubelet here):

- a pod bound to a fleet node that is being deleted goes (the kubelet's
  confirmation of graceful deletion);
- gpugate's smoke Pod (in the smoke namespace, gpugate-smoke) runs: its
  container's command, as written in the Pod, with the file at its
  terminationMessagePath made here (the kubelet's mount), on the simulated
  node's executables; its status written as the kubelet would (phase,
  the container's exit code and termination message,
  truncated to 4096 bytes); or, on a node in ``reject`` or whose Node
  offers fewer GPUs than the Pod asks for (allocatable), it is refused at
  admission as the kubelet refuses a Pod whose GPUs another pod holds
  (phase Failed, the reason and message, no container status);
- the image pull: the smoke Pod waits in ContainerCreating while its node
  pulls the image (``pull``: seconds, per node, until a pull completes
  there once: then the image is on the node) or for ever with ``pull_error``
  (ErrImagePull, then ImagePullBackOff); a Pod deleted meanwhile stops its
  pull; activeDeadlineSeconds counts from the Pod's start, pull included;
  the container reports running once its command starts;
- a container that cannot be made or started on a node (``create_error``:
  node -> (reason, message)): CreateContainerError or RunContainerError
  waits (Pending) until the Pod goes or its deadline; StartError ends it
  (Failed, exit code 128), as the NVIDIA container toolkit's hook failing
  to inject the GPUs leaves it;
- a reboot (``python -m gpugate.testbed.kubelet reboot``: the site's reboot
  command in the tests): the simulated node reboots and its Node reports a
  new bootID and Ready again, with none of its GPU resources (capacity and
  allocatable 0, as a kubelet reports a device plugin's resource until the
  plugin registers again); the device plugin comes back ``gpus_late``
  seconds after the kubelet sees the new bootID (0 by default; None: never,
  a driver that does not load), and the Node offers its GPUs again, less
  those its device plugin reports unhealthy (``unhealthy``: counted in
  capacity, not allocatable)."""

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
    from gpugate.kube.client import node_path

    boot_id = str(uuid.uuid4())
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = admin.get(node_path(name)).get("status") or {}
    none = {r: "0" for r in _gpu_resources(status)}
    admin.patch(node_path(name, "status"), {"status": {
        "nodeInfo": {"bootID": boot_id}, "capacity": none, "allocatable": none,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "gpugate testbed",
                        "lastHeartbeatTime": now, "lastTransitionTime": now}]}}, "strategic")
    return boot_id


def _gpu_resources(status) -> dict:
    """{resource: its count} of a Node status's GPU resources (nvidia.com/gpu, amd.com/gpu, .../gpu)."""
    counts = {}
    for field in ("capacity", "allocatable"):
        for resource, value in ((status or {}).get(field) or {}).items():
            if resource.endswith("/gpu") and str(value).isdigit():
                counts[resource] = max(counts.get(resource, 0), int(value))
    return counts


class Rounds(threading.Thread):
    """A test's kubelet: _round() every interval until stop(); an error in one round is said, not fatal."""

    def __init__(self, api, interval: float):
        super().__init__(daemon=True)
        self.api, self.interval = api, interval
        self.admin = api.admin()
        self.stopping = threading.Event()

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
        raise NotImplementedError


class Kubelets(Rounds):
    def __init__(self, api, nodes, interval: float = 0.2):
        """api: gpugate.testbed.kube.KubeAPI (each thread here has its own client: one connection per thread)."""
        super().__init__(api, interval)
        self.nodes = set(nodes)
        self.started_pods = set()
        self.namespace = "gpugate-smoke"
        self.reject = {}  # node: (reason, message) its kubelet refuses the smoke Pods with
        self.ran = []  # (pod, node, exit code): what the tests may assert on
        self.pull = {}  # node: seconds a pull of the smoke image takes there, until one completes
        self.pull_error = {}  # node: the message its pulls fail with (ErrImagePull, ImagePullBackOff)
        self.create_error = {}  # node: (reason, message) its container cannot be made or started with
        self.gpus_late = {}  # node: seconds after a new bootID until its GPUs are offered again (None: never)
        self.unhealthy = {}  # node: how many of its GPUs its device plugin reports unhealthy (not allocatable)
        self.gpus = {}  # node: {resource: count} it offers when its device plugin is up
        self.boots = {}  # node: (bootID, when this kubelet first saw it)
        for node in self.admin.list_pages("/api/v1/nodes"):
            name = node["metadata"]["name"]
            if name in self.nodes:
                self.gpus[name] = _gpu_resources(node.get("status"))
                self.boots[name] = ((node.get("status") or {}).get("nodeInfo", {}).get("bootID"), 0.0)

    def _round(self) -> None:
        from gpugate.kube.client import KubeError

        self._device_plugins()
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
                refused = self.reject.get(spec["nodeName"]) or self._short(spec)
                if refused:
                    reason, message = refused
                    self.admin.patch(path + "/status", {"status": {"phase": "Failed", "reason": reason,
                                                                    "message": message}}, "strategic")
                    continue
                threading.Thread(target=self._run_pod, args=(pod, path), daemon=True).start()

    def _short(self, spec):
        """(reason, message) of the kubelet's admission refusal when the Node's allocatable GPUs are
        fewer than the Pod asks for (None: admitted)."""
        from gpugate.kube.client import node_path

        allocatable = (self.admin.get(node_path(spec["nodeName"])).get("status") or {}).get("allocatable") or {}
        for resource, asked in ((spec["containers"][0].get("resources") or {}).get("limits") or {}).items():
            have = str(allocatable.get(resource, "0"))
            if resource.endswith("/gpu") and have.isdigit() and int(have) < int(asked):
                return ("OutOf" + resource, "Pod was rejected: Node didn't have enough resource: %s, requested: %s, "
                                            "used: 0, capacity: %s" % (resource, asked, have))
        return None

    def _device_plugins(self) -> None:
        """Each rebooted node's GPUs offered again gpus_late seconds after its new bootID was seen."""
        from gpugate.kube.client import node_path

        for node in self.admin.list_pages("/api/v1/nodes"):
            name, status = node["metadata"]["name"], node.get("status") or {}
            if name not in self.nodes:
                continue
            boot = (status.get("nodeInfo") or {}).get("bootID")
            if self.boots.get(name, (None,))[0] != boot:
                self.boots[name] = (boot, time.monotonic())
            seen = _gpu_resources(status)  # what it offers now, remembered at its most (a Node added late)
            want = self.gpus.setdefault(name, {})
            for resource, count in seen.items():
                want[resource] = max(want.get(resource, 0), count)
            late = self.gpus_late.get(name, 0.0)
            bad = self.unhealthy.get(name, 0)  # counted in capacity, not offered (allocatable)
            now = ({r: str((status.get("capacity") or {}).get(r)) for r in want},
                   {r: str((status.get("allocatable") or {}).get(r)) for r in want})
            counts = ({r: str(n) for r, n in want.items()}, {r: str(max(0, n - bad)) for r, n in want.items()})
            if late is None or not want or now == counts or time.monotonic() - self.boots[name][1] < late:
                continue
            self.admin.patch(node_path(name, "status"), {"status": {"capacity": counts[0], "allocatable": counts[1]}},
                             "strategic")

    def _status(self, path, status) -> bool:
        """The Pod's status as the kubelet writes it (None: only read); False once the Pod is gone or going."""
        from gpugate.kube.client import KubeError

        client = self.api.admin()
        try:
            pod = client.get(path)
            if pod["metadata"].get("deletionTimestamp"):
                return False
            if status is not None:
                client.patch(path + "/status", {"status": status}, "strategic")
            return True
        except KubeError:
            return False

    def _pulled(self, pod, path, container, started: float) -> bool:
        """The image pulled (True), or the Pod gone or past its activeDeadlineSeconds meanwhile (False)."""
        node = pod["spec"]["nodeName"]
        deadline = float(pod["spec"].get("activeDeadlineSeconds") or 600)
        pulling = {"name": container["name"], "image": container["image"], "imageID": "", "ready": False,
                   "restartCount": 0}
        errors, said = 0, {"reason": "ContainerCreating"}
        while node in self.pull_error or time.monotonic() - started < self.pull.get(node, 0.0):
            if time.monotonic() - started >= deadline:
                self._status(path, {"phase": "Failed", "reason": "DeadlineExceeded",
                                    "message": "Pod was active on the node longer than the specified deadline"})
                return False
            wait = {"reason": "ContainerCreating"}
            if node in self.pull_error:
                errors += 1
                wait = {"reason": "ErrImagePull" if errors % 2 else "ImagePullBackOff",
                        "message": self.pull_error[node]}
            status = {"containerStatuses": [dict(pulling, state={"waiting": wait})]} if wait != said else None
            said = wait
            if not self._status(path, status):
                return False  # deleted: the pull stops with it
            time.sleep(0.2)
        self.pull.pop(node, None)  # the image is on the node now
        return True

    def _not_created(self, pod, path, container, started: float) -> None:
        """The container not made or started (create_error): StartError ends the Pod; any other reason
        leaves it waiting until it is deleted or past its activeDeadlineSeconds."""
        reason, message = self.create_error[pod["spec"]["nodeName"]]
        said = {"name": container["name"], "image": container["image"], "imageID": "", "ready": False,
                "restartCount": 0}
        if reason == "StartError":
            self._status(path, {"phase": "Failed", "containerStatuses": [dict(said, state={"terminated": {
                "exitCode": 128, "reason": reason, "message": message}})]})
            return
        status = {"containerStatuses": [dict(said, state={"waiting": {"reason": reason, "message": message}})]}
        deadline = float(pod["spec"].get("activeDeadlineSeconds") or 600)
        while self._status(path, status):
            status = None  # written once; then only read, until the Pod goes
            if time.monotonic() - started >= deadline:
                self._status(path, {"phase": "Failed", "reason": "DeadlineExceeded",
                                    "message": "Pod was active on the node longer than the specified deadline"})
                return
            time.sleep(0.2)

    def _run_pod(self, pod, path) -> None:
        container = pod["spec"]["containers"][0]
        started = time.monotonic()
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        if not self._status(path, {"phase": "Pending", "startTime": now, "containerStatuses": [{
                "name": container["name"], "image": container["image"], "imageID": "", "ready": False,
                "restartCount": 0, "state": {"waiting": {"reason": "ContainerCreating"}}}]}):
            return
        if not self._pulled(pod, path, container, started):
            return
        if pod["spec"]["nodeName"] in self.create_error:
            return self._not_created(pod, path, container, started)
        if not self._status(path, {"phase": "Running", "containerStatuses": [{
                "name": container["name"], "image": container["image"], "imageID": "", "ready": True,
                "restartCount": 0, "state": {"running": {"startedAt": now}}}]}):
            return
        term_path = container.get("terminationMessagePath") or "/dev/termination-log"
        with tempfile.TemporaryDirectory() as tmp:
            mounted = os.path.join(tmp, "termination-log")
            open(mounted, "w").close()
            argv = [mounted if word == term_path else word for word in container["command"] + container.get("args", [])]
            # /dev/shm is the Pod's emptyDir: here, a directory of its own.
            argv = [w.replace("/dev/shm/", tmp + "/") for w in argv]
            deadline = float(pod["spec"].get("activeDeadlineSeconds") or 600) - (time.monotonic() - started)
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

    from gpugate.kube.client import KubeClient

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
