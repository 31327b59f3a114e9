"""A Kubernetes Node object as gpugate reads and writes it.  Pure functions.

Reading: ``state_of`` turns a Node into the NodeState the ownership rules
(gpugate.model.ownership), the budgeted publish (gpugate.node.hold) and
the keeper (gpugate.keeper.run) already decide on, so one set of rules holds
on both schedulers:

- held ("DRAIN"): gpugate's own taint (``TAINT_KEY``, listed in the
  ``OWNED`` annotation), or gpugate's own cordon; or someone else's hold:
  a cordon gpugate did not make, or a taint with gpugate's key that its
  annotation does not list.  Someone else's hold reads as a reason
  without gpugate's tag, so it is never touched (KEEP_ADMIN);
- the reason: gpugate's reason text, from its annotation;
- the comment: the budgeted finding published for the keeper (``PENDING``);
- the partition: the node's value of the pool label the site names.

Writing: merge patches that carry the resourceVersion just read, so a
change made in between fails the write (409) instead of being lost; a taint
list is written whole, everyone else's taints as they were."""

from __future__ import annotations

import json

from gpugate.model.findings import CLASSES
from gpugate.core.jsontext import loads_bounded
from gpugate.slurm.nodestate.record import NodeState
from gpugate.kube import gpushare
from gpugate.kube.condition import CONDITION  # noqa: F401 (read by the demo and the tests as nodeview.CONDITION)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Dict

TAINT_KEY = "gpugate.io/unfit"
OWNED = "gpugate.io/owned"  # what gpugate set on this node: reason, when, its taints' effects, its cordon
PENDING = "gpugate.io/pending"  # a budgeted finding, signed, for the keeper (gpugate.slurm.pending's text)
FOREIGN_CORDON = "cordoned (spec.unschedulable) by someone else"


def owned(node: Dict[str, Any]) -> Dict[str, Any]:
    """gpugate's ownership record, or {} (absent or not gpugate's shape)."""
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(OWNED)
    try:
        record = loads_bounded(text) if isinstance(text, str) else None
    except ValueError:  # not JSON, or nested past any record of ours
        return {}
    if not isinstance(record, dict) or not isinstance(record.get("reason"), str):
        return {}
    effects = record.get("effects")
    if not isinstance(effects, list) or not all(e in ("NoSchedule", "NoExecute") for e in effects):
        return {}
    return record


def _taints(node) -> list:
    taints = (node.get("spec") or {}).get("taints") or []
    return [t for t in taints if isinstance(t, dict)]


def our_taints(node) -> list:
    """The taints with gpugate's key that its annotation lists."""
    effects = owned(node).get("effects") or []
    return [t for t in _taints(node) if t.get("key") == TAINT_KEY and t.get("effect") in effects]


def foreign_taints(node) -> list:
    """Taints with gpugate's key that gpugate did not write (a copy, a paste)."""
    mine = our_taints(node)
    return [t for t in _taints(node) if t.get("key") == TAINT_KEY and t not in mine]


def hold_of(node: Dict[str, Any]) -> tuple:
    """What of a Node gpugate's decisions rest on: its record and pending
    mark as written, its key's taints, the cordon.  Two reads with the same
    hold differ only in what others write (a kubelet's status, labels)."""
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    taints = [t for t in _taints(node) if t.get("key") == TAINT_KEY]
    return (annotations.get(OWNED), annotations.get(PENDING), repr(taints),
            bool((node.get("spec") or {}).get("unschedulable")))


def _ready(node) -> str:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == "Ready":
            return str(cond.get("status"))
    return "Unknown"


def state_of(node: Dict[str, Any], pool_label: str = "", offers: bool = False) -> NodeState:
    """offers: the cluster holds GPUs alone (device_holds, DeviceTaintRule
    served): a waiting node's offer to be held so counts its share."""
    meta, spec = node.get("metadata") or {}, node.get("spec") or {}
    record = owned(node)
    cordoned = bool(spec.get("unschedulable"))
    # gpugate writes its taint and its cordon together: without its taint, a
    # record left behind (an admin lifted the hold by hand) owns nothing,
    # and a cordon there now is whoever's made it.
    ours = bool(our_taints(node)) or bool(devices_held(node))
    reason = ""
    if ours:
        reason = record["reason"]
    elif foreign_taints(node):
        t = foreign_taints(node)[0]
        reason = "taint %s=%s:%s not written by gpugate" % (TAINT_KEY, t.get("value", ""), t.get("effect", ""))
    elif cordoned:
        reason = FOREIGN_CORDON
    flags = {"DRAIN"} if reason else set()
    ready = _ready(node)
    if ready == "Unknown":
        flags.add("NOT_RESPONDING")
    labels = meta.get("labels") or {}
    # The budget's pools: the label's value; a node without it is in none,
    # so the keeper holds its findings ("in no partition") and drains nothing there.
    pools = ((str(labels[pool_label]),) if labels.get(pool_label) else ()) if pool_label else ("all",)
    at = record.get("at") if ours else None
    share = 1.0  # of a node, for the drain budget (gpugate.kube.gpushare)
    comment, offer = gpushare.split(str((meta.get("annotations") or {}).get(PENDING) or ""))
    if ours and not our_taints(node):
        share = gpushare.held_share(record)
    elif offers and not reason:
        share = gpushare.waiting_share(offer)
    return gpushare.kind(share)(
        name=str(meta.get("name", "")), state="IDLE" if ready == "True" else "DOWN", flags=frozenset(flags),
        reason=reason, reason_time=int(at) if isinstance(at, (int, float)) else None, reason_user="",
        partitions=pools, comment=comment)


def drain_patch(node: Dict[str, Any], reason: str, cls: str, no_execute: bool, now: int,
                cordon: bool = True) -> Dict[str, Any]:
    """Hold the node for ``reason``: gpugate's taint (its value the class),
    its cordon unless someone else's stands, its ownership record.
    no_execute: a NoExecute taint too (the caller passes it for an acute
    finding only, where the site asked).  cordon=False: the taint alone
    (Slurm on Kubernetes: a cordon there is the operator's signal to drain
    Slurm itself, gpugate.kube.paired).  Raises ValueError when a taint
    with gpugate's key is not gpugate's, or the read has no resourceVersion."""
    if foreign_taints(node):
        raise ValueError("a %s taint on the node was not written by gpugate: left alone" % TAINT_KEY)
    record, spec = owned(node), node.get("spec") or {}
    value = cls if cls in CLASSES else "probe"
    effects = ["NoSchedule"] + (["NoExecute"] if no_execute else [])
    mine = our_taints(node)
    taints = [t for t in _taints(node) if t not in mine]
    for effect in effects:
        taint = {"key": TAINT_KEY, "value": value, "effect": effect}
        same = [t for t in mine if t.get("effect") == effect and t.get("value") == value]
        taints.append(same[0] if same else taint)  # (its timeAdded kept when unchanged)
    held = bool(mine)  # a record without gpugate's taint is a leftover: it owns no cordon and no time
    cordon_ours = (held and record.get("cordon") is True) if spec.get("unschedulable") else cordon
    keep_at = held and record.get("reason") == reason and isinstance(record.get("at"), (int, float))
    new = {"reason": reason, "at": int(record["at"]) if keep_at else int(now), "effects": effects,
           "cordon": cordon_ours}
    if device_rules(node):  # the GPUs gpugate held alone stay named: lifted with the Node (KubeNodes.undrain)
        new["devices"] = device_rules(node)
    body: Dict[str, Any] = {"taints": taints}
    if cordon:
        body["unschedulable"] = True
    return {"metadata": _precondition(node, {OWNED: json.dumps(new, sort_keys=True)}), "spec": body}


def devices_held(node: Dict[str, Any]) -> list:
    """The DeviceTaintRules gpugate's record says hold this node's GPUs
    instead of the Node (gpugate.kube.dra): [] when none, or when gpugate's
    taint holds the Node."""
    return [] if our_taints(node) else device_rules(node)


def device_rules(node: Dict[str, Any]) -> list:
    """The DeviceTaintRules gpugate's record names, whether or not its
    taint holds the Node too (the sweep's work reason keeps them named)."""
    names = owned(node).get("devices")
    return list(names) if isinstance(names, list) and all(isinstance(n, str) for n in names) else []


def device_patch(node: Dict[str, Any], reason: str, devices, now: int, gpus=None, of: int = 0) -> Dict[str, Any]:
    """Hold GPUs, not the Node: gpugate's record with the rules that hold
    them (no taint, no cordon: the other GPUs keep serving), and which GPUs
    of how many (the budget's share: gpugate.kube.gpushare; kept from the
    record when not given).  Raises ValueError as drain_patch does."""
    if foreign_taints(node):
        raise ValueError("a %s taint on the node was not written by gpugate: left alone" % TAINT_KEY)
    record = owned(node)
    keep_at = record.get("reason") == reason and isinstance(record.get("at"), (int, float))
    new = {"reason": reason, "at": int(record["at"]) if keep_at else int(now), "effects": [], "cordon": False,
           "devices": sorted(devices)}
    gpus, of = (sorted(gpus), of) if gpus else (record.get("gpus"), record.get("of"))
    if gpushare.fraction(gpus, of) < 1:
        new.update(gpus=gpus, of=of)
    return {"metadata": _precondition(node, {OWNED: json.dumps(new, sort_keys=True)})}


def undrain_patch(node: Dict[str, Any]) -> Dict[str, Any]:
    """Lift gpugate's hold only: its taints, its cordon (not someone
    else's), its ownership record."""
    record, spec = owned(node), node.get("spec") or {}
    mine = our_taints(node)
    patch = {"metadata": _precondition(node, {OWNED: None})}
    body = {}
    if mine:
        body["taints"] = [t for t in _taints(node) if t not in mine]
    if spec.get("unschedulable") and mine and record.get("cordon") is True:
        body["unschedulable"] = False
    if body:
        patch["spec"] = body
    return patch


def return_patch(node: Dict[str, Any]) -> Dict[str, Any]:
    """The sweep's return of a node after its proof: undrain_patch, and in the same patch the
    transport's request and answer where still there (one the sweep gave up on, up to 64 KiB:
    the node agent's admission policy lets it remove the request, the sweep's lets it remove both)."""
    from gpugate.kube.channel import ANSWER, REQUEST

    patch = undrain_patch(node)
    there = (node.get("metadata") or {}).get("annotations") or {}
    patch["metadata"]["annotations"].update({key: None for key in (REQUEST, ANSWER) if key in there})
    return patch


def comment_patch(node: Dict[str, Any], text: str) -> Dict[str, Any]:
    return {"metadata": _precondition(node, {PENDING: text or None})}


def _precondition(node, annotations) -> Dict[str, Any]:
    """Every write carries the resourceVersion it was decided on: without
    one a merge patch would replace the node's whole taint list blind."""
    version = (node.get("metadata") or {}).get("resourceVersion")
    if not isinstance(version, str) or not version:
        raise ValueError("the Node read has no resourceVersion: nothing is written on it")
    return {"annotations": annotations, "resourceVersion": version}


def slim(node: Dict[str, Any]) -> Dict[str, Any]:
    """Only what gpugate reads or writes of a Node (a real one carries its
    images and more, 10-20 KB; the keeper holds thousands)."""
    meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    keep = {"metadata": {k: meta[k] for k in ("name", "uid", "resourceVersion", "labels", "annotations")
                         if k in meta},
            "spec": {k: spec[k] for k in ("taints", "unschedulable") if k in spec},
            "status": {"conditions": status.get("conditions") or [],
                       "nodeInfo": {"bootID": (status.get("nodeInfo") or {}).get("bootID") or ""}}}
    for key in ("kind", "apiVersion"):
        if key in node:
            keep[key] = node[key]
    return keep
