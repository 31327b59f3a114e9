"""Node side: what slurmd runs (health check, prolog, epilog) and `gpugate check`."""
