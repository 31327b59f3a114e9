"""A budgeted finding published on the node's own Slurm record, for the
budget keeper (gpugate.keeper) to drain within the drain budget.

Where: the node's ``Comment`` (Slurm 20.11+): only root and SlurmUser may
set it, slurmctld saves it in its state, slurmd and the scheduler never
change it, and every read of the node carries it (``scontrol show node``,
JSON ``comment``, ``sinfo -O Comment``).  ``Extra`` is avoided: slurmd
``--extra`` overwrites it and ``extra_constraints`` schedules on it.

gpugate's part is one bracketed span; an admin's text around it is kept::

    rack 3 cable swap [gpugate-pending @1764120000] gpugate: drift driver=... [/gpugate-pending]

Pure functions: text in, text out."""

import re

OPEN, CLOSE = "[gpugate-pending @", "[/gpugate-pending]"
_PART = re.compile(r"\s*\[gpugate-pending @(\d{1,12})\] (.*?) \[/gpugate-pending\]", re.S)


class Pending:
    """What a node published: the reason it would drain with, and since when."""

    __slots__ = ("reason", "since")

    def __init__(self, reason: str, since: int):
        self.reason, self.since = reason, since

    def __eq__(self, other):
        return isinstance(other, Pending) and (self.reason, self.since) == (other.reason, other.since)

    def __repr__(self):
        return "Pending(%r, %d)" % (self.reason, self.since)


def read(comment: str):
    """The Pending in a node's comment, or None."""
    m = _PART.search(comment or "")
    if not m:
        return None
    return Pending(m.group(2), int(m.group(1)))


def others(comment: str) -> str:
    """The comment without gpugate's part: the admin's text, untouched."""
    return _PART.sub("", comment or "", count=1).strip()


def publish(comment: str, reason: str, now: int) -> str:
    """The comment with ``reason`` published (the time kept when the same
    reason is already there: the keeper drains the oldest first)."""
    reason = " ".join(reason.replace(CLOSE, "").split())  # one line, never our closing mark
    seen = read(comment)
    since = seen.since if seen is not None and seen.reason == reason else int(now)
    part = "%s%d] %s %s" % (OPEN, since, reason, CLOSE)
    rest = others(comment)
    return (rest + " " + part) if rest else part


def clear(comment: str) -> str:
    return others(comment)
