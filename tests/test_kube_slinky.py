"""Slurm on Kubernetes (issue 37, item 5): one machine is a Slurm node and a
Kubernetes Node (Slinky's DaemonSet mode, slurmd in a pod, one name).
``scheduler = "slurm+kubernetes"``: a real slurmctld and slurmds run the
health checks and the sweep as on any Slurm; each hold gpugate puts on a
Slurm node, or lifts, is mirrored on its Node of a real kube-apiserver,
with the same reason, under the node agent's and the sweep's own
ServiceAccount tokens.  slurmd's gpugate holds no token (job processes
run beside it): it writes the Node's hold and condition into a mirror file
(``[kubernetes] mirror_file``), and a sidecar per node, `gpugate agent
--mirror-from FILE` with the node agent's token, writes the Node
(gpugate.kube.mirror).  gpugate.testbed.slinky stands in for the
slurm-operator's NodeSet controller (a cordoned Node's Slurm node drained,
"slurm-operator: ..."; lifted on uncordon), so that gpugate's holds never
set it off (no cordon of gpugate's) is tested, not assumed."""

import json
import os
import subprocess
import sys

import pytest

from conftest import check_now, make_cluster
from gpugate.kube import nodeview as nv
from gpugate.kube.client import node_path
from test_kube_agent import api  # noqa: F401 (the module's API server)
from test_kube_mirror import node_bound
from test_slurm_sweep import drain_flag

pytestmark = [pytest.mark.kube, pytest.mark.slurm]


def _paired_config(cluster, api, who, path):  # noqa: F811
    """The rig's gpugate.toml, Slurm on Kubernetes, with ``who``'s token."""
    kube = api.kube_settings(who)
    with open(cluster.gpugate_conf) as handle:
        text = handle.read()
    text = 'scheduler = "slurm+kubernetes"\n' + text + (
        '\n[kubernetes]\nserver = "%s"\ntoken_file = "%s"\nca_file = "%s"\nnode_name = "{node}"\n'
        % (kube["server"], kube["token_file"], kube["ca_file"]))
    with open(path, "w") as handle:
        handle.write(text)
    os.chmod(path, 0o644)
    return path


def _slurmd_config(cluster, mirror_dir):
    """slurmd's gpugate.toml: Slurm on Kubernetes with a mirror file, and no token at all."""
    with open(cluster.gpugate_conf) as handle:
        text = handle.read()
    with open(cluster.gpugate_conf, "w") as handle:
        handle.write('scheduler = "slurm+kubernetes"\n' + text + '\n[kubernetes]\nnode_name = "{node}"\n'
                     'token_file = "%s/no-token"\nmirror_file = "%s/{node}.json"\n' % (mirror_dir, mirror_dir))


def _sidecars(api, config, mirror_dir, names):  # noqa: F811
    """One `gpugate agent --mirror-from` per node: the slurmd pod's sidecar, the only one with a token."""
    procs = []
    for name in names:
        own = node_bound(api, config, name)
        with open(os.path.join(os.path.dirname(mirror_dir), "sidecar-%s.err" % name), "w") as err:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "gpugate", "agent", "--mirror-from", os.path.join(mirror_dir, name + ".json"),
                 "--node", name, "--config", own, "--poll", "0.2"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err))
    return procs


def _boot(api, tmp_path, extra=""):  # noqa: F811
    from gpugate.testbed import smoke_command, smoke_pair_command
    from gpugate.testbed.kube import add_node
    from gpugate.testbed.slinky import NodeSetController

    directory = tmp_path / "c"
    cluster = make_cluster(directory, nodes=4, extra=extra, sweep={
        "floor": 0.25, "smoke_deadline": 30, "smoke": smoke_command(str(directory)),
        "smoke_pair": smoke_pair_command(str(directory))})
    admin = api.admin()
    names = ["gpu%02d" % i for i in range(1, 5)]
    operator, sidecars = None, []
    mirror_dir = str(tmp_path / "mirror")
    try:
        for name in names:
            add_node(admin, name)
        sweep_conf = _paired_config(cluster, api, "sweep", str(tmp_path / "gpugate-sweep.toml"))
        keeper_conf = _paired_config(cluster, api, "keeper", str(tmp_path / "gpugate-keeper.toml"))
        sidecar_conf = _paired_config(cluster, api, "agent", str(tmp_path / "gpugate-sidecar.toml"))
        _slurmd_config(cluster, mirror_dir)  # what slurmd's health check reads (last): no token
        os.makedirs(mirror_dir, 0o777)
        os.chmod(mirror_dir, 0o777)  # as the kubelet makes an emptyDir: slurmd's gpugate closes it
        sidecars = _sidecars(api, sidecar_conf, mirror_dir, names)
        cluster.sidecar_conf, cluster.kube_api = sidecar_conf, api
        operator = NodeSetController(api.admin(), cluster, names).start()  # its own connection: its own thread
        cluster.admin, cluster.operator, cluster.sweep_conf = admin, operator, sweep_conf
        cluster.mirror_dir = mirror_dir
        cluster.keeper_conf = keeper_conf
        yield cluster
    finally:
        for proc in sidecars:
            proc.terminate()
            proc.wait(10)
        if operator is not None:
            operator.stop()
        cluster.stop()


@pytest.fixture
def both(api, tmp_path):  # noqa: F811
    yield from _boot(api, tmp_path)


@pytest.fixture
def budgeted(api, tmp_path):  # noqa: F811
    yield from _boot(api, tmp_path, "[drain_budget]\nmax_share = 0.5\n")


def node(cluster, name):
    return cluster.admin.get(node_path(name))


def condition(obj):
    for cond in obj["status"].get("conditions") or []:
        if cond["type"] == nv.CONDITION:
            return cond
    return {}


def mirrored(cluster, name, reason):
    obj = node(cluster, name)
    # gpugate's taint and record; no cordon (Slinky's signal to drain Slurm, gpugate.kube.paired)
    return (nv.owned(obj).get("reason") == reason and not obj["spec"].get("unschedulable")
            and [t["value"] for t in nv.our_taints(obj)] == [reason.split()[1]])


def test_one_finding_holds_both_sides_with_one_reason_and_one_proof_returns_both(both):
    cluster = both
    # gpu02 drifts: its health check (under slurmd) drains the Slurm node, then
    # holds its Node with the same reason: Slinky's controller never has to act.
    cluster.sim("set", "FLEET", "gpu02", "driver=550.54.15")
    cluster.wait_for(lambda: cluster.reason("gpu02").startswith("gpugate: drift") or check_now(cluster, "gpu02"),
                     60, "gpu02 drained in Slurm")
    reason = cluster.reason("gpu02")
    # The hold (taint, record) and the condition (the status subresource) are
    # two writes of the sidecar's: wait for both.
    cluster.wait_for(lambda: (mirrored(cluster, "gpu02", reason)
                              and condition(node(cluster, "gpu02")).get("status") == "False")
                     or check_now(cluster, "gpu02"), 60, "gpu02's Node held with Slurm's reason")
    cond = condition(node(cluster, "gpu02"))
    assert (cond["status"], cond["reason"], cond["message"]) == ("False", "DriverDrift", reason)
    # Written by the sidecar from slurmd's mirror file: slurmd's gpugate has no token to write with.
    with open(os.path.join(cluster.mirror_dir, "gpu02.json")) as handle:
        assert json.load(handle)["hold"] == reason
    assert not os.path.exists(os.path.join(cluster.mirror_dir, "no-token"))
    assert os.stat(cluster.mirror_dir).st_mode & 0o777 == 0o755  # the emptyDir closed: no job's user writes there
    record = [r for r in cluster.log_records("gpu02") if r.get("action") == "drain"][-1]
    assert record["backend"].endswith("+kubernetes"), record

    # An admin cordons gpu03 by hand: Slinky drains its Slurm node with the
    # operator's reason.  gpugate's finding there holds neither side (not its
    # holds to change), and says so in the condition.
    cluster.admin.patch(node_path("gpu03"), {"spec": {"unschedulable": True}})
    cluster.wait_for(lambda: cluster.reason("gpu03").startswith("slurm-operator:"), 30, "Slinky drained gpu03")
    cluster.sim("set", "FLEET", "gpu03", "driver=550.54.15")
    cluster.wait_for(lambda: condition(node(cluster, "gpu03")).get("status") == "False"
                     or check_now(cluster, "gpu03"), 60, "gpu03's finding in its condition")
    assert nv.our_taints(node(cluster, "gpu03")) == [] and nv.owned(node(cluster, "gpu03")) == {}
    assert cluster.reason("gpu03").startswith("slurm-operator:")

    # One sweep, one proof (converge, reboot, DCGM, the smoke all_reduce under
    # slurmd), and gpu02 returns on both sides: its Node first, then Slurm.
    result = subprocess.run([sys.executable, "-m", "gpugate", "sweep", "--config", cluster.sweep_conf, "--apply",
                             "--json", "-w", "gpu02"], capture_output=True, text=True, timeout=300, env=cluster.env)
    assert "Traceback" not in result.stderr, result.stderr
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["outcomes"]["gpu02"]["result"] == "resumed", (report, result.stderr)
    obj = node(cluster, "gpu02")
    assert nv.our_taints(obj) == [] and not obj["spec"].get("unschedulable") and nv.OWNED not in (
        obj["metadata"].get("annotations") or {})
    assert not drain_flag(cluster, "gpu02") and cluster.reason("gpu02") == ""
    # Slinky never had to act on gpu02: no cordon of gpugate's for it to follow, even
    # while the reboot cleared Slurm's drain (22.05) and the smoke job ran undrained.
    assert [a for a in cluster.operator.actions if a[0] == "gpu02"] == [] and cluster.operator.errors == []
    check_now(cluster, "gpu02")
    cluster.wait_for(lambda: condition(node(cluster, "gpu02")).get("status") == "True" or check_now(cluster, "gpu02"),
                     60, "gpu02 fit again in its condition")
    # gpu04's Node is away when its Slurm node is drained: slurmd's gpugate writes its
    # mirror file all the same, and the sidecar holds the Node once it is registered again.
    from gpugate.testbed.kube import add_node

    cluster.admin.request("DELETE", node_path("gpu04"))
    cluster.sim("set", "FLEET", "gpu04", "driver=550.54.15")
    cluster.wait_for(lambda: drain_flag(cluster, "gpu04") or check_now(cluster, "gpu04"), 60, "gpu04 drained")
    add_node(cluster.admin, "gpu04")
    node_bound(cluster.kube_api, cluster.sidecar_conf, "gpu04")  # the new sidecar pod's token
    cluster.wait_for(lambda: mirrored(cluster, "gpu04", cluster.reason("gpu04")), 30,
                     "the sidecar holds gpu04's Node registered anew")
    # gpu03: the admin's cordon and Slinky's drain stand.
    assert node(cluster, "gpu03")["spec"]["unschedulable"] and cluster.reason("gpu03").startswith("slurm-operator:")


def test_one_budget_the_keeper_drains_in_slurm_and_holds_the_same_nodes_nodes(budgeted):
    cluster = budgeted
    names = ["gpu%02d" % i for i in range(1, 5)]
    cluster.sim("set", "FLEET", ",".join(names), "driver=550.54.15")
    # Budgeted: each node publishes in Slurm (its comment) and says so in its
    # condition; no node is held on either side without the keeper.
    cluster.wait_for(lambda: all(condition(node(cluster, n)).get("reason") == "DriverDrift" for n in names)
                     or check_now(cluster, *names), 90, "every Node's condition says DriverDrift")
    assert all(not drain_flag(cluster, n) and nv.our_taints(node(cluster, n)) == [] for n in names)
    # One keeper (Slurm's: one budget, not one per side) drains half the
    # partition, and each node it drains is held on its Node with the same reason.
    run = subprocess.run([sys.executable, "-m", "gpugate", "budget", "--json", "--config", cluster.keeper_conf],
                         capture_output=True, text=True, timeout=120, env=cluster.env)
    assert run.returncode == 0, run.stderr
    drained = [n for n in names if drain_flag(cluster, n)]
    assert sorted(json.loads(run.stdout)["drained"]) == drained and len(drained) == 2, run.stdout
    for name in names:
        if name in drained:
            assert mirrored(cluster, name, cluster.reason(name)), name
        else:
            assert nv.our_taints(node(cluster, name)) == [] and not node(cluster, name)["spec"].get("unschedulable")

    assert cluster.operator.actions == [] and cluster.operator.errors == []
