"""The scheduler seam: gpugate.schedulers.registry connects the adapter a
gpugate.toml names (Slurm: gpugate.slurm; Kubernetes: gpugate.kube; Slurm
on Kubernetes: gpugate.kube.paired), all with one interface
(gpugate.schedulers.interface), so the node agent, the keeper and the sweep
are written once above it.  A new scheduler is its adapter plus one line in
the registry.  May import: the layers below it (core .. judges) and the
adapters."""
