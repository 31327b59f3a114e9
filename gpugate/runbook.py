"""The runbook step each finding calls for (`gpugate explain`)."""

from .findings import Finding

_BY_COMPONENT = {
    "module": [
        "drain the node (gpugate has) and wait for running jobs to finish",
        "systemctl stop nvidia-persistenced nvidia-fabricmanager nvidia-dcgm",
        "unload the modules in order: nvidia_uvm nvidia_drm nvidia_modeset nvidia (rmmod/modprobe -r)",
        "modprobe nvidia; modprobe nvidia_uvm; start the services again",
        "compare /proc/driver/nvidia/version with `modinfo -F version nvidia`: they must be equal",
        "run the DCGM diagnostic (gpugate check --mode verify); reboot if a module will not unload",
    ],
    "nvml": [
        "the loaded kernel module and the userspace driver differ (driver/library mismatch)",
        "drain, stop persistenced/fabricmanager/dcgm, reload the nvidia modules (see the module runbook) "
        "or reboot; then gpugate check --mode verify",
    ],
    "dkms": ["no nvidia module is built for the running kernel: run the converge (dkms autoinstall, or "
             "install the precompiled module package), then reboot and verify"],
    "fabricmanager": ["Fabric Manager must run, at the driver's exact version, on NVSwitch nodes: "
                      "install nvidia-fabricmanager-<branch> = driver version, systemctl restart "
                      "nvidia-fabricmanager, check its log (/var/log/fabricmanager.log)"],
    "xid": ["look the Xid up in NVIDIA's Xid catalog; reset the GPU (nvidia-smi -r -i N) or reboot as "
            "the action says; if it recurs after a reboot, open an RMA"],
    "row_remap": ["a pending row remap is applied by a GPU reset or reboot; a remap failure means the "
                  "GPU is out of spare rows: RMA"],
    "ecc": ["uncorrected ECC errors: reset the GPU or reboot, then run dcgmi diag -r 3; repeated "
            "errors on one GPU: RMA"],
    "gpu_count": ["a GPU is missing: check `lspci -d 10de:` and the kernel log for Xid 79; reboot; "
                  "if it stays missing: reseat or RMA"],
    "gpus_lost": ["the node shows fewer GPUs than it did before: check `lspci -d 10de:` and the kernel "
                  "log for Xid 79; reboot; if it stays missing: reseat or RMA"],
    "pci_gpus": ["fewer NVIDIA devices on the PCI bus than expected: reboot; then hardware check"],
    "pcie_width": ["the PCIe link trained narrower than the GPU supports: reseat the GPU or riser"],
    "pcie_gen": ["the PCIe link trained slower than the GPU supports: reseat the GPU or riser, check the "
                 "BIOS link-speed setting"],
    "pcie_max_gen": ["the GPU cannot reach the baseline's pcie_min_gen at all: the baseline's [health] "
                     "minimum does not fit this hardware; fix the baseline (or its nodeset)"],
    "pcie_max_width": ["the GPU cannot reach the baseline's pcie_min_width at all: the baseline's [health] "
                       "minimum does not fit this hardware; fix the baseline (or its nodeset)"],
    "recovery": ["NVML's recovery action asks for it: reset the GPU or reboot as it says"],
    "uncovered": ["no [nodes.\"...\"] section of the baseline names this node, so gpugate does not know "
                  "what it should look like: add it to a section's hostlist (gpugate baseline check "
                  "new-baseline.toml shows the effect first); the drain clears itself on the next check"],
    "dcgm_diag": ["rerun dcgmi diag -r 3 on the drained node; failing memory/pcie tests on the pinned "
                  "stack are hardware: RMA"],
    "smoke": ["the node passed its checks but the sweep's smoke job (nccl-tests all_reduce_perf) failed "
              "twice and after the rollback: read its output (smoke_output_dir/gpugate-smoke-NODE-JOB.out)",
              "low busbw with correct results is NVLink/NVSwitch or P2P off (PCIe speed): nvidia-smi "
              "topo -m and nvidia-smi nvlink -s, Fabric Manager; wrong values or an NCCL error: hardware",
              "after the repair: gpugate smoke -w NODE (on the node in service, or via the sweep)"],
}
_BY_ACTION = {
    "reconverge": ["gpugate sweep reconverges the node to the pin (re-image or config converge), "
                   "reboots it, verifies it and only then resumes it"],
    "reload_or_reboot": ["reload the driver stack or reboot (gpugate sweep does), then verify"],
    "reset_gpu": ["reset the GPU (nvidia-smi -r -i N) or reboot, then verify with the DCGM diagnostic"],
    "reboot": ["reboot the node (scontrol reboot), then verify"],
    "rma": ["hardware: escalate to the vendor (RMA); gpugate never resumes this node by itself"],
    "investigate": ["look at the node by hand: gpugate could not decide a remedy"],
}


def steps(finding: Finding):
    return _BY_COMPONENT.get(finding.component) or _BY_ACTION.get(finding.action, _BY_ACTION["investigate"])
