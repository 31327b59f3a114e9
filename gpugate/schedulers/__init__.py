"""The scheduler seam: gpugate.schedulers.registry connects the adapter a
gpugate.toml names (Slurm: gpugate.slurm; Kubernetes: gpugate.kube; Slurm
on Kubernetes: gpugate.kube.paired), all with one interface
(gpugate.schedulers.interface), so the node agent, the keeper and the sweep
are written once above it.  A new scheduler is its adapter plus one line in
the registry, plus, where the scheduler needs steps of its own above the
seam, modules named for it in the layer that runs them (node/kube_agent.py,
sweep/kube_sweeper.py, keeper/kube_lead.py): tests/test_scheduler_seam.py
fails on any other module above the seam importing an adapter.  May
import: the layers below it (core .. judges) and the adapters."""
