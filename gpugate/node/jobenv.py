"""What slurmd tells the prolog and epilog about the job: its GPUs."""

import os


def job_gpus(env=None):
    """The job's GPUs as host indices (slurmd sets these for the prolog/epilog),
    or None: check every GPU."""
    env = os.environ if env is None else env
    for key in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS"):
        value = env.get(key)
        if value:
            try:
                return sorted({int(x) for x in value.split(",") if x.strip()})
            except ValueError:
                continue  # UUIDs or MIG names: check every GPU
    return None
