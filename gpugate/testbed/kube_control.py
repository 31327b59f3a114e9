"""The rest of a control plane for a test's kube-apiserver (issue 45):
kube-scheduler and kube-controller-manager from the same release
(scripts/kube-build builds them beside kube-apiserver) and KWOK's
controller (sigs.k8s.io/kwok) as the kubelets of the Nodes a test marks
with KWOK_ANNOTATION: they go Ready and renew their node Lease, their bound
pods go Running, their deleted pods go.  Opt-in (KubeAPI(control_plane=True)):
tests of gpugate's own writes need only the API server, and start faster.

The controllers are the ones gpugate's holds meet on a site: the node
lifecycle and taint eviction controllers (NoExecute), the disruption
controller (a PodDisruptionBudget's status), DaemonSets, ReplicaSets, Jobs,
the garbage collector and namespaces.  No ServiceAccount token controller:
the rig's API server authenticates static tokens and admits pods without a
ServiceAccount (its ServiceAccount admission plugin is off).

KWOK runs with its own stages but one: a Pod whose first init container is
gpugate's preflight is made Running only once that container exited 0
(PREFLIGHT_GATE; the testbed kubelet gpugate.testbed.kubelet_preflight
runs it)."""

import os
import subprocess
import time
from typing import Callable, Dict, List

from gpugate.testbed.procs import ClusterError, free_ports

KWOK_VERSION = "0.8.0"  # scripts/kube-build's default (GPUGATE_KWOK_VERSION)
KWOK_ANNOTATION = "kwok.x-k8s.io/node"  # = "fake": a Node whose kubelet KWOK plays
BINARIES = ("kube-scheduler", "kube-controller-manager")
# No deployment controller: the manifests' keeper Deployment (applied by the tests) makes no pods
# that would sit on the test's nodes and be evicted by its sweeps.
# The device taint eviction controller evicts the Pods whose DRA claims use a device a NoExecute
# DeviceTaintRule taints ([kubernetes] device_holds; it does nothing where the release serves no rules).
# The Job controller makes a Job's failed Pod anew (a preflight's culprit: gpugate.testbed.kubelet_preflight);
# the ResourceClaim controller makes a Pod's claims from its ResourceClaimTemplates (a DRA gang's).
CONTROLLERS = ("node-lifecycle-controller", "taint-eviction-controller", "disruption-controller",
               "daemonset-controller", "replicaset-controller", "garbage-collector-controller",
               "namespace-controller", "device-taint-eviction-controller", "job-controller",
               "resourceclaim-controller")
# The node lifecycle controller looks at the Nodes every second (5 s by default): a taint follows
# a Ready condition within a second or two.
NODE_MONITOR_PERIOD = "1s"


def kwok_binary(cache: str) -> str:
    return os.path.join(cache, "kwok-%s" % os.environ.get("GPUGATE_KWOK_VERSION", KWOK_VERSION), "kwok")


def missing(bin_dir: str, cache: str) -> List[str]:
    """What scripts/kube-build has not built yet for this release (or KWOK)."""
    paths = [os.path.join(bin_dir, name) for name in BINARIES] + [kwok_binary(cache)]
    gone = [p for p in paths if not os.access(p, os.X_OK)]
    stages = os.path.join(os.path.dirname(kwok_binary(cache)), "stages.yaml")
    return gone + ([] if os.path.isfile(stages) else [stages])


# KWOK's pod-ready stage waits, for a Pod whose first init container is gpugate's preflight, until
# that container has exited 0 (the testbed kubelet runs it: gpugate.testbed.kubelet_preflight); for
# any other Pod it is true at once, as in KWOK's own stage.  A gojq expression, as KWOK's keys are.
PREFLIGHT_GATE = {
    "key": '((.spec.initContainers // []) | map(.name) | first) != "gpugate-preflight" or '
           '([(.status.initContainerStatuses // [])[] | select(.name == "gpugate-preflight") '
           '| .state.terminated.exitCode] == [0])',
    "operator": "In", "values": ["true"]}


def stages(cache: str, workdir: str) -> str:
    """scripts/kube-build's stages.yaml (KWOK's own), its pod-ready stage gated by
    PREFLIGHT_GATE, written into ``workdir``; returns its path."""
    import yaml

    with open(os.path.join(os.path.dirname(kwok_binary(cache)), "stages.yaml")) as handle:
        docs = [d for d in yaml.safe_load_all(handle) if d]
    for doc in docs:
        if doc["metadata"]["name"] == "pod-ready":
            doc["spec"]["selector"]["matchExpressions"].append(PREFLIGHT_GATE)
    path = os.path.join(workdir, "kwok-stages.yaml")
    with open(path, "w") as handle:
        yaml.safe_dump_all(docs, handle, sort_keys=False)
    return path


def kubeconfig(path: str, server: str, ca_file: str, token: str) -> str:
    """A kubeconfig with the admin's static token (system:masters): the
    controllers' own RBAC roles are not what a test looks at."""
    import yaml

    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "rig",
           "clusters": [{"name": "rig", "cluster": {"server": server, "certificate-authority": ca_file}}],
           "users": [{"name": "admin", "user": {"token": token}}],
           "contexts": [{"name": "rig", "context": {"cluster": "rig", "user": "admin"}}]}
    with open(path, "w") as handle:
        yaml.safe_dump(doc, handle)
    os.chmod(path, 0o600)
    return path


def start(spawn: Callable[[str, List[str]], None], workdir: str, bin_dir: str, cache: str, server: str,
          ca_file: str, token: str) -> Dict[str, int]:
    """kube-scheduler, kube-controller-manager and KWOK, each by ``spawn``
    (KubeAPI._spawn: its log beside the API server's, stopped with it).
    Returns the scheduler's and the controller manager's ports."""
    gone = missing(bin_dir, cache)
    if gone:
        raise ClusterError("the control plane is not built (%s): scripts/kube-build %s"
                           % (", ".join(gone), os.path.basename(bin_dir)))
    config = kubeconfig(os.path.join(workdir, "admin.kubeconfig"), server, ca_file, token)
    ports = dict(zip(BINARIES, free_ports(2)))
    common = ["--kubeconfig", config, "--authentication-kubeconfig", config, "--authorization-kubeconfig", config,
              "--leader-elect=false", "--bind-address", "127.0.0.1"]
    spawn("kube-scheduler", [os.path.join(bin_dir, "kube-scheduler"), "--secure-port",
                             str(ports["kube-scheduler"])] + common)
    spawn("kube-controller-manager", [
        os.path.join(bin_dir, "kube-controller-manager"), "--secure-port", str(ports["kube-controller-manager"]),
        "--controllers", ",".join(CONTROLLERS), "--use-service-account-credentials=false",
        "--node-monitor-period", NODE_MONITOR_PERIOD] + common)
    kwok = kwok_binary(cache)
    spawn("kwok", [kwok, "--kubeconfig", config, "--config", stages(cache, workdir),
                   "--manage-nodes-with-annotation-selector", "%s=fake" % KWOK_ANNOTATION,
                   "--node-port", "0", "--server-address", ""])  # no kubelet port: nothing else binds
    return ports


def _healthy(port: int) -> bool:
    """/healthz of a component on the loopback (always allowed without a
    token; its certificate is its own self-signed one: not verified)."""
    import ssl
    import urllib.request

    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with urllib.request.urlopen("https://127.0.0.1:%d/healthz" % port, timeout=2, context=context) as answer:
            return answer.status == 200 and answer.read(16) == b"ok"
    except (OSError, ValueError):
        return False


def wait_ready(procs: Dict[str, subprocess.Popen], ports: Dict[str, int], workdir: str,
               timeout: float = 90.0) -> None:
    """The scheduler and the controller manager answer /healthz; KWOK is
    running (a test waits for its Nodes' Ready: gpugate.testbed.kube.add_node)."""
    deadline = time.monotonic() + timeout
    waiting = dict(ports)
    while time.monotonic() < deadline:
        for name in BINARIES + ("kwok",):
            proc = procs.get(name)
            if proc is None or proc.poll() is not None:
                raise ClusterError("%s exited (%s): see %s" % (name, proc and proc.returncode,
                                                              os.path.join(workdir, name + ".log")))
        for name, port in list(waiting.items()):
            if _healthy(port):
                del waiting[name]
        if not waiting:
            return
        time.sleep(0.3)
    raise ClusterError("%s not healthy in %.0fs: see %s" % (", ".join(sorted(waiting)), timeout, workdir))


def compact(etcd_url: str) -> int:
    """One write, then etcd compacted up to it (what kube-apiserver's own
    compactor does every 5 minutes, after the cluster moved on): continue
    tokens and resourceVersions from before are gone.  Through etcd's JSON
    gateway, the write outside /registry (the API server never reads it);
    returns the revision."""
    import base64
    import json
    import urllib.request

    def post(path: str, body: dict) -> dict:
        request = urllib.request.Request(etcd_url + path, json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            return json.loads(answer.read(1 << 20))

    key, value = (base64.b64encode(text).decode() for text in (b"/gpugate-testbed/compacted", b"1"))
    revision = int(post("/v3/kv/put", {"key": key, "value": value})["header"]["revision"])
    post("/v3/kv/compaction", {"revision": revision, "physical": True})
    return revision
