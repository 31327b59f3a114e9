"""Batch jobs gpugate submits itself (the sweep's smoke job): sbatch,
scontrol show job, scancel.  Every call goes through CommandSlurm._run (a
deadline each, no shell).  No sacct: a cluster without slurmdbd has none;
`scontrol show job` answers until MinJobAge after the job ended."""

import os
import shlex
from typing import Dict, List, Optional

from ..errors import SlurmError
from ..record import dataclass

# Job states after which nothing more happens (squeue(1) JOB STATE CODES).
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
         "PREEMPTED", "SPECIAL_EXIT", "REVOKED"}
GONE = "GONE"  # slurmctld no longer knows the job (past MinJobAge, or never)


@dataclass(frozen=True)
class JobState:
    job: str
    state: str  # PENDING, RUNNING, COMPLETED, ..., or GONE
    exit_code: Optional[int] = None  # of the batch script, once ended
    signal: int = 0
    reason: str = ""

    @property
    def ended(self) -> bool:
        return self.state in ENDED or self.state == GONE


def submit(slurm, argv: List[str], node: str, reservation: str, minutes: int, output: str, name: str,
           extra: List[str] = ()) -> str:
    """sbatch the command on whole nodes (``node``: one, or "a,b" for a
    pair) inside ``reservation``: the job id."""
    if not reservation:
        raise SlurmError("refusing to submit %s to %s outside a reservation" % (name, node))
    args = ["--parsable", "--job-name=" + name, "--reservation=" + reservation, "--nodelist=" + node,
            "--nodes=%d" % len(node.split(",")), "--exclusive", "--time=%d" % max(1, minutes), "--output=" + output,
            "--open-mode=truncate", "--no-requeue", "--chdir=" + os.path.dirname(output)] + list(extra)
    # sbatch --wrap runs the text with /bin/sh on the node: quote every word.
    out = slurm._run("sbatch", args + ["--wrap", "exec " + " ".join(shlex.quote(a) for a in argv)])
    job = out.strip().split(";")[0]
    if not job.isdigit():
        raise SlurmError("sbatch answered %r, not a job id" % out.strip()[:80])
    return job


def parse_show_job(text: str) -> Dict[str, JobState]:
    """`scontrol show job --oneliner` output: job id -> state."""
    found = {}
    for line in text.splitlines():
        fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
        job = fields.get("JobId")
        if not job:
            continue
        code, _, sig = fields.get("ExitCode", "").partition(":")
        found[job] = JobState(job, fields.get("JobState", "UNKNOWN"),
                              int(code) if code.isdigit() else None, int(sig) if sig.isdigit() else 0,
                              fields.get("Reason", ""))
    return found


def show(slurm, jobs: List[str]) -> Dict[str, JobState]:
    """The state of each job (one call per job: `scontrol show job` takes one id)."""
    states = {}
    for job in jobs:
        try:
            out = slurm._run("scontrol", ["show", "job", "--oneliner", job])
        except SlurmError as exc:
            if "Invalid job id" in str(exc):
                states[job] = JobState(job, GONE)
                continue
            raise
        states[job] = parse_show_job(out).get(job, JobState(job, GONE))
    return states


def cancel(slurm, jobs: List[str]) -> None:
    if jobs:
        slurm._run("scancel", list(jobs))


def cancel_named(slurm, name: str, reservation: str) -> None:
    """Cancel every job of this name in the reservation (left by an interrupted sweeper)."""
    slurm._run("scancel", ["--name=" + name, "--reservation=" + reservation])
