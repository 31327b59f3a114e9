"""Prometheus metrics over HTTP for the keeper and the node agent on
Kubernetes (issue 45, item 5: a failing keeper is seen).  On Slurm the
controller writes `gpugate metrics` to node_exporter's textfile directory;
a keeper replica or an agent pod has no such file a scraper reads, so each
serves its own text on ``GET /metrics`` (``[kubernetes] metrics_port``,
``--metrics-port``), read-only, from a thread beside its loop:

- the keeper (`gpugate budget --watch`): what `gpugate metrics` says of it
  (gpugate.fleet.metrics.keeper_families: its last good run, from the Lease
  on Kubernetes, so a standby says the leader is failing), and whether this
  replica leads, its failed runs in a row, when it last tried;
- the node agent (`gpugate agent`): when its last health check ended
  (``gpugate_last_check_timestamp_seconds``, the name the node's textfile
  uses: GpugateHealthCheckStale fires from either), its failed checks in a
  row, and when its loop last went round.

Nothing is read or run for a scrape: it renders what the loop recorded."""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gpugate.errors import GpugateError
from gpugate.core.promtext import render

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Handler(BaseHTTPRequestHandler):
    timeout = 10  # a client that sends nothing holds its thread this long at most
    text: Callable[[], str]

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path.split("?", 1)[0] != "/metrics":
            self._answer(404, b"gpugate serves /metrics only\n", "text/plain")
            return
        try:
            body = self.text().encode()
        except Exception as exc:  # noqa: BLE001 (a scrape that fails says why; the loop goes on)
            self._answer(500, ("gpugate: %s: %s\n" % (type(exc).__name__, str(exc)[:200])).encode(), "text/plain")
            return
        self._answer(200, body, CONTENT_TYPE)

    def _answer(self, code: int, body: bytes, kind: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # scrapes every 30 s: no line each
        pass


class MetricsServer:
    """``text()`` served on http://address:port/metrics until stop()."""

    def __init__(self, address: str, port: int, text: Callable[[], str]):
        self.address, self.port = address or "0.0.0.0", int(port)
        self.handler = type("Handler", (_Handler,), {"text": staticmethod(text)})
        self.server = None

    def start(self) -> "MetricsServer":
        family = socket.AF_INET6 if ":" in self.address else socket.AF_INET
        server_class = type("Server", (ThreadingHTTPServer,), {"address_family": family, "daemon_threads": True})
        try:
            self.server = server_class((self.address, self.port), self.handler)
        except OSError as exc:
            raise GpugateError("metrics cannot be served on %s port %d: %s" % (self.address, self.port, exc)) from None
        self.port = self.server.server_address[1]  # port 0: the one the system chose
        threading.Thread(target=self.server.serve_forever, name="gpugate-metrics", daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


def keeper_families(status: dict, now: float) -> list:
    """The keeper's own families and this replica's: leader or standby, failed runs in a row."""
    from gpugate.fleet.metrics import keeper_families as common

    status = status or {}
    runs = status.get("failed_runs")
    return common(status, now) + [
        ("gpugate_budget_keeper_leader", "gauge",
         "1 when this keeper replica holds the Lease and drains; 0: it stands by (or gave the Lease up).",
         [("gpugate_budget_keeper_leader", {}, 1 if status.get("leader") == 1 else 0)]),
        ("gpugate_budget_keeper_failed_runs", "gauge", "Failed runs of this keeper replica in a row (0: the latest "
         "was good).", [("gpugate_budget_keeper_failed_runs", {}, runs if isinstance(runs, int) else 0)]),
        ("gpugate_budget_keeper_last_attempt_timestamp_seconds", "gauge",
         "When this keeper replica last tried a run, good or not.",
         [("gpugate_budget_keeper_last_attempt_timestamp_seconds", {}, float(status.get("at") or 0))]),
    ]


class AgentWatch:
    """What the node agent's loop did, recorded as it runs: its
    health_check and serve_once are wrapped (gpugate.node.kube_agent.Agent;
    health_check says whether the check ran to the end)."""

    def __init__(self, agent, clock=time.time):
        self.clock = clock
        self.last_check = self.last_pass = 0.0
        self.failed = 0
        check, serve = agent.health_check, agent.serve_once

        def health_check():
            ran = check()
            if ran is True:
                self.last_check, self.failed = self.clock(), 0
            else:  # did not run, or ran past its time: unknown is never good
                self.failed += 1
            return ran

        def serve_once():
            try:
                return serve()
            finally:
                self.last_pass = self.clock()

        agent.health_check, agent.serve_once = health_check, serve_once

    def text(self) -> str:
        return render([
            ("gpugate_last_check_timestamp_seconds", "gauge", "When the last health check ended.",
             [("gpugate_last_check_timestamp_seconds", {}, round(self.last_check, 3))]),
            ("gpugate_agent_failed_checks", "gauge",
             "Health checks in a row the node agent could not run to the end (0: the latest ran).",
             [("gpugate_agent_failed_checks", {}, self.failed)]),
            ("gpugate_agent_last_pass_timestamp_seconds", "gauge",
             "When the node agent's loop last read its Node (the sweep's requests).",
             [("gpugate_agent_last_pass_timestamp_seconds", {}, round(self.last_pass, 3))]),
        ])


def port_of(settings, option) -> int:
    """--metrics-port, else [kubernetes] metrics_port (0: none)."""
    return int(option if option is not None else (settings.kubernetes.get("metrics_port") or 0))


def serve(settings, port: int, text: Callable[[], str]) -> MetricsServer:
    return MetricsServer(str(settings.kubernetes.get("metrics_address") or ""), port, text).start()
