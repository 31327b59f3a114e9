"""The keeper's proof checks (issue 48): every published span is checked
as gpugate.slurm.pending.verified checks it, at the cost of a fleet-wide
event (100,000 nodes published at once) counted in microseconds a node.

- The HMAC is pending.proof's, with the key's two padded blocks hashed once
  per run (RFC 2104, what hmac.HMAC does before copying them) instead of
  once per proof: the same bytes (tests/test_keeper_lean.py compares them).
- A span is passed here only when its proof is this node's and its times
  are within pending's bounds; anything else is judged by
  pending.unverified itself, so that the verdict and the reason said for
  it are pending's, word for word.
- What a span's proof says does not change with the clock: it is
  remembered per exact (node, comment) text, under the key that checked
  it, for the run's re-read and the next run of the same process
  (`gpugate budget --watch`).  Only the entries of the latest run are kept,
  so the memory follows the fleet's published nodes and never grows past
  them.  What the screen verifies in one step is written there when the
  memory is next looked at (Proofs.settle), with the exact comment it
  judged.  The times are judged afresh by every call.
- A timer's run (a new process each time) reads the verdicts an earlier
  run kept (gpugate.budget.proof_file, HMACed under the budget key): a
  comment equal, character for character, to the one kept for its node
  is not checked again (its times are); any other is.
- A timer's run finds what the file kept for the whole fleet at once,
  each comment compared with the kept text in C (_kept_passed); only the
  nodes left go through the screen's loop, one by one.
- Comments with one opening mark (what a node writes, with an admin's
  text or not) are read here in one step; any other (an admin's paste
  beside the node's span) by pending.read_all."""

import hashlib

from gpugate.core.record import replace
from gpugate.slurm import pending

_OPEN = pending.OPEN
_TAIL = " " + pending.CLOSE
_PAD_IN = bytes(b ^ 0x36 for b in range(256))
_PAD_OUT = bytes(b ^ 0x5C for b in range(256))

# The latest run's memory: (key, {node: entry}), an entry (comment, ((Pending, its proof is the
# node's), ...)), or (comment, Pending, its proof is the node's) for a comment whose only opening
# mark begins a signed span (read in one step: _screen).
_LAST = [b"", {}]


class Signer:
    """pending.proof for one key."""

    def __init__(self, key: bytes):
        block = hashlib.sha256().block_size
        if len(key) > block:
            key = hashlib.sha256(key).digest()
        key = key.ljust(block, b"\0")
        self._inner = hashlib.sha256(key.translate(_PAD_IN))
        self._outer = hashlib.sha256(key.translate(_PAD_OUT))

    def proof(self, node: str, since: int, seen: int, reason: str) -> str:
        inner = self._inner.copy()
        inner.update(("%s\n%s\n%d\n%d\n%s" % (pending._DOMAIN, node, since, seen, reason)).encode(
            "utf-8", "surrogateescape"))
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()[:16].hex()


class Proofs:
    """One run's proof checks, remembered from the previous run of this
    process under the same key (see the module doc)."""

    def __init__(self, key: bytes, stored=None):
        import hmac
        import re

        self.key, self.signer, self._same = key, Signer(key), hmac.compare_digest
        self._head = re.compile(pending._HEAD.pattern)
        self.old = _LAST[1] if _LAST[0] == key else {}
        self.new = {}
        self.fresh = []  # (nodes, comments, spans) _screen verified, lists in step, not yet in new
        self.stored = stored  # an earlier run's verdicts (load), or None
        self.hits = self.macs = 0  # spans found in stored; spans HMACed in one step (save's rule)
        self.odd = []  # nodes whose span _screen read in one step from a comment not written as FMT writes it
        self.order = None  # the published nodes in the fleet's order, where the screen has them (save)

    def keep(self) -> None:
        """This run's memory serves the next run (this process's)."""
        self.settle()
        _LAST[:] = [self.key, self.new]

    def settle(self) -> None:
        """What _screen verified in one step, remembered: when the memory is
        next looked at, not a dict entry a node while it checks (the timer's
        run, a new process each time, mostly never looks)."""
        new = self.new
        for nodes, comments, spans in self.fresh:
            for node, comment, span in zip(nodes, comments, spans):
                new[node] = (comment, span, True)
        self.fresh = []

    def _spans(self, node: str, comment: str) -> tuple:
        """((span, its proof is this node's), ...) for each span of the comment."""
        if self.fresh:
            self.settle()
        got = self.new.get(node)
        if got is None or got[0] != comment:
            got = self.old.get(node)
            if got is None or got[0] != comment:
                got = (comment, tuple([(seen, seen.proof is not None and self._same(
                    seen.proof, self.signer.proof(node, seen.since, seen.seen, seen.reason)))
                    for seen in self._read(comment)]))
            self.new[node] = got
        return got[1] if len(got) == 2 else ((got[1], got[2]),)

    def _read(self, comment: str):
        """pending.read_all(comment), a comment with one opening mark in one step."""
        at = comment.find(_OPEN)
        if at < 0 or comment.find(_OPEN, at + 1) >= 0:
            return pending.read_all(comment)
        m = self._head.match(comment, at)  # pending's search can only find it there
        end = -1 if m is None else comment.find(_TAIL, m.end())
        if end < 0:
            return ()
        since, seen, proof = m.groups()
        return (pending.Pending(comment[m.end():end], int(since), None if seen is None else int(seen), proof),)

    def verified(self, node: str, comment: str, now: float):
        """pending.verified(comment, node, key, now)."""
        why = None
        for seen, mine in self._spans(node, comment):
            if (mine and seen.since <= seen.seen <= now + pending.CLOCK_SLACK_SECONDS
                    and now - seen.seen <= pending.MAX_AGE_SECONDS):
                return seen, None
            problem = pending.unverified(seen, node, self.key, now)  # pending's own words
            if problem is None:
                return seen, None
            why = why or problem
        return None, why


def screen(states, proofs: Proofs, now: float):
    """gpugate.keeper.run.screen's (states, unverified), and spans: node -> the
    span its screened comment reads as (budget.published's spans)."""
    from gpugate.slurm.nodestate.lean import paused_gc

    with paused_gc():
        return _screen(states, proofs, now)


def _screen(states, proofs: Proofs, now: float):
    """One pass.  A comment whose only opening mark begins a signed span
    (what a node writes, after an admin's text or not) is read and its
    proof checked here, each step as Proofs._spans and verified take it:
    the same bytes HMACed, the same bounds, remembered alike (the one-step
    entry); anything else goes through Proofs.verified (pending's own words
    for what fails).  A fleet-wide event's 100,000 spans carry one reason:
    each span holds the one string (the plan hashes it once).  A timer's
    run first finds the verdicts its file kept for the whole fleet at once
    (_kept_passed); only the nodes left are looked at one by one."""
    if proofs.fresh:
        proofs.settle()
    stored = proofs.stored
    hits = macs = 0
    out, unverified, spans = dict(states), {}, {}
    remembered, old, same, Pending = proofs.new, proofs.old, proofs._same, pending.Pending
    inner, outer, domain, join = proofs.signer._inner, proofs.signer._outer, pending._DOMAIN, "\n".join
    head, whole = _one()
    newest, max_age = now + pending.CLOCK_SLACK_SECONDS, pending.MAX_AGE_SECONDS
    recall = bool(remembered or old)  # else nothing is remembered yet, nor will be of a node not yet seen here
    shared = None
    nodes, comments, verified, texts = [], [], [], {}  # the spans verified in one step, in step
    todo, found = states.items(), {}
    if stored is not None:
        proofs.odd += stored.odd  # those found again are kept as they were
        kept_at, kept_comments = stored.index, stored.comments
        if not recall:  # a timer's run: the kept verdicts looked up for the whole fleet at once
            nodes, comments, verified, todo, found, hits, proofs.order = _kept_passed(states, stored, now, newest,
                                                                                      max_age)
            stored = None  # each node left was looked up: none is in the file as it reads now, or in time
    passed_node, passed_comment, passed, one = nodes.append, comments.append, verified.append, texts.setdefault
    odd = proofs.odd.append
    for name, state in todo:
        comment = state.comment
        if not comment or _OPEN not in comment:
            continue
        got = (remembered.get(name) or old.get(name)) if recall else found.get(name)
        if (got is None or got[0] != comment) and stored is not None:
            at = kept_at().get(name)
            if at is not None and kept_comments[at] == comment:  # the exact text an earlier run verified
                hits += 1
                span = stored.span(at)
                since, seen = span.since, span.seen
                if since <= seen <= newest and now - seen <= max_age:
                    passed_node(name)
                    passed_comment(comment)
                    passed(span)
                    continue
                got = (comment, span, True)
        if got is None or got[0] != comment:
            m = whole(comment)  # the span alone, its reason without "[" (so its only opening mark): one step
            if m is not None:
                first, last, proof, reason = m.groups()
            else:
                m = head(comment)
                at = m.end() if m is not None else 0
                end = comment.find(_TAIL, at) if at else -1
                if end >= 0 and comment.count(_OPEN) == 1:
                    first, last, proof = m.groups()
                    reason = comment[at:end]
                    odd(name)  # an admin's text before or after the span: the file keeps its head as it is
                else:
                    m = None
            if m is not None:
                since, seen = int(first), int(last)
                if reason != shared:  # a fleet-wide event: the reason the node before carried
                    shared = one(reason, reason)
                reason = shared
                if first[0] == "0" or last[0] == "0":  # as pending.proof writes them: the numbers' digits
                    first, last = str(since), str(seen)
                    odd(name)
                text = join((domain, name, first, last, reason))
                try:
                    text = text.encode()
                except UnicodeEncodeError:  # a lone surrogate: pending.proof's bytes for it
                    text = text.encode("utf-8", "surrogateescape")
                macs += 1
                mac = inner.copy()
                mac.update(text)
                check = outer.copy()
                check.update(mac.digest())
                span = Pending(reason, since, seen, proof)
                if same(proof, check.hexdigest()[:32]):
                    if since <= seen <= newest and now - seen <= max_age:
                        passed_node(name)  # the node's own span, alone: its state kept as it is
                        passed_comment(comment)
                        passed(span)
                        continue
                    got = (comment, span, True)
                else:
                    got = (comment, span, False)
            else:
                got = None
        if got is not None and len(got) == 3:  # one signed span, the comment's only opening mark
            remembered[name] = got
            span = got[1]
            if got[2] and span.since <= span.seen <= newest and now - span.seen <= max_age:
                spans[name] = span
                continue
        span, why = proofs.verified(name, comment, now)
        if span is None:
            unverified[name] = why
            out[name] = replace(state, comment="")
        else:
            if comment.count(_OPEN) > 1:
                out[name] = replace(state, comment=pending.alone(span))
                span = pending.read(out[name].comment)  # what budget.published would read there
            spans[name] = span
    if verified:
        proofs.fresh.append((nodes, comments, verified))
        spans.update(zip(nodes, verified))  # made in C, in one go
    proofs.hits += hits
    proofs.macs += macs
    return out, unverified, spans


def _kept_passed(states, stored, now: float, newest: float, max_age: float):
    """The published nodes whose comment is, character for character, the
    text an earlier run kept a verdict on (the file: Kept), found for the
    whole fleet at once: compared in C place by place where the fleet is
    read in the order the file kept (a timer's runs read the same fleet
    in the same order), else node by node.  Their times are judged as
    _screen judges them (one comparison each way for all, where all are
    within them).  Returns the nodes passed (names, comments, spans, in
    the fleet's order), the published nodes left (name, state) for
    _screen, those left with a kept span out of its times (name ->
    (comment, span, True): _screen's entry), how many were found, and the
    published nodes in the fleet's order (the file is written so: save)."""
    from itertools import compress, repeat
    from operator import contains, eq, le, not_

    said = [state.comment or "" for state in states.values()]
    marked = list(map(contains, said, repeat(_OPEN)))
    names, texts = list(compress(states, marked)), list(compress(said, marked))
    if stored.names == names:  # in the order kept: compared in C
        hit = list(map(eq, texts, stored.comments))
        count = sum(hit)

        def pick(kept):
            return list(compress(kept, hit))
    else:
        at, kept = stored.index().get, stored.comments
        places = list(map(at, names))
        hit = [place is not None and kept[place] == text for place, text in zip(places, texts)]
        places = list(compress(places, hit))
        count = len(places)

        def pick(kept):
            return list(map(kept.__getitem__, places))
    since, seen = pick(stored.since), pick(stored.seen)
    reasons = (repeat(stored.reasons[0]) if len(stored.reasons) == 1  # a fleet-wide event's one reason
               else map(stored.reasons.__getitem__, pick(stored.which)))
    spans = list(map(pending.Pending, reasons, since, seen, pick(stored.proofs)))
    found_names, found_texts = list(compress(names, hit)), list(compress(texts, hit))
    late = {}
    if spans and not (all(map(le, since, seen)) and max(seen) <= newest and now - min(seen) <= max_age):
        timely = [first <= last <= newest and now - last <= max_age for first, last in zip(since, seen)]
        late = {name: (text, span, True) for name, text, span, ok in zip(found_names, found_texts, spans, timely)
                if not ok}
        found_names, found_texts, spans = (list(compress(found_names, timely)), list(compress(found_texts, timely)),
                                           list(compress(spans, timely)))
    if late:
        taken = set(found_names)
        left = [name for name in names if name not in taken]
    else:
        left = compress(names, map(not_, hit))
    return found_names, found_texts, spans, [(name, states[name]) for name in left], late, count, names


_ONE = []


def _one():
    """The search for a signed span's head, as pending._HEAD reads a signed
    one written in ASCII digits (where the comment holds a single opening
    mark, it is found there; other decimal digits, which pending reads too,
    are left to Proofs.verified); its reason runs up to the first closing
    mark after it, as Proofs._read.  And the match of a comment that is
    such a span alone, its reason without "[" (what a node writes): no
    other opening mark, and the closing mark after the reason is its first."""
    if not _ONE:
        import re

        head = r"\[gpugate-pending @([0-9]{1,12}) seen @([0-9]{1,12}) proof ([0-9a-f]{32})\] "
        _ONE.append(re.compile(head).search)
        _ONE.append(re.compile(head + r"([^\[]*) \[/gpugate-pending\]").fullmatch)
    return _ONE[0], _ONE[1]
