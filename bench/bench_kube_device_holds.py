"""Benchmark: the budget keeper on Kubernetes with GPUs held alone
([kubernetes] device_holds), 10,000 Node objects of 8 GPUs each on a real
kube-apiserver and etcd, 16 pools.

    python3 bench/bench_kube_device_holds.py [--nodes 10000] [--held 0.05] [--share 0.1]

The fleet: 5% of all GPUs held alone already (one GPU on each of
nodes x 8 x 0.05 nodes: gpugate's record with the rule's name, the GPU and
the node's 8, as the agent writes it: 1/8 of a node each in the budget);
1,000 more nodes each publishing an application-Xid repeat on one GPU
with its offer to hold it alone (and the ResourceSlice a DRA driver
publishes for it: the keeper finds the GPU there and writes a
DeviceTaintRule); 1,000 more publishing a wrong pin (a whole node each).

Measured, each in a process of its own (os.fork: wall, CPU, wait4's peak
RSS), against a reference measured in the same run:

- reference: one paginated list of the same nodes, alone;
- the decision on the listed states (every proof screened, every pool
  planned with the shares), and the same decision on the same states read
  as whole nodes (the rule before GPUs counted as shares: every pool is
  full then, and nothing drains);
- one keeper run (the Lease, then gpugate.keeper.run.run_once): the list,
  the plan, each node re-read, each GPU held alone (its Node's
  ResourceSlices listed, its rule created, its Node patched) and each
  whole node drained, the list again.

Targets (exit 1 on a miss): the decision under 2 s (the median of five);
the run's CPU under 10 x the list's and its peak RSS under 2 x the list's
(its wall is the API server's, on the same cores: reported); no pool past
its allowance after the run (the shares summed); the run drains what the
decision planned.  Needs a kube-apiserver built by scripts/kube-build
(GPUGATE_KUBE_VERSION picks one) and openssl.
"""

import argparse
import json
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DRIFT = "gpugate: drift driver=580.65.06 (want 580.95.05)"
POOLS, GPUS, DRIVER = 16, 8, "gpu.nvidia.com"


def xid(gpu: int) -> str:
    return "gpugate: health xid_repeat:gpu%d=xids in >=3 jobs (want < 3 jobs within 24h)" % gpu


def uuid(name: str, gpu: int) -> str:
    return "GPU-%s-%d" % (name, gpu)


def _node(name: str, kind: str, key: bytes, now: int) -> dict:
    """A Node: held (one GPU alone), waiting (a GPU's finding with its offer, or a wrong pin), or fit."""
    from gpugate.kube import dra, gpushare
    from gpugate.kube.nodeview import OWNED, PENDING
    from gpugate.slurm import pending

    number = int(name[3:])
    gpu = number % GPUS
    notes = {}
    if kind == "held":
        rule = dra.rule_name(name, DRIVER, "gpu-%d" % gpu)
        notes[OWNED] = json.dumps({"reason": xid(gpu), "at": now - 3600, "effects": [], "cordon": False,
                                   "devices": [rule], "gpus": [gpu], "of": GPUS}, sort_keys=True)
    elif kind == "gpu":
        text = pending.publish("", xid(gpu), now, key, name, None)
        notes[PENDING] = gpushare.with_offer(text, {gpu: {"uuid": uuid(name, gpu)}}, [gpu], GPUS)
    elif kind == "drift":
        notes[PENDING] = pending.publish("", DRIFT, now, key, name, None)
    return {"metadata": {"name": name, "labels": {"gpugate.io/pool": "pool-%02d" % (number % POOLS)},
                         "annotations": notes}}


def _slice(name: str) -> dict:
    devices = [{"name": "gpu-%d" % i, "attributes": {"uuid": {"string": uuid(name, i)}}} for i in range(GPUS)]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": name + "-gpu"},
            "spec": {"driver": DRIVER, "nodeName": name, "devices": devices,
                     "pool": {"name": name, "generation": 1, "resourceSliceCount": 1}}}


def _create(api, items, key, now):
    from gpugate.kube import dra
    from gpugate.kube.client import node_path

    client = api.admin()
    for name, kind in items:
        client.create("/api/v1/nodes", _node(name, kind, key, now))
        client.patch(node_path(name, "status"), {"status": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "bench",
             "lastHeartbeatTime": "2026-11-28T00:00:00Z", "lastTransitionTime": "2026-11-28T00:00:00Z"}]}},
            "strategic")
        if kind == "gpu":
            client.create(dra.SLICES, _slice(name))
    client.close()


def counted(client):
    """The client's requests counted by verb and what they name."""
    from collections import Counter

    seen, request = Counter(), client.request

    def counting(method, path, *args, **kwargs):
        what = ("resourceslices" if "/resourceslices" in path else "devicetaintrules" if "/devicetaintrules" in path
                else "nodes list" if path == "/api/v1/nodes" else "lease" if "/leases" in path
                else "group" if path.startswith("/apis/") else "node")
        seen["%s %s" % (method, what)] += 1
        return request(method, path, *args, **kwargs)
    client.request = counting
    return seen


def measured(fn) -> dict:
    """fn() in a forked process: its value (JSON), wall and CPU seconds, wait4's peak RSS (MB)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read)
        started, cpu = time.perf_counter(), time.process_time()
        try:
            value, error = fn(), ""
        except BaseException as exc:  # noqa: BLE001 (said in the parent)
            value, error = None, "%s: %s" % (type(exc).__name__, exc)
        text = json.dumps({"wall": time.perf_counter() - started, "cpu": time.process_time() - cpu,
                           "value": value, "error": error})
        with os.fdopen(write, "w") as handle:
            handle.write(text)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as handle:
        text = handle.read()
    _, _, usage = os.wait4(pid, 0)
    out = json.loads(text)
    if out["error"]:
        raise SystemExit("bench: a measured step failed: " + out["error"])
    out["rss"] = usage.ru_maxrss / 1024.0
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--held", type=float, default=0.05, help="the share of all GPUs held alone already")
    parser.add_argument("--waiting", type=int, default=1000, help="nodes publishing each kind of finding")
    parser.add_argument("--share", type=float, default=0.1)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    from gpugate.budget import rules as budget
    from gpugate.core.record import fields
    from gpugate.keeper import run as keeper
    from gpugate.kube.nodes import KubeNodes
    from gpugate.model.config import parse_settings
    from gpugate.slurm.nodestate.record import NodeState
    from gpugate.testbed.kube import KubeAPI

    from bench_kube_keeper import in_threads, with_key

    held = int(args.nodes * GPUS * args.held)  # one GPU a node
    if held + 2 * args.waiting > args.nodes:
        raise SystemExit("bench: %d GPUs held alone and 2 x %d waiting do not fit in %d nodes"
                         % (held, args.waiting, args.nodes))
    kinds = (["held"] * held + ["gpu"] * args.waiting + ["drift"] * args.waiting
             + ["fit"] * (args.nodes - held - 2 * args.waiting))
    items = [("gpu%05d" % i, kind) for i, kind in enumerate(kinds[i * 7919 % args.nodes] for i in range(args.nodes))]
    work = tempfile.mkdtemp(prefix="gpugate-bench-kube-dev-")
    key = with_key(work)
    api = KubeAPI(os.path.join(work, "api")).start()
    try:
        api.apply(os.path.join(ROOT, "deploy", "kubernetes"))  # the keeper's RBAC is all it has
        now = int(time.time())
        took = in_threads(lambda part: _create(api, part, key, now), items, args.threads)
        print("kube-apiserver %s; %d nodes x %d GPUs created in %.1f s: %d GPUs held alone (%.0f%%), %d nodes "
              "publish one GPU's finding, %d a wrong pin" % (api.version, args.nodes, GPUS, took, held,
                                                             100.0 * held / args.nodes / GPUS, args.waiting,
                                                             args.waiting))
        kube = dict(api.kube_settings("keeper"), pool_label="gpugate.io/pool", namespace="gpugate",
                    lease_seconds=60.0, timeout_seconds=60.0, device_holds=True)
        settings = parse_settings({"scheduler": "kubernetes", "kubernetes": kube,
                                   "drain_budget": {"max_share": args.share, "key_file": os.path.join(work, "key")},
                                   "sweep": {"journal": os.path.join(work, "sweep.db")}}, "(bench)")
        tag = settings.reason_tag

        def listed():
            return KubeNodes(api.client("keeper"), kube, tag).nodes(lean=True)

        def decide(whole: bool):
            states = listed()
            if whole:  # the rule before: every held node a whole one
                states = {n: NodeState(**{f.name: getattr(s, f.name) for f in fields(s)}) for n, s in states.items()}
            times = []
            for _ in range(5):  # the median of five (the machine is shared with the API server)
                t0 = time.perf_counter()
                mine, _ = keeper.screen(states, key, time.time(), {})
                plan = budget.plan(mine, tag, args.share)
                times.append(time.perf_counter() - t0)
            return {"seconds": sorted(times)[2], "drain": len(plan.drain), "held": len(plan.held)}

        def run():
            backend = KubeNodes(api.client("keeper", timeout=60.0), kube, tag)
            seen = counted(backend.client)
            why = backend.lead("bench")
            if why:
                raise RuntimeError(why)
            figures = keeper.run_once(settings, backend, sleep=time.sleep)
            after = KubeNodes(api.client("keeper"), kube, tag).nodes(lean=True)
            worst = max(u.weight / u.allowance for u in budget.usage(after, tag, args.share).values())
            devices = sum(1 for s in after.values() if s.drain and budget.share_of(s) < 1)
            return {"drained": len(figures["drained"]), "given_back": len(figures["given_back"]),
                    "worst": worst, "held_alone": devices, "requests": dict(sorted(seen.items()))}

        ref = measured(lambda: len(listed()))
        shares = measured(lambda: decide(False))
        whole = measured(lambda: decide(True))
        done = measured(run)
        print("%-48s %8s %8s %9s" % ("", "wall s", "CPU s", "peak MB"))
        for label, m in (("one paginated list alone (reference)", ref), ("list + decision, GPUs as shares", shares),
                         ("list + decision, every node whole (before)", whole), ("keeper run", done)):
            print("%-48s %8.3f %8.3f %9.1f   ratio to the list: wall %.1f, CPU %.1f, RSS %.2f" % (
                label, m["wall"], m["cpu"], m["rss"], m["wall"] / ref["wall"], m["cpu"] / max(ref["cpu"], 1e-6),
                m["rss"] / ref["rss"]))
        print("decision alone (median of 5): %.3f s with shares (drains %d, holds %d), %.3f s every node whole "
              "(drains %d)"
              % (shares["value"]["seconds"], shares["value"]["drain"], shares["value"]["held"],
                 whole["value"]["seconds"], whole["value"]["drain"]))
        v = done["value"]
        print("keeper run: %d drained (%d nodes with GPUs held alone now), %d given back; fullest pool at %.2f of "
              "its allowance" % (v["drained"], v["held_alone"], v["given_back"], v["worst"]))
        print("requests: %s" % v["requests"])
        misses = []
        if shares["value"]["seconds"] >= 2.0:
            misses.append("decision %.3f s >= 2 s" % shares["value"]["seconds"])
        if done["cpu"] > 10 * ref["cpu"]:
            misses.append("the run's CPU over 10 x the list's")
        if done["rss"] > 2 * ref["rss"]:
            misses.append("the run's peak RSS over 2 x the list's")
        if v["worst"] > 1 + 1e-9 or v["given_back"]:
            misses.append("a pool past its allowance")
        if v["drained"] != shares["value"]["drain"]:
            misses.append("the run drained %d, the decision planned %d" % (v["drained"], shares["value"]["drain"]))
        for miss in misses:
            print("MISSED: " + miss)
        return 1 if misses else 0
    finally:
        api.stop()


if __name__ == "__main__":
    sys.exit(main())
