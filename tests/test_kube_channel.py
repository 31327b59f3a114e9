"""gpugate.kube.channel: what the node agent may run for a request on its
Node, and the request and answer formats.  A token that may patch Nodes
must never become root on them: only the sweep's own commands, with the
sweep's own flags, ever run."""

import json

from hypothesis import given, strategies as st

from gpugate.kube import channel

SWEEPS = [["check", "--mode", "verify"], ["check", "--mode", "verify", "--pin", "previous"],
          ["check", "--mode", "healthcheck"], ["facts", "--max-age", "600"],
          ["reset-gpus", "--timeout", "300", "--gpu", "3", "--gpu", "5"], ["reset-gpus", "--timeout", "300"]]


def test_the_sweeps_own_commands_are_served():
    # What gpugate.sweep sends (steps, reset_step, run): each one allowed.
    assert [channel.refusal(argv) for argv in SWEEPS] == [""] * len(SWEEPS)


def test_anything_else_is_refused():
    for argv in ([], ["evidence", "--max-bytes", "1"], ["sim", "set"], ["check", "--config", "/tmp/x.toml"],
                 ["check", "--mode", "verify", "--sim", "/tmp/fleet"], ["check", "--mode"],
                 ["check", "--mode", "verify", "--mode", "healthcheck"], ["facts", "--max-age", "-1"],
                 ["reset-gpus", "--gpu", "0; reboot"], ["check", "--baseline", "/tmp/evil.toml"],
                 ["sweep", "--apply"], ["--config", "/tmp/x", "check"], ["reset-gpus", "--gpu", "\u00b2"],
                 ["reset-gpus", "--gpu", "123"], ["facts", "--max-age", "nan"], ["facts", "--max-age", "9" * 400]):
        assert channel.refusal(argv), argv


@given(st.lists(st.text(min_size=0, max_size=12), min_size=0, max_size=8))
def test_a_served_request_is_only_ever_a_sweep_command_with_its_flags(argv):
    if channel.refusal(argv):
        return
    assert argv[0] in ("check", "facts", "reset-gpus")
    flags = argv[1::2]
    assert set(flags) <= {"--mode", "--pin", "--max-age", "--timeout", "--gpu"}
    assert not any(w.startswith("/") or w in ("--config", "--sim", "--baseline", "--node") for w in argv)


def test_the_agent_runs_its_own_gpugate_on_its_own_node_and_config():
    argv = channel.run_argv(["/usr/bin/python3", "-m", "gpugate"], ["check", "--mode", "verify"], "gpu07",
                            "/etc/gpugate/gpugate.toml")
    assert argv == ["/usr/bin/python3", "-m", "gpugate", "check", "--mode", "verify", "--json", "--node", "gpu07",
                    "--config", "/etc/gpugate/gpugate.toml"]


def test_requests_and_answers_round_trip_and_a_stale_answer_is_not_taken():
    node = {"metadata": {"annotations": {channel.REQUEST: channel.request_text("a1", SWEEPS[0], 120, 1.0)}}}
    assert channel.read_request(node)["argv"] == SWEEPS[0]
    node["metadata"]["annotations"][channel.ANSWER] = channel.answer_text("a0", 2.0, {"node": "gpu01"})
    assert channel.read_answer(node, "a1") is None  # the previous request's answer
    node["metadata"]["annotations"][channel.ANSWER] = channel.answer_text("a1", 3.0, {"node": "gpu01", "fit": True})
    assert channel.read_answer(node, "a1") == {"node": "gpu01", "fit": True}
    node["metadata"]["annotations"][channel.ANSWER] = channel.answer_text("a1", 3.0, error="refused: no")
    assert channel.read_answer(node, "a1") == "the node agent: refused: no"
    for bad in ("{", "[]", json.dumps({"id": "a1", "argv": "check", "timeout": 1}),
                json.dumps({"id": "", "argv": ["check"], "timeout": 1})):
        assert channel.read_request({"metadata": {"annotations": {channel.REQUEST: bad}}}) is None


def test_an_answer_too_large_for_the_node_says_so():
    text = channel.answer_text("a1", 1.0, {"node": "gpu01", "blob": "x" * (channel.ANSWER_CAP + 1)})
    assert len(text) < channel.ANSWER_CAP
    got = channel.read_answer({"metadata": {"annotations": {channel.ANSWER: text}}}, "a1")
    assert "larger than the Node channel carries" in got


def test_a_request_with_an_unusable_timeout_or_time_is_not_a_request():
    for timeout, at in ((float("nan"), 1.0), (float("inf"), 1.0), (0, 1.0), (10 ** 400, 1.0), (True, 1.0),
                        (60, float("nan")), (60, None)):
        text = json.dumps({"id": "a1", "argv": ["facts", "--max-age", "60"], "timeout": timeout, "at": at})
        assert channel.read_request({"metadata": {"annotations": {channel.REQUEST: text}}}) is None, (timeout, at)


def test_a_claimed_request_is_pending_for_the_sweep_and_never_run_again():
    node = {"metadata": {"annotations": {
        channel.REQUEST: channel.request_text("a1", SWEEPS[4], 300, 1000.0),
        channel.ANSWER: channel.answer_text("a1", 1001.0, state=channel.RUNNING)}}}
    assert channel.claimed(node, "a1") and channel.read_answer(node, "a1") is None
    assert not channel.claimed(node, "a2")
    request = channel.read_request(node)
    # Started within a minute of being asked (either clock a little off), or not at all.
    assert not channel.expired(request, 1000.0 + channel.START_WITHIN_SECONDS)
    assert not channel.expired(request, 1000.0 - channel.START_WITHIN_SECONDS)
    assert channel.expired(request, 1000.0 + channel.START_WITHIN_SECONDS + 1)
    assert channel.expired(request, 1000.0 - channel.START_WITHIN_SECONDS - 1)


def test_the_agent_loop_outlives_a_bad_pass_and_never_spins():
    """The DaemonSet's only process: an unexpected error in one pass is
    said and the loop goes on, one poll later (never a hot loop)."""
    from gpugate.model.config import parse_settings
    from gpugate.node.kube_agent import Agent

    settings = parse_settings({"scheduler": "kubernetes"}, "(test)")
    now, slept, passes = [0.0], [], []
    agent = Agent(settings, "gpu01", "/etc/gpugate/gpugate.toml", ["/bin/true"], interval=300, poll=5,
                  clock=lambda: now[0], sleep=lambda s: (slept.append(s), now.__setitem__(0, now[0] + s)))
    agent.health_check = lambda: passes.append("check")

    def broken():
        passes.append("serve")
        raise ValueError("a Node that is not what it should be")
    agent.serve_once = broken
    agent.run(stop=lambda: len(slept) >= 3)
    assert slept == [5, 5, 5] and passes[0] == "check" and passes.count("check") == 1


@given(depth=st.sampled_from([100, 1000, 2040]), key=st.sampled_from([channel.REQUEST, channel.ANSWER, "owned"]))
def test_an_annotation_nested_past_any_of_ours_is_not_ours_and_raises_nothing(depth, key):
    """A Node's annotations are anyone's with patch rights on it: one nested
    deeper than the interpreter's recursion limit is just not gpugate's
    (json.loads raised RecursionError through every reader here)."""
    from gpugate.kube import nodeview

    deep = "[" * depth + "]" * depth
    name = nodeview.OWNED if key == "owned" else key
    node = {"metadata": {"name": "gpu01", "annotations": {name: deep}}}
    assert channel.read_request(node) is None
    assert channel.read_answer(node, "r1") is None
    assert channel.claimed(node, "r1") is False
    assert nodeview.owned(node) == {}
