"""Node side: what slurmd runs (health check, prolog, epilog) and `gpugate check`.

May import: the layers below it (core .. preflight); never the sweep, the
keeper or the fleet views."""
