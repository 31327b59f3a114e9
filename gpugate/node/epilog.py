"""Epilog: after the job.  Xids raised during the job, ECC and remap deltas,
GPUs still held by leftover processes, and the DCGM diagnostic when the
policy asks for it (the GPUs are free now).  Drain with the reason when unfit."""

import os
import time

from gpugate.judges.job import deltas
from gpugate.probes import files
from gpugate.safety import state as st
from gpugate.node import xidhistory
from gpugate.node.act import settle
from gpugate.node.check import run_check
from gpugate.node.jobenv import job_gpus
from gpugate.probes.reuse import fresh_baseline, last_state, reset_cursor


def run(settings, node: str, record: dict) -> int:
    deadline = time.monotonic() + float(settings.budgets["epilog"])
    job_id = os.environ.get("SLURM_JOB_ID", "")
    record["job"] = job_id
    boot_id = files.boot_id(settings.node_root(node))
    baseline, cursor = fresh_baseline(settings, node, last_state(settings, node), boot_id)
    if baseline is None:
        from gpugate.node.lastgood import load_baseline

        baseline = load_baseline(settings, record, node)
    job_file = st.job_path(settings.state_dir(node), job_id) if job_id else None
    job = st.read_json(job_file) if job_file else None
    own = bool(job and job.get("boot_id") == boot_id and isinstance(job.get("kmsg_seq"), int))
    if own:
        cursor = job["kmsg_seq"]  # Xids since this job started
    cursor = max(cursor, reset_cursor(settings, node, boot_id))  # not the sweep's own GPU reset again
    gpus = job_gpus()
    start = (job or {}).get("counters", {})

    def during_job(facts):
        # The GPUs' history of application Xids records only this job's own
        # (since its prolog, on its own GPUs, with its user): Xids since the
        # last health check, or on other GPUs, may be another job's.
        return deltas(start, facts) + xidhistory.after_job(
            settings, node, facts, job_id if own else "", os.environ.get("SLURM_JOB_UID", ""), gpus,
            baseline.health, record)

    result = run_check(settings, baseline, node, "epilog", xid_after=cursor, gpus=gpus,
                       processes=gpus is not None,  # other GPUs may belong to other jobs
                       job=job_id,  # and other jobs' processes on its GPUs (gpugate.probes.owners)
                       extra=during_job)
    if job_file:
        try:
            os.unlink(job_file)
        except OSError:
            pass
    # Drained with our reason: exit 0.  If Slurm did not take the drain, exit
    # non-zero so slurmd drains the node itself ("Epilog error"): never lose a drain.
    return 0 if settle(settings, node, result, record, deadline) else 1
