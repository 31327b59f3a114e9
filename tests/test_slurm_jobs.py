"""Prolog and epilog run by slurmd around real jobs."""

import sys

import pytest

pytestmark = pytest.mark.slurm
# A long interval: the health check runs once at slurmd start, then the
# prolog has a fresh verdict to reuse and faults appear "after" it.
CLUSTER = {"nodes": 4, "interval": 600}


def submit(cluster, *args):
    out = cluster.run(["/usr/bin/sbatch", "--parsable", "-o", cluster.path("log", "job-%j.out")] + list(args)).stdout
    return out.strip().split(";")[0]


def job_field(cluster, job, field):
    for token in cluster.scontrol("show", "job", job).split():
        if token.startswith(field + "="):
            return token.split("=", 1)[1]
    return ""


def wait_job_done(cluster, job, timeout=90):
    cluster.wait_for(lambda: job_field(cluster, job, "JobState") in ("COMPLETED", "FAILED", "CANCELLED"),
                     timeout, "job %s to end" % job)
    return job_field(cluster, job, "JobState")


def test_healthy_job_runs_and_prolog_makes_no_controller_call(cluster):
    calls_before = len(cluster.slurm_calls())
    job = submit(cluster, "-w", "gpu04", "--wrap", "true")
    assert wait_job_done(cluster, job) == "COMPLETED"
    prologs = [r for r in cluster.log_records("gpu04") if r["mode"] == "prolog" and r.get("job") == job]
    assert prologs and prologs[0]["verdict"] == "fit" and prologs[0]["reused"] is True
    epilogs = [r for r in cluster.log_records("gpu04") if r["mode"] == "epilog" and r.get("job") == job]
    assert epilogs and epilogs[0]["verdict"] == "fit"
    assert cluster.slurm_calls()[calls_before:] == []


def test_node_bad_after_health_check_prolog_drains_job_requeued_elsewhere(cluster):
    # Fresh health verdicts exist; gpu01 goes bad afterwards.
    assert all(r["verdict"] == "fit" for r in cluster.log_records("gpu01") if r["mode"] == "healthcheck")
    cluster.sim("set", "FLEET", "gpu01", "gpu.2.ecc.uncorrected.volatile=3")
    job = submit(cluster, "-x", "gpu[03-04]", "--wrap", "hostname")
    # Slurm holds a requeued job for cred_expire (10 s on the rig) and then
    # leaves it to the backfill scheduler's next pass (every 30 s): once it
    # is requeued and waits for that begin time, start it now.
    ended = ("COMPLETED", "FAILED", "CANCELLED")
    cluster.wait_for(lambda: job_field(cluster, job, "Reason") == "BeginTime"
                     or job_field(cluster, job, "JobState") in ended, 60, "job %s requeued" % job)
    cluster.scontrol("update", "JobId=" + job, "StartTime=now", check=False)
    assert wait_job_done(cluster, job) == "COMPLETED"
    assert job_field(cluster, job, "NodeList") == "gpu02"
    assert int(job_field(cluster, job, "Restarts")) >= 1  # requeued
    assert "drain" in cluster.state("gpu01")
    assert cluster.reason("gpu01") == "gpugate: health ecc:gpu2=3 uncorrected (want <= 0)"
    prolog = [r for r in cluster.log_records("gpu01") if r["mode"] == "prolog"][-1]
    assert prolog["verdict"] == "unfit" and prolog["action"] == "drain" and prolog["reused"] is True


def test_epilog_catches_an_xid_raised_during_the_job(cluster):
    script = "#!/bin/sh\n%s -m gpugate sim set %s gpu03 gpu.5.xid=79\n" % (sys.executable, cluster.fleet)
    path = cluster.path("xid-job.sh")
    with open(path, "w") as handle:
        handle.write(script)
    job = submit(cluster, "-w", "gpu03", path)
    assert wait_job_done(cluster, job) == "COMPLETED"
    cluster.wait_for(lambda: "drain" in cluster.state("gpu03"), 30, "gpu03 drained by the epilog")
    assert cluster.reason("gpu03") == "gpugate: health xid:gpu5=79 (want none)"
    epilog = cluster.records_when("gpu03", lambda r: r["mode"] == "epilog" and r.get("job") == job)[-1]
    assert epilog["verdict"] == "unfit" and epilog["action"] == "drain"
    # The prolog of that job had been fit: the Xid came during the job.
    prolog = [r for r in cluster.log_records("gpu03") if r["mode"] == "prolog" and r.get("job") == job][-1]
    assert prolog["verdict"] == "fit"
