"""The runbook step each finding calls for (`gpugate explain`)."""

from gpugate.model.findings import Finding

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
    "xid": ["look the Xid up in NVIDIA's Xid catalog (gpugate.vendors.nvidia.xidcatalog: the default policy and why it "
            "deviates); reset the GPU (nvidia-smi -r -i N) or reboot as the action says; if it recurs "
            "after a reboot, open an RMA",
            "a MIG GPU names the instance (GPU-I:NN) in the detail: the fault may be the job's in that "
            "instance (Xid 94: contained) or the whole GPU's (48/74/79/95: reset the GPU)",
            "Xid 154: the driver names the recovery it wants (GPU reset or node reboot); a change to "
            "0x0 (None) means the GPU recovered and does not drain",
            "a rate of non-fatal NVLink Xids (144-150, xid_nonfatal_max in xid_window_seconds): check "
            "`nvidia-smi nvlink -e` error counters and the cable/tray; reset the GPU, RMA if it recurs"],
    "sxid": ["an NVSwitch error (SXid): look the code up in the Fabric Manager user guide's SXid list",
             "fatal SXid: the NVSwitch and the GPUs on it need a reset: drain, stop jobs, reboot the node "
             "(or reset the baseboard), check /var/log/fabricmanager.log; repeated on one switch: RMA the "
             "baseboard",
             "a rate of non-fatal SXids (xid_nonfatal_max in xid_window_seconds): a degrading link; "
             "check `nvidia-smi nvlink -e` and the trunk cables, then reboot and watch the rate"],
    "fallen_off_bus": ["the GPU no longer answers on PCIe (NVRM: GPU has fallen off the bus): reboot "
                       "(scontrol reboot); check `lspci -d 10de:`, power, thermals and the riser; if it "
                       "falls off again after the reboot, reseat or RMA"],
    "amdgpu_event": [
        "an amdgpu kernel-log event; the detail names the GPU's PCI address and the "
        "driver's line: dmesg | grep -e 'amdgpu <address>' shows what came before and after it",
        "ue/de/ue_event/poison: an uncorrectable RAS error, a deferred one or poison consumed: reset the GPU "
        "(amd-smi reset -G -g N; on an XGMI hive the driver resets every GPU of the hive, so drain them all), "
        "then check amd-smi bad-pages and amd-smi metric --ecc --ecc-blocks and verify (rvs -r 2); repeated "
        "on one GPU after a reset: RMA",
        "reset_failed/ring_reset_failed: the driver could not recover the GPU (or one ring of it): reboot "
        "(scontrol reboot), then verify; if it fails again after the reboot: RMA",
        "init_failed: amdgpu failed at probe ('Fatal error during GPU init', 'probe of ... failed with error "
        "-22'): check the firmware (amd-smi firmware, the IFWI) and the lines before it ('invalid ip discovery "
        "binary signature', 'firmware load failed'); reboot, reflash the IFWI if it names firmware; RMA if it "
        "persists",
        "bad_page_threshold: the GPU's retired pages reached the driver's threshold (amdgpu_bad_page_threshold; "
        "amd-smi bad-pages lists them): the board is due for RMA; gpugate never resumes it by itself",
        "ring_timeout/gpu_reset x N: jobs hung the GPU (ring timeouts the driver did not soft-recover) or the "
        "driver reset it ring_timeout_max/gpu_reset_events_max times within xid_window_seconds: reset it "
        "(amd-smi reset -G), run rvs -r 2 and the smoke job; many nodes at once is one user's job (ask them), "
        "one GPU again and again: RMA"],
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
    # Runtime settings (judges/settings.py): config management must set them at every boot.
    "compute_mode": ["the GPU's compute mode differs from the nodeset's compute_mode: nvidia-smi -i N -c "
                     "DEFAULT|EXCLUSIVE_PROCESS|PROHIBITED (no reset needed); a reset or reboot loses it, so "
                     "make the node's config management set it at boot; \"not supported\": the pin does not "
                     "fit this GPU, fix the baseline"],
    "power_limit": ["the GPU's power limit differs from the nodeset's power_limit_watts: nvidia-smi -i N -pl "
                    "WATTS (within `nvidia-smi -q -d POWER` min/max; lost at reset, so set it at boot); "
                    "\"not supported\": the pin does not fit this GPU, fix the baseline"],
    "ecc_mode": ["ECC mode differs from the nodeset's ecc: nvidia-smi -i N -e 1|0 sets the pending mode, a "
                 "GPU reset (nvidia-smi -r -i N) or reboot applies it; \"pending\" in the finding means "
                 "that was set and only the reset is missing (or that the next reset will change it)"],
    "mig": ["MIG mode differs from the nodeset's mig: nvidia-smi -i N -mig 1|0, then a GPU reset "
            "(nvidia-smi -r -i N) or reboot applies it; recreate the GPU/compute instances after"],
    "persistence": ["persistence mode is off: nvidia-smi -pm 1 (or enable nvidia-persistenced)"],
    "dcgm_diag": ["rerun dcgmi diag -r 3 on the drained node; failing memory/pcie tests on the pinned "
                  "stack are hardware: RMA"],
    "ib_port": ["an HCA port this node had ACTIVE went down (or its HCA is gone): ibstat / "
                "cat /sys/class/infiniband/<dev>/ports/<n>/{state,phys_state}; check the cable and the "
                "switch port (its log, ibswitches/ibportstate), reseat or replace the cable/transceiver; "
                "the drain lifts once the port is ACTIVE/LinkUp again (a reboot forgets it)"],
    "ib_errors": ["an IB error counter grew faster than [health] ib_error_rate_max (per hour) or "
                  "ib_counter_max (per check) allows: read /sys/class/infiniband/<dev>/ports/<n>/counters "
                  "(or perfquery); symbol_error, link_error_recovery and link_downed point at the cable or "
                  "transceiver: replace it"],
    "xid_repeat": ["the application's Xids (13, 31, 43, 94) came back on this GPU in jobs of different users "
                   "(the detail names the jobs and users): the GPU, not the code; the sweep resets it and runs "
                   "dcgmi diag -r 3 (xid_repeat_diag) on it before it takes jobs again, and a pass clears its "
                   "history (so does a RESUME); many nodes at once is one user's job array (ask them)",
                   "without a GPU (xid_repeat=xids on gpus 2+5 of >=2 users): the same faults on several GPUs in "
                   "jobs of several users, one fault they share (an NVSwitch, a PCIe switch, the baseboard: "
                   "nvidia-smi topo -m, the SXids, the BMC's log); the sweep resets every GPU and the diagnostic "
                   "runs on all"],
    "clocks": ["a GPU spent more than [health] clock_event_share_max of an interval slowed (NVML's clock-event "
               "counters; nvidia-smi -q -d PERFORMANCE): many nodes at once is the room (power brake, a row's "
               "cooling: GpugateClockEventsRoomWide); one node is its own airflow, fans or power: look there"],
    "ib_flap": ["an HCA port went down and came back (link_downed rose) within ib_flap_window_seconds: "
                "many nodes at once is the switch or the subnet manager (its log); one node is its cable or "
                "transceiver: reseat or replace it (the sweep's reboot clears the window)"],
    "hca_count": ["fewer (or more) HCAs than the nodeset's [hca] count: lspci | grep Mellanox, "
                  "ibstat; a missing HCA: reseat or RMA; a wrong count: fix the baseline's nodeset"],
    "hca_port": ["a fabric port the nodeset expects ACTIVE/LinkUp is not: ibstat; cable, switch port or "
                 "an HCA port disabled on purpose (then narrow the nodeset's hca.types or count)"],
    "hca_rate": ["a port trained at another rate than the nodeset's hca.rate: check the cable type, "
                 "the switch port speed and mlxlink; a degraded link: replace the cable"],
    "hca_firmware": ["the HCA firmware is not [pin] hca_firmware for its type: flash it (mlxfwmanager "
                     "-u, then mlxfwreset or a reboot) in the converge, then verify"],
    "imex_domain": ["the IMEX domain is not UP: nvidia-imex-ctl -N shows which member is not READY "
                    "(the finding names it); fix that node (its nvidia-imex service, its "
                    "/etc/nvidia-imex/nodes_config.cfg); once the domain is UP, gpugate sweep verifies and resumes the "
                    "members drained for it (members the drain budget held were never drained)"],
    "imex_service": ["this node's IMEX service is not READY: systemctl status nvidia-imex, "
                     "/var/log/nvidia-imex.log, /etc/nvidia-imex/config.cfg and nodes_config.cfg"],
    "preflight": ["a job's preflight (gpugate.preflight: [preflight] allreduce on the job's GPUs, as root, "
                  "before the job) read wrong values (#wrong or out of bounds) from the all_reduce: data "
                  "corruption under load; the sweep reboots it and its verification (DCGM, the smoke job) "
                  "proves it; again: RMA"],
    "preflight_busbw": ["a job's preflight all_reduce on every GPU of the node averaged under the baseline's "
                        "[smoke] min_busbw_gbps for its product: NVLink/NVSwitch or P2P (nvidia-smi topo -m, "
                        "nvidia-smi nvlink -s, Fabric Manager); many nodes at once is the floor (fix the "
                        "baseline): budgeted, so the keeper drains only its share"],
    "preflight_across": ["a job's preflight across its nodes (gpugate.preflight.cross) pinned this node: the "
                         "all_reduce read wrong values or a bandwidth under [smoke] min_pair_busbw_gbps in every "
                         "group it was in and with two partners each proven good.  Another job's traffic on a "
                         "shared link can cause that, so it is budgeted: the keeper drains it within the drain "
                         "budget and [preflight] pins_per_hour; the sweep reboots it and its verification (DCGM, "
                         "the smoke job) proves it.  Pins alone never make a repeat offender: an rma needs the "
                         "verification or a counter to fail"],
    "preflight_setup": ["a job's preflight `dcgmi diag` failed a deployment test of software (a library, "
                        "persistence mode, environment, denylist): fix the node's stack (many nodes at once is a "
                        "package or setting pushed everywhere: budgeted, so the keeper drains only its share)"],
    "smoke": ["the node passed its checks but the sweep's smoke job (nccl-tests all_reduce_perf) failed "
              "twice and after the rollback: read its output (smoke_output_dir/gpugate-smoke-NODE-JOB.out)",
              "low busbw with correct results is NVLink/NVSwitch or P2P off (PCIe speed): nvidia-smi "
              "topo -m and nvidia-smi nvlink -s, Fabric Manager; wrong values or an NCCL error: hardware",
              "pair=PARTNER (the 2-node pair job): it failed with two different partners, or with its only "
              "one when nobody could tell them apart (a batch of two: look at the partner too); slow or an "
              "NCCL NET error is the inter-node path: ibstat, the HCA's cable and switch port, gpugate audit",
              "after the repair: gpugate smoke -w NODE (on the node in service, or via the sweep; "
              "gpugate smoke -w NODE,GOOD --pairs for its link)"],
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
    """The shared runbook's steps for a finding (a vendor's
    own come first through gpugate.vendors.seam.runbook_steps)."""
    return _BY_COMPONENT.get(finding.component) or _BY_ACTION.get(finding.action, _BY_ACTION["investigate"])
