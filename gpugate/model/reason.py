"""The drain Reason: one ASCII line, <= 255 bytes, parseable back.

    gpugate: drift driver=550.54.15 (want 580.65.06); vbios:gpu3=96.00.74 (want 96.00.99); +2 more

Tag first, then the class, so the 20 characters `sinfo -R` shows by default
already say whose drain it is and what kind of problem.  The tag is the only
mark of ownership (ReasonUser is root for everything run as root).
"""

from __future__ import annotations

from gpugate.model.findings import CHECK_CLASSES, CLASSES, Finding, is_acute, sort_findings
from gpugate.core.lazyre import Lazy
from gpugate.core.record import dataclass

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Optional, Sequence, Tuple

MAX_BYTES = 255
_VALUE_MAX = 64
_SEP = "; "
_FINDING_RE = Lazy(
    r"^(?P<component>[a-z0-9_]{1,32})(?::gpu(?P<gpu>\d{1,3}))?=(?P<observed>[^;()]*) \(want (?P<expected>[^;()]*)\)$")
_MORE_RE = Lazy(r"^\+(\d{1,4}) more$")
_NOT_COMPONENT = Lazy(r"[^a-z0-9_]")
# What slurmctld appends to a reason around `scontrol reboot nextstate=...`:
# " : reboot issued" when it sends the reboot, " : reboot complete" when
# the node registers again.  The reason is still ours, findings unchanged.
_SLURM_SUFFIXES = (" : reboot issued", " : reboot complete")
# Characters with a meaning in the format are replaced, so a value cannot
# forge a finding boundary; control characters would break `sinfo -R`.
_REPLACE = str.maketrans({";": ",", "(": "[", ")": "]", "\t": " ", "\r": " ", "\n": " "})


def sanitize(text: str, limit: int = _VALUE_MAX) -> str:
    text = str(text).translate(_REPLACE)
    text = "".join(c if 32 <= ord(c) < 127 else "?" for c in text)
    text = " ".join(text.split())  # no leading/trailing/double spaces
    if len(text) > limit:
        text = text[: max(limit - 2, 1)] + ".."
    return text or "-"


def _component(name: str) -> str:
    name = _NOT_COMPONENT.sub("_", str(name).lower())[:32]
    return name or "unknown"


def render_finding(f: Finding, limit: int = _VALUE_MAX) -> str:
    where = ":gpu%d" % f.gpu if f.gpu is not None and 0 <= f.gpu < 1000 else ""
    return "%s%s=%s (want %s)" % (_component(f.component), where, sanitize(f.observed, limit),
                                  sanitize(f.expected, limit))


def render(tag: str, cls: str, findings: Sequence[Finding]) -> str:
    """The reason for findings of class ``cls`` (the most severe present).

    Findings are ordered most severe first; as many as fit are shown, then
    ``+N more``.  The result is always ASCII, one line, <= MAX_BYTES.
    """
    tag = sanitize(tag, 16).replace(" ", "")
    head = "%s %s" % (tag, cls if cls in CLASSES else "probe")
    ordered = sort_findings(findings)
    parts = []
    for i, f in enumerate(ordered):
        text = render_finding(f)
        rest = len(ordered) - i - 1
        tail = len(_SEP + "+%d more" % rest) if rest else 0
        line = " ".join([head, _SEP.join(parts + [text])])
        if len(line) + tail <= MAX_BYTES:
            parts.append(text)
            continue
        if not parts:  # the first finding alone is too long: shorten its values
            budget = MAX_BYTES - len(head) - 1 - tail - len(_component(f.component)) - 16
            parts.append(render_finding(f, max(budget // 2, 4)))
            continue
        parts.append("+%d more" % (len(ordered) - i))
        break
    line = head + (" " + _SEP.join(parts) if parts else "")
    return line[:MAX_BYTES]


@dataclass(frozen=True)
class ParsedReason:
    """A gpugate reason read back from Slurm."""

    tag: str
    cls: str
    findings: Tuple[Finding, ...]
    more: int
    text: str

    @property
    def first(self) -> Optional[Finding]:
        return self.findings[0] if self.findings else None


def parse(text: Optional[str], tag: str) -> Optional[ParsedReason]:
    """Read a reason back; None when it is not gpugate's (never guess)."""
    if not text or not text.startswith(tag + " "):
        return None
    rest = _without_slurm_suffixes(text[len(tag) + 1:])
    cls, _, body = rest.partition(" ")
    if cls not in CLASSES:
        return None
    findings, more = [], 0
    for part in body.split(_SEP) if body else []:
        m = _FINDING_RE.match(part)
        if m:
            gpu = m.group("gpu")
            findings.append(Finding(cls=cls, component=m.group("component"), observed=m.group("observed"),
                                    expected=m.group("expected"), action="",
                                    gpu=int(gpu) if gpu is not None else None))
            continue
        m = _MORE_RE.match(part)
        if m:
            more = int(m.group(1))
            continue
        # Free text (e.g. an escalation note) is kept in ``text`` only.
    return ParsedReason(tag=tag, cls=cls, findings=tuple(findings), more=more, text=text)


def acute(parsed: Optional[ParsedReason]) -> bool:
    """Was this drain for an acute finding (outside the drain budget)?
    Reasons lead with their acute finding (findings.sort_findings), so the
    first finding decides.  The sweep's work reasons keep only the class
    (``sweep=...`` first): they read as budgeted, as does anything unknown,
    which can only make the budget stricter, never looser, also where the
    findings of a deferred escalation follow (``sweep=rma deferred``)."""
    if parsed is None or parsed.cls not in CHECK_CLASSES:
        return False
    if parsed.findings and parsed.findings[0].component == "sweep":
        return False
    first = next((f for f in parsed.findings if f.component != "sweep"), None)
    return first is not None and is_acute(parsed.cls, first.component)


def _without_slurm_suffixes(text: str) -> str:
    stripped = True
    while stripped:
        stripped = False
        for suffix in _SLURM_SUFFIXES:
            if text.endswith(suffix):
                text, stripped = text[:-len(suffix)], True
    return text
