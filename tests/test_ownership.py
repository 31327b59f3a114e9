"""Ownership rules: never clobber an admin, never downgrade, undrain only
self-clearing classes.  Table tests over the pure decision function."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpugate.model.findings import EVENTS, Finding, is_acute
from gpugate.model.reason import parse
from gpugate.model import ownership as o
from gpugate.slurm.nodestate import NodeState
from gpugate.model.verdict import decide

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


# An Xid (an event: read once from the kernel log) beside an ECC counter
# (read again at every check).
ECC2 = Finding("health", "ecc", "2", "0", "reboot", gpu=3)
ECC5 = Finding("health", "ecc", "5", "0", "reboot", gpu=3)
XID79 = Finding("health", "xid", "79", "none", "reboot", gpu=3)
XID48 = Finding("health", "xid", "48", "none", "reboot", gpu=3)


def test_an_event_stays_in_the_reason_while_a_counter_stands_beside_it():
    both = decide([ECC2, XID79], TAG)
    counter_alone = decide([ECC2], TAG)
    # The check after the one that read the Xid sees the counter alone: nothing to write.
    assert o.decide(node(True, both.reason), counter_alone, TAG, ()).kind == o.NONE
    # The counter grows: the reason follows it and keeps the Xid.
    grown = o.decide(node(True, both.reason), decide([ECC5], TAG), TAG, ())
    assert grown.kind == o.UPDATE and grown.reason == decide([ECC5, XID79], TAG).reason
    # A second Xid of the same GPU is a second event: both stay.
    second = o.decide(node(True, both.reason), decide([ECC2, XID48], TAG), TAG, ())
    assert second.kind == o.UPDATE and "xid:gpu3=79" in second.reason and "xid:gpu3=48" in second.reason
    # Counters are not kept: one gone from the verdict goes from the reason.
    gone = o.decide(node(True, decide([ECC2, Finding("health", "ecc", "1", "0", "reboot", gpu=1)], TAG).reason),
                    counter_alone, TAG, ())
    assert gone.kind == o.UPDATE and gone.reason == counter_alone.reason


def test_after_scontrol_reboot_the_events_before_it_are_not_kept():
    both = decide([ECC2, XID79], TAG)
    decision = o.decide(node(True, both.reason + " : reboot complete"), decide([ECC5], TAG), TAG, ())
    assert decision.kind == o.UPDATE and decision.reason == decide([ECC5], TAG).reason


def test_an_event_the_reason_shows_changed_is_still_the_same_event():
    fatal = Finding("health", "sxid", "sw1 12 fatal (link; 3)", "none", "reboot")
    shown = decide([ECC2, fatal], TAG)
    assert "fatal [link, 3]" in shown.reason
    # Read again by a later run beside the counter: the reason stays as it is.
    assert o.decide(node(True, shown.reason), shown, TAG, ()).kind == o.NONE
    assert o.decide(node(True, shown.reason), decide([ECC2], TAG), TAG, ()).kind == o.NONE


def test_events_are_kept_within_their_class_only():
    # An amdgpu event in a broken reason; then an acute health finding, which outranks it.
    held = decide([Finding("broken", "amdgpu_event", "init_failed", "none", "reboot", gpu=2)], TAG)
    health = decide([XID79], TAG)
    decision = o.decide(node(True, held.reason), health, TAG, ())
    # Another class replaces the reason whole: its first finding says what the drain counts as.
    assert decision.kind == o.UPDATE and decision.reason == health.reason
    # And a milder class never merges into a more severe reason: it is kept as it is.
    broken = decide([Finding("broken", "module", "none", "nvidia", "reconverge")], TAG)
    assert o.decide(node(True, health.reason), broken, TAG, ()).kind == o.KEEP


FINDINGS = st.one_of(
    st.builds(Finding, st.just("health"), st.sampled_from(["xid", "sxid", "amdgpu_event", "fallen_off_bus"]),
              # Values the reason shows changed (sanitized, cut at 64): never taken for new events.
              st.sampled_from(["79", "48", "94", "ue umc", "nvswitch 12 fatal", "sw1 12 fatal (link; 3)",
                               "across 4 nodes pairs=" + ",".join("gpu%03d" % i for i in range(20))]),
              st.just("none"),
              st.just("reboot"), st.one_of(st.none(), st.integers(0, 7))),
    st.builds(Finding, st.just("health"), st.sampled_from(["ecc", "row_remap", "nvlink", "ras", "gpu_count"]),
              st.sampled_from(["1", "2", "5", "pending"]), st.just("0"), st.just("reboot"),
              st.one_of(st.none(), st.integers(0, 7))),
)


@settings(max_examples=300, deadline=None)
@given(checks=st.lists(st.lists(FINDINGS, min_size=1, max_size=6), min_size=1, max_size=8))
def test_a_reason_settles_and_never_loses_an_event_it_showed(checks):
    """Check after check on one node: the reason Slurm holds is gpugate's,
    within 255 bytes; an event once shown stays shown while the reason has
    room (no "+N more"); and the same findings again write nothing, at most
    two writes after they changed (no write to slurmctld at every check)."""
    reason = ""
    for findings in checks:
        verdict = decide(findings, TAG)
        if not reason:
            reason = verdict.reason
            continue
        before = parse(reason, TAG)
        decision = o.decide(node(True, reason), verdict, TAG, ())
        if decision.kind == o.UPDATE:
            reason = decision.reason
        else:
            assert decision.kind in (o.NONE, o.KEEP), decision
        after = parse(reason, TAG)
        assert after is not None and len(reason.encode()) <= 255
        if not after.more and before.cls == after.cls:
            shown = {(f.component, f.gpu, f.observed) for f in after.findings}
            for f in before.findings:
                if f.component in EVENTS and is_acute(before.cls, f.component):
                    assert (f.component, f.gpu, f.observed) in shown, (before.text, reason)
        writes = 0
        while o.decide(node(True, reason), verdict, TAG, ()).kind == o.UPDATE:
            reason = o.decide(node(True, reason), verdict, TAG, ()).reason
            writes += 1
            assert writes <= 2, reason
