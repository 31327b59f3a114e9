"""A job's user cannot take capacity through the preflight across nodes
(docs/explanation/reliability.md, "Can a job's user cause it?"): as uid 65534 on the
real rig (a real slurmctld and five slurmd with GPU GRES, the simulated
nodes' recorded all_reduce_perf), the two attacks that drained a healthy
node before, and the keeper's bound on pins.

1. An earlier job of the user fills gpu03's /dev/shm (a real tmpfs on the
   node's /dev/shm, filled by uid 65534); NCCL then aborts there (the
   recorded abort).  Before: gpu03 failed every group and was pinned,
   drained acute.  Now: gpu03's environment fails before it joins, the run
   across the nodes does not run, nothing is drained, the job runs.
2. The user's own CPU-only job shares gpu03 (``--exclusive=user``) and
   saturates its link (the recorded slow pair run).  Before: pinned.  Now:
   the node is not the job's alone in Slurm's view (its slurmstepd in the
   node's process table; 23.02+ also SLURM_JOB_OVERSUBSCRIBE=USER):
   undecided, nothing drained.
3. A real slow node is still pinned, now budgeted: published, drained by
   the keeper, and a second pin in the same hour waits on
   ``[preflight] pins_per_hour``."""

import os
import subprocess

import pytest
from test_slurm_preflight_across import preflight_across

# slow: real jobs of 4 nodes (minutes); CI runs it on 22.05, as test_slurm_preflight_across.py.
pytestmark = [pytest.mark.slurm, pytest.mark.slow]
# Two CPUs a node: the user's CPU-only job fits beside their preflighted job (--exclusive=user).
CLUSTER = {"nodes": 5, "interval": 600, "gpus": 8, "cpus": 2, "extra": "[drain_budget]\nmax_share = 0.5\n"}
NOBODY = 65534


def _open_path(path):
    """Let uid 65534 through every folder above ``path`` (search only, no
    listing), as a node's / lets a user reach /dev/shm and Slurm's
    configuration; the modes are put back after."""
    changed = []
    folder = os.path.dirname(path)
    while folder not in ("/", ""):
        mode = os.stat(folder).st_mode & 0o7777
        if not mode & 0o001:
            os.chmod(folder, mode | 0o001)
            changed.append((folder, mode))
        folder = os.path.dirname(folder)
    return changed


@pytest.fixture(scope="module")
def rig(cluster):
    preflight_across(cluster, "shm_free_mb = 64\ntmp_free_mb = 0\n")
    changed = _open_path(cluster.path("munge", "munge.sock")) + _open_path(cluster.path("fleet", "x"))
    for path in (cluster.conf, cluster.path("gres.conf")):
        if os.path.exists(path):
            os.chmod(path, os.stat(path).st_mode | 0o004)
    yield cluster
    for folder, mode in reversed(changed):
        os.chmod(folder, mode)


def _as_user(cluster, argv, timeout=30, ok=(0,)):
    """``argv`` as uid 65534, with nothing of root's."""
    result = subprocess.run(["/usr/bin/setpriv", "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups",
                             "--"] + argv, env=dict(cluster.env, HOME="/"), cwd="/", stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode in ok, (argv, result.stderr)
    return result.stdout


def _submit(cluster, *args):
    return _as_user(cluster, ["/usr/bin/sbatch", "--parsable", "--gres=gpu:8", "--comment", "gpugate-preflight",
                              "-o", "/dev/null", "--chdir", "/"] + list(args) + ["--wrap", "srun true"]
                    ).strip().split(";")[0]


def _records(cluster, job, node):
    return [r for r in cluster.log_records(node) if r.get("mode") == "prolog" and r.get("job") == job]


def _none_drained(cluster):
    return [n for n in cluster.nodes if "drain" in cluster.state(n)]


def test_a_dev_shm_the_user_filled_drains_nothing(rig):
    shm = os.path.join(rig.fleet, "gpu03", "root", "dev", "shm")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=32m,mode=1777", "tmpfs", shm], check=True, timeout=30)
    try:
        # dd stops at "No space left on device" (exit 1), as a job's write would.
        _as_user(rig, ["/usr/bin/dd", "if=/dev/zero", "of=%s/nccl-leftover" % shm, "bs=1M", "count=40"],
                 timeout=60, ok=(0, 1))
        assert os.stat(os.path.join(shm, "nccl-leftover")).st_uid == NOBODY
        # The run through gpu03 is slow (as a job's leftovers and load make it): without the environment
        # check gpu03 would be pinned for busbw; NCCL itself aborts there, which pins nobody either way.
        rig.sim("set", "FLEET", "gpu03", "smoke=pair-slow")
        job = _submit(rig, "--exclusive", "-N4", "-w", "gpu[01-04]")
        info = rig.wait_job_ended(job, 180)
        assert info["JobState"] == "COMPLETED" and info["Restarts"] == "0", info
        assert _none_drained(rig) == []
        mine = _records(rig, job, "gpu03")[-1]["preflight"]
        assert any(u.startswith("environment: /dev/shm has 0 MiB free (want 64") for u in mine["undecided"]), mine
        first = _records(rig, job, "gpu01")[-1]["preflight"]["across"]
        assert first["why"].startswith("not run: gpu03's environment is not fit") and not first["culprits"], first
    finally:
        subprocess.run(["umount", shm], timeout=30)
        rig.sim("set", "FLEET", "gpu03", "smoke=healthy")


def test_the_user_s_own_job_beside_the_preflight_drains_nothing(rig):
    cpu = _as_user(rig, ["/usr/bin/sbatch", "--parsable", "--exclusive=user", "-w", "gpu03", "-n1", "-c1", "-o",
                         "/dev/null", "--chdir", "/", "--wrap", "sleep 300"]).strip().split(";")[0]
    try:
        rig.wait_for(lambda: rig.job(cpu).get("JobState") == "RUNNING", 60, "the CPU job runs on gpu03")
        # The node's process table shows that job's slurmstepd, as a real node's does (the rig's
        # slurmstepds run in this machine's /proc, beside every other node's).
        rig.sim("set", "FLEET", "gpu03", "slurm.jobs=%s" % cpu, "smoke=pair-slow")
        job = _submit(rig, "--exclusive=user", "-N4", "-n4", "-c1", "-w", "gpu[01-04]")
        info = rig.wait_job_ended(job, 180)
        assert info["JobState"] == "COMPLETED" and info["Restarts"] == "0", info
        assert _none_drained(rig) == []
        mine = _records(rig, job, "gpu03")[-1]["preflight"]
        from gpugate.testbed.procs import slurm_version

        # 23.02+: slurmd says the job shares the node (26.05 in SLURM_JOB_EXCLUSIVE); 22.05 says nothing, and
        # the node's process table shows the other job's slurmstepd.
        said = ("SLURM_JOB_EXCLUSIVE=USER" if slurm_version() >= (26, 5) else "SLURM_JOB_OVERSUBSCRIBE=USER"
                if slurm_version() >= (23, 2) else "job %s runs on the node too" % cpu)
        assert any(u.startswith("environment: ") and said in u for u in mine["undecided"]), (said, mine)
    finally:
        rig.run(["/usr/bin/scancel", cpu], check=False)
        rig.sim("set", "FLEET", "gpu03", "slurm.jobs=none", "smoke=healthy")


def test_a_slow_node_is_pinned_within_the_budget_and_the_hour_s_allowance(rig):
    import json
    import sys

    def keeper():
        out = rig.run([sys.executable, "-m", "gpugate", "budget", "--config", rig.gpugate_conf, "--json"],
                      check=False, timeout=60)
        assert "Traceback" not in out.stderr, out.stderr
        return json.loads(out.stdout)

    rig.sim("set", "FLEET", "gpu04", "smoke=pair-slow")
    job = _submit(rig, "--exclusive", "-N4")  # Slurm takes gpu[01-04]; requeued, any four but a drained gpu04
    rig.wait_for(lambda: any(r["preflight"].get("across", {}).get("culprit") for r in _records(rig, job, "gpu04")
                             if "preflight" in r), 150, "gpu04 pinned")
    assert "drain" not in rig.state("gpu04")  # budgeted: published, the keeper drains it
    assert "preflight_across=busbw=17." in rig.scontrol("show", "node", "gpu04")
    figures = keeper()
    assert figures["drained"] == ["gpu04"], figures
    assert rig.reason("gpu04").startswith("gpugate: health preflight_across=busbw=17.")
    info = rig.wait_job_ended(job, 240)
    assert info["JobState"] == "COMPLETED" and "gpu04" not in info["NodeList"], info
    # A second pin within the hour waits: at most [preflight] pins_per_hour (1) a partition.
    rig.sim("set", "FLEET", "gpu05", "smoke=pair-slow")
    job = _submit(rig, "--exclusive", "-N4", "-w", "gpu[01-03],gpu05")
    rig.wait_for(lambda: any(r["preflight"].get("across", {}).get("culprit") for r in _records(rig, job, "gpu05")
                             if "preflight" in r), 150, "gpu05 pinned")
    figures = keeper()
    if not figures["fleet_reads"]:  # decided on the last run's re-read (once, as its timer would): read now
        figures = keeper()
    assert figures["drained"] == [] and "gpu05" in figures["held_nodes"], figures
    assert figures["held_nodes"]["gpu05"].startswith("preflight allowance of partition ")
    assert "drain" not in rig.state("gpu05")
    rig.run(["/usr/bin/scancel", job], check=False)
