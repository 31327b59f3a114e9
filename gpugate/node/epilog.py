"""Epilog: after the job.  Xids raised during the job, ECC and remap deltas,
GPUs still held by leftover processes, and the DCGM diagnostic when the
policy asks for it (the GPUs are free now).  Drain with the reason when unfit."""

import os

from ..judges.job import deltas
from ..probes import files
from . import state as st
from .act import act
from .check import run_check
from .entry import job_gpus
from .reuse import fresh_baseline, last_state


def run(settings, node: str, record: dict) -> int:
    job_id = os.environ.get("SLURM_JOB_ID", "")
    record["job"] = job_id
    boot_id = files.boot_id(settings.node_root(node))
    baseline, cursor = fresh_baseline(settings, node, last_state(settings, node), boot_id)
    if baseline is None:
        from ..config import load_checked_baseline

        baseline = load_checked_baseline(settings)
    job_file = st.job_path(settings.state_dir(node), job_id) if job_id else None
    job = st.read_json(job_file) if job_file else None
    if job and job.get("boot_id") == boot_id and isinstance(job.get("kmsg_seq"), int):
        cursor = job["kmsg_seq"]  # Xids since this job started
    gpus = job_gpus()
    start = (job or {}).get("counters", {})
    result = run_check(settings, baseline, node, "epilog", xid_after=cursor, gpus=gpus,
                       processes=gpus is not None,  # other GPUs may belong to other jobs
                       extra=lambda facts: deltas(start, facts))
    verdict, facts = result.verdict, result.facts
    if job_file:
        try:
            os.unlink(job_file)
        except OSError:
            pass
    record.update(verdict="fit" if verdict.fit else "unfit", cls=verdict.cls, reason=verdict.reason,
                  durations={k: round(v, 4) for k, v in facts.durations.items()})
    if verdict.fit:
        return 0
    outcome = act(settings, node, verdict)
    record["action"] = outcome["action"]
    if not outcome["ok"]:
        # Exit non-zero: slurmd then drains the node ("Epilog error"): never lose a drain.
        record["slurm_error"] = outcome.get("error")
        return 1
    return 0
