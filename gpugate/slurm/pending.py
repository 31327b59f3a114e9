"""A budgeted finding published on the node's own Slurm record, for the
budget keeper (gpugate.keeper.run) to drain within the drain budget.

Where: the node's ``Comment`` (Slurm 20.11+): only root and SlurmUser may
set it, slurmctld saves it in its state, slurmd and the scheduler never
change it, and every read of the node carries it (``scontrol show node``,
JSON ``comment``, ``sinfo -O Comment``).  ``Extra`` is avoided: slurmd
``--extra`` overwrites it and ``extra_constraints`` schedules on it.

gpugate's part is one bracketed span; an admin's text around it is kept::

    rack 3 [gpugate-pending @1764120000 seen @1764123600 proof 9f86...] gpugate: drift driver=... [/gpugate-pending]

Slurm admins and operators may set the Comment too, so the span carries a
proof that this node wrote it (issue 33, item 6): an HMAC, with the drain
budget key only root on the nodes and the controller reads
(gpugate.safety.budgetkey), of the node's name, the first time it published the
reason (``@``), the time it last signed it (``seen``: a node re-signs a held
finding every REFRESH_SECONDS) and the reason.  The keeper drains only a
span that verifies for that node and was signed within MAX_AGE_SECONDS: an
admin's pasted span, one copied from another node, an old one pasted back
after the node cleared it, or one from a gpugate without proofs (a rolling
upgrade) is *unverified*: held and visible, never drained, and it takes no
place in the keeper's queue and no budget.

Pure functions: text in, text out."""

from gpugate.core.lazyre import Lazy

OPEN, CLOSE = "[gpugate-pending @", "[/gpugate-pending]"
_PART = Lazy(r"\s*\[gpugate-pending @(\d{1,12})(?: seen @(\d{1,12}) proof ([0-9a-f]{32}))?\] ([\s\S]*?) "
              r"\[/gpugate-pending\]")
# What reads the spans (the keeper reads 100,000 at a time): _PART's head,
# then the first closing mark by str.find, which is what its lazy (.*?)
# finds, without the regex engine's step per character.
_HEAD = Lazy(r"\[gpugate-pending @(\d{1,12})(?: seen @(\d{1,12}) proof ([0-9a-f]{32}))?\] ")
_TAIL = " " + CLOSE
# A held node re-signs its finding this often (one read and one comment
# update per held node); the keeper refuses a proof older than MAX_AGE:
# an old span pasted back verifies for at most that long.  Four refreshes:
# a node whose checks run an hour apart stays verified.
REFRESH_SECONDS = 1800
MAX_AGE_SECONDS = 4 * REFRESH_SECONDS
# Clocks of the nodes and the controller agree (munge needs it) to this.
CLOCK_SLACK_SECONDS = 300
_DOMAIN = "gpugate-pending/1"


class Pending:
    """What a node published: the reason it would drain with, since when,
    and (from a node with the key) when it signed it and the proof."""

    __slots__ = ("reason", "since", "seen", "proof")

    def __init__(self, reason: str, since: int, seen=None, proof=None):
        self.reason, self.since, self.seen, self.proof = reason, since, seen, proof

    def __eq__(self, other):
        return isinstance(other, Pending) and (self.reason, self.since) == (other.reason, other.since)

    def __repr__(self):
        return "Pending(%r, %d, seen=%r)" % (self.reason, self.since, self.seen)


def _spans(comment: str):
    """Each span, in order, as _PART.finditer reads them."""
    pos = 0
    while True:
        m = _HEAD.search(comment, pos)
        if m is None:
            return
        end = comment.find(_TAIL, m.end())
        if end < 0:
            return
        since, seen, proof_ = m.groups()
        yield Pending(comment[m.end():end], int(since), None if seen is None else int(seen), proof_)
        pos = end + len(_TAIL)


_READ = {}  # comment -> its spans; emptied when it holds 2^17 of them
_READ_MAX = 1 << 17


def _parsed(comment: str) -> tuple:
    # The keeper reads each comment twice a run (its proof, then the plan),
    # and the same comments run after run (--watch): read once.
    found = _READ.get(comment)
    if found is None:
        if len(_READ) >= _READ_MAX:
            _READ.clear()
        found = _READ[comment] = tuple(_spans(comment))
    return found


def read(comment: str):
    """The first Pending in a node's comment, or None (unverified: see
    verified() for the one the keeper may act on)."""
    if not comment or OPEN not in comment:
        return None
    found = _parsed(comment)
    return found[0] if found else None


def read_all(comment: str):
    """Every span in the comment, in order (an admin may paste one beside the node's)."""
    return list(_parsed(comment)) if comment and OPEN in comment else []


def others(comment: str) -> str:
    """The comment without gpugate's spans: the admin's text, untouched.
    What _PART.sub("") leaves, read as _spans reads (one pass: the pattern
    scans the rest of the text from every unclosed head an admin wrote)."""
    if not comment or OPEN not in comment:
        return (comment or "").strip()
    kept, pos = [], 0
    while True:
        m = _HEAD.search(comment, pos)
        end = comment.find(_TAIL, m.end()) if m is not None else -1
        if end < 0:
            break
        kept.append(comment[pos:m.start()].rstrip())  # _PART's leading \s*
        pos = end + len(_TAIL)
    kept.append(comment[pos:])
    return "".join(kept).strip()


def proof(key: bytes, node: str, since: int, seen: int, reason: str) -> str:
    """The span's proof: HMAC-SHA256 (first 128 bits, hex) of the domain,
    node, times and reason, each on its own line (none holds a newline)."""
    import hashlib  # here: a held node's prolog reads REFRESH_SECONDS, and OpenSSL costs it ~4 ms
    import hmac

    text = "\n".join((_DOMAIN, node, str(int(since)), str(int(seen)), reason))
    return hmac.digest(key, text.encode("utf-8", "surrogateescape"), hashlib.sha256)[:16].hex()


def _same(a: str, b: str) -> bool:
    import hmac

    return hmac.compare_digest(a, b)  # in constant time: no byte-by-byte guessing


def publish(comment: str, reason: str, now: int, key=None, node: str = "", since=None) -> str:
    """The comment with ``reason`` published (the first time kept when the
    same reason is already there: the keeper drains the oldest first),
    signed now for ``node`` with ``key``; without a key, unsigned (the
    keeper will not drain it).  Signing, the first time is taken only from
    a span this node signed, else from ``since`` (the node's own record of
    it), never from a span someone pasted: that would move it up the queue
    (an old copy of its own, one the keeper refuses, pasted back included)."""
    reason = " ".join(reason.replace(CLOSE, "").split())  # one line, never our closing mark
    if key:
        seen = next((p for p in read_all(comment) if unverified(p, node, key, now) is None), None)
    else:
        seen = read(comment)
    if seen is not None and seen.reason == reason and seen.since <= now:
        since = seen.since
    elif since is None or not 0 <= int(since) <= now:
        since = int(now)
    if key:
        signed = int(now)
        if (seen is not None and seen.reason == reason and seen.seen is not None
                and 0 <= now - seen.seen < REFRESH_SECONDS and unverified(seen, node, key, now) is None):
            signed = seen.seen  # still good: nothing to write
        head = "%s%d seen @%d proof %s]" % (OPEN, since, signed, proof(key, node, since, signed, reason))
    else:
        head = "%s%d]" % (OPEN, since)
    part = "%s %s %s" % (head, reason, CLOSE)
    rest = others(comment)
    return (rest + " " + part) if rest else part


def alone(seen: Pending) -> str:
    """A comment holding only this span (what the keeper plans on once it
    has verified the span), its signing time and proof kept: the keeper's
    memory reads when the node signed it."""
    if seen.seen is None or seen.proof is None:
        return "%s%d] %s %s" % (OPEN, seen.since, seen.reason, CLOSE)
    return "%s%d seen @%d proof %s] %s %s" % (OPEN, seen.since, seen.seen, seen.proof, seen.reason, CLOSE)


def clear(comment: str) -> str:
    return others(comment)


def unverified(seen: Pending, node: str, key: bytes, now: float):
    """Why the keeper must not act on this span for ``node``, or None."""
    if seen.proof is None:
        return ("unverified tag: no proof (written by hand, or by a node without the drain budget key or "
                "with a gpugate before proofs)")
    if not _same(seen.proof, proof(key, node, seen.since, seen.seen, seen.reason)):
        return "unverified tag: its proof is not this node's (pasted, copied from another node, or another key)"
    if seen.since > seen.seen:
        return "unverified tag: first published after it was signed"
    if seen.seen > now + CLOCK_SLACK_SECONDS:
        return "unverified tag: signed in the future (%d s ahead of the controller's clock)" % (seen.seen - now)
    if now - seen.seen > MAX_AGE_SECONDS:
        return ("unverified tag: signed %d s ago, over %d s (an old copy, or the node stopped re-signing it)"
                % (now - seen.seen, MAX_AGE_SECONDS))
    return None


def verified(comment: str, node: str, key: bytes, now: float):
    """(the span the node wrote, None) or (None, why none is): the first
    span that verifies; an admin's pasted one beside it changes nothing."""
    why = None
    for seen in read_all(comment):
        problem = unverified(seen, node, key, now)
        if problem is None:
            return seen, None
        why = why or problem
    return None, why
