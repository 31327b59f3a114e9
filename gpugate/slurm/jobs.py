"""Batch jobs gpugate submits itself (the sweep's smoke job): what to
submit, and the job states read back.  The backend sends them (commands:
sbatch, scontrol show job, scancel; pyslurm: its job calls), each under
the backend's deadline.  No sacct: a cluster without slurmdbd has none;
slurmctld answers for a job until MinJobAge after it ended."""

import os
import shlex
from typing import Dict, List, Optional

from gpugate.errors import SlurmError
from gpugate.core.record import dataclass

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
           extra: List[str] = (), partition: str = "") -> str:
    """Submit the command on whole nodes (``node``: one, or "a,b" for a
    pair) inside ``reservation``, in ``partition`` ("p1,p2": the nodes'
    own; "": Slurm's default): the job id.  The backend sends it (sbatch,
    or pyslurm's submit)."""
    if not reservation:
        raise SlurmError("refusing to submit %s to %s outside a reservation" % (name, node))
    spec = {"name": name, "reservation": reservation, "node": node, "minutes": max(1, minutes),
            "output": output, "extra": list(extra),
            # The batch script runs with /bin/sh on the node: quote every word.
            "wrap": "exec " + " ".join(shlex.quote(a) for a in argv)}
    if partition:
        spec["partition"] = partition
    return slurm.submit_job(spec)


def sbatch_argv(spec: dict) -> List[str]:
    """sbatch's arguments for a job submit() decided."""
    node = spec["node"]
    return ["--parsable", "--job-name=" + spec["name"], "--reservation=" + spec["reservation"],
            "--nodelist=" + node, "--nodes=%d" % len(node.split(",")), "--exclusive", "--time=%d" % spec["minutes"],
            "--output=" + spec["output"], "--open-mode=truncate", "--no-requeue",
            "--chdir=" + os.path.dirname(spec["output"])] + (
                ["--partition=" + spec["partition"]] if spec.get("partition") else []) + list(spec["extra"]) + [
                "--wrap", spec["wrap"]]


def parse_sbatch(out: str) -> str:
    """The job id `sbatch --parsable` printed ("123" or "123;cluster")."""
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
    """The state of each job (GONE: slurmctld no longer knows it)."""
    return slurm.job_states(list(jobs))


def cancel(slurm, jobs: List[str]) -> None:
    if jobs:
        slurm.cancel_job_ids(list(jobs))


def cancel_named(slurm, name: str, reservation: str) -> None:
    """Cancel every job of this name in the reservation (left by an interrupted sweeper)."""
    slurm.cancel_named(name, reservation)
