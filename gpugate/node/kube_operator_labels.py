"""What a Kubernetes GPU operator says about this node, read from the API
server (bounded, one connection): the labels on the node's own Node (one
GET, for gpugate.judges.operator) and, where the baseline pins the
operator's images, the images of its pods on this node (one list in the
operator's namespace, by spec.nodeName, for gpugate.judges.operator_images).
A Slurm node has none.  A read that fails is said (the judges make it a
probe finding where the baseline requires it), never taken for agreement."""

from __future__ import annotations

from gpugate.errors import GpugateError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Optional, Tuple


class View:
    """labels / images: None when not read; *_error: why a read failed."""

    def __init__(self):
        self.labels: Optional[Dict[str, str]] = None
        self.label_error = ""
        self.images: Optional[List[Tuple[str, str]]] = None
        self.image_error = ""


def share(budget: float) -> float:
    """The seconds the reads may take of a run's budget: a tenth, at most 5 s."""
    return min(5.0, float(budget) * 0.1)


def read(settings, node: str, baseline=None, deadline: Optional[float] = None) -> View:
    """deadline (time.monotonic()): every request ends by then (gpugate.kube.client)."""
    view = View()
    if getattr(settings, "scheduler", "slurm") not in ("kubernetes", "slurm+kubernetes"):
        return view
    from gpugate.judges.operator_images import pins_for
    from gpugate.kube.nodes import connect
    from gpugate.kube.paired import node_name

    name = node_name(settings, node)  # Slurm on Kubernetes: the Node that runs this Slurm node
    try:
        backend = connect(settings, deadline=deadline, timeout=5.0)
    except GpugateError as exc:
        view.label_error = view.image_error = str(exc)
        return view
    try:
        try:
            if backend.own_record(name) is None:
                view.label_error = "no Node named %s" % name
            else:
                labels = (backend.node_object(name).get("metadata") or {}).get("labels") or {}
                view.labels = {str(k): str(v) for k, v in labels.items()}
        except GpugateError as exc:
            view.label_error = str(exc)
        if baseline is not None and pins_for(baseline, node):
            try:
                view.images = _images(backend.client, settings, baseline.vendor_for(node), name)
            except GpugateError as exc:
                view.image_error = str(exc)
    finally:
        backend.close()
    return view


def _images(client, settings, vendor: str, name: str) -> List[Tuple[str, str]]:
    """(pod, image) of every container of the operator's pods bound to the Node."""
    kube = settings.kubernetes
    namespace = str(kube.get("operator_namespace_amd" if vendor == "amd" else "operator_namespace") or "")
    out = []
    for pod in client.list_pages("/api/v1/namespaces/%s/pods" % namespace, fieldSelector="spec.nodeName=" + name):
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue  # ended (a validator's run): not what the node runs
        for container in list(spec.get("initContainers") or []) + list(spec.get("containers") or []):
            if isinstance(container, dict) and isinstance(container.get("image"), str):
                out.append((str(meta.get("name", "?")), container["image"]))
    return out
