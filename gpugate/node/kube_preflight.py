"""The node agent's side of a Pod's preflight on Kubernetes (``[preflight]
kubernetes``): it serves the ``gpugate-preflight`` init container of
opted-in GPU Pods (gpugate.node.kube_preflight_call is the other end) on
``[preflight] kube_port``, and runs their proof (gpugate.node.kube_preflight_run).

The init container holds no key and no right: it only names its Pod.  The
agent believes nothing it is told; it reads the Pod from the API server
and serves it only where the Pod is bound to this agent's Node, that init
container is its first and the kubelet reports it running
(gpugate.node.kube_preflight_pod: a stranger's connection can at most ask
for a proof the named Pod is about to ask for itself).  Until then the
peer hears only that it is not served.  One proof per
Pod (by uid: an init container that restarts hears the same verdict) and
one at a time on the node (its GPUs: a proof runs only for a Pod that
takes all of them).  Anyone may connect: a request is one line of at most 4 KiB within
5 s, and at most ``CONNECTIONS`` are served at once, ``PER_PEER`` from one
address (a flood denies the proof, which is undecided: the Pod starts,
never capacity).

The wire: the request ``{"namespace", "pod", "uid"}``, one JSON line;
the answers, JSON lines: ``{"progress"}`` while it runs, then
``{"verdict": "passed"|"failed"|"undecided", "why", "node"}``.  Every
served request leaves one structured log line (mode "kube-preflight")."""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
import time

from gpugate.errors import GpugateError
from gpugate.node import kube_preflight_pod as pods
from gpugate.node import kube_preflight_run as pod_run

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, Optional, Tuple

CONTAINER = pods.CONTAINER
REQUEST_CAP = 4096
REQUEST_SECONDS = 5.0
CONNECTIONS = 32
PER_PEER = 4  # connections one address may hold at once: one machine cannot take every slot
NOT_SERVED = "not served here (the node agent's log says why: gpugate.log, mode kube-preflight)"
KEEP_VERDICTS = 4096  # Pods' verdicts remembered (by uid), oldest dropped first
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_UID = re.compile(r"^[0-9a-fA-F-]{1,64}$")


class Refused(GpugateError):
    """A request this agent does not serve: said back as undecided."""


def parse_request(line: bytes) -> Tuple[str, str, str]:
    """(namespace, pod, uid) from a request line, or Refused.  Pure."""
    try:
        body = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise Refused("the request is not a JSON line") from None
    if not isinstance(body, dict):
        raise Refused("the request is not a JSON object")
    namespace, pod, uid = body.get("namespace"), body.get("pod"), body.get("uid")
    for value, what, rule in ((namespace, "namespace", _NAME), (pod, "pod", _NAME), (uid, "uid", _UID)):
        if not isinstance(value, str) or not rule.match(value):
            raise Refused("the request's %s is not a Kubernetes name" % what)
    return namespace, pod, uid


class PreflightServer:
    """Serves the preflight port beside the agent's loop (threads)."""

    def __init__(self, settings, node: str, kube_node: str, connect: Callable[[float], object], port: int,
                 address: str = ""):
        """connect(deadline): an API client whose every call ends by the
        deadline (time.monotonic())."""
        self.settings, self.node, self.kube_node, self.connect = settings, node, kube_node, connect
        self.port, self.address = port, address
        self.slots = threading.BoundedSemaphore(CONNECTIONS)
        self.node_lock = threading.Lock()  # one proof at a time on this node's GPUs
        self.lock = threading.Lock()
        self.verdicts: Dict[str, dict] = {}  # Pod uid -> its final answer
        self.pinned: Dict[str, list] = {}  # gang key -> [when this node was found its culprit, refused once]
        self.running: Dict[str, threading.Event] = {}  # Pod uid -> done
        self.peers: Dict[str, int] = {}  # address -> connections held
        self.sock: Optional[socket.socket] = None
        self.closed = False
        cfg = settings.preflight
        # A proof's worst case: the wait for the node's GPUs, then its own and the run across.
        self.worst = 2 * float(cfg["timeout_seconds"]) + float(cfg["across_seconds"]) + pods.ADMITTED_SECONDS + 30

    def start(self) -> "PreflightServer":
        family = socket.AF_INET6 if socket.has_ipv6 and ":" in (self.address or "::") else socket.AF_INET
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # IPv4 too
        except OSError:
            family, sock = socket.AF_INET, socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.address or ("::" if family == socket.AF_INET6 else "0.0.0.0"), self.port))
        sock.listen(64)
        self.sock = sock
        threading.Thread(target=self._accept, name="gpugate-preflight", daemon=True).start()
        return self

    def close(self) -> None:
        self.closed = True
        if self.sock is not None:
            try:
                self.sock.shutdown(socket.SHUT_RDWR)  # wakes the accept
            except OSError:
                pass
            self.sock.close()

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                if self.closed:
                    return
                time.sleep(0.5)  # out of descriptors, a connection reset before accept: the port stays served
                continue
            address = str(peer[0]) if isinstance(peer, tuple) and peer else ""
            if not self._take(address):
                self._log({"node": self.node, "mode": "kube-preflight", "peer": address, "verdict": "refused",
                           "why": "connections full (%d in all, %d an address)" % (CONNECTIONS, PER_PEER)}, once=True)
                conn.close()  # a flood: this one is undecided, the Pod starts
                continue
            try:
                threading.Thread(target=self._serve, args=(conn, address), daemon=True).start()
            except RuntimeError:  # no thread could be made
                self._give(address)
                conn.close()

    def _take(self, address: str) -> bool:
        with self.lock:
            if self.peers.get(address, 0) >= PER_PEER or not self.slots.acquire(blocking=False):
                return False
            self.peers[address] = self.peers.get(address, 0) + 1
            return True

    def _give(self, address: str) -> None:
        with self.lock:
            self.peers[address] -= 1
            if not self.peers[address]:
                del self.peers[address]
            self.slots.release()

    def _serve(self, conn: socket.socket, address: str) -> None:
        record: Dict[str, object] = {"node": self.node, "mode": "kube-preflight", "peer": address}
        started = time.monotonic()
        try:
            answer = self._answer(conn, record)
        except Exception as exc:  # noqa: BLE001 - a proof that cannot decide never takes capacity
            record["error"] = "%s: %s" % (type(exc).__name__, str(exc)[:200])
            answer = {"verdict": pod_run.UNDECIDED, "why": NOT_SERVED}
        answer["node"] = self.kube_node
        record.update(verdict=answer["verdict"], why=str(record.pop("why_refused", answer.get("why", "")))[:300],
                      seconds=round(time.monotonic() - started, 3))
        try:
            _send(conn, answer)
        except OSError:
            record["send_error"] = "the init container was gone before the verdict"
        finally:
            conn.close()
            self._give(address)
        self._log(record)

    def _answer(self, conn: socket.socket, record: dict) -> dict:
        """The answer to one connection.  Until the Pod is found to be one this
        agent serves, the peer hears only NOT_SERVED (the log line says why):
        a stranger learns nothing of other namespaces' Pods."""
        try:
            namespace, name, uid = parse_request(_read_line(conn))
        except Refused as exc:
            record["why_refused"] = str(exc)
            return {"verdict": pod_run.UNDECIDED, "why": NOT_SERVED}
        record["pod"], record["uid"] = "%s/%s" % (namespace, name), uid
        client = self.connect(time.monotonic() + self.worst)
        try:
            pod, refused = pods.admitted(client, pods.read_pod(client, namespace, name), uid, self.kube_node)
            if refused:
                record["why_refused"] = refused
                return {"verdict": pod_run.UNDECIDED, "why": NOT_SERVED}
            return self._once(uid, lambda: self._prove(client, pod, conn, record))
        finally:
            getattr(client, "close", lambda: None)()

    def _once(self, uid: str, prove: Callable[[], dict]) -> dict:
        """The Pod's proof, run once: its verdict again for a later request, a
        second request while it runs waits for the first's."""
        with self.lock:
            if uid in self.verdicts:
                return dict(self.verdicts[uid], again=True)
            event = self.running.get(uid)
            mine = event is None
            if mine:
                event = self.running[uid] = threading.Event()
        if not mine:
            event.wait(self.worst)
            with self.lock:
                return dict(self.verdicts.get(uid) or {"verdict": pod_run.UNDECIDED,
                                                       "why": "the Pod's proof did not end in time"})
        try:
            answer = prove()
            with self.lock:
                self.verdicts[uid] = answer
                while len(self.verdicts) > KEEP_VERDICTS:
                    self.verdicts.pop(next(iter(self.verdicts)))
            return answer
        finally:
            with self.lock:
                self.running.pop(uid, None)
            event.set()

    def _prove(self, client, pod: dict, conn: socket.socket, record: dict) -> dict:
        meta = pod.get("metadata") or {}
        namespace, name, uid = str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid"))

        def progress(text: str) -> None:
            try:
                _send(conn, {"progress": text[:300]})
            except OSError:
                pass  # the init container went: the proof still decides for the node

        def still_here() -> str:
            try:
                now = pods.read_pod(client, namespace, name)
            except GpugateError as exc:
                return "it cannot be read: %s" % str(exc)[:100]
            return pods.check_pod(now, uid, self.kube_node) or ("" if pods.in_preflight(now) else
                                                                "its preflight is no longer running")

        if not self.node_lock.acquire(timeout=float(self.settings.preflight["timeout_seconds"])):
            return {"verdict": pod_run.UNDECIDED, "why": "another Pod's preflight holds this node's GPUs"}
        try:
            verdict, why, pf = pod_run.run_pod(self.settings, self.node, self.kube_node, client, pod, progress,
                                               self.pinned, still_here)
            while len(self.pinned) > KEEP_VERDICTS:
                self.pinned.pop(next(iter(self.pinned)))
        finally:
            self.node_lock.release()
        record["preflight"] = pf
        return {"verdict": verdict, "why": why}

    def _log(self, record: dict, once: bool = False) -> None:
        """One structured line (mode kube-preflight); ``once``: at most one a minute (a flood's)."""
        from gpugate.node.logline import emit

        if once:
            now = time.monotonic()
            if now - getattr(self, "_said", -60.0) < 60.0:
                return
            self._said = now
        try:
            emit(self.settings.log, self.settings.state_dir(self.node), record)
        except OSError as exc:
            sys.stderr.write("gpugate agent: the preflight's log line was not written: %s\n" % exc)


def serve(settings, node: str, connect: Callable[[float], object]) -> Optional[PreflightServer]:
    """The preflight port beside the agent's loop, or None where it cannot be
    served (the port taken, no such address): said on stderr, and the agent
    goes on with its health checks, which gate the node whether or not a
    preflight runs (the init containers, unanswered, are undecided)."""
    try:
        return PreflightServer(settings, node, node, connect, int(settings.preflight["kube_port"])).start()
    except OSError as exc:
        sys.stderr.write("gpugate agent: the preflight port %s cannot be served (%s): the preflight is off on "
                         "this node, its health checks go on\n" % (settings.preflight["kube_port"], exc))
        return None


def _read_line(conn: socket.socket) -> bytes:
    """One line of at most REQUEST_CAP bytes within REQUEST_SECONDS, or Refused."""
    until, data = time.monotonic() + REQUEST_SECONDS, b""
    while b"\n" not in data:
        left = until - time.monotonic()
        if left <= 0:
            raise Refused("no request line in %.0fs" % REQUEST_SECONDS)
        conn.settimeout(left)
        try:
            chunk = conn.recv(REQUEST_CAP)
        except socket.timeout:
            raise Refused("no request line in %.0fs" % REQUEST_SECONDS) from None
        if not chunk:
            raise Refused("the connection closed before a request line")
        data += chunk
        if len(data) > REQUEST_CAP:
            raise Refused("the request is over %d bytes" % REQUEST_CAP)
    conn.settimeout(None)
    return data.split(b"\n", 1)[0]


def _send(conn: socket.socket, body: dict) -> None:
    conn.settimeout(10.0)
    conn.sendall(json.dumps(body, sort_keys=True).encode() + b"\n")
