"""The node agent's side of a Pod's preflight on Kubernetes (``[preflight]
kubernetes``): it serves the ``gpugate-preflight`` init container of
opted-in GPU Pods (gpugate.node.kube_preflight_call is the other end) on
``[preflight] kube_port``, and runs their proof (gpugate.node.kube_preflight_run).

The init container holds no key and no right: it only names its Pod.  The
agent believes nothing it is told; it reads the Pod from the API server
and serves it only where the Pod is bound to this agent's Node, has that
init container, and has not started (a stranger's connection can at most
ask for a proof the named Pod is about to ask for itself).  One proof per
Pod (by uid: an init container that restarts hears the same verdict) and
one at a time on the node (its GPUs: a proof runs only for a Pod that
takes all of them).  Anyone may connect: a request is one line of at most 4 KiB within
5 s, and at most ``CONNECTIONS`` are served at once (a flood denies the
proof, which is undecided: the Pod starts, never capacity).

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
from urllib.parse import quote

from gpugate.errors import GpugateError
from gpugate.node import kube_preflight_run as pod_run

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable, Dict, Optional, Tuple

CONTAINER = "gpugate-preflight"  # the init container's name (the chart's policy injects it)
REQUEST_CAP = 4096
REQUEST_SECONDS = 5.0
CONNECTIONS = 32
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


def check_pod(pod: dict, uid: str, kube_node: str) -> str:
    """Why this agent does not serve the Pod ("" where it does).  Pure."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    if str(meta.get("uid") or "") != uid:
        return "the Pod's uid is not the one named (it was recreated)"
    if spec.get("nodeName") != kube_node:
        return "the Pod is not bound to this node (%s)" % kube_node
    if meta.get("deletionTimestamp"):
        return "the Pod is being deleted"
    if not any((c or {}).get("name") == CONTAINER for c in spec.get("initContainers") or []):
        return "the Pod has no %s init container" % CONTAINER
    if status.get("phase") not in (None, "Pending"):
        return "the Pod is %s, past its preflight" % status.get("phase")
    for item in status.get("initContainerStatuses") or []:
        if (item or {}).get("name") == CONTAINER and ((item.get("state") or {}).get("terminated")):
            return "the Pod's preflight has ended"
    return ""


class PreflightServer:
    """Serves the preflight port beside the agent's loop (threads)."""

    def __init__(self, settings, node: str, kube_node: str, connect: Callable[[], object], port: int,
                 address: str = ""):
        self.settings, self.node, self.kube_node, self.connect = settings, node, kube_node, connect
        self.port, self.address = port, address
        self.slots = threading.BoundedSemaphore(CONNECTIONS)
        self.node_lock = threading.Lock()  # one proof at a time on this node's GPUs
        self.lock = threading.Lock()
        self.verdicts: Dict[str, dict] = {}  # Pod uid -> its final answer
        self.pinned: Dict[str, float] = {}  # gang key -> when this node was found its culprit
        self.running: Dict[str, threading.Event] = {}  # Pod uid or gang -> done
        self.sock: Optional[socket.socket] = None

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
        if self.sock is not None:
            self.sock.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            if not self.slots.acquire(blocking=False):
                conn.close()  # a flood: this one is undecided, the Pod starts
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        record: Dict[str, object] = {"node": self.node, "mode": "kube-preflight"}
        started = time.monotonic()
        try:
            answer = self._answer(conn, record)
        except Exception as exc:  # noqa: BLE001 - a proof that cannot decide never takes capacity
            answer = {"verdict": pod_run.UNDECIDED, "why": "%s: %s" % (type(exc).__name__, str(exc)[:200])}
        answer["node"] = self.kube_node
        record.update(verdict=answer["verdict"], why=str(answer.get("why", ""))[:300],
                      seconds=round(time.monotonic() - started, 3))
        try:
            _send(conn, answer)
        except OSError:
            record["send_error"] = "the init container was gone before the verdict"
        finally:
            conn.close()
            self.slots.release()
        self._log(record)

    def _answer(self, conn: socket.socket, record: dict) -> dict:
        try:
            namespace, name, uid = parse_request(_read_line(conn))
        except Refused as exc:
            return {"verdict": pod_run.UNDECIDED, "why": str(exc)}
        record["pod"], record["uid"] = "%s/%s" % (namespace, name), uid
        with self.lock:
            if uid in self.verdicts:
                return dict(self.verdicts[uid], again=True)
        client = self.connect()
        try:
            pod = client.get("/api/v1/namespaces/%s/pods/%s" % (quote(namespace, safe=""), quote(name, safe="")))
            refused = check_pod(pod, uid, self.kube_node)
            if refused:
                return {"verdict": pod_run.UNDECIDED, "why": refused}
            answer = self._once(uid, lambda: self._prove(client, pod, conn, record))
        finally:
            getattr(client, "close", lambda: None)()
        return answer

    def _once(self, uid: str, prove: Callable[[], dict]) -> dict:
        """The Pod's proof, run once: a second request for it while it runs waits for the first's."""
        with self.lock:
            event = self.running.get(uid)
            mine = event is None
            if mine:
                event = self.running[uid] = threading.Event()
        if not mine:
            event.wait(float(self.settings.preflight["timeout_seconds"]) + float(
                self.settings.preflight["across_seconds"]) + 30)
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
        def progress(text: str) -> None:
            try:
                _send(conn, {"progress": text[:300]})
            except OSError:
                pass  # the init container went: the proof still decides for the node

        if not self.node_lock.acquire(timeout=float(self.settings.preflight["timeout_seconds"])):
            return {"verdict": pod_run.UNDECIDED, "why": "another Pod's preflight holds this node's GPUs"}
        try:
            verdict, why, pf = pod_run.run_pod(self.settings, self.node, self.kube_node, client, pod, CONTAINER,
                                               progress, self.pinned)
            while len(self.pinned) > KEEP_VERDICTS:
                self.pinned.pop(next(iter(self.pinned)))
        finally:
            self.node_lock.release()
        record["preflight"] = pf
        return {"verdict": verdict, "why": why}

    def _log(self, record: dict) -> None:
        from gpugate.node.logline import emit

        try:
            emit(self.settings.log, self.settings.state_dir(self.node), record)
        except OSError as exc:
            sys.stderr.write("gpugate agent: the preflight's log line was not written: %s\n" % exc)


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
