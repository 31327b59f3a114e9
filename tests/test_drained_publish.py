"""A node gpugate has already drained for something else (the sweep's rma,
its work reasons such as ``sweep=rma deferred``, an acute finding) publishes
nothing for the budget keeper (issue 34): a pending span on a drained node
read as if it waited for the keeper.  The keeper's own drain of the node's
published finding keeps its span (the keeper's memory of what it drained,
issue 33, goes with the span)."""

import json
import os
import time

import pytest

from gpugate.model.findings import Finding
from gpugate.node import act as act_mod
from gpugate.slurm import pending
from gpugate.model.verdict import decide

from test_keeper import DRIFT, node
from test_pending_proof import CommentSlurm, _settings

RMA = "gpugate: rma smoke=all_reduce busbw=23.4GB/s (want >= 350)"
DEFERRED = ("gpugate: drift sweep=rma deferred (want room in budget and floor); "
            "driver=550.54.15 (want 580.95.05)")
ACUTE = "gpugate: health xid:gpu1=79 (want none)"


class NodeSlurm(CommentSlurm):
    why = "configured"  # as gpugate.slurm.connect's backends say


def _drift(cfg):
    verdict = decide([Finding("drift", "driver", "550.54.15", "580.95.05", "")], cfg.reason_tag)
    assert not verdict.fit and verdict.reason == DRIFT
    return verdict


def _act(tmp_path, monkeypatch, state):
    cfg = _settings(tmp_path)
    os.makedirs(cfg.state_dir("gpu01"), exist_ok=True)
    slurm = NodeSlurm({"gpu01": state}, lambda: 1000)
    monkeypatch.setattr("gpugate.slurm.connect", lambda *a, **k: slurm)
    out = act_mod.act(cfg, "gpu01", _drift(cfg))
    return cfg, slurm, out


@pytest.mark.parametrize("reason", [RMA, DEFERRED, ACUTE])
def test_a_node_gpugate_drained_for_something_else_publishes_nothing(tmp_path, monkeypatch, reason):
    cfg, slurm, out = _act(tmp_path, monkeypatch, node("gpu01", reason=reason, when=900, comment="rack 3"))
    assert ("comment", "gpu01") not in slurm.calls
    assert slurm.states["gpu01"].comment == "rack 3" and slurm.states["gpu01"].reason == reason
    assert out["action"] == "keep" and out["ok"]
    assert not os.path.exists(os.path.join(cfg.state_dir("gpu01"), "published.json"))


@pytest.mark.parametrize("reason", [RMA, DEFERRED])
def test_a_span_published_before_the_sweep_took_the_node_is_cleared(tmp_path, monkeypatch, reason):
    """Published while held, then escalated to rma (or deferred): the span
    goes, the admin's text stays."""
    state = node("gpu01", reason=reason, when=900, published=DRIFT, since=500, comment="rack 3")
    assert pending.read(state.comment) is not None
    cfg, slurm, out = _act(tmp_path, monkeypatch, state)
    assert pending.read(slurm.states["gpu01"].comment) is None
    assert slurm.states["gpu01"].comment == "rack 3" and out["action"] == "keep"


def test_the_keepers_own_drain_keeps_the_nodes_span(tmp_path, monkeypatch):
    """Drained by the keeper for the span it published: the span stays (the
    keeper remembers the drained span by it; a RESUME must not re-drain)."""
    since = int(time.time()) - 60
    state = node("gpu01", reason=DRIFT, when=since + 30, published=DRIFT, since=since)
    cfg, slurm, out = _act(tmp_path, monkeypatch, state)
    seen = pending.read(slurm.states["gpu01"].comment)
    assert seen is not None and seen.reason == DRIFT and seen.since == since
    assert "drain" not in [c[0] for c in slurm.calls]


@pytest.mark.parametrize("reason", [RMA, ACUTE])
def test_a_node_kept_drained_asks_slurm_nothing_while_its_findings_stay(tmp_path, monkeypatch, reason):
    """Publishing nothing must not cost a controller read on every run: the
    same budgeted findings on a node gpugate holds drained for more ask Slurm
    nothing again until the proof period ends, as a published hold does
    (test_slurm_budget's steady state: no node asks anything)."""
    cfg, slurm, out = _act(tmp_path, monkeypatch, node("gpu01", reason=reason, when=900, comment="rack 3"))
    assert out["action"] == "keep" and out["rpc"]
    calls = len(slurm.calls)
    again = act_mod.act(cfg, "gpu01", _drift(cfg))
    assert again["action"] == "keep" and not again["rpc"] and slurm.calls[calls:] == []
    # Other findings, or the period over: read again.
    kept = os.path.join(cfg.state_dir("gpu01"), "kept.json")
    with open(kept) as handle:
        record = json.load(handle)
    record["at"] -= pending.REFRESH_SECONDS + 1
    with open(kept, "w") as handle:
        json.dump(record, handle)
    assert act_mod.act(cfg, "gpu01", _drift(cfg))["rpc"] and len(slurm.calls) > calls
