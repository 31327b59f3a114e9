"""Benchmark: the budget keeper on Kubernetes (issue 37, item 7) over
10,000 Node objects on a real kube-apiserver and etcd, every node with a
wrong pin published (a signed gpugate.io/pending annotation), 16 pools.

    python3 bench/bench_kube_keeper.py [--nodes 10000] [--share 0.1]

The nodes are created in bulk first (as KWOK does: Node objects, no
kubelet; Ready written as a kubelet would).  Then, in one run of the
keeper (gpugate.keeper.run.run_once over gpugate.kube.nodes, the Lease taken
first as `gpugate budget` does), reported:

- its requests to the API server, by verb (the list is paginated: 500 a page);
- its decision: the screen of every node's proof and the plan, timed on the
  listed states (target < 2 s at 10,000 nodes);
- its whole run, against a reference measured in the same run: one
  paginated list of the same nodes alone (ratio run / list).

Needs a kube-apiserver built by scripts/kube-build (GPUGATE_KUBE_VERSION
picks one) and openssl.
"""

import argparse
import os
import sys
import tempfile
import threading
import time
from collections import Counter

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

REASON = "gpugate: drift driver=580.65.06 (want 580.95.05)"
POOLS = 16


def _create(api, names, key, now):
    from gpugate.kube.client import node_path
    from gpugate.kube.nodeview import PENDING
    from gpugate.slurm import pending

    client = api.admin()
    for name in names:
        pool = "pool-%02d" % (int(name[3:]) % POOLS)
        client.create("/api/v1/nodes", {"metadata": {"name": name, "labels": {"gpugate.io/pool": pool},
                                                     "annotations": {PENDING: pending.publish("", REASON, now, key,
                                                                                              name, None)}}})
        client.patch(node_path(name, "status"), {"status": {"conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "bench",
             "lastHeartbeatTime": "2026-11-28T00:00:00Z", "lastTransitionTime": "2026-11-28T00:00:00Z"}]}},
            "strategic")
    client.close()


def with_key(work: str) -> bytes:
    """A drain budget key, written root-only in ``work`` as "key" (hex: gpugate.safety.budgetkey strips
    the file's whitespace, and random bytes may begin or end with some)."""
    key = os.urandom(32).hex().encode()
    with open(os.path.join(work, "key"), "wb") as handle:
        handle.write(key)
    os.chmod(os.path.join(work, "key"), 0o600)
    return key


def in_threads(target, items, threads: int, *args) -> float:
    """target(items[i::threads], *args) in ``threads`` threads; the seconds they took."""
    started = time.perf_counter()
    running = [threading.Thread(target=target, args=(items[i::threads],) + args) for i in range(threads)]
    for t in running:
        t.start()
    for t in running:
        t.join()
    return time.perf_counter() - started


class Counting:
    """The client, its requests counted by verb and path kind."""

    def __init__(self, client):
        self.client, self.seen = client, Counter()
        self._request = client.request

        def request(method, path, *args, **kwargs):
            kind = "list nodes" if path == "/api/v1/nodes" else (
                "lease" if "/leases" in path else "node")
            self.seen["%s %s" % (method, kind)] += 1
            return self._request(method, path, *args, **kwargs)
        client.request = request


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--share", type=float, default=0.1)
    parser.add_argument("--threads", type=int, default=8)
    args = parser.parse_args()
    from gpugate.budget import rules as budget
    from gpugate.keeper import run as keeper
    from gpugate.model.config import parse_settings
    from gpugate.kube.nodes import KubeNodes
    from gpugate.testbed.kube import KubeAPI

    work = tempfile.mkdtemp(prefix="gpugate-bench-kube-")
    key = with_key(work)
    api = KubeAPI(os.path.join(work, "api")).start()
    try:
        api.apply(os.path.join(ROOT, "deploy", "kubernetes"))  # the keeper's RBAC is all it has
        names = ["gpu%05d" % i for i in range(args.nodes)]
        now = int(time.time())
        took = in_threads(lambda part: _create(api, part, key, now), names, args.threads)
        print("kube-apiserver %s; %d nodes created in %.1f s (%d threads)" % (api.version, args.nodes, took,
                                                                              args.threads))
        kube = dict(api.kube_settings("keeper"), pool_label="gpugate.io/pool", namespace="gpugate",
                    lease_seconds=60.0, timeout_seconds=60.0)
        settings = parse_settings({"scheduler": "kubernetes", "kubernetes": kube,
                                   "drain_budget": {"max_share": args.share, "key_file": os.path.join(work, "key")},
                                   "sweep": {"journal": os.path.join(work, "sweep.db")}}, "(bench)")

        # The reference: one paginated list of the same nodes, alone.
        ref = KubeNodes(api.client("keeper"), kube, settings.reason_tag)
        t0 = time.perf_counter()
        states = ref.nodes(lean=True)
        list_s = time.perf_counter() - t0
        # The decision on those states: every proof checked, every pool planned.
        t0 = time.perf_counter()
        mine, unverified = keeper.screen(states, key, time.time(), {})
        plan = budget.plan(mine, settings.reason_tag, args.share)
        decide_s = time.perf_counter() - t0

        backend = KubeNodes(api.client("keeper", timeout=60.0), kube, settings.reason_tag)
        counting = Counting(backend.client)
        t0 = time.perf_counter()
        why = backend.lead("bench")
        figures = keeper.run_once(settings, backend, sleep=time.sleep)
        run_s = time.perf_counter() - t0
        assert not why, why
        print("decision (screen %d proofs + plan %d pools): %.3f s   (target < 2 s)"
              % (len(states), POOLS, decide_s))
        print("one paginated list alone (reference): %.3f s" % list_s)
        print("keeper run (Lease, list, re-read and drain each, list again): %.3f s   ratio run / list = %.1f"
              % (run_s, run_s / list_s))
        print("drained %d (planned %d, %d unverified), given back %d"
              % (len(figures["drained"]), len(plan.drain), len(unverified), len(figures["given_back"])))
        print("requests: %s (pages of 500: %d per list)" % (dict(sorted(counting.seen.items())),
                                                            -(-args.nodes // 500)))
        ok = decide_s < 2.0 and len(figures["drained"]) == len(plan.drain)
        return 0 if ok else 1
    finally:
        api.stop()


if __name__ == "__main__":
    sys.exit(main())
