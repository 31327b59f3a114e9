"""The Prometheus text exposition format, for both sides: the node's
textfile (node/metrics.py) and the controller's (fleet/metrics.py)."""

from typing import Iterable, List, Tuple

Sample = Tuple[str, dict, float]


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(families: Iterable[Tuple[str, str, str, List[Sample]]]) -> str:
    """families: (name, type, help, samples) -> exposition text."""
    lines = []
    for name, kind, help_text, samples in families:
        lines.append("# HELP %s %s" % (name, help_text))
        lines.append("# TYPE %s %s" % (name, kind))
        for sample_name, labels, value in samples:
            label_text = ",".join('%s="%s"' % (k, _escape(v)) for k, v in sorted(labels.items()))
            lines.append("%s%s %s" % (sample_name, "{%s}" % label_text if label_text else "", _number(value)))
    return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) and value != int(value) else str(int(value))
