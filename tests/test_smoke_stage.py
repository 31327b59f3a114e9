"""The smoke stage's pure parts: the command template, the reason's finding,
`scontrol show job --oneliner` read back (the real stage runs in
test_slurm_smoke.py)."""

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpugate.model import reason as reasons
from gpugate.model.findings import RMA
from gpugate.judges.smoke import judge_smoke
from gpugate.parsers.nccl import parse_nccl_tests
from gpugate.slurm.jobs import GONE, parse_show_job
from gpugate.judges.smoke import template
from gpugate.sweep.smoke import finding

DATA = os.path.join(os.path.dirname(__file__), os.pardir, "gpugate", "data", "smoke")
ARGV = ["/opt/nccl-tests/build/all_reduce_perf", "-b", "1G", "-e", "8G", "-f", "2", "-g", "{gpus}"]
# Captured from the test cluster (Slurm 24.11, `scontrol show job --oneliner ID`):
# a job that exited 0, and one scancel'ed while running.
SHOW_COMPLETED = (
    "JobId=1 JobName=gpugate-smoke UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901759 Nice=0 "
    "Account=(null) QOS=(null) JobState=COMPLETED Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 "
    "Reboot=0 ExitCode=0:0 RunTime=00:00:01 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-25T05:46:53 "
    "EligibleTime=2026-11-25T05:46:53 AccrueTime=2026-11-25T05:46:53 StartTime=2026-11-25T05:46:53 "
    "EndTime=2026-11-25T05:46:54 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-25T05:46:53 "
    "Scheduler=Main Partition=gpu AllocNode:Sid=localhost:10608 ReqNodeList=gpu01 ExcNodeList=(null) NodeList=gpu01 "
    "BatchHost=gpu01 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 "
    "Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 "
    "Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) "
    "Command=(null) WorkDir=/work/wt-smoke/tests StdErr=/tmp/cap-ov59uu5g/log/j-1.out StdIn=/dev/null "
    "StdOut=/tmp/cap-ov59uu5g/log/j-1.out Power=\n")
SHOW_CANCELLED = (
    "JobId=2 JobName=gpugate-smoke UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901758 Nice=0 "
    "Account=(null) QOS=(null) JobState=CANCELLED Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 "
    "Reboot=0 ExitCode=0:15 RunTime=00:00:05 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-25T05:46:59 "
    "EligibleTime=2026-11-25T05:46:59 AccrueTime=2026-11-25T05:46:59 StartTime=2026-11-25T05:46:59 "
    "EndTime=2026-11-25T05:47:04 Deadline=N/A SuspendTime=None SecsPreSuspend=0 LastSchedEval=2026-11-25T05:46:59 "
    "Scheduler=Main Partition=gpu AllocNode:Sid=localhost:10608 ReqNodeList=gpu01 ExcNodeList=(null) NodeList=gpu01 "
    "BatchHost=gpu01 NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 "
    "Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 "
    "Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) "
    "Command=(null) WorkDir=/work/wt-smoke/tests StdErr=/tmp/cap-ov59uu5g/log/j-2.out StdIn=/dev/null "
    "StdOut=/tmp/cap-ov59uu5g/log/j-2.out Power=\n")


def test_template_fills_gpus_and_node():
    assert template(ARGV, "gpu07", 8)[-2:] == ["-g", "8"]
    assert template(["/fleet/{node}/bin/all_reduce_perf"], "gpu07", 8) == ["/fleet/gpu07/bin/all_reduce_perf"]


def test_an_unknown_gpu_count_leaves_the_tools_default_not_a_none():
    out = template(ARGV, "gpu07", None)
    assert "-g" not in out and "None" not in " ".join(out) and out[:2] == ARGV[:2]
    assert template(["--gres=gpu:{gpus}"], "gpu07", None) == []


@pytest.mark.parametrize("sample, want, reason", [
    ("pcie-degraded", 350.0, "gpugate: rma smoke=all_reduce busbw=22.9GB/s (want >= 350)"),
    ("nccl-abort", 350.0, None),
])
def test_the_reason_names_the_failed_proof(sample, want, reason):
    with open(os.path.join(DATA, sample + ".txt")) as handle:
        verdict = judge_smoke(parse_nccl_tests(handle.read()), 1 if sample == "nccl-abort" else 0, False, want)
    assert not verdict.passed
    text = reasons.render("gpugate:", RMA, [finding(verdict.problem)])
    if reason:
        assert text == reason
    assert text.startswith("gpugate: rma smoke=all_reduce ")
    parsed = reasons.parse(text, "gpugate:")
    assert parsed is not None and parsed.cls == RMA and parsed.findings[0].component == "smoke"


def test_the_healthy_recording_passes_at_350():
    with open(os.path.join(DATA, "healthy.txt")) as handle:
        assert judge_smoke(parse_nccl_tests(handle.read()), 0, False, 350.0).passed


@given(st.text(max_size=200))
def test_any_problem_text_gives_a_reason_gpugate_reads_back(problem):
    text = reasons.render("gpugate:", RMA, [finding(problem)])
    parsed = reasons.parse(text, "gpugate:")
    assert parsed is not None and parsed.cls == RMA


def test_show_job_states_and_exit_codes():
    done = parse_show_job(SHOW_COMPLETED)["1"]
    assert (done.state, done.exit_code, done.signal, done.ended) == ("COMPLETED", 0, 0, True)
    cancelled = parse_show_job(SHOW_CANCELLED)["2"]
    assert (cancelled.state, cancelled.signal, cancelled.ended) == ("CANCELLED", 15, True)
    assert parse_show_job("") == {}
    assert parse_show_job(SHOW_COMPLETED.replace("JobState=COMPLETED", "JobState=RUNNING"))["1"].ended is False
    assert GONE not in parse_show_job(SHOW_COMPLETED)


def test_a_huge_output_is_read_by_its_head_and_tail(tmp_path, monkeypatch):
    from gpugate.sweep import smoke_output

    monkeypatch.setattr(smoke_output, "MAX_OUTPUT", 4096)
    monkeypatch.setattr(smoke_output, "HEAD", 1024)
    with open(os.path.join(DATA, "healthy.txt")) as handle:
        result = handle.read()
    path = tmp_path / "out"
    path.write_text("# nThread 1 nGpus 4\n" + "gpu01:1:1 [0] NCCL INFO chatter\n" * 5000 + result)
    text = smoke_output._read_bounded(str(path))
    assert text.startswith("# nThread 1") and text.endswith(result) and len(text) < 6000
    assert judge_smoke(parse_nccl_tests(text), 0, False, 350.0).passed


def test_sim_smoke_key_replays_the_recorded_runs_and_refuses_others():
    from gpugate.errors import ConfigError
    from gpugate.sim import keys
    from gpugate.sim import outputs

    model = {"smoke": "healthy"}
    keys.apply(model, "smoke", "pcie-degraded")
    entry = outputs.smoke_replay(model["smoke"])
    with open(os.path.join(DATA, "pcie-degraded.txt")) as handle:
        assert entry == {"stdout": handle.read(), "rc": 0}
    assert outputs.smoke_replay("hang") == {"hang": True}
    assert outputs.smoke_replay("nccl-abort")["rc"] == 1
    with pytest.raises(ConfigError):
        keys.apply(model, "smoke", "fast")
    assert model["smoke"] == "pcie-degraded"
