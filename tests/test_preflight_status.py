"""`gpugate status`'s preflight figures (gpugate.fleet.preflight_status):
the nodes' counts the last audit gathered, summed only where sound (a
node's root writes them), and the nodes a preflight holds out now."""

from hypothesis import given, settings, strategies as st

from gpugate.fleet.preflight_status import figures, lines
from gpugate.fleet.status import format_age

TAG = "gpugate:"
_COUNT = st.one_of(st.integers(0, 1000), st.integers(-5, -1), st.just(True), st.text(max_size=3), st.none(),
                   st.floats(allow_nan=True), st.just(10 ** 12))
_STATS = st.one_of(
    st.fixed_dictionaries({"runs": st.dictionaries(st.sampled_from(["passed", "acute", "budgeted", "undecided"]),
                                                    _COUNT),
                           "across": st.dictionaries(st.sampled_from(["passed", "culprit", "undecided", "not_run"]),
                                                     _COUNT),
                           "seconds": st.one_of(st.floats(0, 1e6), st.just(-1.0), st.text(max_size=2))}),
    st.none(), st.text(max_size=4), st.lists(st.integers(), max_size=2))


def _sound(stats):
    def whole(v):
        return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 10 ** 9

    return (isinstance(stats, dict) and all(whole(v) for v in stats["runs"].values())
            and all(whole(v) for v in stats["across"].values())
            and isinstance(stats["seconds"], float) and stats["seconds"] >= 0)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["gpu%02d" % i for i in range(1, 12)]), _STATS, max_size=11))
def test_only_sound_counts_are_summed_and_the_rest_are_named(nodes):
    pf = figures({"at": 1000.0, "preflight": nodes}, {}, TAG, 1060.0)
    sound = {n: s for n, s in nodes.items() if _sound(s)}
    if not nodes:
        assert pf is None
        return
    assert pf["nodes"] == len(sound) and sorted(pf["unreadable"]) == sorted(set(nodes) - set(sound))
    for key in ("runs", "across"):
        for outcome, total in pf[key].items():
            assert total == sum(s[key].get(outcome, 0) for s in sound.values())
    assert abs(pf["seconds"] - sum(s["seconds"] for s in sound.values())) < 1e-3 * max(1, pf["seconds"])
    assert pf["audit_age"] == 60.0
    text = "\n".join(lines(pf, format_age))
    assert "jobs across nodes" in text and "audit of 1m ago" in text


def test_the_nodes_a_preflight_holds_out_now_are_named_from_their_reasons():
    drains = {"health": [
        {"node": "gpu05", "reason": "gpugate: health preflight=across busbw=17.8GB/s pair=gpu01 (want >= 50)"},
        {"node": "gpu02", "reason": "gpugate: health xid:gpu3=79 (want none)"},
        {"node": "gpu07", "reason": "gpugate: health preflight_busbw=22.9GB/s (want >= 350)"}]}
    stats = {"runs": {"passed": 14, "acute": 1, "budgeted": 1, "undecided": 0},
             "across": {"passed": 1, "culprit": 1, "undecided": 0, "not_run": 0}, "seconds": 4.5}
    pf = figures({"at": 0, "preflight": {"gpu01": stats}}, drains, TAG, 7200.0)
    assert pf["held_now"] == ["gpu05", "gpu07"]
    text = "\n".join(lines(pf, format_age))
    assert ("preflight (counts of 1 nodes, audit of 2h00m ago): 16 node proofs: passed 14, drained 1 (their jobs "
            "requeued), budgeted 1, undecided 0; 2 jobs across nodes: passed 1, culprit 1, undecided 0, not run 0; "
            "4s spent") in text
    assert "held out by a preflight now: gpu05,gpu07 (2)" in text
    assert figures(None, {"health": drains["health"][1:2]}, TAG, 0.0) is None  # nothing of a preflight's
