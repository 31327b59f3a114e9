"""A GPU's own history (gpugate.judges.apprepeat, gpugate.node.xidhistory):
the application's Xids repeating on one GPU across jobs of different users
become a finding naming the count and the jobs; one job's burst, one user's
jobs, one Xid seen by several jobs' epilogs do not; the record stays
bounded by jobs (issue 33, item 1)."""

import json
import os
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import gpugate_cmd
from gpugate.model.baseline import parse_baseline
from gpugate.model.facts import NodeFacts, XidEvent
from gpugate.model.findings import is_acute
from gpugate.judges import apprepeat
from test_node_side import node_env, run_entry  # noqa: F401  (the fixture)

POLICY = parse_baseline({"pin": {"driver": "1"}}, "b").health
BUS = "0000:3a:00"
BUSES = {0: "0000:18:00", 1: "0000:2a:00", 2: "0000:3a:00", 3: "0000:5d:00"}
_SEQ = [0]


def _facts(*xids, bus=BUS, gpu=2, seq=None):
    events = []
    for x in xids:
        _SEQ[0] += 1
        events.append(XidEvent(xid=x, pci_bus_id=bus, text="pid=1, name=python3", gpu=gpu,
                               seq=_SEQ[0] if seq is None else seq, timestamp=1.7e9))
    return NodeFacts(node="n", mode="epilog", collected_at=0.0, xids=tuple(events))


def _replay(jobs, policy=POLICY, step=600.0):
    """jobs: [(job id, [xids]) or (job id, [xids], user)], one epilog each
    on GPU 2, step seconds apart -> findings after each.  Each job its own
    user unless named."""
    history, seen = None, []
    for i, job in enumerate(jobs):
        user = job[2] if len(job) > 2 else "u" + job[0]
        history = apprepeat.record(history, _facts(*job[1]), job[0], user, [2], i * step, policy)
        seen.append(apprepeat.judge(history, _facts(), i * step, policy))
    return seen, history


def test_one_jobs_burst_never_drains():
    seen, _ = _replay([("101", [13] * 40), ("101", [31, 43])])
    assert seen == [[], []]


def test_repeating_across_jobs_of_different_users_is_a_budgeted_finding_naming_the_jobs():
    seen, _ = _replay([("101", [13]), ("102", [13, 13]), ("103", [31])])
    assert seen[:2] == [[], []]
    (finding,) = seen[2]
    assert (finding.cls, finding.component, finding.observed, finding.expected) == (
        "health", "xid_repeat", "xids in >=3 jobs", "< 3 jobs within 24h")
    assert finding.detail.startswith("xid 13+31 in 3 jobs on GPU ")  # which and how many: the detail's
    assert "jobs 101, 102, 103 of users u101, u102, u103" in finding.detail and BUS in finding.detail
    assert not finding.acute and not is_acute("health", "xid_repeat")


def test_other_xids_other_gpus_and_old_entries_do_not_count():
    seen, _ = _replay([("101", [79]), ("102", [13]), ("103", [48])])
    assert seen[2] == []
    seen, _ = _replay([("101", [13]), ("102", [13]), ("103", [13])], step=50000.0)  # a day apart
    assert seen[2] == []
    history = None
    for i, bus in enumerate(("0000:18:00", "0000:2a:00", "0000:3a:00")):
        history = apprepeat.record(history, _facts(13, bus=bus, gpu=i), str(i), "u%d" % i, [i], 0.0, POLICY)
    assert apprepeat.judge(history, _facts(), 0.0, POLICY) == []


def test_off_and_job_less_runs_record_nothing():
    off = parse_baseline({"pin": {"driver": "1"}, "health": {"xid_app_jobs_max": 0}}, "b").health
    assert _replay([("101", [13]), ("102", [13]), ("103", [13])], policy=off)[0][2] == []
    assert apprepeat.record(None, _facts(13), "", "1", [2], 0.0, POLICY) == {"gpus": {}}
    # slurmd did not say which GPUs the job held: its Xids may be another job's.
    assert apprepeat.record(None, _facts(13), "7", "1", None, 0.0, POLICY) == {"gpus": {}}


def test_attack_one_xid_counts_once_for_the_job_whose_gpu_it_was_on():
    """Four overlapping jobs on GPUs 0, 1, 3 and 2, one Xid 31 on GPU 2:
    each epilog sees it since its prolog; only the job on GPU 2 records it,
    once (before: 'xid 31 in 3 jobs', then 'in 4 jobs')."""
    event = _facts(31, seq=77)  # the same kernel-log record, read by every epilog
    history = None
    for i, (job, gpu) in enumerate((("201", 0), ("202", 1), ("203", 3), ("204", 2))):
        history = apprepeat.record(history, event, job, "u" + job, [gpu], float(i), POLICY)
        assert apprepeat.judge(history, _facts(), float(i), POLICY) == []
    assert list(history["gpus"]) == [BUS] and list(history["gpus"][BUS]["jobs"]) == ["204"]
    # Two jobs sharing the GPU (sharding): the record still counts once.
    history = apprepeat.record(history, event, "205", "u205", [2], 5.0, POLICY)
    assert list(history["gpus"][BUS]["jobs"]) == ["204"]


def test_attack_one_users_jobs_are_the_application():
    """Three jobs as uid 65534, each raising one Xid 31 on the same GPU: one
    user's application, not the GPU (before: drained, then rma)."""
    seen, _ = _replay([("301", [31], "65534"), ("302", [31], "65534"), ("303", [31], "65534"),
                       ("304", [31], "65534")])
    assert seen == [[], [], [], []]
    # A second user on the same GPU makes it the place's.
    seen, _ = _replay([("301", [31], "65534"), ("302", [31], "65534"), ("303", [13], "1001")])
    assert [f.detail.partition(" on GPU")[0] for f in seen[2]] == ["xid 13+31 in 3 jobs"]


def test_a_user_whose_faults_follow_them_across_gpus_is_set_aside_and_said_so():
    """Issue 44, item 6: set aside only where other users' jobs on those
    GPUs show none; where they do, that user's job counts there like
    anyone's (before: set aside for the whole window, and GPU 2's three
    jobs of three users were no finding)."""
    history = None
    runs = (("401", "500", 0, [13]), ("402", "500", 2, [13]),  # 500's faults follow them: GPUs 0 and 2
            ("403", "501", 0, []), ("404", "502", 2, []),  # other users' jobs on those GPUs ran clean
            ("405", "501", 3, [31]), ("406", "502", 3, [31]), ("407", "503", 3, [43]))
    for i, (job, user, gpu, xids) in enumerate(runs):
        history = apprepeat.record(history, _facts(*xids, bus=BUSES[gpu], gpu=gpu), job, user, [gpu], float(i),
                                   POLICY)
    (finding,) = apprepeat.judge(history, _facts(), 9.0, POLICY)  # GPU 3's; 500's two jobs do not count
    assert finding.detail.startswith("xid 31+43 in 3 jobs on GPU 0000:5d:00: jobs 405, 406, 407 of users 501, ")
    assert "not counted, the application's (their Xids follow them across GPUs no other user's jobs show any " \
           "on): user 500 on 0000:18:00, 0000:3a:00" in finding.detail
    assert apprepeat.standing(history, 9.0, POLICY) == ["0000:5d:00"]
    # Two other users' jobs show faults on GPU 2 too: 500's job there counts.
    for i, (job, user) in enumerate((("410", "504"), ("411", "505"))):
        history = apprepeat.record(history, _facts(13), job, user, [2], 10.0 + i, POLICY)
    found = apprepeat.judge(history, _facts(), 12.0, POLICY)
    assert [f.detail.partition(" (")[0] for f in found] == [
        "xid 13 in 3 jobs on GPU 0000:3a:00: jobs 402, 410, 411 of users 500, 504, 505",
        "xid 31+43 in 3 jobs on GPU 0000:5d:00: jobs 405, 406, 407 of users 501, 502, 503"]
    assert not any("not counted" in f.detail for f in found)


def test_attack_a_crash_loop_cannot_push_other_jobs_out():
    """Jobs A and B with one Xid 13 each, then job C with 60 (before: only
    the last 50 events per GPU were kept: job C's, and no finding)."""
    seen, history = _replay([("A", [13]), ("B", [13]), ("C", [13] * 60)])
    assert [f.detail.partition(" on GPU")[0] for f in seen[2]] == ["xid 13 in 3 jobs"]
    assert history["gpus"][BUS]["jobs"]["C"][2:] == [[13], 60]
    # One user's flood of short jobs keeps at most the limit's worth of them.
    seen, history = _replay([("A", [13]), ("B", [13])] + [("F%d" % i, [13], "65534") for i in range(100)])
    assert {"A", "B"} <= set(history["gpus"][BUS]["jobs"]) and len(history["gpus"][BUS]["jobs"]) == 5


def test_clear_and_marks():
    _, history = _replay([("101", [13]), ("102", [13]), ("103", [31])])
    assert apprepeat.standing(history, 1200.0, POLICY) == [BUS]
    marked = apprepeat.mark_drained(history, [BUS], 1300.0)
    assert apprepeat.marked(marked) == {BUS: 1300.0}
    assert apprepeat.standing(apprepeat.clear(marked, [BUS]), 1300.0, POLICY) == []
    assert apprepeat.marked(apprepeat.clear(marked, [BUS])) == {}
    kept = apprepeat.clear(marked, [BUS], before=700.0)  # only the entries after 700 s stay
    assert sorted(kept["gpus"][BUS]["jobs"]) == ["103"]
    assert apprepeat.clear(marked, ["0000:18:00"]) == marked


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10 ** 6), st.integers(0, 5),
                          st.lists(st.sampled_from([13, 31, 43, 94]), max_size=70),
                          st.sampled_from([0, 1, 2])), max_size=200))
def test_the_record_stays_bounded(runs):
    history = None
    for i, (job, user, xids, gpu) in enumerate(runs):
        history = apprepeat.record(history, _facts(*xids, bus=BUSES[gpu], gpu=gpu), str(job), str(user), [gpu],
                                   float(i), POLICY)
    for gpu in (history or {"gpus": {}})["gpus"].values():
        assert 0 < len(gpu["jobs"]) <= apprepeat.MAX_JOBS and len(gpu["seen"]) <= apprepeat.MAX_SEEN
        users = [e[1] for e in gpu["jobs"].values()]
        assert all(users.count(u) <= POLICY.xid_app_jobs_max for u in users)
        assert all(len(e[2]) <= apprepeat.MAX_XIDS for e in gpu["jobs"].values())
    assert len(json.dumps(history)) < 64 * 1024


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ABCDEFGH"), st.sampled_from(["1", "2", "3"]),
                          st.integers(1, 60)), min_size=1, max_size=40))
def test_a_job_is_one_entry_however_many_xids(runs):
    """Whatever the order and the counts, each job is one entry, and the
    finding is a function of the jobs and users only."""
    history = None
    for i, (job, user, n) in enumerate(runs):
        history = apprepeat.record(history, _facts(*[13] * n), job, user + job, [2], float(i), POLICY)
    jobs = history["gpus"][BUS]["jobs"]
    assert set(jobs) == {job for job, _, _ in runs}
    found = apprepeat.judge(history, _facts(), float(len(runs)), POLICY)
    assert bool(found) == (len(jobs) >= POLICY.xid_app_jobs_max)


def _log(env):
    with open(os.path.join(env["state"], "gpu01", "gpugate.log")) as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _job(job, gpus="0,1,2,3,4,5,6,7", uid=None):
    return {"SLURM_JOB_ID": job, "SLURM_JOB_GPUS": gpus, "SLURM_JOB_UID": uid or str(1000 + int(job) % 100)}


def test_epilogs_of_different_jobs_build_the_history_and_the_health_check_keeps_it(node_env):  # noqa: F811
    fleet = node_env["fleet"]
    for job in ("101", "102", "103"):
        assert run_entry("prolog", node_env, extra_env=_job(job)).returncode == 0
        gpugate_cmd("sim", "set", fleet, "gpu01", "gpu.2.xid=13", check=True)
        run_entry("epilog", node_env, extra_env=_job(job))
    last = _log(node_env)[-1]
    assert last["mode"] == "epilog" and last["verdict"] == "unfit", last
    assert "xid_repeat:gpu2=xids in >=3 jobs (want < 3 jobs within 24h)" in last["reason"]
    result = run_entry("healthcheck", node_env)
    assert "xid_repeat:gpu2" in _log(node_env)[-1]["reason"], result.stderr


def test_a_crash_loop_in_one_job_drains_nothing(node_env):  # noqa: F811
    fleet = node_env["fleet"]
    assert run_entry("prolog", node_env, extra_env=_job("7")).returncode == 0
    gpugate_cmd("sim", "set", fleet, "gpu01", *(["gpu.2.xid=13"] * 5), check=True)
    assert run_entry("epilog", node_env, extra_env=_job("7")).returncode == 0
    assert _log(node_env)[-1]["verdict"] == "fit"


def test_attack_overlapping_jobs_on_other_gpus_do_not_count_one_xid(node_env):  # noqa: F811
    """Four overlapping jobs on GPUs 0, 1, 3 and 2 of one node, one Xid 31
    on GPU 2: before, the third epilog logged 'xid 31 in 3 jobs', the
    fourth 'in 4 jobs'.  Now it counts once, for the job on GPU 2."""
    fleet = node_env["fleet"]
    jobs = (("201", "0"), ("202", "1"), ("203", "3"), ("204", "2"))
    for job, gpu in jobs:
        assert run_entry("prolog", node_env, extra_env=_job(job, gpu)).returncode == 0
    gpugate_cmd("sim", "set", fleet, "gpu01", "gpu.2.xid=31", check=True)
    for job, gpu in jobs:
        run_entry("epilog", node_env, extra_env=_job(job, gpu))
        assert "xid_repeat" not in (_log(node_env)[-1].get("reason") or ""), (job, _log(node_env)[-1])
    with open(os.path.join(node_env["state"], "gpu01", "xid-history.json")) as handle:
        gpus = json.load(handle)["gpus"]
    assert [list(g["jobs"]) for g in gpus.values()] == [["204"]]


def test_attack_one_user_raising_xids_in_three_jobs_drains_nothing(node_env):  # noqa: F811
    """Three short jobs as uid 65534, each raising one Xid 31 on the same
    GPU: before, published, drained and escalated to rma."""
    fleet = node_env["fleet"]
    for job in ("301", "302", "303"):
        assert run_entry("prolog", node_env, extra_env=_job(job, "2", uid="65534")).returncode == 0
        gpugate_cmd("sim", "set", fleet, "gpu01", "gpu.2.xid=31", check=True)
        assert run_entry("epilog", node_env, extra_env=_job(job, "2", uid="65534")).returncode == 0
        assert _log(node_env)[-1]["verdict"] == "fit", _log(node_env)[-1]
    run_entry("healthcheck", node_env)
    assert "xid_repeat" not in (_log(node_env)[-1].get("reason") or "")


def test_amdgpu_vm_faults_are_the_applications_per_job_and_gpu(tmp_path):
    """amdgpu's VM page faults (gpugate.vendors.amd.parse_kernlog) go to the same
    record: a job's own GPU only, jobs of different users on one GPU."""
    from conftest import ROOT

    mixed = os.path.join(ROOT, "slurm_conf", "baseline.mixed.example.toml")
    fleet = str(tmp_path / "fleet")
    assert gpugate_cmd("sim", "init", fleet, "--nodes", "mi001", "--baseline", mixed).returncode == 0
    config = tmp_path / "gpugate.toml"
    config.write_text('baseline = "%s"\nstate_dir = "%s/state/{node}"\nlog = "file"\n[healthcheck]\n'
                      'boot_grace_seconds = 0\n[sim]\nfleet = "%s"\n[slurm]\nbin_dir = "%s/no-slurm"\n'
                      % (mixed, tmp_path, fleet, tmp_path))
    env = {"config": str(config), "state": str(tmp_path / "state")}
    for job, gpus in (("801", "0,1"), ("802", "2"), ("803", "2"), ("804", "2,3")):
        assert run_entry("prolog", env, "mi001", _job(job, gpus)).returncode == 0
        gpugate_cmd("sim", "set", fleet, "mi001", "amd.gpu2.log=vm_fault", check=True)
        run_entry("epilog", env, "mi001", _job(job, gpus))
    with open(os.path.join(env["state"], "mi001", "gpugate.log")) as handle:
        last = json.loads(handle.read().splitlines()[-1])
    assert "xid_repeat:gpu2=vm_faults in >=3 jobs (want < 3 jobs within 24h)" in (last.get("reason") or ""), last
    with open(os.path.join(env["state"], "mi001", "xid-history.json")) as handle:
        (gpu,) = json.load(handle)["gpus"].values()
    assert sorted(gpu["jobs"]) == ["802", "803", "804"]  # job 801 held GPUs 0 and 1
    # The sweep's verification runs RVS; its pass clears the record.
    answer = json.loads(gpugate_cmd("check", "--config", str(config), "--node", "mi001", "--mode", "verify",
                                    "--json").stdout)
    assert answer["fit"] and answer["xid_history"].startswith("rvs -r 2 passed"), answer.get("reason")
    run_entry("healthcheck", env, "mi001")
    with open(os.path.join(env["state"], "mi001", "gpugate.log")) as handle:
        assert "xid_repeat" not in (json.loads(handle.read().splitlines()[-1]).get("reason") or "")
