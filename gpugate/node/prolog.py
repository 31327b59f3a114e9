"""Prolog: the fast gate before every job.

Healthy path: reuse the last health check (when fresh), re-read only what
can change between runs and matters to this job (NVML answers, GPU count,
Xid/ECC/remap of the job's GPUs), record the job's start counters for the
epilog, exit 0.  No controller RPC.  Unfit: drain with the precise reason,
then exit 1 so Slurm requeues the job."""

import os
import time

from ..judges.job import start_counters
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
    record["reused"] = baseline is not None
    if baseline is None:
        from ..config import load_checked_baseline

        baseline = load_checked_baseline(settings)
    gpus = job_gpus()
    result = run_check(settings, baseline, node, "prolog", xid_after=cursor, gpus=gpus)
    facts, verdict = result.facts, result.verdict
    if job_id:
        try:
            st.write_json(st.job_path(settings.state_dir(node), job_id), {
                "job": job_id, "at": time.time(), "boot_id": boot_id if isinstance(boot_id, str) else None,
                "kmsg_seq": facts.kernel_log_seq, "gpus": gpus, "counters": start_counters(facts)},
                durable=False)  # losing it in a crash only loses the epilog's deltas
        except OSError as exc:
            record["state_error"] = str(exc)[:200]
    record.update(verdict="fit" if verdict.fit else "unfit", cls=verdict.cls, reason=verdict.reason,
                  durations={k: round(v, 4) for k, v in facts.durations.items()})
    if verdict.fit:
        return 0
    outcome = act(settings, node, verdict)
    record["action"] = outcome["action"]
    if not outcome["ok"]:
        # Slurm drains the node itself ("Prolog error") on our non-zero exit.
        record["slurm_error"] = outcome.get("error")
    return 1
