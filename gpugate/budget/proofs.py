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
  run kept in FILE (load, save; HMACed under the budget key): a comment
  equal, character for character, to the one kept for its node is not
  checked again (its times are); any other is.  A file it cannot trust is
  no memory.  Written when over a tenth of a run's verdicts were not in
  it: most runs of a fleet-wide event read it and write nothing.
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
    each span holds the one string (the plan hashes it once)."""
    if proofs.fresh:
        proofs.settle()
    stored = proofs.stored
    if stored is not None:
        where, kept_reason, kept_end, kept_odd = stored[0].get, stored[1], stored[2], stored[3]
        proofs.odd += kept_odd  # those found again are kept as they were
    hits = macs = 0
    out, unverified, spans = dict(states), {}, {}
    remembered, old, same, Pending = proofs.new, proofs.old, proofs._same, pending.Pending
    inner, outer, domain, join = proofs.signer._inner, proofs.signer._outer, pending._DOMAIN, "\n".join
    head, whole = _one()
    newest, max_age = now + pending.CLOCK_SLACK_SECONDS, pending.MAX_AGE_SECONDS
    recall = bool(remembered or old)  # else nothing is remembered yet, nor will be of a node not yet seen here
    shared = None
    nodes, comments, verified, texts = [], [], [], {}  # the spans verified in one step, in step
    passed_node, passed_comment, passed, one = nodes.append, comments.append, verified.append, texts.setdefault
    odd = proofs.odd.append
    for name, state in states.items():
        comment = state.comment
        if not comment or _OPEN not in comment:
            continue
        got = (remembered.get(name) or old.get(name)) if recall else None
        if (got is None or got[0] != comment) and stored is not None:
            kept = where(name)
            if kept is not None:  # the exact text an earlier run verified: its head, then its reason and closing mark
                kept, w, since, seen, proof = kept
                tail = kept_end[w]
                if len(comment) == len(kept) + len(tail) and comment.startswith(kept) and comment.endswith(tail):
                    hits += 1
                    span = Pending(kept_reason[w], since, seen, proof)
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


# -- the verdicts kept between the timer's runs (see the module doc) ------------------------

FILE = "budget-keeper-proofs.bin"
_MAGIC = b"gpugate-keeper-proofs/2\n"  # also the HMAC's domain: no span's proof reads as a file's
_FILE_CAP = 128 << 20  # bytes: a larger file is not read (everything verified)
_MAX_ENTRIES = 1 << 20
_RESAVE = 0.1  # written again when over this share of a run's verdicts were not in the file
FMT = _OPEN + "%d seen @%d proof %s] "  # a head as pending.publish writes it: a kept one unless odd (save)


def path(status_path: str) -> str:
    """Beside the keeper's status (gpugate.keeper.run.status_path), root's."""
    return status_path[:status_path.rfind("/") + 1] + FILE


def _mac(key: bytes, body) -> bytes:
    import hmac

    mac = hmac.new(key, _MAGIC, hashlib.sha256)
    mac.update(body)
    return mac.digest()


def load(where: str, key: bytes):
    """The verdicts an earlier run kept under this key (Proofs' stored), or
    None: absent, unreadable, not a regular file of this user's, over the
    cap, not signed under this key or not the shape save writes.  None
    means every span is verified.  A kept comment is its head (the text up
    to its reason: FMT's, made here from the numbers kept, or kept as it
    is for an odd one) and its reason's number: a fleet-wide event's
    100,000 comments share one reason, kept once.  Returns (node -> (head,
    reason's number, first time, signing time, proof), reasons, what
    follows each reason's head, the nodes whose head was kept as it is)."""
    import hmac
    import marshal
    import os
    from array import array

    from gpugate.safety.safeio import open_regular

    try:
        fd = open_regular(where, owners=frozenset({os.geteuid()}))
        try:
            size = os.fstat(fd).st_size
            data = os.read(fd, size + 1) if size <= _FILE_CAP else b""  # one read; grown or short: refused
        finally:
            os.close(fd)
        head = len(_MAGIC) + 32
        if len(data) != size or size < head or not data.startswith(_MAGIC):
            return None
        body = memoryview(data)[head:]
        if not hmac.compare_digest(_mac(key, body), data[len(_MAGIC):head]):
            return None  # another key's, damaged or not ours: nothing is trusted
        names, reasons, which, since, seen, proofs, odd_at, odd_heads = marshal.loads(body)
        names, proofs = (names.split("\n") if names else []), (proofs.split("\n") if proofs else [])
        count = len(names)
        which, since, seen, odd_at = array("q", which), array("q", since), array("q", seen), array("q", odd_at)
        if (type(reasons) is not tuple or type(odd_heads) is not tuple or count > _MAX_ENTRIES
                or set(map(type, reasons)) - {str} or set(map(type, odd_heads)) - {str}
                or not len(which) == len(since) == len(seen) == len(proofs) == count
                or len(odd_at) != len(odd_heads) or (odd_at and not 0 <= min(odd_at) <= max(odd_at) < count)
                or (count and (set(map(len, proofs)) != {32} or not 0 <= min(which) <= max(which) < len(reasons)))):
            return None
        heads = list(map(FMT.__mod__, zip(since, seen, proofs)))  # what pending.publish wrote, made in C
        for at, kept in zip(odd_at, odd_heads):
            heads[at] = kept
        ends = tuple(reason + _TAIL for reason in reasons)  # what follows a kept head: the reason, the closing mark
        return (dict(zip(names, zip(heads, which, since, seen, proofs))), reasons, ends,
                frozenset(names[at] for at in odd_at))
    except Exception:  # noqa: BLE001 - whatever it is, it is no memory: verify everything
        return None


def save(where: str, proofs: Proofs) -> bool:
    """Keep this run's verdicts for the next run's load, when over a tenth
    of them were not in the file it read (or it read none): every span
    this run verified in one step and found within its times (the node,
    its reason's number, what it reads as; the head of the comment only
    where it is not FMT's: an admin's text before the span, a time written
    with a leading zero), a comment with text after its span's closing
    mark left out (it is checked again).  False when not written (not
    due, or the write failed: the next run verifies what the file lacks)."""
    if not proofs.macs:
        return False  # nothing checked afresh: what the file holds (or its absence) stands
    if proofs.stored is not None and proofs.macs <= _RESAVE * (proofs.macs + proofs.hits):
        return False
    import marshal
    from array import array
    from itertools import compress
    from operator import attrgetter, not_

    from gpugate.safety.state import write_bytes

    names, comments, spans = [], [], []
    for nodes, texts, verified in proofs.fresh:  # passed in one step by _screen, in step
        names, comments, spans = names + nodes, comments + texts, spans + verified
    if len(proofs.fresh) > 1 and len(set(names)) != len(names):  # a node screened twice: its latest verdict
        latest = dict(zip(names, zip(comments, spans)))
        names, comments, spans = list(latest), [c for c, _ in latest.values()], [p for _, p in latest.values()]
    names, comments, spans = names[:_MAX_ENTRIES], comments[:_MAX_ENTRIES], spans[:_MAX_ENTRIES]
    odd = set(proofs.odd)
    odd = list(compress(range(len(names)), map(odd.__contains__, names))) if odd else []
    cut = {at for at in odd if not comments[at].endswith(spans[at].reason + _TAIL)}
    if cut:  # text after the span's closing mark: left out, checked again
        keep = list(map(not_, map(cut.__contains__, range(len(names)))))
        names, comments, spans = list(compress(names, keep)), list(compress(comments, keep)), list(compress(spans, keep))
        odd = list(compress(range(len(names)), map(set(odd).__contains__, compress(range(len(keep)), keep))))
    said = list(map(attrgetter("reason"), spans))
    reasons = {r: i for i, r in enumerate(dict.fromkeys(said))}
    which = bytes(8 * len(said)) if len(reasons) == 1 else array("q", map(reasons.__getitem__, said)).tobytes()
    odd_heads = {at: comments[at][:len(comments[at]) - len(spans[at].reason + _TAIL)] for at in odd}
    odd_heads = {at: head for at, head in odd_heads.items() if head != FMT % (  # FMT's after all: made at load
        spans[at].since, spans[at].seen, spans[at].proof)}
    body = marshal.dumps(("\n".join(names), tuple(reasons), which,  # a name holds no newline (fields._name)
                          array("q", map(attrgetter("since"), spans)).tobytes(),
                          array("q", map(attrgetter("seen"), spans)).tobytes(),
                          "\n".join(map(attrgetter("proof"), spans)),  # 32 hex digits each (_one's head)
                          array("q", odd_heads).tobytes(), tuple(odd_heads.values())))
    try:
        write_bytes(where, _MAGIC + _mac(proofs.key, body) + body, durable=False, mode=0o600)
    except OSError:
        return False
    return True
