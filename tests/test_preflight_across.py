"""The proof across a job's nodes (issue 36, gpugate.preflight.cross): the
prologs of one job meet at its first node over signed TCP, run the
collective (the simulated nodes' all_reduce_perf, replaying real 2-node
recordings: the worst node of a run plays), and pin a culprit by halving
and re-pairing.  Each node runs in its own thread here, on real sockets and
the production path; through the prolog on a real slurmctld:
tests/test_slurm_preflight.py."""

import os
import socket
import threading
import time

import pytest

from conftest import DEMO_BASELINE, gpugate_cmd
from gpugate.preflight.cross import Member, prove_across, run_rank_command

EVERY_GPU = list(range(8))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def fleet8(tmp_path):
    path = str(tmp_path / "fleet")
    result = gpugate_cmd("sim", "init", path, "--nodes", "gpu[01-08]", "--baseline", DEMO_BASELINE)
    assert result.returncode == 0, result.stderr
    return path


def _settings(settings_for, fleet, tmp_path, **preflight):
    from gpugate.model.config import parse_settings
    from gpugate.core.record import replace

    key = str(tmp_path / "drain-budget.key")
    if not os.path.exists(key):
        with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o600), "w") as handle:
            handle.write(os.urandom(32).hex())
    base = parse_settings({}, "(test)")
    cfg = dict(base.preflight, rendezvous_host="127.0.0.1", port=_free_port(), ports=1, timeout_seconds=10,
               across_seconds=30, run_seconds=10,
               allreduce_multi=(os.path.join(fleet, "{node}", "bin", "all_reduce_perf"), "-b", "1G", "-e", "8G",
                                "-f", "2", "-g", "{gpus}"))
    cfg.update(preflight)
    return replace(settings_for(fleet), preflight=cfg, drain_budget=dict(base.drain_budget, key_file=key))


def _job(settings, nodes, own=None, whole=None, job="4242", join_late=None, others_after=0.0, products=None):
    """Every node's prolog part at once; {node: Across}."""
    from gpugate.model.baseline import load_baseline

    baseline = load_baseline(DEMO_BASELINE)
    out = {}
    started = time.monotonic()

    def one(node):
        if join_late and node in join_late:
            return
        if node != nodes[0]:
            time.sleep(others_after)
        me = Member(node, (own or {}).get(node, "passed"), (whole or {}).get(node, True),
                    (products or {}).get(node, baseline.expect_for(node).product))
        out[node] = prove_across(settings, baseline, job, nodes, me, run_rank_command(settings, node, EVERY_GPU,
                                                                                       False), started)

    threads = [threading.Thread(target=one, args=(n,)) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def _sim(fleet, node, *keys):
    result = gpugate_cmd("sim", "set", fleet, node, *keys)
    assert result.returncode == 0, result.stderr


NODES = ["gpu0%d" % i for i in range(1, 9)]


def test_eight_healthy_nodes_pass_in_one_run(settings_for, fleet8, tmp_path):
    out = _job(_settings(settings_for, fleet8, tmp_path), NODES)
    assert set(out) == set(NODES)
    for node, across in out.items():
        assert across.ran and across.finding is None and across.rounds == 1, (node, across)
        assert across.why.startswith("passed: 8 nodes busbw=70.")
    assert out["gpu01"].first and not out["gpu02"].first


def test_one_slow_node_among_eight_is_pinned_and_only_it(settings_for, fleet8, tmp_path):
    _sim(fleet8, "gpu06", "smoke=pair-slow")
    out = _job(_settings(settings_for, fleet8, tmp_path), NODES)
    pinned = {n: a.finding for n, a in out.items() if a.finding is not None}
    assert list(pinned) == ["gpu06"]
    finding = pinned["gpu06"]
    # Budgeted: another job's traffic on a shared link can slow a run (gpugate.model.findings.USER_CAUSED).
    assert finding.component == "preflight_across" and not finding.acute
    assert finding.observed.startswith("busbw=17.") and finding.expected == ">= 50"
    partners = finding.observed.rpartition("pairs=")[2].split(",")
    assert len(set(partners)) == 2 and set(partners) <= set(NODES) - {"gpu06"}
    assert all(a.culprits == ("gpu06",) and a.rounds == 5 for a in out.values())
    from gpugate.model.reason import render

    assert render("gpugate:", "health", [finding]).startswith("gpugate: health preflight_across=busbw=17.")


def test_wrong_values_across_nodes_pin_the_node(settings_for, fleet8, tmp_path):
    _sim(fleet8, "gpu03", "smoke=nccl-wrong")
    out = _job(_settings(settings_for, fleet8, tmp_path), NODES[:4])
    assert [n for n, a in out.items() if a.finding] == ["gpu03"]
    assert out["gpu03"].finding.observed.startswith("wrong=") and not out["gpu03"].finding.acute


def test_an_nccl_abort_across_nodes_pins_nothing(settings_for, fleet8, tmp_path):
    """An abort names the environment as much as a node (a /dev/shm a job's
    user filled, a port taken, a link saturated): undecided, as in the
    node's own proof; the job runs and nothing is drained."""
    _sim(fleet8, "gpu03", "smoke=pair-abort")
    out = _job(_settings(settings_for, fleet8, tmp_path), NODES[:4])
    assert set(out) == set(NODES[:4])
    assert all(a.finding is None and a.culprits == () for a in out.values()), out
    assert out["gpu01"].why.startswith("undecided: ") and not out["gpu01"].failed


def test_two_nodes_cannot_be_told_apart_and_nothing_is_drained(settings_for, fleet8, tmp_path):
    _sim(fleet8, "gpu02", "smoke=pair-slow")
    out = _job(_settings(settings_for, fleet8, tmp_path), NODES[:2])
    assert all(a.finding is None and a.ran for a in out.values())
    assert out["gpu01"].why.startswith("undecided: no node proven good")


def test_a_node_that_does_not_come_decides_nothing(settings_for, fleet8, tmp_path):
    out = _job(_settings(settings_for, fleet8, tmp_path, timeout_seconds=5, across_seconds=5), NODES[:3],
               join_late={"gpu03"})
    assert out["gpu01"].why == "undecided: gpu03 did not come in time" and not out["gpu01"].ran
    assert out["gpu02"].finding is None and out["gpu02"].why == out["gpu01"].why


def test_a_node_that_failed_its_own_proof_or_a_partial_job_runs_no_collective(settings_for, fleet8, tmp_path):
    settings = _settings(settings_for, fleet8, tmp_path)
    out = _job(settings, NODES[:3], own={"gpu02": "acute"})
    assert all(not a.ran and a.why.startswith("not run: gpu02 failed its own proof") for a in out.values())
    out = _job(settings, NODES[:3], whole={"gpu03": False}, job="4243")
    assert all(not a.ran and "part of gpu03's GPUs" in a.why for a in out.values())


def test_a_command_that_cannot_run_pins_nothing(settings_for, fleet8, tmp_path):
    out = _job(_settings(settings_for, fleet8, tmp_path, allreduce_multi=("/nonexistent/all_reduce_perf",)),
               NODES[:4])
    assert all(a.finding is None and a.rounds == 1 and "could not decide" in a.why for a in out.values())


def test_no_key_no_meeting(settings_for, fleet8, tmp_path):
    from gpugate.core.record import replace

    settings = _settings(settings_for, fleet8, tmp_path)
    settings = replace(settings, drain_budget=dict(settings.drain_budget, key_file=str(tmp_path / "none.key")))
    out = _job(settings, NODES[:2])
    assert all(not a.ran and a.why.startswith("not run: the drain budget key") for a in out.values())


def test_a_stranger_on_the_port_cannot_join_or_answer(settings_for, fleet8, tmp_path):
    """Anyone may connect to the meeting's port: a join that is not signed
    with the site's key is dropped (the stranger hears a greeting and is
    cut off), and the job's own nodes still meet."""
    settings = _settings(settings_for, fleet8, tmp_path)
    port = settings.preflight["port"]
    stop = time.monotonic() + 20
    said = []

    def stranger():
        while time.monotonic() < stop:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                    s.sendall(b'{"body": {"kind": "join", "job": "4242", "node": "gpu02", "seq": 1}, "mac": "00"}\n')
                    said.append(s.recv(4096))
                    said.append(s.recv(4096))  # b"": the meeting closed on it
                    return
            except OSError:
                time.sleep(0.05)

    t = threading.Thread(target=stranger)
    t.start()
    out = _job(settings, NODES[:3], others_after=1.5)
    t.join(30)
    assert said and b'"kind":"greeting"' in said[0] and said[-1] == b"", said
    assert all(a.ran and a.why.startswith("passed") for a in out.values())


def test_the_job_note_says_what_was_proved_and_stays_one_short_ascii_line():
    from gpugate.preflight.note import job_note

    note = job_note({"seconds": {"dcgm": 61.2, "allreduce": 4.04}, "seconds_total": 70.31, "passed": True,
                     "across": {"culprits": ["gpu04"], "rounds": 4, "why": "culprit gpu04 in 4 rounds"}})
    assert note == ("gpugate preflight 70.3s: this node: dcgm 61.2s, all_reduce 4.0s; across: culprit gpu04 "
                    "(its prolog drains it and fails: Slurm requeues or ends the job) (4 rounds)")
    long = job_note({"seconds_total": 1, "across": {"why": "undecided: \u2028" + "x" * 400, "rounds": 1}})
    assert len(long) <= 240 and long.isascii() and "\n" not in long and "\u2028" not in long


def test_amd_nodes_prove_themselves_across_with_rccl_tests(settings_for, tmp_path):
    """Four MI300X nodes (the mixed example baseline, no pair floor: judged
    on values) run rccl-tests across; one whose rank aborts pins nobody (an
    abort is undecided, as on NVIDIA), and every node hears so."""
    from gpugate.model.baseline import load_baseline

    from conftest import ROOT

    mixed = os.path.join(ROOT, "slurm_conf", "baseline.mixed.example.toml")
    path = str(tmp_path / "amd")
    assert gpugate_cmd("sim", "init", path, "--nodes", "mi[001-004]", "--baseline", mixed).returncode == 0
    _sim(path, "mi003", "smoke=rccl-abort-mi210")
    settings = _settings(settings_for, path, tmp_path)
    baseline = load_baseline(mixed)
    nodes = ["mi001", "mi002", "mi003", "mi004"]
    out, started = {}, time.monotonic()

    def one(node):
        out[node] = prove_across(settings, baseline, "77", nodes, Member(node, "passed", True, "AMD Instinct MI300X"),
                                 run_rank_command(settings, node, EVERY_GPU, True), started)

    threads = [threading.Thread(target=one, args=(n,)) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert set(out) == set(nodes) and all(a.ran and a.finding is None for a in out.values()), out
    assert out["mi001"].why.startswith("undecided: ") and "nccl_error" in out["mi001"].why


def test_a_rank_that_hangs_is_stopped_at_rank_0s_budget_and_pins_nothing(settings_for, fleet8, tmp_path):
    """A rank that never ends is stopped at run_seconds on every node (the
    verdict is still heard), and a hang whose cause is unknown (a wedged
    HCA, or a link another job saturates) pins nobody: undecided."""
    _sim(fleet8, "gpu02", "smoke=hang")
    out = _job(_settings(settings_for, fleet8, tmp_path, run_seconds=2), NODES[:4])
    assert set(out) == set(NODES[:4])
    assert all(a.finding is None and a.ran and a.rounds == 1 for a in out.values()), out
    assert out["gpu01"].why.startswith("undecided: the all_reduce across the nodes could not decide: timeout")


def test_a_job_of_mixed_products_is_held_to_no_one_floor(settings_for, fleet8, tmp_path):
    """Each node names its own product in its join (a prolog's cached
    baseline knows its own node only): a run over two products has no one
    floor, so a bandwidth under the H100's pins nobody."""
    _sim(fleet8, "gpu04", "smoke=pair-slow")
    out = _job(_settings(settings_for, fleet8, tmp_path), NODES[:4], products={"gpu04": "NVIDIA A100-SXM4-80GB"})
    assert all(a.finding is None and a.why.startswith("passed: 4 nodes busbw=17.") for a in out.values())
