"""Which Pods on a node use given DRA devices: the ResourceClaims each Pod
names (``status.resourceClaimStatuses``, or ``spec.resourceClaims`` by
name) and the devices the scheduler allocated them
(``status.allocation.devices.results``).  The sweep's repair of one held
GPU waits until no Pod uses it (gpugate.sweep.kube_gpu_repair); the Pods
on the node's other GPUs stay."""

from __future__ import annotations

from urllib.parse import quote

from gpugate.kube.client import KubeError
from gpugate.kube.evict import label_of, pods_on

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable, List, Set, Tuple

CLAIMS = "/apis/resource.k8s.io/v1/namespaces/%s/resourceclaims/%s"


def claim_names(pod: dict) -> List[str]:
    """The ResourceClaims a Pod uses, by name (generated ones from its status)."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    names = [s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or () if isinstance(s, dict)]
    names += [c.get("resourceClaimName") for c in spec.get("resourceClaims") or () if isinstance(c, dict)]
    return sorted({n for n in names if isinstance(n, str) and n})


def allocated(claim: dict) -> Set[Tuple[str, str, str]]:
    """(driver, pool, device) of each device allocated to a claim."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or ()
    return {(r.get("driver"), r.get("pool"), r.get("device")) for r in results if isinstance(r, dict)}


def using(client, node: str, devices: Iterable[Tuple[str, str, str]]) -> List[str]:
    """namespace/name of the Pods on ``node``, not ended, whose claims were
    allocated one of ``devices`` (a Pod leaving is still there)."""
    wanted, found = set(devices), []
    for pod in pods_on(client, node):
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        namespace = str((pod.get("metadata") or {}).get("namespace") or "")
        for name in claim_names(pod):
            try:
                claim = client.get(CLAIMS % (quote(namespace, safe=""), quote(name, safe="")))
            except KubeError as exc:
                if exc.status == 404:
                    continue  # deleted with its Pod
                raise
            if allocated(claim) & wanted:
                found.append(label_of(pod))
                break
    return sorted(found)
