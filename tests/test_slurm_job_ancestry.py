"""Issue 33, item 4 on a real slurmd: the testbed tracks jobs with
ProctrackType=proctrack/linuxproc (no job cgroups), as the sites the
ancestry walk is for.  A running job's process is told by the slurmstepd
above it: Slurm's own title ("slurmstepd: [N.batch]") on every release CI
runs, read through the epilog's probe."""

import os
import time

import pytest

from gpugate.judges.leftover import leftovers
from gpugate.parsers.proctree import step_job
from gpugate.probes import owners
from test_slurm_jobs import submit

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
CLUSTER = {"nodes": 1, "interval": 600}
MARK = "97.3141"  # the job's sleep, found by its argument


def _pids_of(argv):
    out = []
    for name in (n for n in os.listdir("/proc") if n.isdigit()):
        try:
            with open("/proc/%s/cmdline" % name, "rb") as handle:
                if handle.read(4096).split(b"\0")[:2] == argv:
                    out.append(int(name))
        except OSError:
            continue
    return out


def test_a_running_jobs_process_is_its_job_by_its_slurmstepd(cluster):
    job = submit(cluster, "-w", "gpu01", "--wrap", "sleep %s" % MARK)
    deadline = time.monotonic() + 60
    while not _pids_of([b"sleep", MARK.encode()]) and time.monotonic() < deadline:
        time.sleep(0.2)
    pids = _pids_of([b"sleep", MARK.encode()])
    try:
        assert len(pids) == 1, "the job's sleep did not start"
        got = owners.read("/", pids, int(job) + 1)  # the epilog of another job, ending beside it
        assert (got.processes[0].job, got.processes[0].running) == (int(job), True), got
        assert leftovers(pids, got) == ((), None)
        stepds = [p for p in (int(n) for n in os.listdir("/proc") if n.isdigit())
                  if _cmdline(p).startswith(b"slurmstepd: [%s." % job.encode())]
        assert stepds and all(step_job(_cmdline(p)) == int(job) for p in stepds)
    finally:
        cluster.run(["/usr/bin/scancel", job], check=False)


def _cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return handle.read(4096)
    except OSError:
        return b""
