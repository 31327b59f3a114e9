"""The one-RPC read's text (gpugate.slurm.nodestate.show_text): what
slurm_sprint_node_table prints, read exactly or refused, never misread.
Real captures of every release: tests/test_slurm_fixtures.py; the read on a
real slurmctld: tests/test_slurm_node_read.py."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpugate.errors import ParseError
from gpugate.slurm.nodestate.show_text import parse_show_node


def sprint(name, state, reason="", when=0, user="root", comment=None, extra=None, one_liner=False):
    """Slurm 25.11's slurm_sprint_node_table (src/api/node_info.c), the
    lines gpugate reads and a few around them, as that C code builds them."""
    end = " " if one_liner else "\n   "
    out = "NodeName=%s Arch=x86_64 CoresPerSocket=1 " % name + end
    out += "CPUAlloc=0 CPUEfctv=1 CPUTot=1 CPULoad=0.10" + end
    out += "State=%s ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A" % state + end
    out += "BootTime=1795783470 SlurmdStartTime=1795809046" + end
    out += "CurrentWatts=0 AveWatts=0"
    if reason:
        out += end
        tokens = [t for t in reason.split("\n") if t]  # strtok_r(reason, "\n")
        for i, tok in enumerate(tokens):
            out += ("Reason=" if i == 0 else end + "       ") + tok
            if i == 0 and when:
                out += " [%s@%d]" % (user, when)
    if comment is not None:
        out += end + "Comment=" + comment
    if extra is not None:
        out += end + "Extra=" + extra
    return out + ("\n" if one_liner else "\n\n")


def both(*args, **kw):
    return sprint(*args, **kw), sprint(*args, one_liner=True, **kw)


def test_a_drained_node_with_a_comment():
    text, line = both("gpu02", "IDLE+DRAIN", "gpugate: drift driver=1 (want 2) [x@1]", 1795809048,
                      comment='rack 3 [gpugate-pending @1764120000] x=1 [/gpugate-pending]', extra="e")
    node = parse_show_node(text, line, "gpu02")
    assert (node.state, node.flags, node.reason, node.reason_time, node.reason_user) == (
        "IDLE", frozenset({"DRAIN"}), "gpugate: drift driver=1 (want 2) [x@1]", 1795809048, "root")
    assert node.comment == "rack 3 [gpugate-pending @1764120000] x=1 [/gpugate-pending]"
    assert node.partitions == () and node.drained


def test_a_node_in_service_has_no_reason_and_no_comment():
    node = parse_show_node(*both("gpu01", "MIXED"), "gpu01")
    assert (node.state, node.flags, node.reason, node.reason_time, node.comment) == ("MIXED", frozenset(), "",
                                                                                      None, "")


def test_a_forged_field_line_in_a_comment_is_refused():
    text, line = both("gpu01", "IDLE", comment="rack 3\n   State=DOWN")
    with pytest.raises(ParseError, match="line break"):
        parse_show_node(text, line, "gpu01")


def test_a_reason_of_several_lines_is_refused():
    with pytest.raises(ParseError, match="several lines"):
        parse_show_node(*both("gpu01", "IDLE+DRAIN", "PSU\n   Comment=x", 5), "gpu01")


def test_a_reason_time_not_in_epoch_seconds_is_refused():
    text, line = both("gpu01", "IDLE+DRAIN", "PSU", 0)
    text = text.replace("Reason=PSU", "Reason=PSU [root@2026-11-27T19:45:34]")
    line = line.replace("Reason=PSU", "Reason=PSU [root@2026-11-27T19:45:34]")
    with pytest.raises(ParseError, match="epoch"):
        parse_show_node(text, line, "gpu01")


def test_another_nodes_record_is_refused():
    with pytest.raises(ParseError):
        parse_show_node(*both("gpu011", "IDLE"), "gpu01")


@pytest.mark.parametrize("bad", [None, 3, b"NodeName=gpu01 "])
def test_what_is_not_text_is_refused(bad):
    with pytest.raises(ParseError):
        parse_show_node(bad, bad, "gpu01")


_TEXT = st.lists(st.sampled_from(list("ab Z=[]@|,;%\\\"\n") + ["   State=DOWN", " [x@1]", "\u2028"]),
                 max_size=12).map("".join)
_STATES = ["IDLE", "IDLE+DRAIN", "MIXED+DRAIN", "ALLOCATED+DRAIN+COMPLETING", "DOWN+NOT_RESPONDING",
           "DOWN+DRAIN+NOT_RESPONDING", "IDLE+DRAIN+REBOOT_REQUESTED", "IDLE+POWERED_DOWN"]


@settings(max_examples=400, deadline=None)
@given(state=st.sampled_from(_STATES), reason=_TEXT, when=st.integers(1, 10 ** 10),
       user=st.sampled_from(["root", "slurm", "nobody"]), comment=st.one_of(st.none(), _TEXT),
       extra=st.one_of(st.none(), _TEXT))
def test_every_value_is_read_exactly_or_the_record_refused(state, reason, when, user, comment, extra):
    """Whatever an admin puts in a reason, Comment or Extra: the values come
    back as slurmctld holds them (a reason as Slurm prints it: strtok drops
    line breaks at its ends), or ParseError; never another value."""
    text, line = both("gpu07", state, reason, when, user, comment, extra)
    try:
        node = parse_show_node(text, line, "gpu07")
    except ParseError:
        lone = reason.strip("\n")
        assert "\n" in lone or "\n" in (comment or "") or "\n" in (extra or "")
        return
    assert node.name == "gpu07" and node.partitions == ()
    assert node.comment == (comment or "")
    if node.state in ("IDLE", "MIXED", "ALLOCATED") and not node.flags:
        assert node.reason == ""  # in service: a leftover reason is dropped, as every reader does
    else:
        assert node.reason == reason.strip("\n")
        assert (node.reason_time, node.reason_user) == ((when, user) if reason.strip("\n") else (None, ""))
