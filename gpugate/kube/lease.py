"""One budget keeper acts at a time on Kubernetes: a coordination.k8s.io/v1
Lease, taken when free or expired, renewed by its holder each run.  Every
write carries the resourceVersion read, so of two keepers that find the
Lease free at once exactly one takes it (the other gets 409).

A keeper that stops renews nothing: its Lease expires after
leaseDurationSeconds and another takes over; until then nothing is
drained by anyone, which is the fail-safe side (budgeted findings wait,
published; acute ones never wait for the keeper)."""

from __future__ import annotations

import calendar
import time

from gpugate.core.jsontext import loads_bounded
from gpugate.kube.client import KubeError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Optional

NAME = "gpugate-budget-keeper"
# Hosts' clocks differ: a Lease counts as expired only this long after
# renewTime + leaseDurationSeconds by ours (client-go times expiry from when
# it saw the last change; a keeper started by a timer has no such memory).
SKEW_SECONDS = 10.0


def _micro(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(at)) + ".%06dZ" % int((at % 1) * 1e6)


def _parse(text) -> Optional[float]:
    if not isinstance(text, str) or len(text) < 20:
        return None
    try:
        whole = calendar.timegm(time.strptime(text[:19], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None
    frac = text[19:].rstrip("Z")
    try:
        return whole + (float(frac) if frac.startswith(".") else 0.0)
    except ValueError:
        return whole


def _refused(namespace: str, name: str, what: str, exc: KubeError) -> KubeError:
    """The API's refusal, said as the keeper's: a failed run, never a standby."""
    return KubeError("the keeper's Lease %s/%s %s: %s" % (namespace, name, what, exc), exc.status, exc.reason)


def acquire(client, namespace: str, identity: str, seconds: float, clock=time.time, name: str = NAME) -> str:
    """"" when ``identity`` holds the Lease now (taken or renewed), else why
    it stands by (another holder, not yet expired; a race lost to another
    keeper).  KubeError when the Lease cannot be read, created or written,
    or says something it cannot judge: a failed run, never a quiet standby."""
    path = "/apis/coordination.k8s.io/v1/namespaces/%s/leases/%s" % (namespace, name)
    now = clock()
    try:
        lease = client.get(path)
    except KubeError as exc:
        if exc.status != 404:
            raise _refused(namespace, name, "cannot be read", exc) from None
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"holderIdentity": identity, "leaseDurationSeconds": int(seconds),
                         "acquireTime": _micro(now), "renewTime": _micro(now), "leaseTransitions": 0}}
        try:
            client.create("/apis/coordination.k8s.io/v1/namespaces/%s/leases" % namespace, body)
        except KubeError as exc2:
            if exc2.status == 409:
                return "another keeper created the Lease %s/%s at the same moment" % (namespace, name)
            raise _refused(namespace, name, "was not created", exc2) from None
        return ""
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity") or ""
    renewed = _parse(spec.get("renewTime"))
    duration = spec.get("leaseDurationSeconds")
    duration = float(duration) if isinstance(duration, (int, float)) else float(seconds)
    gave_up = annotation(lease, RELEASED)
    if not holder and gave_up.get("by") == identity and isinstance(gave_up.get("at"), (int, float)) \
            and now < gave_up["at"] + float(seconds):
        # It gave the Lease up after failed runs: another replica takes it first (alone, it takes it again).
        return ("this keeper gave up the Lease %s/%s %.0fs ago after %s failed runs: another replica may take "
                "it first (this one again after %.0fs)" % (namespace, name, now - gave_up["at"],
                                                           gave_up.get("failed_runs", "?"), float(seconds)))
    if holder and holder != identity:
        if renewed is None:
            raise KubeError("the keeper's Lease %s/%s is held by %s with a renewTime that cannot be read (%r): "
                            "not taken; delete the Lease if that keeper is gone"
                            % (namespace, name, holder, spec.get("renewTime")))
        if now < renewed + duration + SKEW_SECONDS:
            return ("another keeper leads: %s holds the Lease %s/%s, renewed %.0fs ago (expires after %.0fs)"
                    % (holder, namespace, name, now - renewed, duration))
    changed = holder != identity
    spec = dict(spec, holderIdentity=identity, leaseDurationSeconds=int(seconds), renewTime=_micro(now))
    if changed:
        spec["acquireTime"] = _micro(now)
        spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if holder or gave_up else 0)
    lease["spec"] = spec
    try:
        client.replace(path, lease)  # its metadata.resourceVersion: the write fails if anyone wrote since
    except KubeError as exc:
        if exc.status == 409:
            return "another keeper took or renewed the Lease %s/%s at the same moment" % (namespace, name)
        raise _refused(namespace, name, "was not written", exc) from None
    return ""


# The keeper's memory (gpugate.budget.memory, and gpugate.budget.pools) rides on its Lease: a failover keeps it.
MEMORY = "gpugate.io/keeper-memory"
MEMORY_CAP = 128 << 10  # of the 256 KiB a Node's or Lease's annotations may hold in all
# The leader's latest run: what `gpugate status` and every replica's metrics say of the keeper.
STATUS = "gpugate.io/keeper-status"
# Who gave the Lease up after failed runs, and when (acquire: another replica takes it first).
RELEASED = "gpugate.io/keeper-released"
STATUS_KEYS = ("at", "by", "ok", "last_ok", "last_ok_by", "failed_runs", "error", "drained", "given_back", "held",
                "unverified")


def lease_path(namespace: str, name: str) -> str:
    return "/apis/coordination.k8s.io/v1/namespaces/%s/leases/%s" % (namespace, name)


def annotation(lease, key: str) -> dict:
    """A JSON annotation of gpugate's on the Lease as a dict ({} when absent or not JSON)."""
    text = ((lease.get("metadata") or {}).get("annotations") or {}).get(key)
    try:
        data = loads_bounded(text) if isinstance(text, str) else None
    except ValueError:  # not JSON, or nested past any record of ours
        return {}
    return data if isinstance(data, dict) else {}


def read_status(client, namespace: str, name: str = NAME) -> dict:
    """The keeper as its Lease tells it: the leader's latest run (STATUS),
    the holder and when it renewed.  {} when there is no Lease yet."""
    try:
        lease = client.get(lease_path(namespace, name))
    except KubeError as exc:
        if exc.status == 404:
            return {}
        raise
    spec = lease.get("spec") or {}
    status = {k: v for k, v in annotation(lease, STATUS).items() if k in STATUS_KEYS}
    status.update(holder=str(spec.get("holderIdentity") or ""), renewed=_parse(spec.get("renewTime")))
    gave_up = annotation(lease, RELEASED)
    if gave_up:
        status["released"] = gave_up
    return status


def held_by(client, namespace: str, identity: str, name: str):
    lease = client.get(lease_path(namespace, name))
    if (lease.get("spec") or {}).get("holderIdentity") != identity:
        raise KubeError("the keeper's Lease %s/%s is no longer %s's: nothing written on it" % (
            namespace, name, identity))
    return lease


def annotate(lease, values: dict) -> None:
    import json

    meta = lease.setdefault("metadata", {})
    annotations = dict(meta.get("annotations") or {})
    for key, value in values.items():
        if value is None:
            annotations.pop(key, None)
        else:
            annotations[key] = json.dumps(value, sort_keys=True, separators=(",", ":"))
    meta["annotations"] = annotations


def note_failure(client, namespace: str, identity: str, status: dict, give_up: bool, clock=time.time,
                 name: str = NAME) -> None:
    """A failed run of the leader, said on its Lease (STATUS); with
    ``give_up`` the Lease is released too (no holder, RELEASED naming this
    keeper), so another replica takes it at its next run instead of
    waiting for a Lease renewed before every failed run (issue 45)."""
    lease = held_by(client, namespace, identity, name)
    before = annotation(lease, STATUS)  # the last good run stands: a failed one does not move it
    kept = {k: before[k] for k in ("last_ok", "last_ok_by") if k in before}
    values = {STATUS: dict(kept, **{k: v for k, v in status.items() if k in STATUS_KEYS and k not in kept})}
    if give_up:
        spec = dict(lease.get("spec") or {})
        spec.pop("holderIdentity", None)
        spec["renewTime"] = _micro(clock())
        lease["spec"] = spec
        values[RELEASED] = {"by": identity, "at": round(clock(), 3), "failed_runs": status.get("failed_runs")}
    annotate(lease, values)
    client.replace(lease_path(namespace, name), lease)
