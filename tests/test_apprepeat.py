"""A GPU's own history (gpugate.judges.apprepeat, gpugate.node.xidhistory):
the application's Xids repeating on one GPU across different jobs become a
finding naming the count and the jobs; one job's burst does not; the
record stays bounded."""

import json
import os

from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import gpugate_cmd
from gpugate.baseline import parse_baseline
from gpugate.facts import NodeFacts, XidEvent
from gpugate.findings import is_acute
from gpugate.judges import apprepeat
from test_node_side import node_env, run_entry  # noqa: F401  (the fixture)

POLICY = parse_baseline({"pin": {"driver": "1"}}, "b").health
BUS = "0000:3a:00"


def _facts(*xids, bus=BUS):
    events = tuple(XidEvent(xid=x, pci_bus_id=bus, text="pid=1, name=python3") for x in xids)
    return NodeFacts(node="n", mode="epilog", collected_at=0.0, xids=events)


def _replay(jobs, policy=POLICY, step=600.0):
    """jobs: [(job id, [xids])], one epilog each, step seconds apart -> findings after each."""
    history, seen = None, []
    for i, (job, xids) in enumerate(jobs):
        history = apprepeat.record(history, _facts(*xids), job, i * step, policy)
        seen.append(apprepeat.judge(history, _facts(), i * step, policy))
    return seen, history


def test_one_jobs_burst_never_drains():
    seen, _ = _replay([("101", [13] * 40), ("101", [31, 43])])
    assert seen == [[], []]


def test_repeating_across_jobs_is_a_budgeted_finding_naming_the_jobs():
    seen, _ = _replay([("101", [13]), ("102", [13, 13]), ("103", [31])])
    assert seen[:2] == [[], []]
    (finding,) = seen[2]
    assert (finding.cls, finding.component, finding.observed, finding.expected) == (
        "health", "xid_repeat", "xid 13+31 in 3 jobs", "< 3 jobs within 24h")
    assert "jobs 101, 102, 103" in finding.detail and BUS in finding.detail
    assert not finding.acute and not is_acute("health", "xid_repeat")


def test_other_xids_other_gpus_and_old_entries_do_not_count():
    seen, _ = _replay([("101", [79]), ("102", [13]), ("103", [48])])
    assert seen[2] == []
    seen, _ = _replay([("101", [13]), ("102", [13]), ("103", [13])], step=50000.0)  # a day apart
    assert seen[2] == []
    history = None
    for i, bus in enumerate(("0000:18:00", "0000:2a:00", "0000:3a:00")):
        history = apprepeat.record(history, _facts(13, bus=bus), str(i), 0.0, POLICY)
    assert apprepeat.judge(history, _facts(), 0.0, POLICY) == []


def test_off_and_job_less_runs_record_nothing():
    off = parse_baseline({"pin": {"driver": "1"}, "health": {"xid_app_jobs_max": 0}}, "b").health
    assert _replay([("101", [13]), ("102", [13]), ("103", [13])], policy=off)[0][2] == []
    assert apprepeat.record(None, _facts(13), "", 0.0, POLICY) == {"gpus": {}}


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10 ** 6), st.lists(st.sampled_from([13, 31, 43, 94]), max_size=5),
                          st.sampled_from(["0000:18:00", "0000:2a:00", "0000:3a:00"])), max_size=200))
def test_the_record_stays_bounded(runs):
    history = None
    for i, (job, xids, bus) in enumerate(runs):
        history = apprepeat.record(history, _facts(*xids, bus=bus), str(job), float(i), POLICY)
    for entries in (history or {"gpus": {}})["gpus"].values():
        assert 0 < len(entries) <= apprepeat.MAX_ENTRIES
    assert len(json.dumps(history)) < 64 * 1024


def _log(env):
    with open(os.path.join(env["state"], "gpu01", "gpugate.log")) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def test_epilogs_of_different_jobs_build_the_history_and_the_health_check_keeps_it(node_env):  # noqa: F811
    fleet = node_env["fleet"]
    for job in ("101", "102", "103"):
        assert run_entry("prolog", node_env, extra_env={"SLURM_JOB_ID": job}).returncode == 0
        gpugate_cmd("sim", "set", fleet, "gpu01", "gpu.2.xid=13", check=True)
        run_entry("epilog", node_env, extra_env={"SLURM_JOB_ID": job})
    last = _log(node_env)[-1]
    assert last["mode"] == "epilog" and last["verdict"] == "unfit", last
    assert "xid_repeat:gpu2=xid 13 in 3 jobs (want < 3 jobs within 24h)" in last["reason"]
    result = run_entry("healthcheck", node_env)
    assert "xid_repeat:gpu2" in _log(node_env)[-1]["reason"], result.stderr


def test_a_crash_loop_in_one_job_drains_nothing(node_env):  # noqa: F811
    fleet = node_env["fleet"]
    assert run_entry("prolog", node_env, extra_env={"SLURM_JOB_ID": "7"}).returncode == 0
    gpugate_cmd("sim", "set", fleet, "gpu01", *(["gpu.2.xid=13"] * 5), check=True)
    assert run_entry("epilog", node_env, extra_env={"SLURM_JOB_ID": "7"}).returncode == 0
    assert _log(node_env)[-1]["verdict"] == "fit"
