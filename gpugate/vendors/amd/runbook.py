"""The runbook steps of AMD Instinct findings (`gpugate explain` on a node
whose nodeset says vendor = "amd"): amd-smi, rvs and the amdgpu driver's
own files, where NVIDIA's steps name nvidia-smi and DCGM."""

_RESET = ("reset the node's GPUs (gpugate sweep does: `gpugate reset-gpus`, i.e. amd-smi reset -G -g all; an "
          "XGMI hive resets as one, and no process may hold /dev/kfd), then verify (rvs -r 2, the rccl smoke job)")

AMD_STEPS = {
    "module": ["amdgpu is not loaded (or not live): dmesg | grep amdgpu for why it failed (firmware, 'Fatal "
               "error during GPU init'); modprobe amdgpu, or reboot (gpugate sweep does), then verify; "
               "cat /sys/module/amdgpu/initstate must say live"],
    "gpu_count": ["a GPU is missing: amd-smi list, lspci -d 1002: and dmesg | grep amdgpu (probe failures, "
                  "'fallen off'); reboot; if it does not come back: reseat or RMA"],
    "gpus_lost": ["the node shows fewer GPUs than it did before: amd-smi list, lspci -d 1002:, dmesg | grep "
                  "amdgpu; reboot; if it does not come back: reseat or RMA"],
    "pci_gpus": ["fewer AMD Instinct devices on the PCI bus than expected (lspci -d 1002:): reboot; then a "
                 "hardware check of the OAM/baseboard"],
    "power_limit": ["the GPU's power cap differs from the nodeset's power_limit_watts: amd-smi set -g N "
                    "--power-cap WATTS (the converge does), then verify"],
    "processes": ["a process still holds /dev/kfd after the job (ls /sys/class/kfd/kfd/proc): kill it or "
                  "reboot; then verify"],
    "product": ["the GPU's product (the board FRU's product_name) is not the nodeset's, or it is empty: "
                "amd-smi static --board; with an empty FRU pin the nodeset's device_id so the product's "
                "pins still apply"],
    "vbios": ["the GPU's VBIOS (sysfs vbios_version, the part number) is not [pin.vbios] for its product: "
              "flash the pinned IFWI/VBIOS in the converge, reboot, verify"],
    "pcie_width": ["the PCIe link trained narrower than the GPU supports (current_link_width): reseat the "
                   "OAM/riser, check the retimer; reboot and verify"],
    "pcie_gen": ["the PCIe link trained slower than the GPU supports (current_link_speed): reseat, check the "
                 "retimer and the BIOS PCIe settings; reboot and verify"],
    "kernel_log": ["the kernel log could not be read or records were lost before gpugate read them: amdgpu "
                   "events may be missing; read dmesg by hand; a flood of user records points at one job"],
    "amdgpu": ["the amdgpu module is not [pin] amdgpu, or amdgpu facts were not read: install the pinned ROCm "
               "DKMS driver (amdgpu-dkms) or, for \"inbox\", remove it, then reboot and verify (cat "
               "/sys/module/amdgpu/version); facts from before the node became AMD's: read it again"],
    "ras": ["uncorrectable RAS errors in the blocks [health] ras_uncorrected_blocks names, counted by amdgpu "
            "since it loaded (/sys/class/drm/cardN/device/ras/<block>_err_count; amd-smi metric --ecc-blocks)",
            _RESET + "; the reset clears the counters",
            "UMC (memory) errors: check amd-smi bad-pages: the driver retires the page; XGMI_WAFL: the link "
            "between GPUs (the hive's cabling/baseboard); the same GPU again after a reset: RMA"],
    "amdgpu_repeat": ["jobs hung the GPU (ring timeouts the driver did not soft-recover) or the driver reset it "
                      "ring_timeout_max/gpu_reset_events_max times within xid_window_seconds (a reset gpugate's "
                      "sweep made is not counted): " + _RESET, "many nodes at once is one user's job (ask them; "
                      "the drain budget holds the rest); one GPU again and again: RMA"],
    "ras_deferred": ["UMC deferred errors: poison was created in HBM and will be consumed by a job",
                     _RESET, "repeated on one GPU: RMA"],
    "bad_pages": ["VRAM pages: pending (P) ones are retired by a reset (" + _RESET + ")",
                  "unreservable (F) ones could not be retired, and 'threshold exceeded' means the driver's "
                  "bad-page threshold (amdgpu.bad_page_threshold) was reached: RMA the board; gpugate never "
                  "resumes it by itself (amd-smi bad-pages lists the pages)"],
    "xgmi": ["an XGMI link between two GPUs of the hive is down (amd-smi xgmi --link-status): " + _RESET,
             "still down after a reset and a reboot: the baseboard or the GPU's OAM connector: RMA"],
    "bound_gpus": ["Instinct GPUs on the PCI bus that amdgpu does not drive: dmesg | grep amdgpu ('Fatal error "
                   "during GPU init', 'probe of ... failed with error'), the IFWI and firmware (amd-smi "
                   "firmware); reboot, reflash if it names firmware, RMA if it persists"],
    "rvs": ["the ROCm Validation Suite failed on the repaired node: rvs -r LEVEL names the action and the "
            "GPU (by its KFD gpu_id: amd-smi list shows it); rerun that level by hand; hardware again: RMA"],
    "compute_partition": ["the GPU is in another compute partition than the nodeset's: amd-smi set "
                          "--compute-partition SPX|DPX|TPX|QPX|CPX (the converge does), then verify"],
    "memory_partition": ["the GPU is in another memory partition than the nodeset's: amd-smi set "
                         "--memory-partition NPS1|NPS4 (a driver reload follows), then verify"],
    "rocm": ["ROCm is not [pin] rocm (/opt/rocm/.info/version): run the converge (the rocm packages of the "
             "pinned release), then verify"],
    "amd_smi": ["amd-smi did not answer (the detail says why: driver not loaded, no /dev/kfd access, hung) or "
                "is not [pin] amd_smi: check `amd-smi version` as root and the amd-smi-lib package"],
    "ifwi": ["the GPU's IFWI is not [pin] ifwi for its product (amd-smi static: ifwi/vbios version): flash "
             "the pinned IFWI with AMD's tool for the platform in the converge, reboot, verify"],
    "amdgpu_firmware": ["a firmware of the GPU is not the pinned one (/sys/class/drm/cardN/device/fw_version): "
                        "it comes with the amdgpu firmware package of the pinned ROCm: converge, reboot, verify"],
    "device_id": ["the GPU's PCI device id is not the nodeset's device_id: another GPU model is installed "
                  "than the baseline says; fix the baseline's nodeset or the hardware"],
}
# By action, where no component step says more.
AMD_ACTIONS = {"reset_gpu": [_RESET], "reload_or_reboot": ["reload amdgpu (modprobe -r amdgpu; modprobe amdgpu) "
                                                           "or reboot (gpugate sweep does), then verify"]}


def amd_steps(finding):
    """The AMD steps for this finding, or None (the shared ones apply)."""
    return AMD_STEPS.get(finding.component) or AMD_ACTIONS.get(finding.action)
