"""gpugate: keep a Slurm GPU fleet on one pinned baseline and out of service when it is not."""

__version__ = "0.1.0"
