"""The sweep's repair of one GPU held alone ([kubernetes] device_holds),
against a real control plane (the release's kube-apiserver, kube-scheduler
and kube-controller-manager, KWOK's kubelets; tests/test_kube_device_holds.py
builds the node and its ResourceSlice).  A node with two Pods, each
claiming one GPU; one GPU's ECC finding holds it alone (NoSchedule).  The
sweep (gpugate.sweep.kube_gpu_repair) writes a NoExecute rule of its own
for that GPU: the device taint eviction controller evicts the Pod on it,
the Pod on the other GPU runs on (the Node is never tainted nor
cordoned); it resets that GPU and verifies it alone (the simulated node's
nvidia-smi and dcgmi, gpugate.sim), and lifts the rules after the proof.
A diagnostic that fails keeps the GPU held alone (rma), the Node serving."""

import pytest

from gpugate.kube import nodeview as nv
from gpugate.kube.client import node_path
from test_kube_agent import DEMO_BASELINE
from test_kube_control_plane import PODS, pod, wait_for
from test_kube_device_holds import (MINOR, allocated, check, claim_pod, fleet_with_slice, plane, rules,  # noqa: F401
                                    serves_device_taints)

pytestmark = pytest.mark.kube


def sweep(fleet, node):
    """`gpugate sweep -w NODE` as the sweep's identity, device_holds on (no smoke Pod: KWOK runs no command)."""
    lines, kube = fleet.sweep_settings(drain_timeout=40, smoke=False)
    lines += "\nfloor = 0"  # the node is its pool's only one (the planner counts it out while the sweep has it)
    out, report = fleet.sweep(fleet.config("sweep", sweep=lines, extra=kube + "\ndevice_holds = true"), "-w", node)
    assert report is not None, "gpugate sweep printed no report (exit %d): %s" % (out.returncode, out.stderr[-2000:])
    return out, report["outcomes"].get(node, {})


def two_pods_one_gpu_held(plane, tmp_path, node, *more):
    """The node, a Pod on each of two GPUs, the first one's GPU held alone for an ECC finding."""
    if not serves_device_taints(plane):
        pytest.skip("kube-apiserver %s serves no DeviceTaintRule: the Node is held and repaired whole" % plane.version)
    admin = plane.admin()
    # PCIe GPUs (no NVSwitch): one GPU is reset while the others serve (an HGX baseboard resets whole).
    baseline = tmp_path / "pcie-baseline.toml"
    text = open(DEMO_BASELINE).read()
    assert "nvswitch = true" in text
    baseline.write_text(text.replace("nvswitch = true", "nvswitch = false"))
    fleet = fleet_with_slice(plane, tmp_path, node, str(baseline))
    for name in ("bad-" + node, "good-" + node):
        claim_pod(admin, name, node)
    wait_for("both Pods running", lambda: all((pod(admin, n) or {}).get("status", {}).get("phase") == "Running"
                                              for n in ("bad-" + node, "good-" + node)), timeout=60)
    bad = MINOR.index(int(allocated(admin, "bad-" + node)[0].split("-")[1]))
    check(fleet, node, "gpu.%d.ecc.uncorrected.volatile=2" % bad, *more)
    assert [r["spec"]["taint"]["effect"] for r in rules(admin, node)] == ["NoSchedule"]
    assert pod(admin, "bad-" + node)["status"]["phase"] == "Running"  # NoSchedule evicts nothing
    return fleet, admin, bad


def test_the_sweep_repairs_the_held_gpu_alone_and_lifts_its_rule_after_the_proof(plane, tmp_path):
    node = "gpu81"
    fleet, admin, bad = two_pods_one_gpu_held(plane, tmp_path, node)
    good = admin.get(PODS + "/good-" + node)["metadata"]["uid"]
    out, outcome = sweep(fleet, node)
    assert outcome.get("result") == "resumed", (outcome, out.stdout[-3000:], out.stderr[-3000:])
    assert pod(admin, "bad-" + node) is None  # evicted by the sweep's NoExecute rule
    there = admin.get(PODS + "/good-" + node)
    assert there["metadata"]["uid"] == good and there["status"]["phase"] == "Running"
    assert not there["metadata"].get("deletionTimestamp")
    assert rules(admin, node) == []
    got = admin.get(node_path(node))
    assert nv.owned(got) == {} and not got["spec"].get("unschedulable") and not nv.our_taints(got)
    # The reset and the verification were that GPU's alone (the sweep's journal).
    steps = {step: detail for _, _, step, status, _, _, detail in journal(fleet).events(node) if status == "done"}
    assert steps["reset"].startswith("GPUs [%d] reset" % bad), steps
    assert steps["wait_drained"].startswith("GPU %d emptied, the Node serving" % bad), steps  # (the Pod gone)
    assert steps["verify"] == "fit" and steps["diag r3"] == "pass", steps


def journal(fleet):
    import os

    from gpugate.sweep.journal import Journal

    return Journal(os.path.join(fleet.dir, "controller", "sweep.db"))


def test_a_failing_diagnostic_keeps_the_gpu_held_alone(plane, tmp_path):
    node = "gpu82"
    fleet, admin, bad = two_pods_one_gpu_held(plane, tmp_path, node)
    fleet.sim(node, "dcgm.diag_fail=%d" % bad)
    out, outcome = sweep(fleet, node)
    assert outcome.get("result") == "escalated", (outcome, out.stdout[-3000:])
    steps = [(step, status) for _, _, step, status, _, _, _ in journal(fleet).events(node)]
    assert ("reset", "done") in steps and ("verify", "failed") in steps, steps
    assert ("reboot", "started") not in steps  # the reboot rung would empty the Node
    got = admin.get(node_path(node))
    assert nv.owned(got)["reason"].startswith("gpugate: rma"), nv.owned(got)
    assert nv.our_taints(got) == [] and not got["spec"].get("unschedulable")  # the Node serving
    effects = sorted(r["spec"]["taint"]["effect"] for r in rules(admin, node))
    assert effects == ["NoExecute", "NoSchedule"]  # the GPU held alone, still empty
    assert sorted(nv.devices_held(got)) == sorted(r["metadata"]["name"] for r in rules(admin, node))
    assert admin.get(PODS + "/good-" + node)["status"]["phase"] == "Running"


def test_the_keeper_holds_a_budgeted_gpu_finding_alone_and_counts_it_as_its_share(plane, tmp_path):
    """Two nodes publish an application-Xid repeat on one GPU with their
    agent's offer, a third a wrong pin, all in one pool whose allowance is
    one node (max_share 0.01).  The keeper holds the two GPUs alone
    (NoSchedule rules, the Nodes serving: 2/8 of a node), and the wrong pin
    not: a whole node does not fit beside them."""
    import time

    from gpugate.kube import gpushare
    from gpugate.slurm import pending

    if not serves_device_taints(plane):
        pytest.skip("kube-apiserver %s serves no DeviceTaintRule" % plane.version)
    admin, fleets = plane.admin(), {}
    for node in ("gpu91", "gpu92", "gpu93"):
        fleets[node] = fleet_with_slice(plane, tmp_path / node, node)
    with open(fleets["gpu91"].key, "rb") as handle:
        key = handle.read().strip()
    now = int(time.time())
    for i, node in enumerate(("gpu91", "gpu92")):
        uuid = [d for d in admin.list_pages("/apis/resource.k8s.io/v1/resourceslices")
                if d["spec"]["nodeName"] == node][0]["spec"]["devices"][0]["attributes"]["uuid"]["string"]
        gpu = next(i for i, g in enumerate(_gpus(fleets[node], node)) if g["uuid"] == uuid)
        reason = "gpugate: health xid_repeat:gpu%d=xids in >=3 jobs (want < 3 jobs within 24h)" % gpu
        text = gpushare.with_offer(pending.publish("", reason, now - 60 + i, key, node), {gpu: {"uuid": uuid}},
                                   [gpu], 8)
        admin.patch(node_path(node), {"metadata": {"annotations": {nv.PENDING: text}}})
    drift = "gpugate: drift driver=550.54.15 (want 580.65.06)"
    admin.patch(node_path("gpu93"), {"metadata": {"annotations": {
        nv.PENDING: pending.publish("", drift, now - 50, key, "gpu93")}}})
    keeper = fleets["gpu91"].config("keeper", share=0.01, extra="device_holds = true")
    figures = fleets["gpu91"].keeper(keeper)
    assert figures["_exit"] == 0 and sorted(figures["drained"]) == ["gpu91", "gpu92"], figures
    for node in ("gpu91", "gpu92"):
        got = admin.get(node_path(node))
        assert nv.our_taints(got) == [] and not got["spec"].get("unschedulable")
        assert [r["spec"]["taint"]["effect"] for r in rules(admin, node)] == ["NoSchedule"]
        assert (nv.owned(got)["of"], len(nv.owned(got)["gpus"])) == (8, 1)
    assert nv.owned(admin.get(node_path("gpu93"))) == {}  # held back: 2/8 + 1 > 1
    assert figures["held"] >= 1


def _gpus(fleet, node):
    from gpugate.sim import fleet as simfleet

    return simfleet.load(fleet.fleet, node)["nvml"]["gpus"]
