"""A real Slurm cluster on this machine, for the tests and `gpugate demo`.

Not part of the gate: only `gpugate demo` (cli/demo.py) and the tests import
it (tests/test_layout.py checks), and it imports the library, never the
other way round.

munged, one slurmctld and N ``slurmd -N gpuNN`` (Debian's multiple-slurmd
build) on loopback, everything under one directory: DIR/slurm.conf,
DIR/gpugate.toml, DIR/baseline.toml, the simulated fleet in DIR/fleet, state
in DIR/state/<node>.  slurmd runs gpugate's installed entry points through
small shims that name DIR/gpugate.toml (slurmd passes no arguments and no
environment).  Processes are stopped by the pids they wrote, nothing else.

cluster.py is the Cluster (start, stop, ask, wait); files.py writes the
rig's files (its slurm.conf, gpugate.toml, shims, RebootProgram); procs.py
has the process and port helpers.

May import: any layer below it; only the tests and `gpugate demo` import it."""

from gpugate.testbed.cluster import Cluster
from gpugate.testbed.files import node_names_from_conf, smoke_command, smoke_pair_command
from gpugate.testbed.procs import SBIN, ClusterError, free_ports, slurm_version

__all__ = ["Cluster", "ClusterError", "SBIN", "free_ports", "node_names_from_conf", "slurm_version", "smoke_command",
           "smoke_pair_command"]
