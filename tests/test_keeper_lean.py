"""The keeper's decision (issue 48) decides as the straightforward path
did, on the same fleets: the keeper's Fleet of a full read (its own read
of `scontrol show node` is compared with what the records say in
tests/test_show_fleet.py) against every comment's proof checked by
pending.verified (the keeper's screen as it was, kept here as the
reference), the pins' allowance and the plan on every node.  Fleets are
generated as sinfo's text and read in full (parse_nodes_text): published
spans signed by their node, forged, copied from another node, stale,
from the future, unsigned, an admin's paste before or after the node's
own, partitions that differ from line to line, lines in any order; a
text the full reader refuses decides nothing.  The kept verdicts' file
(gpugate.budget.proofs) is tested here too.  No timing here:
bench/bench_budget.py measures."""

import hmac

import pytest
from hypothesis import given, settings, strategies as st

from gpugate.budget import rules as budget
from gpugate.budget import pins as budget_pins
from gpugate.keeper import run as keeper
from gpugate.budget import memory as keeper_memory
from gpugate.budget import fleet_plan, proof_file, proofs as keeper_proofs
from gpugate.errors import ParseError
from gpugate.core.record import replace
from gpugate.slurm import pending
from gpugate.slurm.nodestate import NodeState, parse_nodes_text
from gpugate.slurm.nodestate.lean import Fleet, deciding, of_states
from gpugate.slurm.nodestate.show_fleet import read_show_text
from gpugate.testbed.show_node_text import Records

TAG = "gpugate:"
KEY = b"0123456789abcdef0123456789abcdef"
OTHER_KEY = b"fedcba9876543210fedcba9876543210"
NOW = 1800000000
DRIFT = "gpugate: drift driver=550.54.15 (want 580.95.05)"
PIN = "gpugate: health preflight_across=pinned (want none)"
XID = "gpugate: health xid:gpu1=79 (want none)"
BRACKETS = "gpugate: drift nic=[mlx5_0] (want [mlx5_1])"  # a reason with brackets: not read in one step
PARTS = ("gpu", "pool0", "pool1", "debug")


# -- the reference: the keeper's screen before issue 48, word for word ------------------------

def reference_screen(states, key: bytes, now: float, checked=None):
    out, unverified = {}, {}
    for name, state in states.items():
        if not state.comment or pending.OPEN not in state.comment:
            out[name] = state
            continue
        verdict = None if checked is None else checked.get((name, state.comment))
        if verdict is None:
            verdict = pending.verified(state.comment, name, key, now)
            if checked is not None:
                checked[(name, state.comment)] = verdict
        seen, why = verdict
        if seen is None:
            unverified[name] = why
        if seen is None or state.comment.count(pending.OPEN) > 1:
            state = replace(state, comment=pending.alone(seen) if seen is not None else "")
        out[name] = state
    return out, unverified


def reference_decide(states, share, per_hour, memory, now):
    mine, unverified = reference_screen(states, KEY, now, {})
    memory, waiting = keeper_memory.review(memory, mine, TAG, now)
    for name, why in budget_pins.pins_held(mine, TAG, now, per_hour).items():
        waiting.setdefault(name, why)
    plan = budget.plan({n: replace(s, comment="") if n in waiting else s for n, s in mine.items()}, TAG, share)
    return mine, unverified, memory, waiting, plan


# -- fleets ---------------------------------------------------------------------------------

def _span(draw, name, names):
    """One span in node ``name``'s comment, of the given kind."""
    kind = draw(st.sampled_from(["own", "own", "own", "forged", "copied", "stale", "future", "late_since",
                                 "unsigned", "other_key", "acute", "padded", "wide"]))
    reason = draw(st.sampled_from([DRIFT, DRIFT, PIN, BRACKETS])) if kind != "acute" else XID
    seen = NOW - draw(st.sampled_from([0, 5, 600, pending.MAX_AGE_SECONDS - 1]))
    since = seen - draw(st.integers(0, 3000))
    signer, key = name, KEY
    if kind == "stale":
        seen -= pending.MAX_AGE_SECONDS + draw(st.integers(1, 9999))
        since = seen - 5
    elif kind == "future":
        seen = NOW + pending.CLOCK_SLACK_SECONDS + draw(st.integers(1, 999))
    elif kind == "late_since":
        since = seen + draw(st.integers(1, 50))
    elif kind == "copied":
        signer = draw(st.sampled_from(names))
    elif kind == "other_key":
        key = OTHER_KEY
    if kind == "unsigned":
        return "%s%d] %s %s" % (pending.OPEN, since, reason, pending.CLOSE)
    proof = pending.proof(key, signer, since, seen, reason)
    if kind == "forged":
        proof = draw(st.text("0123456789abcdef", min_size=32, max_size=32))
    if kind == "padded":  # a time written with a leading zero: the proof is over the number
        return "%s0%d seen @0%d proof %s] %s %s" % (pending.OPEN, since, seen, proof, reason, pending.CLOSE)
    if kind == "wide":  # times in other decimal digits (pending reads any): the proof is over the number
        return "%s%s seen @%s proof %s] %s %s" % (pending.OPEN, _digits(since), _digits(seen), proof, reason,
                                                 pending.CLOSE)
    return "%s%d seen @%d proof %s] %s %s" % (pending.OPEN, since, seen, proof, reason, pending.CLOSE)


def _digits(number: int) -> str:
    """The number in Arabic-Indic digits (what \\d reads as decimal digits too)."""
    return "".join(chr(0x660 + int(c)) for c in str(number))


@st.composite
def fleets(draw):
    count = draw(st.integers(1, 24))
    names = ["gpu%02d" % i for i in range(count)]
    lines = []
    for name in names:
        spans = [_span(draw, name, names) for _ in range(draw(st.sampled_from([0, 0, 1, 1, 1, 2])))]
        admin = draw(st.sampled_from(["", "", "rack 3", "[gpugate-pending @12] not closed",
                                      "closed early %s" % pending.CLOSE]))
        pieces = spans + ([admin] if admin else [])
        comment = " ".join(draw(st.permutations(pieces))) if pieces else "(null)"
        state = draw(st.sampled_from(["idle", "idle", "mixed", "idle+drain", "allocated+drain", "down+drain",
                                      "down*"]))
        drained = "drain" in state
        reason = draw(st.sampled_from([DRIFT, PIN, XID, "admin: PSU", "gpugate: rma budgeted=drift x (want y)"])
                      ) if drained or draw(st.booleans()) else "none"
        stamp = str(NOW - draw(st.integers(0, 99))) if reason != "none" else "Unknown"
        user = "root" if reason != "none" else "Unknown"
        parts = draw(st.lists(st.sampled_from(PARTS), min_size=1, max_size=3))  # a repeat is printed twice
        for part in parts:
            lines.append("%s|%s|%s|%s|%s|%s\x1f%s" % (name, part, state, stamp, user, comment, reason))
    if draw(st.booleans()):
        lines = draw(st.permutations(lines))
    odd = draw(st.sampled_from([None] * 6 + ["continued", "bad_state", "twice", "blank", "bad_name"]))
    at = draw(st.integers(0, len(lines) - 1))
    if odd == "continued":
        lines.insert(at + 1, "and its reason's next line")
    elif odd == "bad_state":
        lines[at] = "|".join(lines[at].split("|")[:2] + ["sleepy"] + lines[at].split("|")[3:])
    elif odd == "twice":
        lines.append("|".join(lines[at].split("|")[:2] + ["mixed+drain"] + lines[at].split("|")[3:]))
    elif odd == "blank":
        lines.insert(at, "")
    elif odd == "bad_name":
        lines.insert(at, "bad name|gpu|idle|Unknown|Unknown|(null)\x1fnone")
    return "\n".join(lines) + "\n", draw(st.sampled_from([0.1, 0.25, 0.5, 0.99])), draw(st.integers(0, 3))


def _full(text):
    try:
        return parse_nodes_text(text)
    except ParseError as exc:
        return exc


def _lean(full) -> Fleet:
    """The keeper's Fleet of a full read (what show_fleet reads from
    scontrol's text: tests/test_show_fleet.py)."""
    return of_states(full)


def _memory_of(states, draw_names):
    """A memory of earlier drains for some published nodes (a RESUME since)."""
    memory = {}
    for name in draw_names:
        seen = budget.published(states[name], TAG) if name in states else None
        if seen is not None:
            memory[name] = {"since": int(seen.since), "drained": NOW - 99, "returned": None}
    return memory


@settings(max_examples=200, deadline=None)
@given(fleets(), st.data())
def test_the_lean_path_decides_as_the_full_one(case, data):
    text, share, per_hour = case
    full = _full(text)
    if isinstance(full, ParseError):
        return  # refused: nothing is decided on it
    lean = _lean(full)
    names = sorted(full)
    memory = _memory_of(full, data.draw(st.lists(st.sampled_from(names), unique=True, max_size=3)))
    mine, unverified, memory_after, waiting, plan = reference_decide(full, share, per_hour, dict(memory), NOW)
    proofs = keeper_proofs.Proofs(KEY)
    for _ in range(2):  # a second time on what the first remembered (the run's re-read, --watch)
        got = keeper.decide(lean, proofs, TAG, share, per_hour, dict(memory), lambda: NOW)
        assert got.plan.drain == plan.drain
        assert got.plan.held == plan.held
        assert got.plan.uses == plan.uses
        assert got.unverified == unverified
        assert got.waiting == waiting and got.memory == memory_after
        assert {n: s for n, s in got.mine.items()} == {n: s for n, s in mine.items() if n in lean.states}
        read = {n: pending.read(s.comment) for n, s in mine.items() if n in lean.states}
        assert set(got.spans) == {n for n, seen in read.items() if seen is not None}
        assert all((got.spans[n].seen, got.spans[n].proof) == (read[n].seen, read[n].proof) for n in got.spans)
        assert got.spans == {n: seen for n, seen in read.items() if seen is not None}
        proofs.keep()
        proofs = keeper_proofs.Proofs(KEY)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_remembered_verdict_is_the_verdict_of_the_exact_text(data):
    """Across runs (--watch) a node's comment changed by a digit, re-signed,
    pasted from another node, or judged at another time, or a new key: each
    is judged as pending.verified judges it then."""
    names = ["gpu01", "gpu02"]
    proofs = keeper_proofs.Proofs(KEY)
    for _ in range(4):
        name = data.draw(st.sampled_from(names))
        comment = " ".join(_span(data.draw, name, names) for _ in range(data.draw(st.integers(1, 2))))
        if data.draw(st.booleans()):
            digits = [i for i, c in enumerate(comment) if c.isdigit()]
            i = data.draw(st.sampled_from(digits))
            comment = comment[:i] + str((int(comment[i]) + 1) % 10) + comment[i + 1:]
        now = NOW + data.draw(st.sampled_from([0, 1, pending.MAX_AGE_SECONDS]))
        key = data.draw(st.sampled_from([KEY, KEY, OTHER_KEY]))
        if key != proofs.key:
            proofs.keep()
            proofs = keeper_proofs.Proofs(key)
        want = pending.verified(comment, name, key, now)
        got = proofs.verified(name, comment, now)
        assert (got[0], got[1]) == want and (got[0] is None or got[0].seen == want[0].seen)
        if data.draw(st.booleans()):
            proofs.keep()
            proofs = keeper_proofs.Proofs(key)


@settings(max_examples=100, deadline=None)
@given(fleets(), fleets(), st.data())
def test_a_runs_re_read_is_judged_on_its_own_text(first, second, data):
    """The run's read and its re-read (one Proofs; what the read verified in
    one step is remembered only when next looked at): a node whose comment
    changed between them (re-signed, forged, pasted from another node,
    gone) is judged on the re-read's text, an unchanged one as before;
    each screen as the reference screens it, at its own time; and the
    memory kept for the next run (--watch) judges a third read alike."""
    reads = []
    for text, _share, _per_hour in (first, second):
        full = _full(text)
        reads.append({} if isinstance(full, ParseError) else {n: s for n, s in full.items() if deciding(s)})
    # the re-read: the first read's nodes, each kept or taking a comment of the second's (another node's included)
    later = dict(reads[0])
    for name in data.draw(st.lists(st.sampled_from(sorted(later)), unique=True)) if later else ():
        other = data.draw(st.sampled_from(sorted(reads[1]))) if reads[1] else None
        comment = reads[1][other].comment if other is not None else ""
        later[name] = replace(later[name], comment=comment)
    proofs = keeper_proofs.Proofs(KEY)
    for states, now in ((reads[0], NOW), (later, NOW + data.draw(st.sampled_from([0, 1, 600])))):
        if data.draw(st.booleans()) and states:  # a single node's read between (the run's re-read before a drain)
            name = data.draw(st.sampled_from(sorted(states)))
            assert keeper_proofs.screen({name: states[name]}, proofs, now)[:2] == reference_screen(
                {name: states[name]}, KEY, now)
        mine, unverified, spans = keeper_proofs.screen(states, proofs, now)
        want_mine, want_unverified = reference_screen(states, KEY, now)
        assert (mine, unverified) == (want_mine, want_unverified)
        assert spans == {n: seen for n, seen in ((n, pending.read(s.comment)) for n, s in want_mine.items())
                         if seen is not None}
    proofs.settle()
    for name, entry in proofs.new.items():  # what is remembered says of each proof what pending says
        pairs = ((entry[1], entry[2]),) if len(entry) == 3 else entry[1]
        assert [mine for _, mine in pairs] == [
            seen.proof is not None and seen.proof == pending.proof(KEY, name, seen.since, seen.seen, seen.reason)
            for seen, _ in pairs]
    proofs.keep()
    again = keeper_proofs.Proofs(KEY)
    assert keeper_proofs.screen(reads[1], again, NOW)[:2] == reference_screen(reads[1], KEY, NOW)


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=200), st.text(max_size=30), st.integers(0, 10 ** 12),
       st.integers(0, 10 ** 12), st.text(max_size=200))
def test_the_signer_proves_as_pending(key, node, since, seen, reason):
    assert hmac.compare_digest(keeper_proofs.Signer(key).proof(node, since, seen, reason),
                               pending.proof(key, node, since, seen, reason))


@pytest.mark.parametrize("reason", [DRIFT + " \udcff", "gpugate: drift driver=\u00e9 (want 580)"])
def test_a_span_whose_text_is_not_ascii_is_checked_on_pending_proofs_bytes(reason):
    """A lone surrogate (bytes that were not UTF-8) or another non-ASCII
    character in a signed span: the screen HMACs the bytes pending.proof
    does, and a copy on another node is refused as pending refuses it."""
    own = pending.publish("", reason, NOW, KEY, "gpu01")
    states = {name: NodeState(name, "IDLE", frozenset(), "", None, "", ("gpu",), own) for name in ("gpu01", "gpu02")}
    proofs = keeper_proofs.Proofs(KEY)
    mine, unverified, spans = keeper_proofs.screen(states, proofs, NOW)
    assert (mine, unverified) == reference_screen(states, KEY, NOW)
    assert set(spans) == {"gpu01"} and spans["gpu01"].reason == reason and set(unverified) == {"gpu02"}
    proofs.settle()
    assert proofs.new["gpu01"][-1] is True  # verified in one step: the same bytes HMACed


def test_a_healthy_node_is_counted_not_made_a_record():
    records = Records("25.11")
    fleet = read_show_text(records.record("n1", "IDLE", ("gpu", "pool0"))
                           + records.record("n2", "IDLE+DRAIN", ("gpu",), "admin: PSU", NOW)
                           + records.record("n3", "MIXED", ("gpu",), "a [gpugate-pending @1] in a reason", NOW,
                                            comment="rack 3"))
    assert sorted(fleet.states) == ["n2"] and fleet.sizes == {"gpu": 3, "pool0": 1} and fleet.nodes == 3


def test_the_keepers_view_keeps_the_sizes(tmp_path):
    from gpugate.model.config import parse_settings

    base = parse_settings({"drain_budget": {"max_share": 0.25}}, "(test)")
    cfg = replace(base, sweep=dict(base.sweep, journal=str(tmp_path / "sweep.db")))
    records = Records("24.11")
    fleet = read_show_text(records.record("n1", "IDLE", ("gpu",))
                           + records.record("n2", "IDLE+DRAIN", ("gpu",), DRIFT, NOW - 5))
    keeper.save_view(cfg, NOW, fleet)
    at, again = keeper.take_view(cfg, NOW + 1)
    assert at == NOW and again.states == fleet.states and again.sizes == fleet.sizes and again.nodes == 2
    assert keeper.take_view(cfg, NOW + 1) is None  # once


@st.composite
def planned_fleets(draw):
    """States as the keeper's screen leaves them, the spans it verified, and
    partition sizes counting nodes beyond them (the lean read's)."""
    reasons_ = ["", "", DRIFT, PIN, XID, "admin: PSU", "gpugate: rma budgeted=drift x (want y)",
                "gpugate: rma xid:gpu3=79 (want none)"]
    states, spans = {}, {}
    for i in range(draw(st.integers(0, 30))):
        name = "n%02d" % i
        drained = draw(st.booleans())
        reason = draw(st.sampled_from(reasons_))
        when = draw(st.sampled_from([None, NOW - 50, NOW - 5, NOW])) if reason else None
        parts = tuple(sorted(set(draw(st.lists(st.sampled_from(PARTS), max_size=3)))))
        states[name] = NodeState(name, "IDLE", frozenset({"DRAIN"}) if drained else frozenset(), reason, when,
                                 "root" if reason else "", parts, "")
        if draw(st.booleans()):
            spans[name] = pending.Pending(draw(st.sampled_from([DRIFT, DRIFT, PIN, XID, "admin text"])),
                                          NOW - draw(st.integers(0, 5)), NOW, "0" * 32)
    sizes = {p: sum(1 for s in states.values() if p in s.partitions) + draw(st.integers(0, 40)) for p in PARTS}
    return states, spans, sizes


@settings(max_examples=250, deadline=None)
@given(planned_fleets(), st.sampled_from([0.01, 0.1, 0.25, 0.5, 0.99]))
def test_plan_published_plans_as_plan(fleet, share):
    """fleet_plan.plan_published (the keeper's) against budget.plan, the rule:
    ties on the time published, drained nodes counted or not, reasons not
    gpugate's, nodes in no partition, partitions full from the start."""
    states, spans, sizes = fleet
    want = budget.plan(states, TAG, share, sizes, spans)
    got = fleet_plan.plan_published(states, TAG, share, sizes, spans)
    assert (got.drain, got.held, got.uses) == (want.drain, want.held, want.uses)
    assert list(got.held) == list(want.held)  # held in the same order (the status shows the first 20)


def test_a_record_made_at_once_is_the_record():
    from gpugate.slurm.nodestate.lean import _made

    args = ("n1", "IDLE", frozenset({"DRAIN"}), "admin: PSU", NOW, "root", ("gpu", "pool0"), "rack 3")
    made, plain = _made(*args), NodeState(*args)
    assert made == plain and hash(made) == hash(plain) and repr(made) == repr(plain) and made.drain
    assert made.__dict__ == plain.__dict__  # every field of NodeState, none besides (a new field fails here)
    assert replace(made, comment="") == replace(plain, comment="")
    with pytest.raises(AttributeError):
        made.comment = "x"


# -- the verdicts kept between the timer's runs (gpugate.budget.proof_file) ----------

def _kept(tmp_path, proofs):
    """Save this run's verdicts as the keeper does (due or not, forced) and read them back as the next run."""
    where = str(tmp_path / proof_file.FILE)
    proofs.stored = None  # due: the first run of a file
    assert proof_file.save(where, proofs) == bool(proofs.macs)  # written when anything was checked afresh
    return where


def _kept_texts(stored) -> dict:
    """node -> the exact comment the file kept a verdict on."""
    return dict(zip(stored.names, stored.comments))


@settings(max_examples=100, deadline=None)
@given(fleets(), fleets(), st.data())
def test_a_kept_verdict_serves_only_the_exact_text_it_judged(first, second, data):
    """A run keeps its verdicts in the file; the next run (a new process:
    nothing in memory) reads them.  Its fleet is the first's with nodes
    re-signed, forged, copied from another node, pasted stale, reordered
    with an admin's text, or gone, read later, in another order or with
    another key: each node is judged as pending.verified judges it then,
    and the decision is the straightforward path's."""
    import tempfile
    from pathlib import Path

    reads = []
    for text, _share, _per_hour in (first, second):
        full = _full(text)
        reads.append({} if isinstance(full, ParseError) else full)
    later = dict(reads[0])
    for name in data.draw(st.lists(st.sampled_from(sorted(later)), unique=True)) if later else ():
        kind = data.draw(st.sampled_from(["other", "own", "digit", "gone", "swapped"]))
        comment = later[name].comment
        if kind == "other" and reads[1]:  # another node's comment (its span is not this node's)
            comment = data.draw(st.sampled_from(sorted(s.comment for s in reads[1].values())))
        elif kind == "own":  # signed again, or a forged, stale, unsigned... one in its place
            comment = _span(data.draw, name, sorted(later))
        elif kind == "digit" and any(c.isdigit() for c in comment):  # one digit changed: the text judged differs
            i = data.draw(st.sampled_from([i for i, c in enumerate(comment) if c.isdigit()]))
            comment = comment[:i] + str((int(comment[i]) + 1) % 10) + comment[i + 1:]
        elif kind == "gone":
            comment = ""
        elif kind == "swapped":  # an admin's text moved before the node's span: another text
            comment = ("rack 3 " + comment) if comment else comment
        later[name] = replace(later[name], comment=comment)
    if data.draw(st.booleans()):  # the fleet read in another order than the file kept it: found by name
        later = dict(reversed(list(later.items())))
    share, per_hour = first[1], first[2]
    now = NOW + data.draw(st.sampled_from([0, 1, 600, pending.MAX_AGE_SECONDS]))
    key = data.draw(st.sampled_from([KEY, KEY, KEY, OTHER_KEY]))
    with tempfile.TemporaryDirectory() as tmp:
        proofs = keeper_proofs.Proofs(KEY)
        keeper.decide(of_states(reads[0]), proofs, TAG, share, per_hour, {}, lambda: NOW)
        where = _kept(Path(tmp), proofs)
        stored = proof_file.load(where, key)
        assert (stored is None) == (key != KEY or not proofs.macs)  # another key's file is no memory
        mine, unverified, memory, waiting, plan = reference_decide(later, share, per_hour, {}, now)
        fleet = of_states(later)
        if stored is None:
            return
        again = keeper_proofs.Proofs(KEY, stored)
        got = keeper.decide(fleet, again, TAG, share, per_hour, {}, lambda: now)
        assert (got.plan.drain, got.plan.held, got.plan.uses) == (plan.drain, plan.held, plan.uses)
        assert got.unverified == unverified and got.waiting == waiting
        assert got.mine == {n: s for n, s in mine.items() if n in fleet.states}
        read = {n: pending.read(s.comment) for n, s in mine.items() if n in fleet.states}
        assert got.spans == {n: seen for n, seen in read.items() if seen is not None}
        assert all((got.spans[n].seen, got.spans[n].proof) == (read[n].seen, read[n].proof) for n in got.spans)
        # what the file said was used only for a node whose comment is the very text it kept
        kept = _kept_texts(stored)
        assert again.hits == sum(1 for n, s in fleet.states.items() if kept.get(n) == s.comment)
        assert all(reads[0][n].comment == text for n, text in kept.items())  # each verdict on the text it judged
        if again.macs:  # written again from this run's checks and hits: each kept text is this run's comment
            rewritten = proof_file.load(_kept(Path(tmp) / "again", again), KEY)
            assert all(later[n].comment == text for n, text in _kept_texts(rewritten).items())


def _signed_fleet():
    names = ["gpu%02d" % i for i in range(6)]
    return {n: NodeState(n, "IDLE", frozenset(), "", None, "", ("gpu",),
                         pending.publish("", DRIFT, NOW - 60 - i, KEY, n)) for i, n in enumerate(names)}


def test_a_file_that_cannot_be_trusted_is_no_memory(tmp_path):
    """Absent, damaged anywhere, cut short, grown, under another key, a
    link, over the cap, or signed but not the shape written: load says
    None, and the run verifies every span (the same decision)."""
    import marshal
    import os

    states = _signed_fleet()
    proofs = keeper_proofs.Proofs(KEY)
    keeper_proofs.screen(states, proofs, NOW)
    where = _kept(tmp_path, proofs)
    good = open(where, "rb").read()
    assert proof_file.load(where, KEY) is not None and proof_file.load(where, OTHER_KEY) is None
    assert proof_file.load(str(tmp_path / "absent"), KEY) is None

    def refused(data):
        with open(where, "wb") as handle:
            handle.write(data)
        return proof_file.load(where, KEY) is None

    for at in range(0, len(good), max(1, len(good) // 97)):  # one byte changed anywhere
        assert refused(good[:at] + bytes([good[at] ^ 0x20]) + good[at + 1:])
    assert refused(good[:-1]) and refused(good + b"\0") and refused(b"") and refused(good[:20])
    def signed(names="gpu00", reasons=(DRIFT,), which=(0,), since=(1,), seen=(2,), proofs="0" * 32, odd_at=(0,),
               odd_heads=("x",)):
        """A file in the shape save writes, signed under KEY."""
        from array import array

        body = marshal.dumps((names, reasons, array("q", which).tobytes(), array("q", since).tobytes(),
                              array("q", seen).tobytes(), proofs, array("q", odd_at).tobytes(), odd_heads))
        return proof_file._MAGIC + proof_file._mac(KEY, body) + body

    assert not refused(signed()) and not refused(signed(odd_at=(), odd_heads=()))  # the shape written: read
    # the variants below are each one thing off
    assert refused(signed(names=b"gpu00")) and refused(signed(which=(1,))) and refused(signed(odd_heads=(b"x",)))
    assert refused(signed(odd_heads=("x", "y"))) and refused(signed(odd_heads=["x"])) and refused(signed(odd_at=(1,)))
    assert refused(signed(odd_at=(-1,))) and refused(signed(odd_at=(0, 0)))
    assert refused(signed(proofs="0" * 31)) and refused(signed(proofs="0" * 32 + "\n" + "0" * 32))
    assert refused(signed(since=(1, 2))) and refused(signed(reasons=[DRIFT]))
    assert refused(signed(names="gpu00\ngpu01"))  # two names, one verdict
    assert not refused(good)
    os.rename(where, where + ".real")
    os.symlink(where + ".real", where)
    assert proof_file.load(where, KEY) is None  # a link at the name
    os.unlink(where)
    os.rename(where + ".real", where)
    saved, proof_file._FILE_CAP = proof_file._FILE_CAP, len(good) - 1
    try:
        assert proof_file.load(where, KEY) is None
    finally:
        proof_file._FILE_CAP = saved


def test_a_kept_verdict_says_nothing_of_a_span_forged_beside_it(tmp_path):
    """The file keeps a node's verdict on its exact comment: a forged proof,
    another node's span, a stale or future one, or an admin's paste before
    its own span, in a later run, are judged afresh, as pending judges them."""
    states = _signed_fleet()
    proofs = keeper_proofs.Proofs(KEY)
    keeper_proofs.screen(states, proofs, NOW)
    stored = proof_file.load(_kept(tmp_path, proofs), KEY)
    own = states["gpu00"].comment
    forged = own[:own.index("proof ") + 6] + "0" * 32 + own[own.index("proof ") + 38:]
    later = dict(states)
    later["gpu00"] = replace(states["gpu00"], comment=forged)
    later["gpu01"] = replace(states["gpu01"], comment=states["gpu02"].comment)  # copied from another node
    later["gpu03"] = replace(states["gpu03"], comment=pending.publish("", DRIFT, NOW - 9999, KEY, "gpu03"))
    later["gpu04"] = replace(states["gpu04"], comment=states["gpu04"].comment + " " + states["gpu05"].comment)
    for now in (NOW, NOW + pending.MAX_AGE_SECONDS, NOW - pending.MAX_AGE_SECONDS):  # stale, then from the future
        again = keeper_proofs.Proofs(KEY, stored)
        mine, unverified, spans = keeper_proofs.screen(later, again, now)
        assert (mine, unverified) == reference_screen(later, KEY, now)
        assert again.hits == 2  # gpu02, gpu05: their own comments, unchanged (their times judged at `now`)
        assert {"gpu00", "gpu01"} <= set(unverified) and ("gpu03" in unverified) == (now >= NOW)
        assert ("gpu02" in spans) == (now == NOW)  # a kept verdict's times are judged at every run


def test_the_file_holds_one_runs_verdicts_and_is_written_when_due(tmp_path):
    """Written on a run that checked over a tenth of its spans afresh (the
    event's first run, or after many re-signed), not on the runs between;
    it holds the verdicts of the run that wrote it, none older."""
    states = _signed_fleet()
    where = str(tmp_path / proof_file.FILE)
    first = keeper_proofs.Proofs(KEY, proof_file.load(where, KEY))
    keeper_proofs.screen(states, first, NOW)
    assert first.stored is None and proof_file.save(where, first)
    second = keeper_proofs.Proofs(KEY, proof_file.load(where, KEY))
    keeper_proofs.screen(states, second, NOW)
    assert (second.hits, second.macs) == (6, 0) and not proof_file.save(where, second)
    fewer = {n: s for n, s in states.items() if n != "gpu05"}
    fewer["gpu00"] = replace(states["gpu00"], comment=pending.publish("", XID, NOW - 5, KEY, "gpu00"))
    third = keeper_proofs.Proofs(KEY, proof_file.load(where, KEY))
    keeper_proofs.screen(fewer, third, NOW)
    assert (third.hits, third.macs) == (4, 1) and proof_file.save(where, third)  # 1 of 5 afresh: due
    kept = _kept_texts(proof_file.load(where, KEY))
    assert kept == {n: s.comment for n, s in fewer.items()}  # gpu05 (no longer published) is gone from the file


def test_the_file_keeps_each_verdict_on_its_exact_text(tmp_path):
    """A comment as a node writes it is kept as its numbers (its text made
    again at load); one an admin wrote text before, or with a time written
    with a leading zero, keeps its head as it is; one with text after the
    span is left out.  Each node's kept text is its comment, character for
    character, and the next run finds each (the left-out one checked again)."""
    states = _signed_fleet()
    own = {n: s.comment for n, s in states.items()}
    padded = own["gpu01"].replace(" @", " @0")
    odd = {"gpu00": "rack 3 " + own["gpu00"], "gpu01": padded, "gpu02": own["gpu02"] + " rack 3"}
    states.update({n: replace(states[n], comment=c) for n, c in odd.items()})
    proofs = keeper_proofs.Proofs(KEY)
    mine, unverified, spans = keeper_proofs.screen(states, proofs, NOW)
    assert (mine, unverified) == reference_screen(states, KEY, NOW) and len(spans) == 6
    stored = proof_file.load(_kept(tmp_path, proofs), KEY)
    kept = _kept_texts(stored)
    assert kept == {n: s.comment for n, s in states.items() if n != "gpu02"}
    assert stored.odd == {"gpu00", "gpu01"}  # the heads kept as they are; the others made at load
    again = keeper_proofs.Proofs(KEY, stored)
    assert keeper_proofs.screen(states, again, NOW) == (mine, unverified, spans)
    assert (again.hits, again.macs) == (5, 1)
    stored = proof_file.load(_kept(tmp_path, again), KEY)  # written again from the hits: the same texts
    assert _kept_texts(stored) == kept and stored.odd == {"gpu00", "gpu01"}


def test_the_file_keeps_the_fleets_order_and_the_next_run_finds_it_so(tmp_path):
    """A run that passes kept verdicts and fresh ones (a later run of an
    event, a quarter of its nodes re-signed: the file is due) writes them
    in the fleet's order, as the next run reads the fleet; that run finds
    every node the file kept, compared place by place, and decides as
    the straightforward path does."""
    names = ["gpu%02d" % i for i in range(20)]
    states = {n: NodeState(n, "IDLE", frozenset(), "", None, "", ("gpu",),
                           pending.publish("", DRIFT, NOW - 600 - i, KEY, n)) for i, n in enumerate(names)}
    where = str(tmp_path / proof_file.FILE)
    first = keeper_proofs.Proofs(KEY)
    keeper_proofs.screen(states, first, NOW)
    assert proof_file.save(where, first)
    later = dict(states)
    for name in names[::4]:  # re-signed since: the same span, a new text, checked afresh
        later[name] = replace(states[name], comment=pending.publish(states[name].comment, DRIFT, NOW + 2000, KEY, name))
    assert all(later[n].comment != states[n].comment for n in names[::4])
    second = keeper_proofs.Proofs(KEY, proof_file.load(where, KEY))
    keeper_proofs.screen(later, second, NOW + 2000)
    assert (second.hits, second.macs) == (15, 5) and proof_file.save(where, second)
    kept = proof_file.load(where, KEY)
    assert kept.names == names and dict(zip(kept.names, kept.comments)) == {n: s.comment for n, s in later.items()}
    third = keeper_proofs.Proofs(KEY, kept)
    assert keeper_proofs.screen(later, third, NOW + 2030)[:2] == reference_screen(later, KEY, NOW + 2030)
    assert (third.hits, third.macs) == (20, 0)


def test_the_keepers_run_keeps_its_verdicts_for_the_next_process(tmp_path):
    """gpugate budget (a new process each timer run): the run writes the
    file beside its status, the next reads it and decides the same."""
    from gpugate.model.config import parse_settings

    key = tmp_path / "drain-budget.key"
    key.write_bytes(KEY + b"\n")
    key.chmod(0o600)
    base = parse_settings({"drain_budget": {"max_share": 0.25, "key_file": str(key)}}, "(test)")
    cfg = replace(base, sweep=dict(base.sweep, journal=str(tmp_path / "sweep.db")))
    states = _signed_fleet()

    class Fleet:
        def fleet(self):
            return of_states(states)

        def own_record(self, name):
            return None  # changed since the read: nothing is drained, the runs compare their plans

    runs = []
    for _ in range(3):
        keeper_proofs._LAST[:] = [b"", {}]  # a new process: nothing in memory
        figures = keeper.run_once(cfg, Fleet(), clock=lambda: NOW, sleep=lambda s: None)
        runs.append((figures["held"], figures["skipped"], figures["unverified"]))
        if len(runs) == 2:  # the file damaged: verified afresh, the same decision
            path = tmp_path / proof_file.FILE
            path.write_bytes(path.read_bytes()[:-3] + b"xyz")
    path = tmp_path / proof_file.FILE
    assert runs[0] == runs[1] == runs[2] and len(runs[0][1]) == 1  # one node's drain skipped: 25 % of 6
    assert proof_file.load(str(path), KEY) is not None  # the third run wrote it again, whole
    kept = path.read_bytes()
    states["gpu00"] = replace(states["gpu00"], comment=pending.publish("", XID, NOW - 5, KEY, "gpu00"))
    figures = keeper.run_once(cfg, Fleet(), clock=lambda: NOW, sleep=lambda s: None)  # --watch: the same process
    assert figures["ok"] and path.read_bytes() == kept  # its memory, not the file
