"""A simulated node's GPUs as NVIDIA's DRA driver publishes them: one
ResourceSlice (tests/fixtures/dra-resourceslice-nvidia-h100x8.json's
shape), each device carrying the UUID and PCI address of the simulated
GPU its minor belongs to, named by its /dev/nvidia minor (not NVML's
order), owned by the Node as the driver's are."""

import copy
import json
import os

from gpugate.kube import dra
from gpugate.kube.client import node_path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "dra-resourceslice-nvidia-h100x8.json")
# The driver's minor numbers in NVML's (PCI) order: gpu index i is device gpu-MINOR[i].
MINOR = (2, 0, 3, 1, 6, 4, 7, 5)
DEVICE_CLASS = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"},
                "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com'"}}]}}


def publish_slice(admin, fleet_dir: str, node: str) -> dict:
    """Create the Node ``node``'s ResourceSlice for the simulated fleet in ``fleet_dir``."""
    from gpugate.sim import fleet as simfleet

    gpus = simfleet.load(fleet_dir, node)["nvml"]["gpus"]
    with open(FIXTURE) as handle:
        item = json.load(handle)
    template = item["spec"]["devices"][0]
    devices = []
    for index, gpu in enumerate(gpus):
        device = copy.deepcopy(template)
        device["name"] = "gpu-%d" % MINOR[index]
        device["attributes"]["uuid"] = {"string": gpu["uuid"]}
        device["attributes"]["pcieBusID"] = {"string": gpu["pci_bus_id"][4:].lower()}  # the driver's 4-digit domain
        devices.append(device)
    uid = admin.get(node_path(node))["metadata"]["uid"]
    item["metadata"] = {"name": "%s-gpu.nvidia.com-x1" % node,
                        "ownerReferences": [dict(item["metadata"]["ownerReferences"][0], name=node, uid=uid)]}
    item["spec"].update(nodeName=node, pool={"name": node, "generation": 1, "resourceSliceCount": 1},
                        devices=sorted(devices, key=lambda d: d["name"]))
    return admin.create(dra.SLICES, item)
