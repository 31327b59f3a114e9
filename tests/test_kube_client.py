"""gpugate.kube.client's transport rules against a real HTTP server on
loopback (http.server), for what a real kube-apiserver does not do on
demand: drop a kept-alive connection, answer through a proxy's page.
Everything else is tested against the real API server (test_kube_agent;
a 409 Conflict and a 410 Gone continue token: test_kube_control_plane)."""

import http.server
import json
import socketserver
import threading

import pytest

from gpugate.kube.client import KubeClient, KubeError


class _Threads(socketserver.ThreadingTCPServer):
    daemon_threads = True  # a kept-alive connection never holds shutdown


class _Server:
    def __init__(self, answer):
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            seen = []

            def _reply(self):
                Handler.seen.append((self.command, self.path))
                status, body, close = answer(len(Handler.seen))
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                self.close_connection = close  # closed without "Connection: close": the client may try to reuse it

            do_GET = do_PATCH = _reply

            def log_message(self, *args):
                pass

        self.handler = Handler
        self.server = _Threads(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def serve():
    servers = []

    def make(answer):
        servers.append(_Server(answer))
        return servers[-1]
    yield make
    for s in servers:
        s.stop()


def test_a_get_on_a_connection_the_server_closed_is_asked_once_more(serve):
    server = serve(lambda n: (200, json.dumps({"kind": "Node", "n": n}).encode(), True))
    client = KubeClient(server.url, timeout=5)
    assert client.get("/api/v1/nodes/a")["n"] == 1
    assert client.get("/api/v1/nodes/b")["n"] == 2  # the first try met the closed connection
    assert client.requests == 3


def test_a_patch_on_a_closed_connection_is_not_sent_twice(serve):
    server = serve(lambda n: (200, b'{"kind": "Node"}', True))
    client = KubeClient(server.url, timeout=5)
    client.get("/api/v1/nodes/a")
    with pytest.raises(KubeError) as info:
        client.patch("/api/v1/nodes/a", {"metadata": {"resourceVersion": "1"}})
    assert "no answer" in str(info.value)
    assert [c for c, _ in server.handler.seen].count("PATCH") == 0  # never half-written twice


@pytest.mark.parametrize("body", [b"<html>proxy</html>", b"", b"[]", b"ok"])
def test_a_success_that_is_not_a_json_object_is_an_error_never_an_empty_node(serve, body):
    server = serve(lambda n: (200, body, False))
    with pytest.raises(KubeError) as info:
        KubeClient(server.url, timeout=5).get("/api/v1/nodes/a")
    assert "not a JSON object" in str(info.value)


def test_a_refusal_says_the_servers_reason_or_its_text(serve):
    status = json.dumps({"kind": "Status", "reason": "Forbidden", "message": "nodes is forbidden"}).encode()
    server = serve(lambda n: (403, status, False) if n == 1 else (502, b"bad gateway from the proxy", False))
    client = KubeClient(server.url, timeout=5)
    with pytest.raises(KubeError) as info:
        client.get("/api/v1/nodes")
    assert info.value.status == 403 and info.value.reason == "Forbidden" and "nodes is forbidden" in str(info.value)
    with pytest.raises(KubeError) as info:
        client.get("/api/v1/nodes")
    assert info.value.status == 502 and "bad gateway from the proxy" in str(info.value)


def test_a_node_answered_without_a_resource_version_is_never_written(serve):
    """What a proxy or a broken server could answer: the backend refuses
    every write on it with KubeError (the run fails and is retried), and
    no PATCH reaches the server."""
    from gpugate.kube.nodes import KubeNodes

    node = {"kind": "Node", "metadata": {"name": "gpu01"}, "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]},
            "status": {}}
    server = serve(lambda n: (200, json.dumps(node).encode(), False))
    backend = KubeNodes(KubeClient(server.url, timeout=5), {}, "gpugate:")
    for write in (lambda: backend.drain("gpu01", "gpugate: health ecc:gpu1=1 uncorrected (want <= 0)"),
                  lambda: backend.undrain("gpu01"), lambda: backend.set_comment("gpu01", "x")):
        with pytest.raises(KubeError) as info:
            write()
        assert "no resourceVersion" in str(info.value)
    assert [c for c, _ in server.handler.seen if c != "GET"] == []
