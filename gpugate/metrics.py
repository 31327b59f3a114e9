"""Prometheus text exposition.  Node side: a textfile for node_exporter's
textfile collector (verdict, class, per-component match with the pin).
Labels are bounded: classes and component names are fixed sets."""

import os
import time
from typing import Iterable, List, Tuple

from .baseline import PIN_COMPONENTS
from .findings import CHECK_CLASSES

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


def node_families(node: str, verdict, facts, baseline, held: bool = False) -> list:
    differs = {f.component for f in list(verdict.findings) + list(verdict.notes) if f.cls in ("drift", "pending")}
    unknown = {f.component for f in verdict.findings if f.cls == "probe"}
    pinned = [c for c in PIN_COMPONENTS if baseline.pin.get(c) is not None]
    if baseline.pin.vbios:
        pinned.append("vbios")
    # A component gpugate could not read has no sample: never a healthy-looking 1.
    pinned = [c for c in pinned if c not in unknown]
    classes = {f.cls for f in verdict.findings}
    return [
        ("gpugate_node_fit", "gauge", "1 when the node passed its last gpugate health check.",
         [("gpugate_node_fit", {}, 1 if verdict.fit else 0)]),
        ("gpugate_node_unfit", "gauge", "1 for each class of finding present on the node.",
         [("gpugate_node_unfit", {"class": c}, 1 if c in classes else 0) for c in CHECK_CLASSES]),
        ("gpugate_component_matches_pin", "gauge", "1 when the component equals the baseline pin.",
         [("gpugate_component_matches_pin", {"component": c}, 0 if c in differs else 1) for c in pinned]),
        ("gpugate_drain_held", "gauge", "1 when the node is unfit but the partition's drain budget keeps it in service.",
         [("gpugate_drain_held", {}, 1 if held else 0)]),
        ("gpugate_findings", "gauge", "Number of findings of the last check.",
         [("gpugate_findings", {}, len(verdict.findings))]),
        ("gpugate_last_check_timestamp_seconds", "gauge", "When the last health check ended.",
         [("gpugate_last_check_timestamp_seconds", {}, round(time.time(), 3))]),
        ("gpugate_check_duration_seconds", "gauge", "Wall time of the slowest probe of the last check.",
         [("gpugate_check_duration_seconds", {}, round(max(facts.durations.values() or [0.0]), 4))]),
    ]


def write_node_textfile(path: str, node: str, verdict, facts, baseline, held: bool = False) -> None:
    text = render(node_families(node, verdict, facts, baseline, held))
    tmp = "%s.tmp.%d" % (path, os.getpid())
    try:
        with open(tmp, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)  # node_exporter must never read half a file
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
