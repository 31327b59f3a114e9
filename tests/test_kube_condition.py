"""The GpugateHealthy condition as node-problem-detector's readers know
one (gpugate.kube.condition): CamelCase reasons derived from gpugate's
findings, Unknown for "could not tell", the heartbeat on every write.  Pure;
the same on a real kube-apiserver: tests/test_kube_agent.py."""

import copy

from hypothesis import given, settings, strategies as st

from gpugate.model import reason as reasons
from gpugate.model.findings import CLASSES, Finding
from gpugate.kube import condition as cond

TAG = "gpugate:"
ECC = "gpugate: health ecc:gpu6=4 uncorrected (want <= 0)"
XID79 = "gpugate: health xid:gpu2=79 (want none)"
DRIVER = "gpugate: drift driver=550.54.15 (want 580.65.06)"
PROBE = "gpugate: probe dcgm_health=host engine down (want answer)"
RMA = "gpugate: rma sweep=rma repeat offender"


def node(conditions=()):
    return {"metadata": {"name": "gpu01"}, "status": {"conditions": [dict(c) for c in conditions]}}


def test_reasons_name_the_finding_in_camel_case():
    assert cond.wanted(False, "health", XID79, TAG) == ("False", "XidFallenOffBus", XID79)
    assert cond.wanted(False, "drift", DRIVER, TAG) == ("False", "DriverDrift", DRIVER)
    assert cond.wanted(False, "health", ECC, TAG)[1] == "EccFault"
    assert cond.wanted(True, "", "", TAG) == ("True", "Fit", "fit")
    status, word, message = cond.wanted(True, "", "", TAG, held=XID79)
    assert (status, word) == ("True", "FitHeld") and XID79 in message  # the precise reason kept
    assert cond.wanted(True, "", "", TAG, held=RMA)[1] == "AwaitingRepair"
    assert cond.wanted(True, "", "", TAG, held="gpugate: health sweep=reboot (want verified)")[1] == "SweepInProgress"


def test_could_not_tell_is_unknown_never_false():
    assert cond.wanted(False, "probe", PROBE, TAG) == ("Unknown", "DcgmHealthUnknown", PROBE)
    assert cond.not_run("timed out after 330s")[0] == "Unknown"


findings = st.builds(
    Finding, cls=st.sampled_from(("health", "broken", "drift", "probe")),
    component=st.text(min_size=0, max_size=300), observed=st.text(max_size=40), expected=st.text(max_size=10),
    action=st.just(""), gpu=st.one_of(st.none(), st.integers(-5, 2000)))


@settings(max_examples=400, deadline=None)
@given(st.booleans(), st.sampled_from(CLASSES + ("", "weird")), st.lists(findings, max_size=4),
       st.one_of(st.none(), st.text(max_size=300)), st.booleans())
def test_every_reason_is_camel_case_and_short(fit, cls, found, raw, held):
    """Whatever the findings (components are anyone's words: a judge's, a
    reason read back from a Node), the reason is [A-Z][A-Za-z0-9]*, <= 128."""
    text = raw if raw is not None else (reasons.render(TAG, found[0].cls, found) if found else "")
    if fit:
        status, word, message = cond.wanted(True, "", "", TAG, held=text if held else "")
    else:
        status, word, message = cond.wanted(False, cls, text, TAG)
        assert message == text
        assert status == ("Unknown" if cls == "probe" else "False")
    assert cond.REASON_RE.match(word) and len(word) <= cond.REASON_MAX, word
    parsed = reasons.parse(text, TAG)
    assert cond.REASON_RE.match(cond.reason_word(fit, parsed, cls)), parsed


def test_the_heartbeat_moves_on_every_write_and_the_transition_only_with_the_status():
    want = cond.wanted(False, "health", ECC, TAG)
    first = cond.patch(node(), want, "2026-11-28T00:00:00Z")["status"]["conditions"][0]
    assert first["type"] == cond.CONDITION and first["lastTransitionTime"] == first["lastHeartbeatTime"]
    written = node([first])
    again = cond.patch(written, want, "2026-11-28T00:05:00Z")["status"]["conditions"][0]
    assert again["lastHeartbeatTime"] == "2026-11-28T00:05:00Z"  # written although nothing changed
    assert again["lastTransitionTime"] == "2026-11-28T00:00:00Z"
    fit = cond.patch(node([again]), cond.wanted(True, "", "", TAG, held=ECC), "2026-11-28T00:10:00Z")
    fit = fit["status"]["conditions"][0]
    assert fit["lastTransitionTime"] == "2026-11-28T00:10:00Z" and fit["status"] == "True"
    # Unread (the fit run's heartbeat): no transition time named, the server keeps its own.
    blind = cond.patch(None, cond.wanted(True, "", "", TAG), "2026-11-28T00:15:00Z")["status"]["conditions"][0]
    assert "lastTransitionTime" not in blind and blind["lastHeartbeatTime"] == "2026-11-28T00:15:00Z"
    assert cond.current(copy.deepcopy(node([fit]))) == fit
