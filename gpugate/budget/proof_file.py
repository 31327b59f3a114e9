"""The proof verdicts the budget keeper keeps between the timer's runs
(issue 48): a timer's run is a new process each time, so what one run
verified (gpugate.budget.proofs) is written here, HMACed under the budget
key, for the next run to read.

A comment equal, character for character, to the one kept for its node is
not checked again (its times are, by every run); any other is.  A file it
cannot trust is no memory: every span is verified.  Written when over a
tenth of a run's verdicts were not in it: most runs of a fleet-wide event
read it and write nothing.  It holds the verdicts of the run that wrote
it, in the fleet's order, none older."""

import hashlib

from gpugate.slurm import pending

FILE = "budget-keeper-proofs.bin"
_MAGIC = b"gpugate-keeper-proofs/2\n"  # also the HMAC's domain: no span's proof reads as a file's
_FILE_CAP = 128 << 20  # bytes: a larger file is not read (everything verified)
_MAX_ENTRIES = 1 << 20
_RESAVE = 0.1  # written again when over this share of a run's verdicts were not in the file
_TAIL = " " + pending.CLOSE
FMT = pending.OPEN + "%d seen @%d proof %s] "  # a head as pending.publish writes it: a kept one unless odd (save)


class Kept:
    """What an earlier run kept (load's): names, in the order it read
    them; comments, the exact text each verdict was on; reasons (the
    distinct ones) and which (each node's, by number), since, seen and
    proofs: what each reads as; odd: the nodes whose comment is not
    FMT's (an admin's text before the span, a time written with a leading
    zero).  index(): node -> its place."""

    __slots__ = ("names", "comments", "reasons", "which", "since", "seen", "proofs", "odd", "_index")

    def __init__(self, names, comments, reasons, which, since, seen, proofs, odd):
        self.names, self.comments, self.reasons, self.which = names, comments, reasons, which
        self.since, self.seen, self.proofs, self.odd = since, seen, proofs, odd
        self._index = None

    def index(self) -> dict:
        if self._index is None:
            self._index = dict(zip(self.names, range(len(self.names))))
        return self._index

    def span(self, at: int):
        return pending.Pending(self.reasons[self.which[at]], self.since[at], self.seen[at], self.proofs[at])


def path(status_path: str) -> str:
    """Beside the keeper's status (gpugate.keeper.run.status_path), root's."""
    return status_path[:status_path.rfind("/") + 1] + FILE


def _mac(key: bytes, body) -> bytes:
    import hmac

    mac = hmac.new(key, _MAGIC, hashlib.sha256)
    mac.update(body)
    return mac.digest()


def load(where: str, key: bytes):
    """The verdicts an earlier run kept under this key (a Kept: Proofs'
    stored), or None: absent, unreadable, not a regular file of this
    user's, over the cap, not signed under this key or not the shape save
    writes.  None means every span is verified.  A kept comment is written
    as its head (the text up to its reason: FMT's, made here from the
    numbers kept, or kept as it is for an odd one) and its reason's
    number: a fleet-wide event's 100,000 comments share one reason, kept
    once."""
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
        ends = tuple(reason + _TAIL for reason in reasons)  # what follows a kept head: the reason, the closing mark
        # what pending.publish wrote, made in C
        comments = list(map((FMT + "%s").__mod__, zip(since, seen, proofs, map(ends.__getitem__, which))))
        for at, kept in zip(odd_at, odd_heads):
            comments[at] = kept + ends[which[at]]
        return Kept(names, comments, reasons, which.tolist(), since.tolist(), seen.tolist(), proofs,
                    frozenset(names[at] for at in odd_at))
    except Exception:  # noqa: BLE001 - whatever it is, it is no memory: verify everything
        return None


def save(where: str, proofs) -> bool:
    """Keep this run's verdicts (a gpugate.budget.proofs.Proofs) for the
    next run's load, when over a tenth of them were not in the file it
    read (or it read none): every span this run verified in one step and
    found within its times (the node, its reason's number, what it reads
    as; the head of the comment only where it is not FMT's: an admin's
    text before the span, a time written with a leading zero), a comment
    with text after its span's closing mark left out (it is checked
    again).  False when not written (not due, or the write failed: the
    next run verifies what the file lacks)."""
    if not proofs.macs:
        return False  # nothing checked afresh: what the file holds (or its absence) stands
    if proofs.stored is not None and proofs.macs <= _RESAVE * (proofs.macs + proofs.hits):
        return False
    import marshal
    from array import array
    from itertools import compress
    from operator import attrgetter, gt, not_

    from gpugate.safety.state import write_bytes

    names, comments, spans = [], [], []
    for nodes, texts, verified in proofs.fresh:  # passed in one step by the screen, in step
        names, comments, spans = names + nodes, comments + texts, spans + verified
    if len(proofs.fresh) > 1 and len(set(names)) != len(names):  # a node screened twice: its latest verdict
        latest = dict(zip(names, zip(comments, spans)))
        names, comments, spans = list(latest), [c for c, _ in latest.values()], [p for _, p in latest.values()]
    if proofs.order:  # in the fleet's order, as the next run reads it (the screen compares the two place by place)
        rank = dict(zip(proofs.order, range(len(proofs.order))))
        keys = [rank.get(name, len(rank)) for name in names]
        if any(map(gt, keys, keys[1:])):
            order = sorted(range(len(names)), key=keys.__getitem__)
            names, comments, spans = ([names[at] for at in order], [comments[at] for at in order],
                                      [spans[at] for at in order])
    names, comments, spans = names[:_MAX_ENTRIES], comments[:_MAX_ENTRIES], spans[:_MAX_ENTRIES]
    odd = set(proofs.odd)
    odd = list(compress(range(len(names)), map(odd.__contains__, names))) if odd else []
    cut = {at for at in odd if not comments[at].endswith(spans[at].reason + _TAIL)}
    if cut:  # text after the span's closing mark: left out, checked again
        keep = list(map(not_, map(cut.__contains__, range(len(names)))))
        names, comments, spans = (list(compress(names, keep)), list(compress(comments, keep)),
                                  list(compress(spans, keep)))
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
                          "\n".join(map(attrgetter("proof"), spans)),  # 32 hex digits each (the screen's head)
                          array("q", odd_heads).tobytes(), tuple(odd_heads.values())))
    try:
        write_bytes(where, _MAGIC + _mac(proofs.key, body) + body, durable=False, mode=0o600)
    except OSError:
        return False
    return True
