"""gpugate.fleet.metrics_server: what the keeper and the node agent serve over
HTTP on Kubernetes, read-only, from a thread beside their loop (issue 45,
item 5).  A real server on a real socket; the keeper and the agent serving
it against a real kube-apiserver are tests/test_kube_alerts.py."""

import http.client

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpugate.errors import GpugateError
from gpugate.fleet.metrics_server import AgentWatch, MetricsServer, keeper_families
from gpugate.core.promtext import render


def _ask(port, method="GET", path="/metrics"):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=b"x" if method == "POST" else None)
        answer = conn.getresponse()
        return answer.status, answer.getheader("Content-Type"), answer.read().decode()
    finally:
        conn.close()


def _values(text):
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_it_serves_the_latest_text_on_metrics_only_and_nothing_else():
    said = {"text": "a 1\n"}

    def text():
        if said["text"] is None:
            raise RuntimeError("no status yet")
        return said["text"]

    server = MetricsServer("127.0.0.1", 0, text).start()
    try:
        assert _ask(server.port) == (200, "text/plain; version=0.0.4; charset=utf-8", "a 1\n")
        said["text"] = "a 2\n"  # rendered at each scrape: the loop's latest
        assert _ask(server.port)[2] == "a 2\n"
        assert _ask(server.port, path="/")[0] == 404
        assert _ask(server.port, "POST")[0] == 501  # read-only: no method but GET
        assert _ask(server.port, "PUT")[0] == 501
        said["text"] = None
        status, _, body = _ask(server.port)
        assert status == 500 and "no status yet" in body
    finally:
        server.stop()


def test_a_port_that_cannot_be_bound_is_a_clear_error():
    first = MetricsServer("127.0.0.1", 0, lambda: "").start()
    try:
        with pytest.raises(GpugateError, match="metrics cannot be served on 127.0.0.1 port %d" % first.port):
            MetricsServer("127.0.0.1", first.port, lambda: "").start()
    finally:
        first.stop()


def test_the_keepers_families_say_leader_failed_runs_and_the_last_good_run():
    failing = {"ok": False, "error": "x", "last_ok": 100.0, "failed_runs": 2, "leader": 1, "at": 200.0}
    values = _values(render(keeper_families(failing, 300.0)))
    assert values["gpugate_budget_keeper_last_run_timestamp_seconds"] == 100.0
    assert values["gpugate_budget_keeper_last_error"] == 1 and values["gpugate_budget_keeper_failed_runs"] == 2
    assert values["gpugate_budget_keeper_leader"] == 1
    assert values["gpugate_budget_keeper_last_attempt_timestamp_seconds"] == 200.0
    standby = {"ok": True, "standby": "another keeper leads", "leader": 0, "last_ok": None, "failed_runs": 0}
    values = _values(render(keeper_families(standby, 300.0)))
    assert values["gpugate_budget_keeper_leader"] == 0
    assert values["gpugate_budget_keeper_last_run_timestamp_seconds"] == 0
    assert _values(render(keeper_families({}, 300.0)))["gpugate_budget_keeper_leader"] == 0  # no run yet


def test_the_agent_watch_counts_checks_that_did_not_run_and_times_those_that_did():
    class Loop:
        ran = [True, False, False, True]

        def health_check(self):
            return self.ran.pop(0)

        def serve_once(self):
            raise RuntimeError("the Node could not be read")

    loop, now = Loop(), [1000.0]
    watch = AgentWatch(loop, clock=lambda: now[0])
    seen = []
    for _ in range(4):
        now[0] += 300
        loop.health_check()
        seen.append((_values(watch.text())["gpugate_last_check_timestamp_seconds"],
                     _values(watch.text())["gpugate_agent_failed_checks"]))
    assert seen == [(1300.0, 0), (1300.0, 1), (1300.0, 2), (2200.0, 0)]
    with pytest.raises(RuntimeError):
        loop.serve_once()
    assert _values(watch.text())["gpugate_agent_last_pass_timestamp_seconds"] == 2200.0  # the pass went round
