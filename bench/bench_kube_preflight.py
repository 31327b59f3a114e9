"""Benchmark: what a gang's preflight adds to its start on Kubernetes, on
the real control plane (kube-apiserver, kube-scheduler,
kube-controller-manager of the newest release built, KWOK's kubelets:
gpugate.testbed.kube_preflight_rig), the node agents as the DaemonSet runs
them, the nodes' dcgmi and all_reduce_perf replaying real recordings (so
the proof's own tools cost nothing here: what is measured is gpugate's
part: the admission, the init container's call, the agent's reads of the
Pod and the gang, the meeting and the rounds).

    python3 bench/bench_kube_preflight.py [--sizes 2,4] [--repeat 5]

For each gang size N: Jobs of N whole-node Pods in a Volcano PodGroup,
in a namespace without the preflight (the reference) and in one that opted
in, interleaved; per gang, the time from the Job's creation to its last
Pod started (Running, or Succeeded: KWOK completes a Job's Pods), and
each Pod's preflight as its agent served it.  Exit 1 when a preflighted
healthy gang had a Pod fail its preflight or a node was held; exit 2 where
the control plane is not built (scripts/kube-build)."""

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpugate.testbed.kube_preflight_rig import OPTED_IN, PLAIN, GangRig, policy_served, preflight_exit  # noqa: E402

NODES = ["gpu%02d" % i for i in range(1, 5)]


def _started(rig, job, namespace, size):
    pods = rig.pods(job, namespace)
    going = [p for p in pods if p["status"].get("phase") in ("Running", "Succeeded")]
    return len(going) >= size


def one_gang(rig, name, size, namespace):
    began = time.monotonic()
    rig.gang(name, size, namespace)
    while not _started(rig, name, namespace, size):
        if time.monotonic() - began > 120:
            raise SystemExit("gang %s/%s did not start in 120 s" % (namespace, name))
        time.sleep(0.05)
    took = time.monotonic() - began
    while not rig.complete(name, namespace):
        time.sleep(0.1)
    return took, rig.pods(name, namespace)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="2,4")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if max(sizes) > len(NODES):
        parser.error("a gang of at most %d (the rig's nodes)" % len(NODES))
    from gpugate.testbed import kube_control
    from gpugate.testbed.kube import KubeAPI, built_versions, cache_dir

    versions = built_versions()
    gone = kube_control.missing(os.path.join(cache_dir(), versions[-1]), cache_dir()) if versions else ["all"]
    if gone:
        print("the control plane is not built (%s): scripts/kube-build" % ", ".join(gone), file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="bench-kube-preflight-")
    api = KubeAPI(os.path.join(work, "api"), control_plane=True).start()
    rig, bad = None, []
    try:
        if not policy_served(api.admin()):
            print("kube-apiserver %s serves no MutatingAdmissionPolicy v1" % versions[-1], file=sys.stderr)
            return 2
        rig = GangRig(api, work, NODES).start()
        print("Kubernetes %s, %d KWOK nodes; gang start = the Job's creation to its last Pod started"
              % (versions[-1], len(NODES)))
        print("Pods | gang start: none (reference) / with preflight, median [min-max] | added | ratio | "
              "agent's proof per Pod, median")
        for size in sizes:
            plain, proved, served = [], [], []
            for i in range(args.repeat):
                took, _ = one_gang(rig, "ref-%d-%d" % (size, i), size, PLAIN)
                plain.append(took)
                took, pods = one_gang(rig, "pf-%d-%d" % (size, i), size, OPTED_IN)
                proved.append(took)
                bad += ["%s %s" % (p["metadata"]["name"], preflight_exit(p)) for p in pods
                        if preflight_exit(p) != 0]
            for node in NODES:
                served += [r["seconds"] for r in rig.records(node) if r.get("verdict") == "passed"
                           and str(r.get("pod", "")).startswith("%s/pf-%d-" % (OPTED_IN, size))]
            ref, got = statistics.median(plain), statistics.median(proved)
            print("%4d | %.2f s [%.2f-%.2f] / %.2f s [%.2f-%.2f] | +%.2f s | %.1fx | %.2f s (%d Pods)" % (
                size, ref, min(plain), max(plain), got, min(proved), max(proved), got - ref,
                got / ref if ref else float("inf"), statistics.median(served) if served else float("nan"),
                len(served)))
        from gpugate.kube import nodeview as nv
        from gpugate.kube.client import node_path

        bad += ["%s held" % n for n in NODES if nv.our_taints(rig.admin.get(node_path(n)))]
    finally:
        if rig is not None:
            rig.stop()
        api.stop()
    if bad:
        print("FAILED: %s" % ", ".join(bad[:10]))
        return 1
    print("every preflighted gang passed; no node held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
