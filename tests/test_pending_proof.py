"""Issue 33, item 6: the keeper drains only tags gpugate wrote.

Slurm admins and operators may set any node's Comment; an admin's text
holding a pasted ``[gpugate-pending @1] gpugate: drift ...`` made the keeper
drain a healthy node first (oldest) and hold a real drift behind it.  A node
now signs what it publishes with the drain budget key (gpugate.safety.budgetkey,
root's alone on the nodes and the controller): an HMAC of the node's name,
the times and the reason (gpugate.slurm.pending); the keeper
(gpugate.keeper.run.screen) plans only on a span that verifies for that node
and was signed within MAX_AGE_SECONDS.  Everything else is an *unverified
tag*: held and named, never drained, no place in the queue, no budget."""

import json
import os
import time

import pytest
from hypothesis import given, settings, strategies as st

from gpugate.safety import budgetkey
from gpugate.keeper import run as keeper
from gpugate.model.config import parse_settings
from gpugate.node import hold
from gpugate.core.record import replace
from gpugate.slurm import pending

from test_keeper import DRIFT, KEY, MemorySlurm, fleet, node

NOW = int(time.time())
PASTED = "rack 3 PSU swap; was [gpugate-pending @1] %s [/gpugate-pending]" % DRIFT


class CommentSlurm(MemorySlurm):
    """MemorySlurm that also takes a node's Comment (what a node publishes with)."""

    def set_comment(self, name, comment):
        self.calls.append(("comment", name))
        self.states[name] = replace(self.states[name], comment=comment)


def _settings(tmp_path, key=KEY, mode=0o600, share=0.25):
    tmp_path.mkdir(exist_ok=True)
    path = tmp_path / "drain-budget.key"
    if key is not None:
        path.write_bytes(key + b"\n")
        path.chmod(mode)
    base = parse_settings({"drain_budget": {"max_share": share, "key_file": str(path)}}, "(test)")
    return replace(base, sweep=dict(base.sweep, journal=str(tmp_path / "sweep.db")),
                   state_dir_template=str(tmp_path / "state" / "{node}"))


def _run(cfg, slurm, now=NOW):
    return keeper.run_once(cfg, slurm, clock=lambda: now, sleep=lambda s: None)


def test_an_admins_pasted_tag_drains_nothing_and_holds_nothing(tmp_path):
    """The reviewer's case: one 4-node partition (allowance 1).  gpu01 is
    healthy and carries an admin's pasted tag, older than anything real;
    gpu02 published a real drift.  Before: the keeper drained gpu01 and held
    gpu02 ("budget spent").  Now: gpu02 drains; gpu01 is held as an
    unverified tag, named, and takes no budget.  A pasted tag placed
    before the node's own in the same comment changes nothing either."""
    cfg = _settings(tmp_path)
    states = fleet(node("gpu01", comment=PASTED), node("gpu02", published=DRIFT, since=NOW - 500),
                   node("gpu03"), node("gpu04"))
    slurm = MemorySlurm(states, lambda: NOW)
    figures = _run(cfg, slurm)
    assert figures["drained"] == ["gpu02"]
    assert not slurm.states["gpu01"].drain and slurm.states["gpu02"].reason == DRIFT
    assert figures["held_nodes"]["gpu01"].startswith("unverified tag: no proof")
    assert figures["unverified"] == 1 and figures["partitions"]["a"]["drained"] == 1

    # Recorded: `gpugate status` and `gpugate metrics` say it.
    from gpugate.fleet.metrics import keeper_families
    from gpugate.fleet.status import _held_lines
    from gpugate.core.promtext import render

    figures.pop("_view", None)  # as keeper.run does
    status = keeper.record(cfg, figures)
    assert "gpugate_budget_keeper_unverified_nodes 1" in render(keeper_families(status, NOW))
    assert "1 UNVERIFIED TAGS" in "\n".join(_held_lines({"budget_keeper": status, "held": {}}))

    # The pasted span first, the node's own after it: the node's drains.
    cfg = _settings(tmp_path / "b")
    real = node("gpu02", published=DRIFT, since=NOW - 500).comment
    slurm = MemorySlurm(fleet(node("gpu02", comment=PASTED + " " + real), node("gpu03")), lambda: NOW)
    assert _run(cfg, slurm)["drained"] == ["gpu02"]


@pytest.mark.parametrize("where", ["own", "view"])
def test_a_real_nodes_publish_still_drains(tmp_path, where):
    """The node side as the health check runs it (gpugate.node.hold.publish
    with the key): signed, remembered in published.json, drained by the
    keeper; from a fleet read or from the previous run's view."""
    cfg = _settings(tmp_path / where)
    slurm = CommentSlurm(fleet(node("gpu01", comment="rack 3"), node("gpu02"), node("gpu03"), node("gpu04")),
                         time.time)
    os.makedirs(cfg.state_dir("gpu01"))
    why = hold.publish(cfg, slurm, "gpu01", slurm.states["gpu01"], DRIFT)
    assert "drains it within" in why and "UNSIGNED" not in why
    comment = slurm.states["gpu01"].comment
    assert comment.startswith("rack 3 [gpugate-pending @") and " proof " in comment
    with open(os.path.join(cfg.state_dir("gpu01"), hold.PUBLISHED)) as handle:
        assert json.load(handle)["seen"] == pending.read(comment).seen
    view = (time.time(), dict(slurm.states)) if where == "view" else None
    figures = keeper.run_once(cfg, slurm, sleep=lambda s: None, view=view)
    assert figures["drained"] == ["gpu01"] and slurm.states["gpu01"].reason == DRIFT


def test_a_proof_for_another_node_an_old_one_or_a_changed_one_drains_nothing(tmp_path):
    """gpu01's real, signed comment copied onto gpu02; gpu03's own tag
    signed three hours ago pasted back (a replay after it cleared); gpu04's
    signed tag with its time moved earlier (to jump the queue); gpu05's with
    its reason changed; gpu06's signed with another key: none drains, none
    takes the budget, each says why.  gpu07's own, fresh, drains."""
    cfg = _settings(tmp_path, share=0.5)
    own = {name: node(name, published=DRIFT, since=NOW - 100).comment for name in ("gpu01", "gpu07")}
    old = node("gpu03", published=DRIFT, since=NOW - 3 * 3600).comment
    moved = node("gpu04", published=DRIFT, since=NOW - 100).comment.replace("@%d seen" % (NOW - 100), "@5 seen")
    changed = node("gpu05", published=DRIFT, since=NOW - 100).comment.replace("550.54.15", "550.54.16")
    other_key = pending.publish("", DRIFT, NOW - 100, b"another site's key, 32 bytes ok!", "gpu06")
    states = fleet(node("gpu02", comment=own["gpu01"]), node("gpu03", comment=old), node("gpu04", comment=moved),
                   node("gpu05", comment=changed), node("gpu06", comment=other_key),
                   node("gpu07", comment=own["gpu07"]), *[node("gpu%02d" % i) for i in range(8, 13)])
    slurm = MemorySlurm(states, lambda: NOW)
    figures = _run(cfg, slurm)
    assert figures["drained"] == ["gpu07"]
    held = figures["held_nodes"]
    assert "not this node's" in held["gpu02"] and "not this node's" in held["gpu06"]
    assert "signed 10800 s ago" in held["gpu03"]
    assert "not this node's" in held["gpu04"] and "not this node's" in held["gpu05"]
    assert figures["unverified"] == 5 and figures["partitions"]["a"]["drained"] == 1


def test_a_tag_replaced_by_a_paste_between_the_read_and_the_drain_is_not_drained(tmp_path):
    """The keeper re-reads each node before it drains it: gpu01's own part,
    replaced meanwhile by an admin's paste of the same reason, is "changed
    since the fleet read", and gpu01 stays in service."""
    cfg = _settings(tmp_path)
    slurm = MemorySlurm(fleet(node("gpu01", published=DRIFT, since=NOW - 10), node("gpu02")), lambda: NOW)
    real = slurm.own_record

    def pasting(name):
        if name == "gpu01":
            slurm.states["gpu01"] = node("gpu01", comment="[gpugate-pending @1] %s [/gpugate-pending]" % DRIFT)
        return real(name)
    slurm.own_record = pasting
    figures = _run(cfg, slurm)
    assert figures["drained"] == [] and figures["skipped"] == {"gpu01": "changed since the fleet read"}
    assert not slurm.states["gpu01"].drain


def test_an_old_release_tag_is_held_as_unverified_never_drained(tmp_path):
    """A rolling upgrade, keeper first: a node still on a gpugate before
    proofs publishes ``[gpugate-pending @T] reason`` without one.  Held,
    named "unverified tag: no proof", never drained, no budget; once that
    node runs the new release its next check signs it (published.json has
    no "seen": it reads and publishes again) and the keeper drains it."""
    cfg = _settings(tmp_path)
    slurm = CommentSlurm(fleet(node("gpu01", comment=pending.publish("", DRIFT, NOW - 50)), node("gpu02")),
                         lambda: NOW)
    figures = _run(cfg, slurm)
    assert figures["drained"] == [] and "no proof" in figures["held_nodes"]["gpu01"]
    os.makedirs(cfg.state_dir("gpu01"))
    with open(os.path.join(cfg.state_dir("gpu01"), hold.PUBLISHED), "w") as handle:
        json.dump({"reason": DRIFT, "since": NOW - 50}, handle)  # what the old release kept

    class Verdict:
        fit, acute, reason = False, False, DRIFT
    assert hold.held_recently(cfg, "gpu01", Verdict()) is None  # sign it: ask the controller once
    hold.publish(cfg, slurm, "gpu01", slurm.states["gpu01"], DRIFT)
    assert pending.read(slurm.states["gpu01"].comment).since == NOW - 50  # its place in the queue kept
    assert keeper.run_once(cfg, slurm, sleep=lambda s: None)["drained"] == ["gpu01"]


@pytest.mark.parametrize("case", ["missing", "others-read", "short", "untrusted-dir"])
def test_no_usable_key_on_the_controller_drains_nothing_and_says_so(tmp_path, case):
    """Fail safe: without its key the keeper cannot tell a node's tag from a
    paste, so its run fails before reading Slurm, draining nothing; the
    status (`gpugate budget`, `gpugate status`) and the metric
    gpugate_budget_keeper_last_error say so, with the fix."""
    from gpugate.fleet.metrics import keeper_families
    from gpugate.core.promtext import render

    cfg = _settings(tmp_path, key=None if case == "missing" else b"short" if case == "short" else KEY,
                    mode=0o644 if case == "others-read" else 0o600)
    if case == "untrusted-dir":
        os.chmod(tmp_path, 0o777)
    slurm = MemorySlurm(fleet(node("gpu01", published=DRIFT, since=int(time.time())), node("gpu02")), time.time)
    status = keeper.run(cfg, connect=lambda settings, deadline=None: slurm)
    assert not status["ok"] and not slurm.calls and not slurm.states["gpu01"].drain
    assert "drain budget key" in status["error"] and "drains nothing published" in status["error"]
    want = {"missing": "is missing", "others-read": "readable by group or others", "short": "at least 16",
            "untrusted-dir": "writable by group or others"}[case]
    assert want in status["error"], status["error"]
    assert "gpugate_budget_keeper_last_error 1" in render(keeper_families(keeper.read_status(cfg), time.time()))
    # `gpugate status` of a keeper that never had a good run (a new install, no key yet): the whole error, with the fix.
    from gpugate.fleet.status import _held_lines

    said = "\n".join(_held_lines({"budget_keeper": keeper.read_status(cfg), "held": {}}))
    assert "LATEST RUN FAILED: " + status["error"] in said and "NEVER RAN" not in said, said


def test_a_node_without_the_key_publishes_unsigned_held_and_says_so(tmp_path):
    """A node whose key is missing still publishes (visible in `scontrol
    show node`, `gpugate status`), unsigned, and its log says the keeper
    will never drain it; it tries again once every REFRESH_SECONDS."""
    cfg = _settings(tmp_path, key=None)
    slurm = CommentSlurm(fleet(node("gpu01")), time.time)
    os.makedirs(cfg.state_dir("gpu01"))
    why = hold.publish(cfg, slurm, "gpu01", slurm.states["gpu01"], DRIFT)
    assert "UNSIGNED" in why and "never drains it" in why and "is missing" in why
    seen = pending.read(slurm.states["gpu01"].comment)
    assert seen.reason == DRIFT and seen.proof is None

    class Verdict:
        fit, acute, reason = False, False, DRIFT
    assert "UNSIGNED" in hold.held_recently(cfg, "gpu01", Verdict())


def test_a_held_node_re_signs_its_finding_keeping_its_place(tmp_path):
    """A held node's proof is renewed once every REFRESH_SECONDS (one read
    and one comment update per held node), keeping its first time (its
    place in the queue); the same finding within that time writes nothing."""
    k, name = KEY, "gpu01"
    first = pending.publish("rack 3", DRIFT, NOW, k, name)
    assert pending.publish(first, DRIFT, NOW + 60, k, name) == first
    again = pending.publish(first, DRIFT, NOW + pending.REFRESH_SECONDS, k, name)
    seen = pending.read(again)
    assert (seen.since, seen.seen) == (NOW, NOW + pending.REFRESH_SECONDS)
    assert pending.verified(again, name, k, NOW + pending.MAX_AGE_SECONDS + 100)[0] == seen
    assert pending.verified(first, name, k, NOW + pending.MAX_AGE_SECONDS + 100)[0] is None


# ------------------------------------------------------------------ properties
NAMES = st.from_regex(r"[a-z][a-z0-9-]{0,15}[0-9]", fullmatch=True)
REASONS = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), min_size=1, max_size=255).map(
    lambda r: " ".join(r.replace(pending.CLOSE, "").split())).filter(bool)
ADMIN = st.text(max_size=80).filter(lambda t: "[gpugate-pending" not in t and "\x00" not in t)
KEYS = st.binary(min_size=16, max_size=64)


@settings(max_examples=300, deadline=None)
@given(NAMES, NAMES, REASONS, ADMIN, KEYS, KEYS, st.integers(0, 10 ** 10), st.integers(0, pending.MAX_AGE_SECONDS))
def test_a_signed_tag_verifies_for_its_node_and_key_only(name, other, reason, admin, key, other_key, since, age):
    """Any node name, reason, admin text around it, key and time: the span a
    node signs reads back and verifies for that node and key while fresh;
    for another node, another key, past MAX_AGE, or with any of its fields
    changed, it does not; pasted beside it, an unsigned copy changes nothing."""
    comment = pending.publish(admin, reason, since, key, name)
    now = since + age
    seen, why = pending.verified(comment, name, key, now)
    assert why is None and (seen.reason, seen.since, seen.seen) == (reason, since, since)
    assert pending.others(comment) == admin.strip()
    if other != name:
        assert pending.verified(comment, other, key, now)[0] is None
    if other_key != key:
        assert pending.verified(comment, name, other_key, now)[0] is None
    assert pending.verified(comment, name, key, since + pending.MAX_AGE_SECONDS + 1)[0] is None
    at = comment.index(pending.OPEN)  # the admin's text before it holds no span
    for field in ("@%d seen" % since, "seen @%d" % since):
        forged = comment[:at] + comment[at:].replace(field, field.replace(str(since), str(since + 1)), 1)
        assert forged != comment and pending.verified(forged, name, key, now)[0] is None
    pasted = pending.publish("", reason, max(since - 1, 0)) + " " + comment
    assert pending.verified(pasted, name, key, now)[0] == seen


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(ADMIN, st.builds(
    lambda s, w, p, r: "[gpugate-pending @%d seen @%d proof %s] %s [/gpugate-pending]" % (s, w, p, r),
    st.integers(0, 10 ** 12 - 1), st.integers(0, 10 ** 12 - 1), st.from_regex(r"[0-9a-f]{32}", fullmatch=True),
    REASONS)), max_size=4), NAMES, KEYS)
def test_text_written_without_the_key_never_verifies(parts, name, key):
    """Whatever an admin writes (well-formed spans with any proof, times and
    reason, and any text around them), without the key nothing verifies;
    every span reads back and `others` removes each one."""
    comment = " ".join(parts)
    assert pending.verified(comment, name, key, 10 ** 12)[0] is None
    assert pending.read(pending.others(comment)) is None


FRAGMENTS = st.sampled_from(["[gpugate-pending @", "[/gpugate-pending]", " [/gpugate-pending]", "] ", " ", "  ",
                             "\n", "12", "1764120000", " seen @", " proof ", "0123456789abcdef" * 2, "x", "[", "]",
                             "\u0663", "gpugate: drift driver=1 (want 2)"])


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(FRAGMENTS, st.text(max_size=6)), max_size=24))
def test_the_span_reader_reads_what_the_pattern_reads(parts):
    """read/read_all find the head by regex and the end by str.find (the
    keeper reads 100,000 comments a run): on any text, the same spans, in
    the same order, as the one pattern (_PART, which `others` removes)."""
    comment = "".join(parts)
    want = [(m.group(4), int(m.group(1)), m.group(2) and int(m.group(2)), m.group(3))
            for m in pending._PART.finditer(comment)]
    got = [(p.reason, p.since, p.seen, p.proof) for p in pending.read_all(comment)]
    assert got == want
    assert pending.read(comment) == (pending.read_all(comment) or [None])[0]


def test_a_pasted_older_tag_does_not_move_the_node_up_the_queue(tmp_path):
    """The node takes its first time from a span it signed, or from its own
    record (published.json, root's), never from a span someone pasted in
    its comment: an admin's `@1` with the node's very reason would
    otherwise be signed by the node and put it first in the queue."""
    pasted = "[gpugate-pending @1] %s [/gpugate-pending]" % DRIFT
    assert pending.read(pending.publish(pasted, DRIFT, NOW, KEY, "gpu01")).since == NOW
    own = pending.publish("", DRIFT, NOW - 4000, KEY, "gpu01")
    again = pending.publish(pasted + " " + own, DRIFT, NOW, KEY, "gpu01")
    assert (pending.read(again).since, pending.read(again).seen) == (NOW - 4000, NOW)
    assert pending.read_all(again) == [pending.read(again)]  # the pasted span is gone
    # Through the node's code: its record names its first time.
    cfg = _settings(tmp_path)
    slurm = CommentSlurm(fleet(node("gpu01", comment=pasted)), time.time)
    os.makedirs(cfg.state_dir("gpu01"))
    hold.publish(cfg, slurm, "gpu01", slurm.states["gpu01"], DRIFT)
    first = pending.read(slurm.states["gpu01"].comment).since
    assert first >= NOW
    slurm.states["gpu01"] = replace(slurm.states["gpu01"], comment=pasted)  # the admin again
    hold.publish(cfg, slurm, "gpu01", slurm.states["gpu01"], DRIFT)
    assert pending.read(slurm.states["gpu01"].comment).since == first


def test_an_old_copy_of_the_nodes_own_span_pasted_back_does_not_move_it_up_the_queue():
    """A span the node signed long ago (over MAX_AGE_SECONDS: the keeper
    refuses it) pasted back by an admin while the node holds the same
    finding again: the node does not sign the old first time afresh, which
    would put it first in the queue."""
    old_at = NOW - 3 * pending.MAX_AGE_SECONDS
    old = pending.publish("", DRIFT, old_at, KEY, "gpu01")
    assert pending.verified(old, "gpu01", KEY, NOW)[0] is None  # refused as it is
    again = pending.publish(old, DRIFT, NOW, KEY, "gpu01", since=NOW - 60)
    assert (pending.read(again).since, pending.read(again).seen) == (NOW - 60, NOW)
    assert pending.read(pending.publish(old, DRIFT, NOW, KEY, "gpu01")).since == NOW


@settings(max_examples=500, deadline=None)
@given(st.lists(st.one_of(FRAGMENTS, st.text(max_size=6)), max_size=24))
def test_others_removes_what_the_pattern_removes(parts):
    """`others` (what a node keeps of an admin's comment when it publishes
    or clears) removes exactly the pattern's spans, in one pass."""
    comment = "".join(parts)
    assert pending.others(comment) == pending._PART.sub("", comment).strip()


def test_a_long_comment_of_open_tags_is_read_in_one_pass():
    """An admin's comment of 3,000 unclosed heads: the node's publish and
    clear took ~3 s over it with the pattern (every head scanned to the end)."""
    comment = "rack 3 " + "[gpugate-pending @1] " * 3000
    started = time.process_time()
    assert pending.others(comment) == comment.strip()
    assert pending.read_all(comment) == []
    assert time.process_time() - started < 0.5
