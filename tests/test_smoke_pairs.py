"""The smoke stage's 2-node pairs (gpugate/sweep/pairs.py): pairing, the
rule that tells a bad node from its partner, and the "the command cannot
run" classification (the site's configuration, never the node's).  The
pairs on real Slurm are in test_slurm_smoke.py."""

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpugate.judges.smoke import cannot_run
from gpugate.parsers.nccl import parse_nccl_tests
from gpugate.sweep.pairs import FAIL, NOT_REPROVEN, ODD_ONE_OUT, PASS, UNPAIRED, PairRun, decide, first_round, run_rounds, second_round
from gpugate.sweep.smoke import SmokeResult

DATA = os.path.join(os.path.dirname(__file__), os.pardir, "gpugate", "data", "smoke")
NAMES = st.lists(st.from_regex(r"gpu[0-9]{2,3}", fullmatch=True), max_size=40, unique=True)


@given(NAMES)
def test_first_round_pairs_every_node_once_sorted_and_leaves_at_most_one_out(nodes):
    pairs, odd = first_round(nodes)
    flat = [n for p in pairs for n in p] + odd
    assert sorted(flat) == sorted(nodes) and len(flat) == len(set(flat))
    assert len(odd) == len(nodes) % 2
    assert flat == sorted(nodes)  # deterministic: the sorted names, in order
    assert first_round(list(reversed(nodes))) == (pairs, odd)


@given(NAMES, st.data())
def test_second_round_gives_each_suspect_a_new_partner_at_most_once(nodes, data):
    pairs, _ = first_round(nodes)
    failed = data.draw(st.lists(st.sampled_from(pairs), unique=True)) if pairs else []
    suspects = {n for p in failed for n in p}
    good = {n for p in pairs if p not in failed for n in p}
    tried = {frozenset(p) for p in pairs}
    again = second_round(suspects, good, tried)
    flat = [n for p in again for n in p]
    assert len(flat) == len(set(flat))  # at most one pair per node in a round
    assert all(frozenset(p) not in tried for p in again)  # always a different partner
    assert all(set(p) & suspects for p in again) and set(flat) <= suspects | good
    assert second_round(set(suspects), set(good), set(tried)) == again
    # A suspect left without a partner had no untried free one: none was wasted.
    if len(good) >= len(suspects):
        assert suspects <= set(flat)


def _rounds_with_bad(nodes, bad):
    """The rounds against a fleet where a pair fails exactly when it holds a bad node."""
    def run_pairs(pairs):
        return {",".join(p): SmokeResult(",".join(p), "1", passed=not (set(p) & bad),
                                         problem="busbw=17.8GB/s (want >= 50)" if set(p) & bad else "")
                for p in pairs}
    return run_rounds(nodes, run_pairs)


@given(st.lists(st.from_regex(r"gpu[0-9]{2}", fullmatch=True), min_size=4, max_size=20, unique=True), st.data())
def test_one_bad_node_fails_alone_and_never_its_partner(nodes, data):
    bad = data.draw(st.sampled_from(sorted(nodes)))
    verdicts = decide(nodes, _rounds_with_bad(nodes, {bad}))
    _, odd = first_round(nodes)
    for node, verdict in verdicts.items():
        if node == bad:
            assert verdict.verdict == (UNPAIRED if node in odd else FAIL), verdicts
        else:
            assert verdict.verdict in (PASS, UNPAIRED), verdicts


def test_the_rule_two_different_partners_fail_the_node_one_failed_and_one_passed_pass_it():
    runs = [PairRun(("a", "b"), 1, False, "", "busbw=17.86GB/s (want >= 50)"), PairRun(("c", "d"), 1, True, ""),
            PairRun(("a", "c"), 2, False, "", "nccl error: x"), PairRun(("b", "d"), 2, True, "")]
    verdicts = decide("abcd", runs)
    assert (verdicts["a"].verdict, verdicts["a"].partner, verdicts["a"].problem) == (FAIL, "c", "nccl error: x")
    assert [verdicts[n].verdict for n in "bcd"] == [PASS] * 3
    assert verdicts["b"].partner == "d"


def test_a_pair_nobody_can_tell_apart_fails_both_and_an_odd_one_out_is_no_failure():
    runs = _rounds_with_bad(["gpu01", "gpu02", "gpu03"], {"gpu02"})
    assert [(r.nodes, r.round) for r in runs] == [(("gpu01", "gpu02"), 1)]  # no second partner: one round
    verdicts = decide(["gpu01", "gpu02", "gpu03"], runs)
    assert [verdicts[n].verdict for n in ("gpu01", "gpu02")] == [FAIL, FAIL]
    assert (verdicts["gpu03"].verdict, verdicts["gpu03"].problem) == (UNPAIRED, ODD_ONE_OUT)


def test_a_node_retried_after_failing_its_pairs_is_not_resumed_alone():
    assert decide(["gpu02"], [], {"gpu02"})["gpu02"].problem == NOT_REPROVEN
    assert decide(["gpu02"], [])["gpu02"].verdict == UNPAIRED
    passed_again = decide(["gpu01", "gpu02"], [PairRun(("gpu01", "gpu02"), 1, True, "")], {"gpu02"})
    assert passed_again["gpu02"].verdict == PASS


def test_a_site_fault_in_round_one_runs_no_second_round():
    def run_pairs(pairs):
        return {",".join(p): SmokeResult(",".join(p), "1", problem="cannot run: exit 127", site="exit 127")
                for p in pairs}
    runs = run_rounds(["gpu01", "gpu02", "gpu03", "gpu04"], run_pairs)
    assert [r.round for r in runs] == [1, 1] and all(r.site for r in runs)


# Real lines: dash (/bin/sh, what sbatch --wrap runs) and bash on this
# machine for a missing and a non-executable program.
DASH_MISSING = "sh: 1: exec: /opt/nccl-tests/build/all_reduce_perf: not found\n"
BASH_MISSING = "bash: /opt/nccl-tests/build/all_reduce_perf: No such file or directory\n"
DASH_NOEXEC = "sh: 1: exec: /tmp/noexec-perf: Permission denied\n"
# The smoke job's output on the test cluster (sbatch --wrap, slurmd's spool).
SLURM_MISSING = ("/tmp/pytest-of-root/pytest-285/test_a_smoke_command_that_cann0/c0/spool/gpu01/job00001/"
                 "slurm_script: 4: exec: /tmp/pytest-of-root/pytest-285/test_a_smoke_command_that_cann0/"
                 "no-nccl-tests/all_reduce_perf: not found\n")


@pytest.mark.parametrize("text, code, site", [
    (DASH_MISSING, 127, True),
    (SLURM_MISSING, 127, True),
    (BASH_MISSING, 127, True),
    (DASH_NOEXEC, 126, True),
    ("", 127, True),
    (BASH_MISSING, 1, True),  # a launcher's own exit code, with the shell's words
    ("", 1, False),  # no words for it: the node's failure path as before
    ("", 0, False),
])
def test_a_command_that_cannot_run_is_the_sites(text, code, site):
    assert bool(cannot_run(parse_nccl_tests(text), code, text)) is site


def test_the_site_fault_keeps_the_end_of_the_line():
    said = cannot_run(parse_nccl_tests(SLURM_MISSING), 127, SLURM_MISSING)
    assert said.startswith("exit 127: ..") and said.endswith("no-nccl-tests/all_reduce_perf: not found")
    assert len(said) == 80


@pytest.mark.parametrize("sample, code", [("nccl-abort", 1), ("healthy", 0), ("pcie-degraded", 0),
                                          ("pair-slow", 0), ("nccl-abort", 127)])
def test_a_run_that_started_is_the_nodes_whatever_it_printed_or_exited(sample, code):
    with open(os.path.join(DATA, sample + ".txt")) as handle:
        text = handle.read()
    # A "No such file" among NCCL's own lines of a run that got going is no site fault either.
    text += BASH_MISSING
    assert cannot_run(parse_nccl_tests(text), code, text) == ""


@given(st.text(max_size=300), st.one_of(st.none(), st.integers(-64, 255)))
def test_cannot_run_is_short_and_total(text, code):
    said = cannot_run(parse_nccl_tests(text), code, text)
    assert len(said) <= 80
    assert not said or code in (126, 127) or code


def test_the_pair_run_replays_the_worse_node_of_the_job(tmp_path):
    """The simulated all_reduce_perf of a pair's first node, run as Slurm
    runs a 2-node batch script, plays the worse 2-node recording of the two."""
    import subprocess

    from conftest import DEMO_BASELINE, gpugate_cmd

    fleet = str(tmp_path / "fleet")
    assert gpugate_cmd("sim", "init", fleet, "--nodes", "gpu[01-03]", "--baseline", DEMO_BASELINE).returncode == 0
    assert gpugate_cmd("sim", "set", fleet, "gpu02", "smoke=pair-abort").returncode == 0
    tool = os.path.join(fleet, "gpu01", "bin", "all_reduce_perf")

    def play(nodelist=None, count="2"):
        env = {"PATH": "/usr/bin:/bin"}
        if nodelist:
            env.update(SLURM_JOB_NUM_NODES=count, SLURM_JOB_NODELIST=nodelist)
        proc = subprocess.run([tool, "-b", "1G", "-e", "8G", "-f", "2", "-g", "1"], capture_output=True, text=True,
                              env=env, timeout=30)
        return proc.returncode, parse_nccl_tests(proc.stdout)

    def recording(name):
        with open(os.path.join(DATA, name + ".txt")) as handle:
            return parse_nccl_tests(handle.read())

    assert play() == (0, recording("healthy"))  # the single-node job: pair-* leaves it healthy
    assert play("gpu[01-02]") == (1, recording("nccl-abort"))
    assert play("gpu01,gpu03") == (0, recording("pair-healthy"))
    assert play("gpu[01,03]") == (0, recording("pair-healthy"))
    assert play("gpu[01-02]", count="1") == (0, recording("healthy"))
    assert gpugate_cmd("sim", "set", fleet, "gpu03", "smoke=pair-slow").returncode == 0
    code, run = play("gpu[01,03]")
    assert (code, run.avg_busbw_gbps) == (0, 17.8617)
    assert gpugate_cmd("sim", "set", fleet, "gpu03", "smoke=pair-fast").returncode != 0


def _node(name, state="IDLE", flags=(), reason="", partitions=("gpu",)):
    from gpugate.slurm.nodestate.record import NodeState

    return NodeState(name, state, frozenset(flags), reason, None, "", tuple(partitions))


def test_an_in_service_partner_is_idle_flagless_in_the_same_partition_and_outside_the_batch():
    from gpugate.sweep.partner import pick, still_free

    states = {"gpu01": _node("gpu01", flags=("DRAIN",), reason="gpugate: x"),
              "gpu02": _node("gpu02", state="ALLOCATED"), "gpu03": _node("gpu03", flags=("RESERVED",)),
              "gpu04": _node("gpu04", partitions=("cpu",)), "gpu05": _node("gpu05", reason="admin: hold"),
              "gpu06": _node("gpu06"), "gpu07": _node("gpu07")}
    assert pick(states, "gpu01", ["gpu01"]) == "gpu06"
    assert pick(states, "gpu01", ["gpu06"]) == "gpu07"
    assert pick(states, "gpu01", ["gpu06", "gpu07"]) is None
    assert pick(states, "gpu99", []) is None
    assert still_free(_node("gpu06", flags=("MAINTENANCE", "RESERVED")))
    assert not still_free(_node("gpu06", state="MIXED", flags=("MAINTENANCE", "RESERVED")))
    assert not still_free(None)


def test_the_odd_one_out_pairs_with_the_lent_partner_who_is_never_judged_nor_reused():
    lent = []

    def partner_for(odd):
        lent.append(odd)
        return "gpu09"
    runs = run_rounds(["gpu01", "gpu02", "gpu03"], lambda pairs: {
        ",".join(p): SmokeResult(",".join(p), "1", passed="gpu02" not in p, problem="" if "gpu02" not in p else "x")
        for p in pairs}, partner_for)
    assert lent == ["gpu03"]
    assert [(r.nodes, r.round, r.passed) for r in runs] == [(("gpu01", "gpu02"), 1, False),
                                                            (("gpu03", "gpu09"), 1, True),
                                                            (("gpu01", "gpu03"), 2, True)]
    verdicts = decide(["gpu01", "gpu02", "gpu03"], runs)
    assert "gpu09" not in verdicts
    assert [verdicts[n].verdict for n in ("gpu01", "gpu02", "gpu03")] == [PASS, FAIL, PASS]


class _Slurm:
    """Slurm's answers for the lender: node states (before and after the
    update) and the reservation's nodes; records the updates."""

    def __init__(self, after="IDLE", fail_update=False):
        self.after, self.fail_update, self.updates = after, fail_update, []

    def reservations(self):
        return {"gpugate_sweep_r1_b1": "gpu01"}

    def nodes(self, names=None):
        states = {"gpu01": _node("gpu01", flags=("MAINTENANCE", "RESERVED")), "gpu02": _node("gpu02")}
        if self.updates:
            states["gpu02"] = _node("gpu02", state=self.after, flags=("MAINTENANCE", "RESERVED"))
        return {n: s for n, s in states.items() if names is None or n == names}

    def update_reservation(self, name, nodes):
        from gpugate.errors import SlurmError

        self.updates.append(nodes)
        if self.fail_update and len(self.updates) == 1:
            raise SlurmError("scontrol: error: Requested nodes are busy")


@pytest.mark.parametrize("after, fail_update, partner, updates", [
    ("IDLE", False, "gpu02", ["gpu[01-02]", "gpu01"]),
    ("ALLOCATED", False, None, ["gpu[01-02]", "gpu01"]),  # took a job in between: given back at once
    ("IDLE", True, None, ["gpu[01-02]", "gpu01"]),  # refused: set back all the same
])
def test_the_lender_gives_every_partner_back(after, fail_update, partner, updates):
    from gpugate.sweep.partner import Lender

    slurm = _Slurm(after, fail_update)
    lender = Lender(slurm, "gpugate_sweep_r1_b1", ["gpu01"])
    assert lender("gpu01") == partner
    lender.give_back()
    assert slurm.updates == updates
