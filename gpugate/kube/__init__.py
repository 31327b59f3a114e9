"""Kubernetes GPU nodes under the same gate (docs/explanation/kubernetes.md).

The node side judges a Kubernetes node exactly as a Slurm node; only the
writer differs.  gpugate.kube.nodes is a scheduler backend with the Slurm
backends' interface (own_record, drain, undrain, set_comment, nodes), so
the ownership rules (gpugate.model.ownership), the budgeted publish
(gpugate.node.hold) and the budget keeper (gpugate.keeper.run) run unchanged:
a drain is a taint, a cordon and an ownership annotation; the reason is
gpugate's reason grammar in that annotation and in the node condition
GpugateHealthy.  gpugate.kube.client is the HTTP client (http.client and
TLS only: see docs/explanation/kubernetes.md for why not the official client).

May import: the layers below the schedulers (core .. judges) and
gpugate.slurm; never the node agent, the keeper or the sweep (their
Kubernetes parts live with them: gpugate.node.kube_agent,
gpugate.sweep.kube_sweeper, gpugate.keeper.kube_lead)."""
