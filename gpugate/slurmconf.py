"""The slurm.conf fragment for this installation (`gpugate slurm-conf`)."""
