"""What slurmd tells the prolog and epilog about the job: its GPUs."""

import os


MAX_GPUS = 64  # more GPU indices than any node has: an index past it is not a GPU


def job_gpus(env=None):
    """The job's GPUs as host indices (slurmd sets these for the prolog/epilog),
    or None: check every GPU.  Anything but a list of indices 0..MAX_GPUS-1
    ("", ",", "-1", "1,,2", UUIDs, MIG names) is passed over, then None: a
    value that selects no GPU must never mean "check none" (an index past
    the node's count is checked against it where the GPUs are read,
    gpugate.vendors.nvidia.nvmlread)."""
    env = os.environ if env is None else env
    for key in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS"):
        value = env.get(key)
        if value:
            parts = [x.strip() for x in value.split(",")]
            if all(x.isdigit() and x.isascii() and int(x) < MAX_GPUS for x in parts):
                return sorted({int(x) for x in parts})
            # UUIDs, MIG names or junk: the next variable, else every GPU
    return None
