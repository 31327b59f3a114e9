"""A failing keeper and a silent node agent are seen on Kubernetes (issue 45,
item 5): the keeper (`gpugate budget --watch --metrics-port`) and the node
agent serve their metrics over HTTP against a real kube-apiserver; what a
scrape returns is fed to the real promtool with slurm_conf/gpugate-alerts.yml
and deploy/kubernetes/monitoring/gpugate-alerts-kubernetes.yml.  Each served
timestamp is held as served: 0 (never) stays 0; any other is rewritten every
minute (the loop runs)."""

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpugate.kube.client import KubeError
from test_alerts import RULES, expected, promtool
from test_kube_agent import DEMO_BASELINE, ROOT, api  # noqa: F401 (the module's API server)
from test_kube_keeper_lease import LEASE, _publish_drift, _with_key, six  # noqa: F401

pytestmark = pytest.mark.kube

KUBE_RULES = os.path.join(ROOT, "deploy", "kubernetes", "monitoring", "gpugate-alerts-kubernetes.yml")
STEPS = 70
AGENT = "gpugate-node-agent"


def _scrape(port: int, want, timeout: float = 90.0) -> str:
    deadline, text = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5) as answer:
                text = answer.read().decode()
            if "gpugate_budget_keeper" in text or "gpugate_agent" in text:  # ours, not another test's server
                if want(text):
                    return text
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError("the metrics never said it: %s" % text[-2000:])


def _has(text: str, sample: str) -> bool:
    """A sample line as served (not a HELP line that starts alike)."""
    return sample in text.splitlines()


def _keeper_texts(config: str, wants) -> list:
    """`gpugate budget --watch 5 --metrics-port` until each of ``wants`` is scraped in turn."""
    from gpugate.testbed.procs import free_ports

    port = free_ports(1)[0]
    proc = subprocess.Popen([sys.executable, "-m", "gpugate", "budget", "--config", config, "--watch", "5",
                             "--metrics-port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return [_scrape(port, want) for want in wants]
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _agent_text(fleet, node: str, healthcheck) -> str:
    """The node agent's loop as `gpugate agent --metrics-port` wires it: one health check, then a scrape."""
    from gpugate.model.config import load_settings
    from gpugate.node.kube_agent import Agent
    from gpugate.fleet.metrics_server import AgentWatch, MetricsServer

    config = fleet.config("agent")
    runner = Agent(load_settings(config), node, config, healthcheck + ["--config", config])
    server = MetricsServer("127.0.0.1", 0, AgentWatch(runner).text).start()
    try:
        runner.health_check()
        return _scrape(server.port, lambda text: "gpugate_agent_failed_checks" in text)
    finally:
        server.stop()


def _series(text: str, instance: str) -> list:
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = dict(s.labels, instance=instance)
            name = "%s{%s}" % (s.name, ",".join('%s="%s"' % kv for kv in sorted(labels.items())))
            if s.name.endswith("_timestamp_seconds") and s.value:
                values = "0+60x%d" % STEPS  # served fresh: the loop keeps it so
            else:
                values = "%sx%d" % (repr(float(s.value)), STEPS)
            out.append({"series": name, "values": values})
    return out


def _up(instance: str, value: int) -> dict:
    """What Prometheus records for the agent pod's scrape (the label the chart's ServiceMonitor copies from the pod)."""
    return {"series": 'up{app_kubernetes_io_name="%s",instance="%s"}' % (AGENT, instance),
            "values": "%dx%d" % (value, STEPS)}


def _unavailable(count: int) -> dict:
    """kube-state-metrics' view of the agents' DaemonSet (a site's exporter, not gpugate's metrics)."""
    return {"series": 'kube_daemonset_status_number_unavailable{daemonset="%s",namespace="gpu-health"}' % AGENT,
            "values": "%dx%d" % (count, STEPS)}


def test_on_kubernetes_the_keeper_and_agent_alerts_fire_from_what_they_serve(six, tmp_path):  # noqa: F811
    from gpugate.testbed.procs import installed_entry_point

    tool = promtool()
    _publish_drift(six, 0.2)
    good = six.config("keeper", share=0.2)
    broken = _with_key(good, os.path.join(six.dir, "no-such.key"), "controller-a")
    leading = _keeper_texts(good, [lambda t: _has(t, "gpugate_budget_keeper_leader 1")])[0]
    try:
        six.admin.request("DELETE", LEASE)  # the broken keeper leads at once
    except KubeError:
        pass
    failing, gave_up = _keeper_texts(broken, [lambda t: _has(t, "gpugate_budget_keeper_failed_runs 1"),
                                              lambda t: _has(t, "gpugate_budget_keeper_leader 0")])
    checked = _agent_text(six, "gpu01", [installed_entry_point("healthcheck")])
    unchecked = _agent_text(six, "gpu02", [os.path.join(six.dir, "no-such-healthcheck")])
    assert _has(failing, "gpugate_budget_keeper_last_error 1") and _has(failing, "gpugate_budget_keeper_leader 1")
    assert _has(failing, "gpugate_budget_keeper_last_run_timestamp_seconds 0")  # never a good run
    assert _has(unchecked, "gpugate_agent_failed_checks 1") and _has(checked, "gpugate_agent_failed_checks 0")
    assert _has(unchecked, "gpugate_last_check_timestamp_seconds 0")

    rules = {}
    for path in (RULES, KUBE_RULES):
        with open(path) as handle:
            rules.update({r["alert"]: r for g in yaml.safe_load(handle)["groups"] for r in g["rules"]})
    watched = ["GpugateBudgetKeeperStale", "GpugateHealthCheckStale", "GpugateBudgetKeeperDown",
               "GpugateBudgetKeeperNoLeader", "GpugateNodeAgentDown", "GpugateNodeAgentsUnavailable",
               "GpugateNodeAgentsNotScraped"]
    agents_gone = {"daemonset": AGENT, "namespace": "gpu-health"}
    cases = [  # (what Prometheus scraped, the alerts that fire)
        (_series(leading, "keeper-a") + _series(checked, "gpu01") + [_up("gpu01", 1), _unavailable(0)], {}),
        (_series(failing, "keeper-a") + _series(unchecked, "gpu02") + [_up("gpu02", 1), _up("gpu03", 0)],
         {"GpugateBudgetKeeperStale": {"instance": "keeper-a"}, "GpugateHealthCheckStale": {"instance": "gpu02"},
          "GpugateNodeAgentDown": {"app_kubernetes_io_name": AGENT, "instance": "gpu03"}}),
        (_series(gave_up, "keeper-a") + _series(checked, "gpu01") + [_up("gpu01", 1)],  # the Lease given up
         {"GpugateBudgetKeeperStale": {"instance": "keeper-a"}, "GpugateBudgetKeeperNoLeader": {}}),
        (_series(checked, "gpu01") + [_up("gpu01", 1)], {"GpugateBudgetKeeperDown": {}}),  # no keeper scraped
        # Two agent pods gone (no target, so no up == 0): only kube-state-metrics sees them.
        (_series(leading, "keeper-a") + _series(checked, "gpu01") + [_up("gpu01", 1), _unavailable(2)],
         {"GpugateNodeAgentsUnavailable": agents_gone}),
        # No agent target at all (the DaemonSet runs none, or nothing scrapes them).
        (_series(leading, "keeper-a"), {"GpugateNodeAgentsNotScraped": {"app_kubernetes_io_name": AGENT}}),
    ]
    tests = [{"interval": "1m", "input_series": scraped,
              "alert_rule_test": [{"eval_time": "60m", "alertname": a,
                                   "exp_alerts": [expected(rules, a, fire[a])] if a in fire else []}
                                  for a in watched]}
             for scraped, fire in cases]
    spec = tmp_path / "kube-alerts.test.yml"
    spec.write_text(json.dumps({"rule_files": [RULES, KUBE_RULES], "evaluation_interval": "1m", "tests": tests}))
    result = subprocess.run([tool, "test", "rules", str(spec)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_kubernetes_rules_are_valid_and_every_one_is_tested():
    result = subprocess.run([promtool(), "check", "rules", KUBE_RULES], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    with open(KUBE_RULES) as handle:
        names = {r["alert"] for g in yaml.safe_load(handle)["groups"] for r in g["rules"]}
    assert names == {"GpugateBudgetKeeperDown", "GpugateBudgetKeeperNoLeader", "GpugateNodeAgentDown",
                     "GpugateNodeAgentsUnavailable", "GpugateNodeAgentsNotScraped"}


def test_gpugate_agent_with_a_metrics_port_serves_when_its_last_check_ended(six):  # noqa: F811
    """`gpugate agent --metrics-port` as the DaemonSet runs it: the first
    health check runs at once, and the scrape says when it ended."""
    from gpugate.testbed.procs import free_ports

    port = free_ports(1)[0]
    began = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "gpugate", "agent", "--config", six.config("agent"), "--node",
                             "gpu03", "--interval", "600", "--metrics-port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        text = _scrape(port, lambda t: not _has(t, "gpugate_last_check_timestamp_seconds 0"))
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert began <= values["gpugate_last_check_timestamp_seconds"] <= time.time(), values
    assert values["gpugate_agent_failed_checks"] == 0
