"""`python -m gpugate` = the `gpugate` command."""

from gpugate.cli.main import main

main(prog_name="gpugate")
