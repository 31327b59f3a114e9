"""A health check that read the GPUs before the sweep reset them must not
drain the node again for what the reset cleared (issue 28, seen in the
demo: the sweep verified gpu01 after the reset and lifted its drain for the
smoke job; a health check that had read 4 uncorrected ECC errors before the
reset drained it again, the smoke job waited on a drained node for its whole
deadline and the repaired node fell to the reboot rung)."""

import os
import time

from gpugate.model.config import load_settings
from gpugate.model.findings import Finding
from gpugate.node import act as act_mod
from gpugate.node.gpureset import MARKER
from gpugate.safety.state import write_json
from gpugate.slurm.nodestate import NodeState
from gpugate.model.verdict import decide
from gpugate.slurm.base import NodeUpdates

ECC = "gpugate: health ecc:gpu6=4 uncorrected (want <= 0)"


class FakeSlurm(NodeUpdates):  # the scheduler interface's defaults (report_verdict, lead)
    name = "fake"
    why = "configured"
    node_read = "libslurm"

    def __init__(self):
        self.calls = []

    def own_record(self, node):
        # Undrained, no reason: the sweep's smoke stage lifted its drain.
        return NodeState(name=node, state="IDLE", flags=frozenset(), reason="", reason_time=None,
                         reason_user="", partitions=())

    def drain(self, node, reason):
        self.calls.append(("drain", node, reason))

    def undrain(self, node):
        self.calls.append(("undrain", node))

    def update_comment(self, *args, **kwargs):
        self.calls.append(("comment",) + args)

    def close(self):
        pass


def _setup(tmp_path, monkeypatch):
    config = tmp_path / "gpugate.toml"
    config.write_text('state_dir = "%s/state/{node}"\n' % tmp_path)
    settings = load_settings(str(config))
    os.makedirs(settings.state_dir("gpu01"), exist_ok=True)
    slurm = FakeSlurm()
    monkeypatch.setattr("gpugate.slurm.connect", lambda *a, **k: slurm)
    verdict = decide([Finding("health", "ecc", "4 uncorrected", "<= 0", "", gpu=6)], settings.reason_tag)
    assert not verdict.fit and verdict.reason == ECC
    return settings, slurm, verdict


def test_a_verdict_read_before_a_gpu_reset_does_not_drain_the_node_again(tmp_path, monkeypatch):
    settings, slurm, verdict = _setup(tmp_path, monkeypatch)
    read_at = time.time() - 2
    write_json(os.path.join(settings.state_dir("gpu01"), MARKER), {"boot_id": "b", "kmsg_seq": 7,
                                                                   "at": read_at + 1.5, "gpus": [6]})
    out = act_mod.act(settings, "gpu01", verdict, read_at=read_at)
    assert [c for c in slurm.calls if c[0] == "drain"] == []
    assert out["action"] == "none" and out["applied"] is False and "reset" in out["why"]


def test_a_verdict_read_after_the_reset_still_drains(tmp_path, monkeypatch):
    settings, slurm, verdict = _setup(tmp_path, monkeypatch)
    now = time.time()
    write_json(os.path.join(settings.state_dir("gpu01"), MARKER), {"boot_id": "b", "kmsg_seq": 7,
                                                                   "at": now - 30, "gpus": [6]})
    out = act_mod.act(settings, "gpu01", verdict, read_at=now)
    assert ("drain", "gpu01", ECC) in slurm.calls and out["action"] == "drain"


def test_a_reset_marker_in_the_future_does_not_hold_drains_off(tmp_path, monkeypatch):
    """A clock stepped back after a reset: the marker is "later" than every
    read until the clock catches up; it must not switch drains off."""
    settings, slurm, verdict = _setup(tmp_path, monkeypatch)
    now = time.time()
    write_json(os.path.join(settings.state_dir("gpu01"), MARKER), {"boot_id": "b", "kmsg_seq": 7,
                                                                   "at": now + 3600, "gpus": [6]})
    out = act_mod.act(settings, "gpu01", verdict, read_at=now)
    assert ("drain", "gpu01", ECC) in slurm.calls and out["action"] == "drain"


def test_the_health_check_passes_when_it_began_reading(tmp_path, monkeypatch):
    """healthcheck._act hands act() the time its reads began."""
    from gpugate.node import healthcheck

    seen = {}
    monkeypatch.setattr(healthcheck, "act", lambda *a, **k: seen.update(k) or {"action": "none"})
    j = healthcheck._Judged()
    j.in_grace, j.last, j.in_service, j.read_at = False, {}, None, 123.0
    j.verdict = decide([], "gpugate:")
    healthcheck._act(None, "gpu01", j, time.monotonic() + 10, None)
    assert seen["read_at"] == 123.0


def test_a_node_read_the_older_way_says_why_in_its_log_line(tmp_path, monkeypatch):
    """Issue 34: where the one-RPC read fell back (`sinfo -n`, two RPCs),
    the run's outcome (its log line) says so and why; not when it did not."""
    settings, slurm, verdict = _setup(tmp_path, monkeypatch)
    out = act_mod.act(settings, "gpu01", verdict, read_at=time.time())
    assert "node_read" not in out
    slurm.node_read = "sinfo -n (no libslurm at /usr/lib*/ beside /usr/bin (set [slurm] library))"
    out = act_mod.act(settings, "gpu01", verdict, read_at=time.time())
    assert out["node_read"] == slurm.node_read and out["action"] == "drain"
