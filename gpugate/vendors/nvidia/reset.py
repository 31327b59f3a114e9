"""NVIDIA's reset rung, node side (`gpugate reset-gpus` through
gpugate.vendors.seam, run by the sweep through its transport on a drained,
idle node): what a GPU reset needs, in the order NVIDIA's tools need it.

1. No process may hold a GPU: a compute process listed by
   ``nvidia-smi --query-compute-apps`` refuses the reset before anything is
   stopped (the sweep never kills a job's process).
2. Stop what holds the GPUs: nvidia-persistenced (persistence mode counts as
   an attachment: "In use by another client", exit 255, NVIDIA/NVSentinel
   #1690), DCGM's nv-hostengine (nvidia-dcgm), Fabric Manager where present.
3. Reset.  nvidia-smi(1), -r/--gpu-reset: "Without this option [-i], all
   GPUs are reset. ... Starting with the NVIDIA Ampere architecture, GPUs
   with NVLink connections can be individually reset. On Ampere NVSwitch
   systems, Fabric Manager is required to facilitate reset. ... If Fabric
   Manager is not running, or if any of the GPUs being reset are based on an
   architecture preceding the NVIDIA Ampere architecture, any GPUs with
   NVLink connections to a GPU being reset must also be reset in the same
   command. This can be done either by omitting the -i switch ... If the -i
   option does not specify a complete set of NVLink GPUs to reset, this
   command will issue an error".  Fabric Manager is stopped in step 2 (it
   holds the GPUs; the Fabric Manager user guide restarts it to train the
   fabric again), so on an NVSwitch (HGX) node every GPU of the baseboard is
   reset in one command (no -i); elsewhere only the GPUs asked for
   (``-i 0,3``).  The node is drained and idle: resetting every GPU costs
   nothing a job would notice.
4. Start the services again (always, also after a failed reset), Fabric
   Manager first: the fabric must be up before persistenced and DCGM.
5. Record the kernel log's newest record at the reset (gpugate.node.gpureset.mark:
   state dir, ``gpu-reset.json``): the sweep's verification after it judges only Xids
   newer than that, as a check after a reboot judges only this boot's.

The sweep verifies exactly as after a reboot (versions, DCGM r1 -> r3, the
smoke job); a reset that fails or does not verify falls to the reboot rung.
"""

import os
import time
from typing import List

from gpugate.errors import CommandError
from gpugate.node.gpureset import mark
from gpugate.safety.runner import run

# The units a run stopped, written before each stop: a run killed before it
# started them again leaves them here, and the next run starts them too.
STOPPED = "gpu-reset-stopped.json"
DCGM_UNITS = ("nvidia-dcgm", "dcgm")  # DCGM 3/4 packages; "dcgm" before


def _units(settings) -> List[str]:
    """What holds the GPUs, in the order they are stopped."""
    out = []
    persistenced = settings.services.get("persistenced", "nvidia-persistenced")
    if persistenced != "none":
        out.append(persistenced)
    out += list(DCGM_UNITS)
    fabric = settings.services.get("fabricmanager", "nvidia-fabricmanager")
    if fabric != "none":
        out.append(fabric)
    return out


def reset(settings, node: str, gpus: List[int], timeout: float) -> dict:
    steps: List[dict] = []
    out = {"node": node, "ok": False, "error": "", "steps": steps, "gpus": sorted(set(gpus)), "all": not gpus,
           "started": time.time()}

    def step(name, detail, ok=True):
        steps.append({"step": name, "detail": str(detail)[:1000], "ok": ok, "at": time.time()})

    smi = settings.command("nvidia-smi", node)
    # 1. Nothing may run on the GPUs: refuse before anything is stopped.
    try:
        listed = run([smi, "--query-compute-apps=pid,process_name,gpu_bus_id", "--format=csv,noheader"], timeout)
    except CommandError as exc:
        out["error"] = "cannot list the GPUs' processes (%s): not reset" % exc
        step("processes", out["error"], False)
        return out
    procs = [line.strip() for line in listed.stdout.splitlines() if line.strip()]
    switches = _nvswitches(settings, node)
    if procs and gpus and not switches:  # -i below: only the GPUs reset must be free (the others may serve)
        procs = _on(settings, node, smi, procs, gpus, timeout)
    if procs:
        out["error"] = "%d process(es) on the GPUs (%s): not reset" % (len(procs), "; ".join(procs[:3]))
        step("processes", out["error"], False)
        return out
    step("processes", "none on the GPUs")
    systemctl = settings.command("systemctl", node)
    from gpugate.safety.state import read_json, write_json

    stopped_path = os.path.join(settings.state_dir(node), STOPPED)
    left = (read_json(stopped_path) or {}).get("units")
    stopped: List[str] = [u for u in left if isinstance(u, str)] if isinstance(left, list) else []
    if stopped:
        step("stop", "an interrupted reset left %s stopped: started again afterwards" % ", ".join(stopped))
    try:
        # 2. Stop what holds the GPUs.
        if os.path.exists(systemctl):
            for unit in _units(settings):
                try:
                    active = run([systemctl, "is-active", unit], timeout, ok_codes=range(256)).rc == 0
                    if active:
                        write_json(stopped_path, {"units": stopped + [unit]})
                        run([systemctl, "stop", unit], timeout)
                        stopped.append(unit)
                except CommandError as exc:
                    out["error"] = "cannot stop %s (%s): not reset" % (unit, exc)
                    step("stop", out["error"], False)
                    return out
            step("stop", "stopped %s" % (", ".join(stopped) or "nothing (none active)"))
        else:
            step("stop", "no systemctl (%s): services left as they are" % systemctl)
        # 3. Reset: the whole baseboard together on an NVSwitch node (see above).
        argv = [smi, "-r"]
        if gpus and not switches:
            argv += ["-i", ",".join(str(g) for g in sorted(set(gpus)))]
        out["all"] = len(argv) == 2
        out["nvswitches"] = switches
        try:
            done = run(argv, timeout, ok_codes=range(256))
        except CommandError as exc:
            out["error"] = "%s: %s" % (" ".join(argv[1:]), exc)
            step("reset", out["error"], False)
            return out
        said = (done.stdout + done.stderr).strip()
        if done.rc != 0:
            out["error"] = "nvidia-smi %s exited %d: %s" % (" ".join(argv[1:]), done.rc, " ".join(said.split())[:400])
            step("reset", out["error"], False)
            return out
        step("reset", said or "nvidia-smi %s: exit 0" % " ".join(argv[1:]))
        out["ok"] = True
    finally:
        # 4. Start them again, whatever happened (Fabric Manager first).
        failed = []
        for unit in reversed(stopped):
            try:
                run([systemctl, "start", unit], timeout)
            except CommandError as exc:
                failed.append("%s (%s)" % (unit, exc))
        if stopped:
            step("start", "started %s%s" % (", ".join(reversed(stopped)),
                                            "; FAILED: " + "; ".join(failed) if failed else ""), not failed)
        if failed and out["ok"]:
            out["ok"] = False
            out["error"] = "reset done, but could not start again: %s" % "; ".join(failed)
        if not failed and stopped:
            try:
                os.unlink(stopped_path)
            except OSError:
                pass
    mark(settings, node, out)
    return out


def _on(settings, node, smi: str, procs: List[str], gpus: List[int], timeout: float) -> List[str]:
    """The processes (nvidia-smi's lines: pid, name, bus id) on the GPUs
    ``gpus``; all of them where the GPUs' bus ids cannot be read."""
    try:
        listed = run([smi, "--query-gpu=index,pci.bus_id", "--format=csv,noheader"], timeout)
    except CommandError:
        return procs
    buses = set()
    for line in listed.stdout.splitlines():
        index, _, bus = line.partition(",")
        if index.strip().isdigit() and int(index) in gpus and bus.strip():
            buses.add(bus.strip().lower())
    if len(buses) != len(set(gpus)):
        return procs
    return [p for p in procs if p.rsplit(",", 1)[-1].strip().lower() in buses]


def _nvswitches(settings, node) -> int:
    from gpugate.probes.files import pci_counts

    counts = pci_counts(settings.node_root(node))
    return counts[1] if isinstance(counts, tuple) else 0
