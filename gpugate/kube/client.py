"""A small Kubernetes API client over http.client, covering only what
gpugate calls: get, list (paginated), patch (merge, strategic-merge, JSON),
create and replace.  Every request is bounded by the client's timeout and
an optional deadline (time.monotonic()); nothing is retried here (the
callers decide: a node-side run tries again next run).

Authentication is a bearer token (a ServiceAccount's, or a site's) and the
server is verified against a CA file; in a pod both come from the
ServiceAccount mount and KUBERNETES_SERVICE_HOST/PORT."""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import time
from urllib.parse import quote, urlencode, urlsplit

from gpugate.errors import GpugateError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict, Iterator, Optional

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
PATCH_TYPES = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
}
_MAX_BODY = 256 << 20  # a list page of 500 nodes is a few MB; never read without a bound


class KubeError(GpugateError):
    """The API server refused or did not answer.  status: the HTTP status
    (0: no answer), reason: the Status object's reason (Conflict, NotFound,
    Forbidden, Expired, ...)."""

    def __init__(self, message: str, status: int = 0, reason: str = ""):
        super().__init__(message)
        self.status, self.reason = status, reason

    @property
    def ask_again(self) -> bool:
        """No answer, 429 or 5xx; never a Forbidden or a NotFound (answers the same read gets again)."""
        return self.status == 0 or self.status == 429 or self.status >= 500


def in_cluster_server(environ=os.environ) -> str:
    host, port = environ.get("KUBERNETES_SERVICE_HOST", ""), environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        return ""
    return "https://%s:%s" % ("[%s]" % host if ":" in host else host, port)


class KubeClient:
    """One API server.  ``requests`` counts the requests made (the keeper's
    figures and the scale benchmark read it)."""

    def __init__(self, server: str, token: str = "", ca_file: str = "", timeout: float = 10.0,
                 deadline: Optional[float] = None):
        parts = urlsplit(server)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise KubeError("kubernetes server %r: expected https://HOST[:PORT]" % server)
        self.server, self.token, self.timeout, self.deadline = server, token, float(timeout), deadline
        self.host, self.port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
        self.scheme = parts.scheme
        self._context = None
        if parts.scheme == "https":
            self._context = ssl.create_default_context(cafile=ca_file or None)
        self._conn = None
        self.requests = 0

    # ------------------------------------------------------------ transport
    def _connection(self, timeout: float):
        if self._conn is None:
            if self.scheme == "https":
                self._conn = http.client.HTTPSConnection(self.host, self.port, timeout=timeout,
                                                         context=self._context)
            else:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        else:
            self._conn.timeout = timeout
            if self._conn.sock is not None:
                self._conn.sock.settimeout(timeout)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _time_left(self) -> float:
        limit = self.timeout
        if self.deadline is not None:
            limit = min(limit, self.deadline - time.monotonic())
        if limit <= 0:
            raise KubeError("kubernetes: no time left for another request (the run's deadline has passed)")
        return limit

    def request(self, method: str, path: str, body=None, content_type: str = "application/json",
                query: Optional[Dict[str, Any]] = None, text: bool = False) -> Dict[str, Any]:
        """The decoded JSON answer; KubeError for anything but 2xx, and for
        a 2xx that is not a JSON object (a proxy's page must never read as
        an empty Node).  text: the answer is plain text ({"text": ...})."""
        url = path + ("?" + urlencode(query) if query else "")
        headers = {"Accept": "application/json", "User-Agent": "gpugate"}
        if self.token:
            headers["Authorization"] = "Bearer " + self.token
        data = None
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = content_type
        for attempt in (1, 2):
            limit = self._time_left()
            reused = self._conn is not None and self._conn.sock is not None
            self.requests += 1
            try:
                conn = self._connection(limit)
                conn.request(method, url, body=data, headers=headers)
                response = conn.getresponse()
                raw = response.read(_MAX_BODY + 1)
                break
            except (OSError, http.client.HTTPException) as exc:
                self.close()  # a half-read connection is never reused
                # A kept-alive connection the server closed meanwhile: a GET
                # (which changes nothing) is asked once more on a new one.
                if attempt == 1 and reused and method == "GET" and not isinstance(exc, socket.timeout):
                    continue
                raise KubeError("kubernetes %s %s: no answer from %s within %.1fs: %s"
                                % (method, path, self.server, limit, exc)) from None
        if len(raw) > _MAX_BODY:
            self.close()
            raise KubeError("kubernetes %s %s: answer larger than %d bytes" % (method, path, _MAX_BODY))
        if text and 200 <= response.status < 300:
            return {"text": raw.decode("utf-8", "replace")}
        try:
            answer = json.loads(raw)
        except (ValueError, RecursionError):  # RecursionError: nested past the interpreter's limit
            answer = None
        if not 200 <= response.status < 300:
            reason = answer.get("reason", "") if isinstance(answer, dict) else ""
            message = (answer.get("message", "") if isinstance(answer, dict)
                       else raw[:200].decode("utf-8", "replace"))
            # A refused eviction names the PodDisruptionBudget in its causes only.
            details = answer.get("details") if isinstance(answer, dict) else None
            causes = [c["message"] for c in (details.get("causes") or [] if isinstance(details, dict) else [])
                      if isinstance(c, dict) and isinstance(c.get("message"), str)]
            message = "; ".join([message] + causes[:3])
            # Up to 1000 characters: a write two admission policies refuse
            # names both, in either order; an admin needs each one's words.
            raise KubeError("kubernetes %s %s: %d %s: %s" % (method, path, response.status, reason or
                                                             response.reason, message[:1000]),
                            response.status, reason)
        if not isinstance(answer, dict):
            raise KubeError("kubernetes %s %s: %d, but the answer is not a JSON object: %r"
                            % (method, path, response.status, raw[:120]))
        return answer

    def wait_for_change(self, path: str, version: str, seconds: float, **query) -> bool:
        """Block until the watched collection (``path`` and its field
        selector) changes after ``version``, or ``seconds`` pass: True on a
        change.  Its own connection, closed after; KubeError when the watch
        cannot be made (the caller then polls)."""
        query = dict(query, watch="1", resourceVersion=version, timeoutSeconds=str(max(1, int(seconds))))
        headers = {"Accept": "application/json", "User-Agent": "gpugate"}
        if self.token:
            headers["Authorization"] = "Bearer " + self.token
        conn = (http.client.HTTPSConnection(self.host, self.port, timeout=seconds + 10, context=self._context)
                if self.scheme == "https" else http.client.HTTPConnection(self.host, self.port, timeout=seconds + 10))
        self.requests += 1
        try:
            conn.request("GET", path + "?" + urlencode(query), headers=headers)
            response = conn.getresponse()
            if response.status != 200:
                raise KubeError("kubernetes watch %s: %d %s" % (path, response.status, response.reason),
                                response.status, response.reason)
            line = response.readline(1 << 20)  # one event (a Node of a few KB), or the end of the watch
            if not line:
                return False
            try:
                event = json.loads(line)
            except (ValueError, RecursionError):
                raise KubeError("kubernetes watch %s: an event that is not JSON" % path) from None
            if not isinstance(event, dict) or event.get("type") == "ERROR":  # (410: too old a version)
                raise KubeError("kubernetes watch %s: %s" % (path, str(event)[:200]))
            return True
        except (OSError, http.client.HTTPException) as exc:
            if isinstance(exc, socket.timeout):
                return False
            raise KubeError("kubernetes watch %s: %s" % (path, exc)) from None
        finally:
            conn.close()

    # ------------------------------------------------------------ verbs
    def get(self, path: str) -> Dict[str, Any]:
        return self.request("GET", path)

    def list_pages(self, path: str, limit: int = 500, **query) -> Iterator[Dict[str, Any]]:
        """Every item of a collection, one page of ``limit`` at a time.  A
        continue token that expired (410) starts the list again, once:
        what is returned is then one consistent snapshot, never two halves."""
        for attempt in (1, 2):
            items, token = [], ""
            try:
                while True:
                    page = self.request("GET", path, query=dict(query, limit=limit, **({"continue": token}
                                                                                        if token else {})))
                    items.extend(page.get("items") or [])
                    token = (page.get("metadata") or {}).get("continue") or ""
                    if not token:
                        return iter(items)
            except KubeError as exc:
                if exc.status != 410 or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def patch(self, path: str, patch, kind: str = "merge") -> Dict[str, Any]:
        return self.request("PATCH", path, patch, PATCH_TYPES[kind])

    def create(self, path: str, body) -> Dict[str, Any]:
        return self.request("POST", path, body)

    def replace(self, path: str, body) -> Dict[str, Any]:
        return self.request("PUT", path, body)


def node_path(name: str, sub: str = "") -> str:
    return "/api/v1/nodes/" + quote(name, safe="") + ("/" + sub if sub else "")


def connect(kube: Dict[str, Any], deadline: Optional[float] = None, environ=os.environ) -> KubeClient:
    """A client from gpugate.toml's [kubernetes] (its server, or the pod's
    own; its token and CA files, by default the ServiceAccount's)."""
    server = str(kube.get("server") or "") or in_cluster_server(environ)
    if not server:
        raise KubeError("kubernetes: no server: set [kubernetes] server in gpugate.toml, or run in a pod "
                        "(KUBERNETES_SERVICE_HOST)")
    token = ""
    token_file = str(kube.get("token_file") or "")
    if token_file:
        try:
            with open(token_file) as handle:
                token = handle.read(64 << 10).strip()
        except OSError as exc:
            raise KubeError("kubernetes: cannot read the token file %s: %s (set [kubernetes] token_file)"
                            % (token_file, exc.strerror or exc)) from None
    ca_file = str(kube.get("ca_file") or "")
    try:
        return KubeClient(server, token, ca_file if server.startswith("https:") else "",
                          float(kube.get("timeout_seconds", 10.0)), deadline)
    except (OSError, ssl.SSLError) as exc:
        raise KubeError("kubernetes: cannot use the CA file %s: %s (set [kubernetes] ca_file)"
                        % (ca_file, exc)) from None
