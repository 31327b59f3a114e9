"""The reset rung's part every vendor shares (`gpugate reset-gpus`): after a
vendor's reset (gpugate.vendors.seam: NVIDIA's nvidia-smi -r,
gpugate.vendors.nvidia.reset; AMD's amd-smi reset, gpugate.vendors.amd.reset)
the kernel log's newest record is kept (state dir, ``gpu-reset.json``), so
the sweep's verification after it judges only Xids newer than that, as a
check after a reboot judges only this boot's; and the cursor a verification
starts from.  The sweep verifies exactly as after a reboot (versions, DCGM
r1 -> r3, the smoke job); a reset that fails or does not verify falls to the
reboot rung."""

import os
import time

from gpugate.probes.reuse import RESET_MARKER as MARKER  # the reset marker (reuse: read by every run)


def mark(settings, node, out) -> None:
    """The kernel log's newest record at the reset, for the verification after it."""
    from gpugate.probes.files import boot_id
    from gpugate.probes.kernlog import last_seq, read_kmsg
    from gpugate.safety.state import write_json

    text, _ = read_kmsg(os.path.join(settings.node_root(node), settings.kernel_log.lstrip("/")))
    boot = boot_id(settings.node_root(node))
    if not isinstance(text, str) or not isinstance(boot, str):
        step = "cannot read the kernel log or boot id: the verification judges every Xid of this boot"
        out["steps"].append({"step": "mark", "detail": step, "ok": False, "at": time.time()})
        return
    out["kmsg_seq"] = last_seq(text)
    write_json(os.path.join(settings.state_dir(node), MARKER),
               {"boot_id": boot, "kmsg_seq": out["kmsg_seq"], "at": time.time(), "gpus": out["gpus"]})


def verify_cursor(settings, node: str) -> int:
    """The kernel-log cursor a verification starts from: the last GPU reset
    of this boot, else -1 (every Xid of the boot)."""
    from gpugate.probes.files import boot_id
    from gpugate.probes.reuse import reset_cursor

    return reset_cursor(settings, node, boot_id(settings.node_root(node)))
