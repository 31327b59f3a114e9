"""Ownership rules: never clobber an admin, never downgrade, undrain only
self-clearing classes.  Table tests over the pure decision function."""

import pytest

from gpugate.findings import Finding
from gpugate.slurm import ownership as o
from gpugate.slurm.nodestate import NodeState
from gpugate.verdict import decide

TAG = "gpugate:"
FIT = decide([], TAG)
DRIFT = decide([Finding("drift", "driver", "550.54.15", "580.65.06", "reconverge")], TAG)
DRIFT2 = decide([Finding("drift", "driver", "550.54.16", "580.65.06", "reconverge")], TAG)
HEALTH = decide([Finding("health", "xid", "79", "none", "reboot", gpu=3)], TAG)
PROBE = decide([Finding("probe", "dcgm", "timeout", "answer", "investigate")], TAG)
# Budgeted health (the GPU count a nodeset expects) and acute broken (a stale module).
COUNT = decide([Finding("health", "gpu_count", "8", "4", "reboot")], TAG)
STALE = decide([Finding("broken", "module", "loaded 550.54.15", "on-disk 580.65.06", "reload_or_reboot")], TAG)


def node(drain=False, reason="", state="IDLE"):
    return NodeState(name="gpu01", state=state, flags=frozenset({"DRAIN"} if drain else ()), reason=reason,
                     reason_time=None, reason_user="root", partitions=("gpu",))


@pytest.mark.parametrize("state,verdict,kind", [
    (node(), FIT, o.NONE),
    (node(), DRIFT, o.DRAIN),
    (node(state="MIXED"), HEALTH, o.DRAIN),
    (node(True, "rack maintenance"), DRIFT, o.KEEP_ADMIN),
    (node(True, "rack maintenance"), FIT, o.KEEP_ADMIN),
    (node(True, ""), DRIFT, o.KEEP_ADMIN),
    (node(True, "Prolog error"), HEALTH, o.KEEP_ADMIN),
    (node(True, DRIFT.reason), DRIFT, o.NONE),
    (node(True, DRIFT.reason), DRIFT2, o.UPDATE),
    (node(True, DRIFT.reason), HEALTH, o.UPDATE),
    (node(True, HEALTH.reason), DRIFT, o.KEEP),
    (node(True, DRIFT.reason), FIT, o.KEEP),
    (node(True, HEALTH.reason), FIT, o.KEEP),
    (node(True, PROBE.reason), FIT, o.UNDRAIN),
    (node(True, PROBE.reason), DRIFT, o.UPDATE),
    (node(True, "gpugate: rma xid:gpu3=79 (want none)"), FIT, o.KEEP),
    (node(True, "gpugate: rollout driver=570.133.20 (want 580.65.06)"), DRIFT, o.KEEP),
    (None, DRIFT, o.UNKNOWN),
    # A DOWN node (not drained) with someone else's reason: DRAIN would replace it.
    (node(False, "PSU swap", state="DOWN"), DRIFT, o.KEEP_ADMIN),
    (node(False, "PSU swap", state="DOWN"), FIT, o.NONE),
    # The sweep's own reason while it works on the node: hands off.
    (node(True, "gpugate: drift sweep=reconverge batch 2 attempt 1 (want verified)"), DRIFT2, o.KEEP),
    (node(True, "gpugate: probe sweep=reboot batch 1 attempt 1 (want verified)"), FIT, o.KEEP),
    # During and after the sweep's `scontrol reboot nextstate=DOWN` Slurm
    # appends to the reason (recorded on 24.11): still the sweep's.
    (node(True, "gpugate: drift sweep=reconverge batch 1 attempt 1 (want verified) : reboot issued",
          state="DOWN"), DRIFT, o.KEEP),
    (node(False, "gpugate: drift sweep=reconverge batch 1 attempt 1 (want verified) : reboot issued"
          " : reboot complete", state="DOWN"), DRIFT, o.KEEP),
    (node(False, "gpugate: rma xid:gpu3=79 (want none)", state="DOWN"), HEALTH, o.KEEP),
    (node(False, "gpugate: drift sweep=reconverge batch 1 attempt 1 (want verified)", state="DOWN"), FIT, o.NONE),
    # A node-side reason with Slurm's suffix is still ours, findings and all.
    (node(True, DRIFT.reason + " : reboot issued", state="DOWN"), DRIFT2, o.UPDATE),
    (node(True, HEALTH.reason + " : reboot complete"), DRIFT, o.KEEP),
    # Acute outranks budgeted whatever the classes: a budgeted health reason
    # gives way to an acute broken one, never the other way round.
    (node(True, COUNT.reason), STALE, o.UPDATE),
    (node(True, STALE.reason), COUNT, o.KEEP),
    (node(True, COUNT.reason), HEALTH, o.UPDATE),
    (node(True, HEALTH.reason), COUNT, o.KEEP),
    (node(True, DRIFT.reason), COUNT, o.UPDATE),
])
def test_decision(state, verdict, kind):
    decision = o.decide(state, verdict, TAG, ("probe",))
    assert decision.kind == kind, decision
    if kind in (o.DRAIN, o.UPDATE):
        assert decision.reason == verdict.reason


def test_self_clearing_is_configurable():
    assert o.decide(node(True, DRIFT.reason), FIT, TAG, ("probe", "drift")).kind == o.UNDRAIN
    assert o.decide(node(True, PROBE.reason), FIT, TAG, ()).kind == o.KEEP
