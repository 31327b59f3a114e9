"""Slurm on Kubernetes with no writable token where jobs run
(gpugate.kube.mirror, gpugate.node.kube_mirror_agent): slurmd's gpugate writes
a mirror file, the slurmd pod's sidecar alone writes the Node.  The file
and its checks here; the sidecar against a real kube-apiserver below and
in tests/test_kube_slinky.py (a real slurmctld and slurmds)."""

import json
import os

import pytest
from hypothesis import given, settings, strategies as st

from gpugate.kube import mirror
from gpugate.kube import nodeview as nv
from gpugate.kube.client import node_path
from gpugate.model.verdict import decide
from gpugate.model.findings import Finding

TAG = "gpugate:"
DRIFT = "gpugate: drift driver=550.54.15 (want 580.65.06)"


def node_bound(api, config, node):
    """``config`` with a token of the node agent naming ``node``, where the rig
    hands those out (the agent's admission policy refuses one naming none),
    minted again each call (a Node registered anew refuses the old one)."""
    try:
        from gpugate.testbed.kube_tokens import node_config
    except ImportError:
        return config
    return node_config(api, config, node)


def test_what_slurmd_s_gpugate_writes_reads_back_as_the_node_s_hold(tmp_path):
    shared = tmp_path / "volume"
    shared.mkdir()
    os.chmod(str(shared), 0o777)  # an emptyDir as the kubelet makes it
    side = mirror.MirrorFile(str(shared / "{node}.json"), TAG, clock=lambda: 1000.0)
    assert side.own_record("gpu01").reason == ""  # nothing written yet: nothing held
    side.drain("gpu01", DRIFT)
    verdict = decide([Finding("drift", "driver", "550.54.15", "580.65.06", "")], TAG)
    side.report_verdict("gpu01", verdict, side.own_record("gpu01"))
    assert side.own_record("gpu01").reason == DRIFT and side.own_record("gpu01").drain
    assert os.stat(str(shared)).st_mode & 0o777 == 0o755  # closed before the first write
    record = mirror.read_trusted(str(shared / "gpu01.json"), TAG)
    assert (record["hold"], record["seq"], record["condition"]) == (DRIFT, 2, ("False", "DriverDrift", DRIFT))
    side.undrain("gpu01")
    assert mirror.read_trusted(str(shared / "gpu01.json"), TAG)["hold"] == ""


def test_a_file_someone_else_could_write_is_refused(tmp_path):
    shared = tmp_path / "volume"
    shared.mkdir()
    mirror.MirrorFile(str(shared / "{node}.json"), TAG).drain("gpu01", DRIFT)
    path = str(shared / "gpu01.json")
    os.chmod(path, 0o666)  # a job's user could have written it
    with pytest.raises(mirror.MirrorFileError) as info:
        mirror.read_trusted(path, TAG)
    assert "writable" in str(info.value), info.value
    os.chmod(path, 0o644)
    os.chmod(str(shared), 0o777)  # ... or replaced it
    with pytest.raises(mirror.MirrorFileError):
        mirror.read_trusted(path, TAG)
    os.chmod(str(shared), 0o755)
    assert mirror.read_trusted(path, TAG)["hold"] == DRIFT
    assert mirror.read_trusted(str(shared / "gpu02.json"), TAG) is None  # none yet: nothing to do


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["version", "hold", "seq", "at", "condition", "node", "x"]),
                       st.one_of(st.none(), st.booleans(), st.integers(-5, 2 ** 40), st.floats(allow_nan=True),
                                 st.text(max_size=40), st.sampled_from([DRIFT, "", 1]),
                                 st.lists(st.text(max_size=12), max_size=4))))
def test_only_gpugates_shape_is_ever_applied(data):
    """Whatever the file says, it parses to a gpugate hold (or none) and a
    condition of GpugateHealthy's shape, or is refused."""
    try:
        record = mirror.parse(data, TAG)
    except mirror.MirrorFileError:
        return
    assert record["hold"] in ("", DRIFT) or record["hold"].startswith(TAG + " ")
    assert record["condition"] is None or record["condition"][0] in ("True", "False", "Unknown")


@pytest.mark.kube
def test_the_sidecar_writes_the_node_from_the_file_and_holds_a_node_registered_anew(tmp_path):
    from gpugate.model.config import load_settings
    from gpugate.node.kube_mirror_agent import MirrorAgent
    from gpugate.testbed.kube import KubeAPI, add_node
    from test_kube_agent import MANIFESTS, _require_kube

    _require_kube()
    api = KubeAPI(str(tmp_path / "kube")).start()
    try:
        api.apply(MANIFESTS)
        admin = api.admin()
        add_node(admin, "gpu01")
        kube = api.kube_settings("agent")
        config = tmp_path / "sidecar.toml"
        config.write_text('scheduler = "slurm+kubernetes"\nbaseline = "/nonexistent"\nstate_dir = "%s/{node}"\n'
                          '[kubernetes]\nserver = "%s"\ntoken_file = "%s"\nca_file = "%s"\n'
                          % (tmp_path, kube["server"], kube["token_file"], kube["ca_file"]))
        shared = tmp_path / "volume"
        side = mirror.MirrorFile(str(shared / "{node}.json"), TAG, clock=lambda: 1764300000.0)
        own = node_bound(api, str(config), "gpu01")
        sidecar = MirrorAgent(load_settings(own), "gpu01", str(shared / "gpu01.json"), poll=0.1)
        side.drain("gpu01", DRIFT)
        assert sidecar.once()
        held = admin.get(node_path("gpu01"))
        assert nv.owned(held)["reason"] == DRIFT and not held["spec"].get("unschedulable")  # never a cordon
        # The Node deleted and registered again: held again from the file.
        admin.request("DELETE", node_path("gpu01"))
        add_node(admin, "gpu01")
        node_bound(api, str(config), "gpu01")  # its pod's new token (the old one named the Node deleted)
        assert sidecar.once() and nv.owned(admin.get(node_path("gpu01")))["reason"] == DRIFT
        # The sweep returns the Node after its proof (its own token; here the
        # admin's): the file still names the hold, yet the sidecar does not put
        # it back on the same Node; slurmd's gpugate draining again does.
        from gpugate.kube.nodes import KubeNodes

        KubeNodes(api.admin(), {}, TAG).undrain("gpu01")
        assert sidecar.once() and nv.owned(admin.get(node_path("gpu01"))) == {}
        side.drain("gpu01", DRIFT)
        assert sidecar.once() and nv.owned(admin.get(node_path("gpu01")))["reason"] == DRIFT
        # A forged file (a job's user could write it) changes nothing.
        path = str(shared / "gpu01.json")
        with open(path, "w") as handle:
            json.dump({"version": 1, "hold": "", "seq": 99, "at": 1.0, "condition": None}, handle)
        os.chmod(path, 0o666)
        assert not sidecar.once()
        assert nv.owned(admin.get(node_path("gpu01")))["reason"] == DRIFT
        # slurmd's gpugate lifts: the Node's hold goes, and the condition carries the file's time.
        os.unlink(path)
        side.drain("gpu01", DRIFT)
        side.report_verdict("gpu01", decide([], TAG), None)
        side.undrain("gpu01")
        assert sidecar.once()
        back = admin.get(node_path("gpu01"))
        assert nv.our_taints(back) == [] and nv.OWNED not in (back["metadata"].get("annotations") or {})
        cond = [c for c in back["status"]["conditions"] if c["type"] == nv.CONDITION][0]
        assert (cond["status"], cond["reason"], cond["lastHeartbeatTime"]) == ("True", "Fit", "2025-11-28T03:20:00Z")
    finally:
        api.stop()
