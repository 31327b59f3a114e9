"""Draw docs/flow.svg, the picture of gpugate's flow in README.md.

The SVG is generated, never edited by hand: change the boxes or arrows here,
then run ``python3 docs/flow.py`` (tests/test_docs_tree.py checks that the
committed SVG is this script's output).  Pure Python, no dependencies, the
same bytes on every run.
"""

import os
import sys

W, H = 1000, 400
BOX_W, BOX_H = 190, 64

# name: (x, y, fill, lines of text)
BOXES = {
    "run": (20, 30, "#e8eef7", ["slurmd or the node agent", "runs gpugate: health", "check, prolog, epilog"]),
    "checks": (270, 30, "#e8eef7", ["node checks", "baseline.toml, NVML, DCGM,", "kernel log, HCAs"]),
    "acute": (520, 30, "#fbe3e1", ["acute finding", "(Xid 79, ECC, GPU lost)", "drains at once"]),
    "fit": (270, 150, "#e3f4e1", ["fit", "the node keeps running jobs"]),
    "publish": (520, 150, "#fff3d6", ["budgeted finding", "(drift): publish it,", "keep running jobs"]),
    "keeper": (750, 150, "#fff3d6", ["keeper (controller)", "drains within each", "partition's drain budget"]),
    "drained": (750, 30, "#fbe3e1", ["drained node", "(a gpugate: reason,", "or taint and cordon)"]),
    "sweep": (750, 300, "#e8eef7", ["gpugate sweep", "evidence, GPU reset,", "reconverge, reboot"]),
    "proof": (520, 300, "#e8eef7", ["proof", "verify, DCGM diagnostic,", "smoke all_reduce job"]),
    "resume": (270, 300, "#e3f4e1", ["RESUME", "Slurm: RESUME; Kubernetes:", "taint and cordon lifted"]),
    "rma": (20, 300, "#f1e6f7", ["rma", "escalated, evidence kept,", "never resumed by itself"]),
}

# (from, to, side of "from", side of "to", label)
ARROWS = [
    ("run", "checks", "e", "w", ""),
    ("checks", "acute", "e", "w", "acute"),
    ("checks", "fit", "s", "n", ""),
    ("checks", "publish", "e2", "w", "budgeted"),
    ("publish", "keeper", "e", "w", ""),
    ("keeper", "drained", "n", "s", ""),
    ("acute", "drained", "e", "w", ""),
    ("drained", "sweep", "e", "e", ""),
    ("sweep", "proof", "w", "e", ""),
    ("proof", "resume", "w", "e", "passed"),
    ("proof", "rma", "s", "s", "failed, or out of rungs"),
]


def anchor(name, side):
    x, y, _, _ = BOXES[name]
    points = {"n": (x + BOX_W / 2, y), "s": (x + BOX_W / 2, y + BOX_H),
              "e": (x + BOX_W, y + BOX_H / 2), "w": (x, y + BOX_H / 2),
              "e2": (x + BOX_W, y + 54)}
    return points[side]


def num(value):
    return ("%.1f" % value).rstrip("0").rstrip(".")


def path(a, b, side_a, side_b):
    (x1, y1), (x2, y2) = anchor(a, side_a), anchor(b, side_b)
    if side_a == side_b == "e":  # around the right-hand side
        right = max(x1, x2) + 40
        return [(x1, y1), (right, y1), (right, y2), (x2, y2)]
    if side_a == side_b == "s":  # under the bottom row
        low = max(y1, y2) + 26
        return [(x1, y1), (x1, low), (x2, low), (x2, y2)]
    if side_a == "e2":  # down beside the node checks
        return [(x1, y1), (x1 + 30, y1), (x1 + 30, y2), (x2, y2)]
    return [(x1, y1), (x2, y2)]


def render():
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d"'
           ' font-family="Helvetica, Arial, sans-serif" font-size="13">' % (W, H, W, H),
           '<title>gpugate: from a node check to RESUME</title>',
           '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="8"'
           ' markerHeight="8" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z"'
           ' fill="#333"/></marker></defs>',
           '<rect width="%d" height="%d" fill="#ffffff"/>' % (W, H)]
    for a, b, side_a, side_b, label in ARROWS:
        points = path(a, b, side_a, side_b)
        out.append('<polyline points="%s" fill="none" stroke="#333" stroke-width="1.5"'
                   ' marker-end="url(#arrow)"/>' % " ".join("%s,%s" % (num(x), num(y)) for x, y in points))
        if label:
            (x1, y1), (x2, y2) = points[-2], points[-1]
            if len(points) == 4:
                (x1, y1), (x2, y2) = points[1], points[2]
            if x1 == x2:  # a vertical segment: the label beside it
                out.append('<text x="%s" y="%s" fill="#333">%s</text>'
                           % (num(x1 + 5), num((y1 + y2) / 2 + 4), label))
            else:
                out.append('<text x="%s" y="%s" text-anchor="middle" fill="#333">%s</text>'
                           % (num((x1 + x2) / 2), num((y1 + y2) / 2 - 6), label))
    for name in BOXES:
        x, y, fill, lines = BOXES[name]
        out.append('<rect x="%d" y="%d" width="%d" height="%d" rx="8" fill="%s" stroke="#333"/>'
                   % (x, y, BOX_W, BOX_H, fill))
        top = y + BOX_H / 2 - (len(lines) - 1) * 8 + 4
        for i, line in enumerate(lines):
            weight = ' font-weight="bold"' if i == 0 else ""
            out.append('<text x="%s" y="%s" text-anchor="middle"%s>%s</text>'
                       % (num(x + BOX_W / 2), num(top + i * 16), weight, line))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    target = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flow.svg")
    with open(target, "w") as handle:
        handle.write(render())
    print(target)


if __name__ == "__main__" and not sys.flags.interactive:
    main()
