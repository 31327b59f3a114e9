"""The drain reason: ASCII, one line, <= 255 bytes, class first, parses back."""

from hypothesis import assume, given, settings, strategies as st

from gpugate.model import reason
from gpugate.model.findings import CHECK_CLASSES, Finding, class_rank
from gpugate.model.verdict import decide

TAG = "gpugate:"
findings_st = st.builds(
    Finding,
    cls=st.sampled_from(CHECK_CLASSES),
    component=st.text(min_size=1, max_size=40),
    observed=st.text(max_size=300),
    expected=st.text(max_size=300),
    action=st.sampled_from(["reconverge", "reboot", "rma"]),
    gpu=st.one_of(st.none(), st.integers(0, 2000)),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(findings_st, min_size=1, max_size=30), st.sampled_from(["gpugate:", "GG:", "nhc-gpu:"]))
def test_rendered_reason_is_bounded_ascii_one_line_and_parses_back(findings, tag):
    verdict = decide(findings, tag)
    text = verdict.reason
    assert len(text.encode("ascii")) <= reason.MAX_BYTES
    assert "\n" not in text and "\r" not in text
    assert all(32 <= ord(c) < 127 for c in text)
    assert text.startswith("%s %s" % (tag, verdict.cls))
    parsed = reason.parse(text, tag)
    assert parsed is not None and parsed.cls == verdict.cls
    # Acute findings lead (Slurm's copy tells an acute drain from a budgeted
    # one), then the most severe class.
    leading = [f for f in findings if f.acute] or findings
    assert parsed.cls == max((f.cls for f in leading), key=class_rank)
    # Every finding is either shown or counted in "+N more".
    assert len(parsed.findings) + parsed.more == len(findings)
    first, lead = parsed.first, verdict.findings[0]
    assert first.component == reason._component(lead.component)
    assert first.gpu == (lead.gpu if lead.gpu is not None and lead.gpu < 1000 else None)


@settings(max_examples=100, deadline=None)
@given(st.lists(findings_st, min_size=1, max_size=5),
       st.lists(st.sampled_from([" : reboot issued", " : reboot complete"]), min_size=1, max_size=3))
def test_slurms_reboot_suffixes_leave_the_reason_ours_and_its_findings(findings, suffixes):
    # slurmctld appends these around `scontrol reboot nextstate=...`.
    text = decide(findings, TAG).reason
    plain, suffixed = reason.parse(text, TAG), reason.parse(text + "".join(suffixes), TAG)
    assert suffixed is not None
    assert (suffixed.cls, suffixed.findings, suffixed.more) == (plain.cls, plain.findings, plain.more)
    assert suffixed.text == text + "".join(suffixes)


def test_first_twenty_characters_say_owner_and_class():
    f = Finding("drift", "driver", "550.54.15", "580.65.06", "reconverge")
    text = decide([f], TAG).reason
    assert text == "gpugate: drift driver=550.54.15 (want 580.65.06)"
    assert text[:20] == "gpugate: drift drive"


def test_most_severe_class_leads_and_more_is_counted():
    fs = [Finding("drift", "kernel", "6.1.0-26", "6.1.0-27", "reconverge"),
          Finding("health", "xid", "79", "none", "reboot", gpu=3)]
    text = decide(fs, TAG).reason
    assert text == "gpugate: health xid:gpu3=79 (want none); kernel=6.1.0-26 (want 6.1.0-27)"
    many = [Finding("drift", "vbios", "96.00.%02d.00.01" % i, "96.00.99.00.01", "reconverge", gpu=i)
            for i in range(40)]
    text = decide(many, TAG).reason
    parsed = reason.parse(text, TAG)
    assert text.endswith("more") and parsed.more == 40 - len(parsed.findings) and len(text) <= 255


def test_values_cannot_forge_structure():
    f = Finding("drift", "driver", "1; +9 more", "x (want y)", "reconverge")
    parsed = reason.parse(decide([f], TAG).reason, TAG)
    assert len(parsed.findings) == 1 and parsed.more == 0


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_parse_never_raises_and_foreign_reasons_are_not_ours(text):
    parsed = reason.parse(text, TAG)
    if parsed is not None:
        assert text.startswith(TAG + " ")


def test_foreign_reasons_are_not_ours():
    for text in ["rack maintenance", "Prolog error", "Epilog error", "Kill task failed", "Not responding",
                 "Node unexpectedly rebooted", "reboot requested", "Reboot ASAP", "", None,
                 "gpugate:drift x", "gpugate: weird x=1 (want 2)", "NHC: nv_health: GPU lost"]:
        assert reason.parse(text, TAG) is None, text


@settings(max_examples=200, deadline=None)
@given(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}", fullmatch=True),
       st.from_regex(r"/[a-z0-9_./-]{1,300}", fullmatch=True), st.lists(findings_st, max_size=5))
def test_an_uncovered_node_renders_bounded_and_parses_back(node, path, others):
    """Item 7: the finding for a node no [nodes] section names, alone or
    after other findings, with any node name and baseline path."""
    from gpugate.model.baseline import parse_baseline
    from gpugate.judges import _uncovered

    assume(node not in ("x-not-this-node1", "x-not-this-node2"))
    baseline = parse_baseline({"pin": {"driver": "1"}, "nodes": {"x-not-this-node[1-2]": {"gpus": 8}}}, path)
    uncovered = _uncovered(baseline, node)
    assert [(f.cls, f.component, f.observed) for f in uncovered] == [("probe", "uncovered", node)]
    assert uncovered[0].expected == "a [nodes] section in %s" % path
    alone = decide(uncovered, TAG).reason
    assert len(alone.encode("ascii")) <= reason.MAX_BYTES
    parsed = reason.parse(alone, TAG)
    assert parsed.cls == "probe" and parsed.more == 0
    assert (parsed.first.component, parsed.first.observed) == ("uncovered", node)
    assert parsed.first.expected.startswith("a [nodes] section in ")
    mixed = decide(others + uncovered, TAG).reason
    assert len(mixed.encode("ascii")) <= reason.MAX_BYTES
    parsed = reason.parse(mixed, TAG)
    assert len(parsed.findings) + parsed.more == len(others) + 1


def test_an_acute_finding_leads_the_reason_over_a_more_severe_budgeted_one():
    budgeted = Finding("health", "0", "", "", "reconverge")  # not in findings.ACUTE
    acute = Finding("broken", "dkms", "", "", "reconverge")
    assert acute.acute and not budgeted.acute
    verdict = decide([budgeted, acute], TAG)
    assert verdict.cls == "broken" and reason.parse(verdict.reason, TAG).first.component == "dkms"
