"""The reset rung on an AMD node (`gpugate reset-gpus` where the baseline's
nodeset is ``vendor = "amd"``): the node's GPUs are reset as one unit.

1. No process may hold a GPU: a process listed under /sys/class/kfd/kfd/proc
   (every process that opened /dev/kfd) refuses the reset before anything is
   done (the sweep never kills a job's process).
2. Reset every GPU: ``amd-smi reset -G -g all --json``.  On an XGMI hive a reset is
   hive-wide whatever one asks (amdgpu_device_gpu_recover: "In case of XGMI
   hive ... will also reset all the other nodes"; the captured MI300X log
   shows a MODE1 reset on all 8 GPUs after one GPU's fault), so gpugate never
   pretends to reset one GPU alone.  amd-smi says a failure in-band ("Failed
   to reset GPU", exit 0) and asks for root ("Command requires elevation"):
   its answer is parsed (gpugate.vendors.amd.parse_smi.parse_reset), never its exit
   code alone.
3. Record the kernel log's newest record (gpugate.node.gpureset's marker):
   the verification after it judges only amdgpu events newer than the reset.
   "VRAM is lost due to GPU reset!" is expected there.

The sweep then verifies exactly as after a reboot (versions, RAS counts,
bad pages, RVS, the rccl smoke job); a reset that fails or does not verify
falls to the reboot rung.
"""

import time
from typing import List

from gpugate.errors import CommandError
from gpugate.safety.runner import run

RESET = ("reset", "-G", "-g", "all", "--json")


def reset(settings, node: str, gpus: List[int], timeout: float) -> dict:
    from gpugate.node.gpureset import mark

    steps: List[dict] = []
    out = {"node": node, "ok": False, "error": "", "steps": steps, "gpus": sorted(set(gpus)), "all": True,
           "started": time.time(), "vendor": "amd"}

    def step(name, detail, ok=True):
        steps.append({"step": name, "detail": str(detail)[:1000], "ok": ok, "at": time.time()})

    from gpugate.model.facts import failed
    from gpugate.vendors.amd import probe_sysfs

    facts = probe_sysfs.read(settings.node_root(node))
    procs = getattr(facts, "kfd_processes", None)
    if failed(facts) or failed(procs) or procs is None:
        out["error"] = "cannot list the processes on the GPUs (%s): not reset" % (
            (facts if failed(facts) else procs).describe() if failed(facts) or failed(procs) else "no answer")
        step("processes", out["error"], False)
        return out
    if procs:
        out["error"] = "%d process(es) hold /dev/kfd (pid %s): not reset" % (
            len(procs), ", ".join(str(p) for p in procs[:5]))
        step("processes", out["error"], False)
        return out
    step("processes", "none on the GPUs")
    if gpus:
        step("scope", "every GPU of the node is reset (an XGMI hive resets as one), not only %s"
             % ",".join(str(g) for g in sorted(set(gpus))))
    smi = settings.command("amd-smi", node)
    argv = [smi] + list(RESET)
    try:
        from gpugate.probes.commands import ENV  # amd-smi is Python run as root: none of the caller's PYTHON* variables

        done = run(argv, timeout, env=ENV, ok_codes=tuple(range(256)))
    except CommandError as exc:
        out["error"] = "%s: %s" % (" ".join(RESET), exc)
        step("reset", out["error"], False)
        return out
    from gpugate.vendors.amd.parse_smi import parse_reset

    said = " ".join((done.stdout + done.stderr).split())[:400]
    results = parse_reset(done.rc, done.stdout, done.stderr)
    bad = {gpu: r for gpu, r in sorted(results.items()) if r is not True}
    if done.rc != 0 or bad or not results:
        why = "; ".join("gpu%s: %s" % (g, r.describe() if failed(r) else r) for g, r in bad.items())
        out["error"] = "amd-smi %s: %s" % (" ".join(RESET), why or ("exit %d: %s" % (done.rc, said or "no answer")))
        step("reset", out["error"], False)
        return out
    step("reset", said or "amd-smi %s: exit 0" % " ".join(RESET))
    out["ok"] = True
    mark(settings, node, out)
    return out
