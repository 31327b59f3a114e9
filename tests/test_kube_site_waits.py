"""Issue 45, item 6, on the real API server: the smoke and reboot proofs
wait for the site, not against the node.  An image still pulling (or
failing to pull) when smoke_deadline is up is the site's: the node is
deferred, held, never failed, and the next pass proves it; a pull that
ends late leaves the command its whole deadline.  After a reboot the sweep
waits for the Node's GPUs to be allocatable again (a GPU operator's driver
container loads after Ready) before verify and the smoke Pod; GPUs that
never come back are the node's: held, the reason said, never returned.

gpugate.testbed.kubelet plays the kubelet: the pull delay (``pull``,
``pull_error``), the device plugin that registers ``gpus_late`` seconds
after the new bootID (None: never), and the admission that refuses a Pod
asking for more GPUs than the Node offers."""

import json
import re
import subprocess
import sys

import pytest

from gpugate.kube import nodeview as nv
from gpugate.kube.client import node_path
from test_kube_agent import api  # noqa: F401 (the module's API server)
from test_kube_sweep import held, journal, site  # noqa: F401 (the sweep's fleet and kubelets)

pytestmark = pytest.mark.kube

DEADLINE = 10  # smoke_deadline: its least


def settings(site, run_seconds=0, gpus_timeout=None):  # noqa: F811
    """The sweep's gpugate.toml: smoke_deadline 10 s; the smoke command taking ``run_seconds`` before it
    replays all_reduce_perf (a site's command, as in a Pod); [kubernetes] gpus_allocatable_timeout."""
    lines, kube = site.sweep_settings()
    lines = lines.replace("smoke_deadline = 60", "smoke_deadline = %d" % DEADLINE)
    if run_seconds:
        argv = json.loads(re.search(r"^smoke = (.*)$", lines, re.M).group(1))
        slow = ["/bin/sh", "-c", 'sleep %d; exec "$0" "$@"' % run_seconds] + argv
        lines = re.sub(r"^smoke = .*$", "smoke = " + json.dumps(slow).replace("\\", "\\\\"), lines, flags=re.M)
    if gpus_timeout is not None:
        kube += "\ngpus_allocatable_timeout = %d" % gpus_timeout
    return site.config("sweep", sweep=lines, extra=kube)


def sweep(site, config):  # noqa: F811
    out, report = site.sweep(config)
    assert report is not None, "gpugate sweep printed no report (exit %d): %s" % (out.returncode, out.stderr[-2000:])
    return out, report


def said(config):
    """One sweep pass in text: what an admin reads (the --json run prints the report only)."""
    out = subprocess.run([sys.executable, "-m", "gpugate", "sweep", "--config", config, "--apply"],
                         capture_output=True, text=True, timeout=600)
    return out


def not_counted(site, node):
    """Nothing against the node: no failed proof, no retry, no escalation."""
    events = journal(site, node)
    assert not any(status == "failed" for _, status, _ in events), events
    assert not any(step == "escalate" for step, _, _ in events), events
    assert not any("retry" in (detail or "") for _, _, detail in events), events


def test_a_smoke_image_still_pulling_at_the_deadline_defers_the_node_and_the_next_pass_proves_it(site):  # noqa: F811
    agent = site.config("agent")
    site.sim("gpu01", "gpu.1.xid=79")  # acute; a reboot repairs it; its all_reduce passes
    site.healthcheck(agent, "gpu01")
    site.kubelets.pull["gpu01"] = 3600  # a large image on a slow registry: still pulling at the deadline
    config = settings(site, run_seconds=6)

    out, report = sweep(site, config)
    assert out.returncode == 0, out.stderr[-2000:]
    outcome = report["outcomes"]["gpu01"]
    assert outcome["result"] == "deferred", (report, out.stderr[-2000:])
    assert re.search(r"the site's: image not pulled in 1\d s \(ContainerCreating\)", outcome["detail"]), outcome
    assert "not a finding against the node" in outcome["detail"], outcome
    assert [t["value"] for t in held(site.admin, "gpu01")] == ["health"]  # held, with the class it came in with
    not_counted(site, "gpu01")
    assert ("deferred", "done") in [(s, st) for s, st, _ in journal(site, "gpu01")]
    assert site.kubelets.ran == [] and list(site.admin.list_pages("/api/v1/namespaces/gpugate-smoke/pods")) == []

    # The next pass: the pull ends 5 s in; the command (6 s) still has its whole deadline from its start.
    site.kubelets.pull["gpu01"] = 5
    out, report = sweep(site, config)
    outcome = report["outcomes"]["gpu01"]
    assert (outcome["result"], outcome["attempts"]) == ("resumed", 1), (report, out.stderr[-2000:])
    assert held(site.admin, "gpu01") == []
    assert [(n, code) for _, n, code in site.kubelets.ran] == [("gpu01", 0)]
    not_counted(site, "gpu01")


def test_an_image_that_fails_to_pull_defers_the_node_it_never_stops_the_sweep_or_fails_the_node(site):  # noqa: F811
    agent = site.config("agent")
    site.sim("gpu02", "gpu.1.xid=79")
    site.healthcheck(agent, "gpu02")
    site.kubelets.pull_error["gpu02"] = 'failed to pull image "registry.example.com/nccl-tests:2.13": 503'
    out, report = sweep(site, settings(site))
    assert out.returncode == 0 and not report.get("stopped"), (report, out.stderr[-2000:])
    outcome = report["outcomes"]["gpu02"]
    assert outcome["result"] == "deferred", report
    assert re.search(r"the site's: image not pulled in 1\d s \((ErrImagePull|ImagePullBackOff): failed to pull",
                     outcome["detail"]), outcome
    assert [t["value"] for t in held(site.admin, "gpu02")] == ["health"]
    not_counted(site, "gpu02")
    assert site.kubelets.ran == []


def test_after_a_reboot_the_sweep_waits_for_the_gpus_to_be_allocatable_then_proves(site):  # noqa: F811
    """The device plugin registers 2 s after the kubelet is Ready with the new bootID (capacity and
    allocatable 0 until then, as a kubelet reports them): verify and the smoke Pod wait for it."""
    agent = site.config("agent")
    site.sim("gpu02", "gpu.1.xid=79")
    site.healthcheck(agent, "gpu02")
    site.kubelets.gpus_late["gpu02"] = 2
    out = said(settings(site))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert re.search(r"gpu02: Ready with a new bootID; waiting up to 600 s for its 8 nvidia.com/gpu to be "
                     r"allocatable \(0 allocatable now", out.stdout), out.stdout[-3000:]
    assert held(site.admin, "gpu02") == [], out.stdout[-3000:]  # proven and returned
    events = journal(site, "gpu02")
    steps = [step for step, _, _ in events]
    gpus = [d for step, status, d in events if step == "gpus" and status == "done"]
    assert len(gpus) == 1 and re.fullmatch(r"8 of 8 nvidia.com/gpu allocatable [1-9]\d* s after Ready", gpus[0]), events
    # Verify and the smoke Pod only after the GPUs are back; the smoke Pod got them and passed.
    assert steps.index("gpus") < steps.index("verify") < steps.index("smoke"), events
    assert [(n, code) for _, n, code in site.kubelets.ran] == [("gpu02", 0)]
    status = site.admin.get(node_path("gpu02"))["status"]
    assert status["allocatable"]["nvidia.com/gpu"] == "8"
    not_counted(site, "gpu02")


def test_gpus_that_never_come_back_after_the_reboot_hold_the_node_with_the_reason(site):  # noqa: F811
    agent = site.config("agent")
    site.sim("gpu03", "gpu.1.xid=79")
    site.healthcheck(agent, "gpu03")
    site.kubelets.gpus_late["gpu03"] = None  # the driver never loads: the device plugin never registers
    out, report = sweep(site, settings(site, gpus_timeout=3))
    assert out.returncode == 0, out.stderr[-2000:]
    outcome = report["outcomes"]["gpu03"]
    # The node's: the attempt failed (a retry reboots it again), then it is escalated, never returned.
    assert outcome["result"] == "escalated" and outcome["attempts"] == 2, report
    assert outcome["detail"].startswith("its GPUs did not come back: 0 of 8 nvidia.com/gpu allocatable"), outcome
    assert [t["value"] for t in held(site.admin, "gpu03")] == ["rma"]
    reason = json.loads(site.admin.get(node_path("gpu03"))["metadata"]["annotations"][nv.OWNED])["reason"]
    assert "allocatable=0/8 nvidia.com/gpu (want 8)" in reason, reason
    failed = [d for step, status, d in journal(site, "gpu03") if step == "wait_up" and status == "failed"]
    assert len(failed) == 2 and all("gpus_allocatable_timeout" in d for d in failed), failed
    # Never verified, never a smoke Pod.
    assert not any(step in ("verify", "smoke") for step, _, _ in journal(site, "gpu03"))
    assert site.kubelets.ran == []


def test_a_smoke_pod_refused_for_gpus_the_device_plugin_reports_unhealthy_is_the_node_s(site):  # noqa: F811
    """OutOfnvidia.com/gpu with the GPUs counted (capacity 8) but one not offered (allocatable 7: the
    device plugin reports it unhealthy) is the node's, never deferred; another pod holding the GPUs
    leaves allocatable as it is (test_kube_smoke_owned: deferred)."""
    agent = site.config("agent")
    site.sim("gpu01", "gpu.1.ecc.uncorrected.volatile=2")  # a GPU reset clears it: the reset rung, no reboot
    site.healthcheck(agent, "gpu01")
    site.kubelets.unhealthy["gpu01"] = 1
    out, report = sweep(site, settings(site, gpus_timeout=3))
    outcome = report["outcomes"]["gpu01"]
    assert outcome["result"] == "escalated", (report, out.stderr[-2000:])
    events = journal(site, "gpu01")
    refused = [d for step, status, d in events if step == "smoke" and status == "failed"]
    assert refused and "the kubelet refused the smoke Pod: 7 of 8 nvidia.com/gpu healthy" in refused[0], events
    # The reboot rung after it: the GPU does not come back healthy either.
    assert any(step == "wait_up" and status == "failed" and "7 of 8 nvidia.com/gpu allocatable" in d
               for step, status, d in events), events
    assert [t["value"] for t in held(site.admin, "gpu01")] == ["rma"]
    assert site.kubelets.ran == []


TOOLKIT = ('failed to create containerd task: OCI runtime create failed: nvidia-container-cli: initialization error: '
           'nvml error: driver not loaded')


def test_a_smoke_container_not_created_on_one_node_while_its_peer_starts_is_that_node_s(site):  # noqa: F811
    """CreateContainerError on gpu02 (its NVIDIA container toolkit fails to inject the GPUs) after the
    same image started and passed on gpu01 (the canary batch, before it): gpu02's finding, the ladder
    (a retry, then rma); gpu01 returns."""
    agent = site.config("agent")
    for node in ("gpu01", "gpu02"):
        site.sim(node, "gpu.1.xid=79")
        site.healthcheck(agent, node)
    site.kubelets.create_error["gpu02"] = ("CreateContainerError", TOOLKIT)
    out, report = sweep(site, settings(site))
    assert out.returncode == 0 and not report.get("stopped"), (report, out.stderr[-2000:])
    outcome = report["outcomes"]["gpu02"]
    assert (outcome["result"], outcome["attempts"]) == ("escalated", 2), (report, out.stderr[-2000:])
    failed = [d for step, status, d in journal(site, "gpu02") if step == "smoke" and status == "failed"]
    assert len(failed) == 2 and all("not started here (CreateContainerError: failed to create containerd task"
                                    in d and "started on gpu01" in d for d in failed), failed
    assert [t["value"] for t in held(site.admin, "gpu02")] == ["rma"]
    reason = json.loads(site.admin.get(node_path("gpu02"))["metadata"]["annotations"][nv.OWNED])["reason"]
    assert "smoke=container CreateContainerError" in reason, reason
    assert report["outcomes"]["gpu01"]["result"] == "resumed", report
    assert held(site.admin, "gpu01") == []
    assert ("gpu01", 0) in [(n, code) for _, n, code in site.kubelets.ran]
    assert not any(n == "gpu02" for _, n, _ in site.kubelets.ran)


def test_a_smoke_container_not_created_on_every_node_is_the_site_s_deferred_never_stopping_the_sweep(site):  # noqa: F811
    agent = site.config("agent")
    for node in ("gpu01", "gpu02"):
        site.sim(node, "gpu.1.xid=79")
        site.healthcheck(agent, node)
        site.kubelets.create_error[node] = ("CreateContainerError", TOOLKIT)
    out, report = sweep(site, settings(site))
    assert out.returncode == 0 and not report.get("stopped"), (report, out.stderr[-2000:])
    for node in ("gpu01", "gpu02"):
        outcome = report["outcomes"][node]
        assert outcome["result"] == "deferred", (report, out.stderr[-2000:])
        assert ("the site's: its container could not be made or started and the smoke image started on no node "
                "of this sweep (CreateContainerError: failed to create containerd task") in outcome["detail"], outcome
        assert "not a finding against the node" in outcome["detail"], outcome
        assert [t["value"] for t in held(site.admin, node)] == ["health"]
        not_counted(site, node)
    assert site.kubelets.ran == [] and list(site.admin.list_pages("/api/v1/namespaces/gpugate-smoke/pods")) == []


def test_which_smoke_containers_could_not_be_made_or_started():
    from gpugate.kube import smokepod as sp

    def pod(phase, **state):
        return {"status": {"phase": phase, "containerStatuses": [{"name": "smoke", "state": state}]}}

    assert sp.start_error(pod("Pending", waiting={"reason": "CreateContainerError", "message": TOOLKIT})) == (
        "CreateContainerError: " + TOOLKIT)
    assert sp.start_error(pod("Pending", waiting={"reason": "RunContainerError"})) == "RunContainerError"
    assert sp.start_error(pod("Failed", terminated={"exitCode": 128, "reason": "StartError",
                                                    "message": "nvidia-container-cli: mount error"})).startswith(
        "StartError: nvidia-container-cli")
    # Still pulling, or ran (even to a failure): not a start error.
    assert sp.start_error(pod("Pending", waiting={"reason": "ImagePullBackOff"})) == ""
    assert sp.start_error(pod("Failed", terminated={"exitCode": 1, "reason": "Error"})) == ""
    assert sp.start_error(pod("Running", running={"startedAt": "2026-12-05T00:00:00Z"})) == ""
