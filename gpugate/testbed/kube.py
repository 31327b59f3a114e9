"""A real Kubernetes API server for the tests and the demo: etcd and
kube-apiserver as scripts/kube-build built them (no controller-manager,
scheduler or kubelet: envtest's model, DESIGN.md section 10); with
``control_plane=True`` also kube-scheduler, kube-controller-manager and
KWOK's fake kubelets (gpugate.testbed.kube_control).

Users come from a static token file: ``admin`` (system:masters) for the
test's own writes, and the ServiceAccount users the manifests bind
(deploy/kubernetes), so a test's node agent or keeper runs with exactly the
RBAC the manifests grant."""

import os
import shutil
import signal
import subprocess
import time
from typing import Dict, List, Optional, Sequence

from gpugate.testbed import manifests
from gpugate.testbed.procs import ClusterError, free_ports

CACHE_ENV = "GPUGATE_KUBE_CACHE"
DEFAULT_CACHE = "/var/cache/gpugate/kube"
NAMESPACE = "gpugate"
OPERATOR_NAMESPACES = ("gpu-operator", "kube-amd-gpu")
# Token -> (user, groups): the node agent's and the keeper's ServiceAccounts (deploy/kubernetes).
USERS = {
    "admin": ("admin", "system:masters"),
    "agent": ("system:serviceaccount:%s:gpugate-node-agent" % NAMESPACE, "system:serviceaccounts"),
    "keeper": ("system:serviceaccount:%s:gpugate-keeper" % NAMESPACE, "system:serviceaccounts"),
    "sweep": ("system:serviceaccount:%s:gpugate-sweep" % NAMESPACE, "system:serviceaccounts"),
    "stranger": ("system:serviceaccount:default:someone", "system:serviceaccounts"),
}


# kind -> its collection's path (gpugate.testbed.manifests: every kind the chart renders).
_COLLECTIONS = manifests.COLLECTIONS


def cache_dir() -> str:
    return os.environ.get(CACHE_ENV, DEFAULT_CACHE)


def built_versions() -> List[str]:
    """The releases built here (newest last)."""
    root = cache_dir()
    try:
        names = os.listdir(root)
    except OSError:
        return []
    found = [n for n in names if os.access(os.path.join(root, n, "kube-apiserver"), os.X_OK)
             and os.access(os.path.join(root, n, "etcd"), os.X_OK)]
    return sorted(found, key=lambda v: tuple(int(p) for p in v.split(".") if p.isdigit()))


class KubeAPI:
    def __init__(self, workdir: str, version: Optional[str] = None, control_plane: bool = False,
                 apiserver_args: Sequence[str] = ()):
        """apiserver_args: more kube-apiserver flags (an alpha API: --feature-gates, --runtime-config)."""
        versions = built_versions()
        if not versions:
            raise ClusterError("no kube-apiserver built in %s: run scripts/kube-build" % cache_dir())
        # GPUGATE_KUBE_VERSION: the release a run tests (scripts/test --kube runs each one built).
        self.version = version or os.environ.get("GPUGATE_KUBE_VERSION") or versions[-1]
        if self.version not in versions:
            raise ClusterError("kube-apiserver %s is not built in %s (built: %s): scripts/kube-build %s"
                               % (self.version, cache_dir(), ", ".join(versions), self.version))
        self.bin = os.path.join(cache_dir(), self.version)
        self.dir = workdir
        self.procs: Dict[str, subprocess.Popen] = {}
        self.server = ""
        self.ca_file = os.path.join(workdir, "certs", "apiserver.crt")
        self.control_plane, self.apiserver_args = control_plane, list(apiserver_args)

    def token_file(self, who: str) -> str:
        return os.path.join(self.dir, "token-" + who)

    def start(self, timeout: float = 90.0) -> "KubeAPI":
        try:
            return self._start(timeout)
        except BaseException:  # a start that failed leaves no process behind (its caller has no KubeAPI to stop)
            self.stop()
            raise

    def _start(self, timeout: float) -> "KubeAPI":
        os.makedirs(os.path.join(self.dir, "certs"), exist_ok=True)
        etcd_port, peer_port, api_port = free_ports(3)
        key = os.path.join(self.dir, "sa.key")
        subprocess.run(["openssl", "genrsa", "-out", key, "2048"], check=True, capture_output=True, timeout=60)
        with open(os.path.join(self.dir, "tokens.csv"), "w") as handle:
            for i, (who, (user, groups)) in enumerate(sorted(USERS.items())):
                handle.write('%s-token,%s,uid-%d,"%s"\n' % (who, user, i, groups))
                with open(self.token_file(who), "w") as tok:
                    tok.write("%s-token\n" % who)
        etcd_url, peer_url = "http://127.0.0.1:%d" % etcd_port, "http://127.0.0.1:%d" % peer_port
        self._spawn("etcd", [os.path.join(self.bin, "etcd"), "--name", "default",
                             "--data-dir", os.path.join(self.dir, "etcd"), "--listen-client-urls", etcd_url,
                             "--advertise-client-urls", etcd_url, "--listen-peer-urls", peer_url,
                             "--initial-advertise-peer-urls", peer_url,
                             "--initial-cluster", "default=" + peer_url, "--unsafe-no-fsync"])
        self._spawn("kube-apiserver", [
            os.path.join(self.bin, "kube-apiserver"), "--etcd-servers", etcd_url,
            "--cert-dir", os.path.join(self.dir, "certs"), "--secure-port", str(api_port),
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--service-account-key-file", key, "--service-account-signing-key-file", key,
            "--authorization-mode", "RBAC", "--token-auth-file", os.path.join(self.dir, "tokens.csv"),
            "--disable-admission-plugins", "ServiceAccount", "--service-cluster-ip-range", "10.0.0.0/24",
            "--allow-privileged=true", "--anonymous-auth=false",
            "--endpoint-reconciler-type", "none"]  # a loopback advertise address: no Endpoints reconciling
            # With the control plane, the Nodes' lists come from etcd (no watch cache for them): a
            # continue token then expires with etcd's compaction (410 Gone), as a real server's does.
            + (["--watch-cache-sizes", "nodes#0"] if self.control_plane else []) + self.apiserver_args)
        self.etcd_url = etcd_url
        self.server = "https://127.0.0.1:%d" % api_port
        self._wait_ready(timeout)
        admin = self.admin()
        # gpugate's namespace, and the GPU operators' (their charts make them; operator-rbac.yaml binds in them)
        for name in (NAMESPACE,) + OPERATOR_NAMESPACES:
            admin.create("/api/v1/namespaces", {"metadata": {"name": name}})
        if self.control_plane:
            from gpugate.testbed import kube_control

            ports = kube_control.start(self._spawn, self.dir, self.bin, cache_dir(), self.server, self.ca_file,
                                       "admin-token")
            kube_control.wait_ready(self.procs, ports, self.dir, timeout)
        return self

    def _spawn(self, name: str, argv: List[str]) -> None:
        log = open(os.path.join(self.dir, name + ".log"), "wb")
        self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            start_new_session=True)
        log.close()

    def _wait_ready(self, timeout: float) -> None:
        from gpugate.kube.client import KubeError

        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise ClusterError("%s exited (%s): see %s" % (name, proc.returncode,
                                                                  os.path.join(self.dir, name + ".log")))
            if os.path.exists(self.ca_file):
                try:
                    self.admin().request("GET", "/readyz", text=True)  # "ok", not JSON
                    return
                except KubeError as exc:
                    last = str(exc)
            time.sleep(0.2)
        raise ClusterError("kube-apiserver not ready in %.0fs (%s): see %s" % (timeout, last[:200], self.dir))

    def client(self, who: str = "admin", **kwargs):
        from gpugate.kube.client import KubeClient

        with open(self.token_file(who)) as handle:
            return KubeClient(self.server, handle.read().strip(), self.ca_file, **kwargs)

    def admin(self):
        return self.client("admin")

    def apply(self, source) -> List[tuple]:
        """Every manifest in ``source`` (a directory of *.yaml, as
        deploy/kubernetes, or a list of objects, as `helm template` renders
        them), created by the admin with strict server-side field validation
        (gpugate.testbed.manifests.apply: an unknown field is refused; a
        refusal raises the server's words).  Returns the (kind, name) applied."""
        docs = manifests.load_dir(source) if isinstance(source, str) else list(source)
        applied = manifests.apply(self.admin(), docs)
        if ("ValidatingAdmissionPolicy", "gpugate-node-agent") in applied:
            self._wait_for_agent_policy()
        return applied

    def _wait_for_agent_policy(self, timeout: float = 30.0) -> None:
        """A new admission policy is enforced once the API server has
        loaded it, a moment after it is created: until then the agent's
        token could write what the policy refuses.  Probed as it will be
        used: the agent's dry-run write of a label on a Node of its own."""
        from gpugate.kube.client import KubeError, node_path

        admin, probe = self.admin(), "gpugate-policy-probe"
        admin.create("/api/v1/nodes", {"metadata": {"name": probe}})
        last = "no answer"
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    self.client("agent").request("PATCH", node_path(probe), {"metadata": {"labels": {"probe": "x"}}},
                                                 "application/merge-patch+json", query={"dryRun": "All"})
                    last = "the agent's label write was let through"
                except KubeError as exc:
                    if exc.status in (403, 422) and "does not change a Node's labels" in str(exc):
                        return
                    last = str(exc)[:200]  # RBAC not caught up with the bindings yet, say: not yet
                time.sleep(0.2)
            raise ClusterError("the gpugate-node-agent admission policy was not enforced in %.0fs (%s)"
                               % (timeout, last))
        finally:
            try:
                admin.request("DELETE", node_path(probe))
            except KubeError:
                pass  # what the probe found matters more; a later add_node never takes this name

    def kube_settings(self, who: str) -> Dict[str, object]:
        """gpugate.toml's [kubernetes] for one of USERS."""
        return {"server": self.server, "token_file": self.token_file(who), "ca_file": self.ca_file}

    def write_pids(self) -> None:
        """Left running (the demo's --keep): each process's pid, to stop it by hand."""
        for name, proc in self.procs.items():
            with open(os.path.join(self.dir, name + ".pid"), "w") as handle:
                handle.write("%d\n" % proc.pid)

    def stop(self) -> None:
        for name in reversed(list(self.procs)):  # the control plane, the API server, etcd last
            proc = self.procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=15)
        shutil.rmtree(os.path.join(self.dir, "etcd"), ignore_errors=True)


def add_node(admin, name: str, labels: Optional[Dict[str, str]] = None, taints=(), gpus: int = 8,
             kwok: bool = False) -> None:
    """A Node object as a kubelet would register it (created fresh), and
    the Ready condition and GPU capacity it would report.  kwok: KWOK plays
    its kubelet (KubeAPI(control_plane=True)): the Node has room for pods
    and is waited for until KWOK has reported it Ready."""
    from gpugate.kube.client import KubeError, node_path

    try:
        admin.request("DELETE", node_path(name))
    except KubeError:
        pass
    meta = {"name": name, "labels": dict(labels or {})}
    if kwok:
        from gpugate.testbed.kube_control import KWOK_ANNOTATION

        meta["annotations"] = {KWOK_ANNOTATION: "fake"}
        meta["labels"].setdefault("kubernetes.io/hostname", name)  # as a kubelet registers it
    room = {"nvidia.com/gpu": str(gpus)}
    if kwok:
        room.update({"cpu": "64", "memory": "512Gi", "pods": "110"})
    status = {"capacity": room, "allocatable": room, "nodeInfo": {"bootID": "boot-0-%s" % name}}
    if not kwok:  # KWOK writes its own conditions
        status["conditions"] = [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                 "message": "gpugate testbed", "lastHeartbeatTime": "2026-11-28T00:00:00Z",
                                 "lastTransitionTime": "2026-11-28T00:00:00Z"}]
    # Registered with its status, as a kubelet registers its Node: KWOK renders each status write
    # from the Node as an event showed it, four at once; a Node made bare and its status written
    # next let a render of the bare Node land last, with an empty bootID (a sweep then held it:
    # "its reboot could not be proven").
    made = admin.create("/api/v1/nodes", {"metadata": meta, "spec": {"taints": [dict(t) for t in taints]},
                                          "status": status})
    if ((made.get("status") or {}).get("nodeInfo") or {}).get("bootID") != status["nodeInfo"]["bootID"]:
        raise ClusterError("Node %s: the API server did not keep the status it was registered with" % name)
    if kwok:
        _wait_ready(admin, name)


def _wait_ready(admin, name: str, timeout: float = 60.0) -> None:
    """Ready=True and the node lifecycle controller's not-ready taint gone."""
    from gpugate.kube.client import node_path

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        node = admin.get(node_path(name))
        ready = [c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"]
        taints = [t.get("key") for t in (node.get("spec") or {}).get("taints") or []]
        if ready and ready[0].get("status") == "True" and "node.kubernetes.io/not-ready" not in taints:
            return
        time.sleep(0.2)
    raise ClusterError("Node %s not Ready (KWOK) in %.0fs" % (name, timeout))


class KubeFleet:
    """Simulated GPU nodes that are Kubernetes nodes: a sim fleet (gpugate
    sim init, the demo baseline), their Node objects, the drain budget key,
    and gpugate.toml for the node agent or the keeper (each with its own
    ServiceAccount's token: the manifests' RBAC is all it has)."""

    def __init__(self, api: KubeAPI, directory: str, names, baseline: str, labels=None, taints=(),
                 kwok: bool = False):
        import sys

        self.api, self.dir, self.names, self.baseline = api, directory, list(names), baseline
        self.fleet = os.path.join(directory, "fleet")
        self.python = sys.executable
        init = subprocess.run([self.python, "-m", "gpugate", "sim", "init", self.fleet, "--nodes",
                               ",".join(self.names), "--baseline", baseline], capture_output=True, text=True,
                              timeout=120)
        if init.returncode != 0:
            raise ClusterError("gpugate sim init failed: %s" % init.stderr.strip()[:300])
        self.key = os.path.join(directory, "drain-budget.key")
        with open(self.key, "wb") as handle:
            handle.write(os.urandom(32))
        os.chmod(self.key, 0o600)
        self.admin = api.admin()
        for name in self.names:
            add_node(self.admin, name, labels, taints, kwok=kwok)

    def config(self, who: str, share: float = 1.0, extra: str = "", sweep: str = "") -> str:
        """extra: more [kubernetes] lines; sweep: more [sweep] lines."""
        kube = self.api.kube_settings(who)
        path = os.path.join(self.dir, "gpugate-%s.toml" % who)
        with open(path, "w") as handle:
            handle.write(
                'baseline = "%s"\nstate_dir = "%s/state/{node}"\nlog = "file"\nscheduler = "kubernetes"\n'
                '[healthcheck]\nboot_grace_seconds = 0\n[sim]\nfleet = "%s"\n'
                '[sweep]\njournal = "%s/controller/sweep.db"\n%s\n'
                '[drain_budget]\nkey_file = "%s"\nmax_share = %s\n'
                '[kubernetes]\nserver = "%s"\ntoken_file = "%s"\nca_file = "%s"\n'
                'pool_label = "nvidia.com/gpu.product"\n%s\n'
                % (self.baseline, self.dir, self.fleet, self.dir, sweep, self.key, share, kube["server"],
                   kube["token_file"], kube["ca_file"], extra))
        return path

    def sweep_settings(self, poll: float = 0.3, drain_timeout: float = 20, smoke: bool = True) -> str:
        """The sweep's [sweep] and [kubernetes] lines for this fleet: the
        local transport, `gpugate sim converge`, the test kubelet's reboot
        (gpugate.testbed.kubelet), the replayed all_reduce_perf in a Pod."""
        import json

        gpugate = [self.python, "-m", "gpugate"]
        converge = gpugate + ["sim", "converge", self.fleet, "{nodes}", "--baseline", self.baseline]
        kube = self.api.kube_settings("admin")
        reboot = [self.python, "-m", "gpugate.testbed.kubelet", "reboot", "--fleet", self.fleet, "--server",
                  kube["server"], "--token-file", kube["token_file"], "--ca-file", kube["ca_file"], "{node}"]
        smoke_argv = [os.path.join(self.fleet, "{node}", "bin", "all_reduce_perf"), "-b", "1G", "-e", "8G", "-f",
                      "2", "-g", "{gpus}"] if smoke else []
        sweep = {"transport": "local", "gpugate": gpugate, "converge": converge, "poll_seconds": poll,
                 "drain_timeout": drain_timeout, "reboot_timeout": 60, "verify_timeout": 120, "smoke": smoke_argv,
                 "smoke_deadline": 60}
        lines = "\n".join("%s = %s" % (k, json.dumps(v)) for k, v in sweep.items())
        return lines, 'reboot = %s\nsmoke_image = "registry.example.com/nccl-tests:2.13"' % json.dumps(reboot)

    def node_config(self, config: str, node: str) -> str:
        """The node agent's config for its run on ``node``: its token names that Node
        (gpugate.testbed.kube_tokens; the agent's admission policy refuses one that names none)."""
        from gpugate.testbed.kube_tokens import node_config

        return node_config(self.api, config, node)

    def healthcheck(self, config: str, node: str) -> subprocess.CompletedProcess:
        """gpugate-healthcheck as installed, as the DaemonSet runs it (with a token naming its node)."""
        from gpugate.testbed.procs import installed_entry_point

        config = self.node_config(config, node)
        return subprocess.run([installed_entry_point("healthcheck"), "--config", config],
                              env={"GPUGATE_NODE_NAME": node}, capture_output=True, text=True, timeout=120)

    def sim(self, nodes: str, *assignments: str) -> None:
        out = subprocess.run([self.python, "-m", "gpugate", "sim", "set", self.fleet, nodes] + list(assignments),
                             capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            raise ClusterError("gpugate sim set: %s" % out.stderr.strip()[:300])

    def sweep(self, config: str, *args: str):
        """One `gpugate sweep --apply --json` run: (the process, its report; None when it printed none)."""
        import json

        out = subprocess.run([self.python, "-m", "gpugate", "sweep", "--config", config, "--apply", "--json"]
                             + list(args), capture_output=True, text=True, timeout=900)
        try:
            return out, json.loads(out.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return out, None

    def keeper(self, config: str) -> dict:
        """One `gpugate budget --json` run; its figures."""
        import json

        out = subprocess.run([self.python, "-m", "gpugate", "budget", "--config", config, "--json"],
                             capture_output=True, text=True, timeout=120)
        try:
            figures = json.loads(out.stdout)
        except ValueError:
            raise ClusterError("gpugate budget printed no figures (exit %d): %s"
                               % (out.returncode, out.stderr.strip()[:300])) from None
        figures["_exit"] = out.returncode
        return figures
