"""Issue 33: an admin's RESUME of a node the keeper drained is respected.

Before, the keeper (every 30 s) drained a RESUMEd node again from the
comment its node had not yet cleared (the node sees the RESUME, clears its
Xid history and its comment only at its next health check): a RESUME of an
``xid_repeat`` drain was undone a minute later with no new fault.  The
keeper now remembers the spans it drained (gpugate.budget.memory): one seen
in service since waits, out of the queue and the budget, until its node
signs it again; a standing drift the admin did not fix drains again then."""

import pytest
from hypothesis import given, settings, strategies as st

from gpugate.keeper import run as keeper
from gpugate.budget import memory as keeper_memory
from gpugate.core.record import replace
from gpugate.slurm import pending

from test_keeper import DRIFT, KEY, TAG, MemorySlurm, fleet, node
from test_pending_proof import _settings

NOW = 1_800_000_000
XID_REPEAT = "gpugate: health xid_repeat:gpu2=xid 31 in 3 jobs (want < 3 jobs within 24h)"


def _run(cfg, slurm, now, memory):
    figures = keeper.run_once(cfg, slurm, clock=lambda: now, sleep=lambda s: None, memory=memory)
    return figures, figures.pop("_memory")


def _resume(slurm, name):
    slurm.states[name] = replace(slurm.states[name], flags=frozenset(), reason="", reason_time=None)


@pytest.mark.parametrize("reason", [XID_REPEAT, DRIFT])
def test_an_admins_resume_is_not_undone_by_the_keeper(tmp_path, reason):
    cfg = _settings(tmp_path, share=0.5)
    states = fleet(node("gpu01", published=reason, since=NOW - 60), node("gpu02"), node("gpu03"), node("gpu04"))
    slurm = MemorySlurm(states, lambda: NOW)
    figures, memory = _run(cfg, slurm, NOW, {})
    assert figures["drained"] == ["gpu01"] and memory["gpu01"]["since"] == NOW - 60
    _resume(slurm, "gpu01")  # the admin's RESUME; the node's comment is still there
    for later in (NOW + 30, NOW + 60, NOW + 600):
        figures, memory = _run(cfg, slurm, later, memory)
        assert figures["drained"] == [], later
        assert "returned to service since gpugate drained it" in figures["held_nodes"]["gpu01"]
        assert figures["partitions"]["a"]["drained"] == 0  # no budget spent on it
    # The finding stands and the node signs it again (every 30 min): drained again.
    comment = pending.publish(slurm.states["gpu01"].comment, reason, NOW + 1800, KEY, "gpu01")
    slurm.states["gpu01"] = replace(slurm.states["gpu01"], comment=comment)
    figures, memory = _run(cfg, slurm, NOW + 1801, memory)
    assert figures["drained"] == ["gpu01"]
    # Its node cleared the span (fit again, or the xid history cleared): forgotten.
    slurm.states["gpu01"] = replace(slurm.states["gpu01"], comment=pending.clear(comment))
    assert _run(cfg, slurm, NOW + 1900, memory)[1] == {}


def test_without_the_memory_the_keeper_drains_a_resumed_span_again(tmp_path):
    """The attack as found (the memory lost: the keeper is no worse than before)."""
    cfg = _settings(tmp_path, share=0.5)
    slurm = MemorySlurm(fleet(node("gpu01", published=XID_REPEAT, since=NOW - 60), node("gpu02")), lambda: NOW)
    _run(cfg, slurm, NOW, {})
    _resume(slurm, "gpu01")
    assert _run(cfg, slurm, NOW + 30, {})[0]["drained"] == ["gpu01"]


def test_a_node_given_back_over_the_budget_is_not_remembered(tmp_path):
    cfg = _settings(tmp_path, share=0.25)
    slurm = MemorySlurm(fleet(node("gpu01", published=DRIFT, since=NOW - 60), node("gpu02"), node("gpu03")),
                        lambda: NOW)
    figures, memory = _run(cfg, slurm, NOW, {"gpu09": {"since": 5, "drained": 6, "returned": None}})
    assert figures["drained"] == ["gpu01"] and set(memory) == {"gpu01"}  # gpu09's span is gone


def test_the_memory_file_round_trips_and_a_garbled_one_is_empty(tmp_path):
    status = str(tmp_path / "budget-keeper.json")
    memory = {"gpu01": {"since": 100, "drained": 200.5, "returned": None}}
    keeper_memory.save(status, memory)
    assert keeper_memory.load(status) == memory
    for garbled in ('{"nodes": [1]}', '[]', '{"nodes": {"gpu01": {"since": "x", "drained": 1}}}', "{"):
        (tmp_path / keeper_memory.FILE).write_text(garbled)
        assert keeper_memory.load(status) == {}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["resume", "sign", "keeper", "clear"]), st.integers(1, 900)),
                max_size=25))
def test_a_resumed_span_drains_again_only_after_its_node_signs_it_again(steps):
    """Any sequence of admin RESUMEs, node signatures, node clears and keeper
    runs: the keeper never drains a span it drained before and then saw in
    service, unless the node signed it after that."""
    states = {"gpu01": node("gpu01", published=DRIFT, since=NOW, parts=("a",)),
              "gpu02": node("gpu02"), "gpu03": node("gpu03")}
    memory, now, returned_at, drained_before = {}, NOW, None, False
    for action, dt in steps:
        now += dt
        state = states["gpu01"]
        if action == "resume" and "DRAIN" in state.flags:
            states["gpu01"] = replace(state, flags=frozenset(), reason="")
        elif action == "sign" and state.comment:
            now += pending.REFRESH_SECONDS  # a node re-signs a standing finding this often
            states["gpu01"] = replace(state, comment=pending.publish(state.comment, DRIFT, now, KEY, "gpu01",
                                                                      since=NOW))
        elif action == "clear":
            states["gpu01"] = replace(state, comment="")
        elif action == "keeper":
            if drained_before and "DRAIN" not in state.flags and returned_at is None:
                returned_at = now
            memory, waiting = keeper_memory.review(memory, states, TAG, now)
            seen = pending.read(states["gpu01"].comment) if states["gpu01"].comment else None
            if "gpu01" in waiting:
                assert returned_at is not None and seen.seen <= returned_at
            elif seen is not None and "DRAIN" not in states["gpu01"].flags:
                assert returned_at is None or seen.seen > returned_at or seen.since != NOW
                states["gpu01"] = replace(states["gpu01"], flags=frozenset({"DRAIN"}), reason=DRIFT)
                memory = keeper_memory.drained(memory, ["gpu01"], states, TAG, now)
                drained_before, returned_at = True, None
        if not states["gpu01"].comment:
            memory, drained_before, returned_at = {}, False, None


def test_a_resumed_node_signed_again_drains_with_an_admins_paste_beside_its_span(tmp_path):
    """The node signed its standing finding again after the RESUME; an
    admin's pasted tag beside it must not keep it waiting (the screened
    comment keeps when the node signed)."""
    cfg = _settings(tmp_path, share=0.5)
    slurm = MemorySlurm(fleet(node("gpu01", published=DRIFT, since=NOW - 60), node("gpu02")), lambda: NOW)
    figures, memory = _run(cfg, slurm, NOW, {})
    assert figures["drained"] == ["gpu01"]
    _resume(slurm, "gpu01")
    figures, memory = _run(cfg, slurm, NOW + 30, memory)
    assert figures["drained"] == [] and memory["gpu01"]["returned"] == NOW + 30
    signed = pending.publish(slurm.states["gpu01"].comment, DRIFT, NOW + 1800, KEY, "gpu01")
    pasted = "[gpugate-pending @1] %s [/gpugate-pending] " % DRIFT
    slurm.states["gpu01"] = replace(slurm.states["gpu01"], comment=pasted + signed)
    figures, memory = _run(cfg, slurm, NOW + 1801, memory)
    assert figures["drained"] == ["gpu01"]


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.from_regex(r"gpu[0-9]{1,5}", fullmatch=True),
                       st.tuples(st.integers(1, 2 ** 31), st.floats(1e9, 2e9), st.booleans()), max_size=60),
       st.integers(12, 4000))
def test_the_memory_cut_to_a_size_keeps_the_most_recently_drained(raw, cap):
    """What rides on the Kubernetes Lease is bounded (annotations hold 256 KiB
    in all); what is dropped is the oldest drains."""
    import json

    memory = {n: {"since": s, "drained": d, "returned": d + 1 if r else None} for n, (s, d, r) in raw.items()}
    kept = keeper_memory.newest(memory, cap)
    assert len(json.dumps(kept, separators=(",", ":"))) <= cap
    assert keeper_memory.parse({"nodes": kept}) == kept and all(memory[n] == e for n, e in kept.items())
    dropped = set(memory) - set(kept)
    if kept and dropped:
        assert min(e["drained"] for e in kept.values()) >= max(memory[n]["drained"] for n in dropped)
    if len(json.dumps(memory, separators=(",", ":"))) <= cap:
        assert kept == memory
