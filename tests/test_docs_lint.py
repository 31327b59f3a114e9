"""README.md and docs/ render and lint: markdownlint-cli2 (pinned in
scripts/markdownlint/package.json, installed by scripts/setup) with the
project's rules (.markdownlint-cli2.jsonc, and scripts/markdownlint/
table-shape.js for tables GitHub would not render), and every relative link
and anchor resolves, which markdownlint does not check across files."""

import glob
import os
import re
import shutil
import subprocess

import pytest

from conftest import ROOT

LINTER = os.path.join(ROOT, "scripts", "markdownlint", "node_modules", "markdownlint-cli2",
                      "markdownlint-cli2-bin.mjs")


def docs():
    found = [os.path.join(ROOT, "README.md")] + glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)
    return sorted(found)


def test_markdownlint_passes_on_readme_and_docs():
    node = shutil.which("node")
    if not (node and os.path.exists(LINTER)):
        why = "markdownlint-cli2 is not installed (scripts/setup installs it: npm ci in scripts/markdownlint)"
        if os.environ.get("GPUGATE_REQUIRE_MARKDOWNLINT"):
            pytest.fail(why)
        pytest.skip(why)
    result = subprocess.run([node, LINTER], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_table_rule_catches_a_delimiter_row_wider_than_its_header(tmp_path):
    node = shutil.which("node")
    if not (node and os.path.exists(LINTER)):
        pytest.skip("markdownlint-cli2 is not installed")
    bad = tmp_path / "bad.md"
    bad.write_text("# t\n\n| a | b |\n|---|---|---|\n| 1 | 2 |\n")
    config = tmp_path / ".markdownlint-cli2.jsonc"
    config.write_text('{"customRules": ["%s"]}' % os.path.join(ROOT, "scripts", "markdownlint", "table-shape.js"))
    result = subprocess.run([node, LINTER, "bad.md"], cwd=str(tmp_path), capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "table-shape" in result.stdout + result.stderr, result.stdout + result.stderr


FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _prose(text):
    """The lines outside fenced code blocks, code spans blanked."""
    out, fence = [], False
    for line in text.split("\n"):
        if FENCE.match(line):
            fence = not fence
            out.append("")
            continue
        out.append("" if fence else re.sub(r"`[^`]*`", lambda m: "`" + "x" * (len(m.group()) - 2) + "`", line))
    return out


def anchors(path):
    """GitHub's anchors for the headings of a Markdown file."""
    with open(path) as handle:
        text = handle.read()
    seen, result, fence = {}, set(), False
    for line in text.split("\n"):
        if FENCE.match(line):
            fence = not fence
            continue
        m = None if fence else re.match(r"^#{1,6}\s+(.+?)\s*#*\s*$", line)
        if not m:
            continue
        title = re.sub(r"`([^`]*)`", r"\1", m.group(1))
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title)
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        result.add(slug if n == 0 else "%s-%d" % (slug, n))
    for m in re.finditer(r'<a\s+(?:name|id)="([^"]+)"', text):
        result.add(m.group(1))
    return result


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for path in docs():
        with open(path) as handle:
            lines = _prose(handle.read())
        for number, line in enumerate(lines, 1):
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("//"):
                    continue  # https:, mailto:
                file_part, _, anchor = target.partition("#")
                where = "%s:%d: %s" % (os.path.relpath(path, ROOT), number, target)
                resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
                if not os.path.exists(resolved):
                    broken.append(where + " (no such file)")
                elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
                    broken.append(where + " (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_anchor_rule_is_githubs():
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".md", delete=False) as handle:
        handle.write("# Blast radius: the drain budget\n## `gpugate sweep` and 2-node pairs (`pairs = true`)\n"
                     "## Usage\n## Usage\n```\n# not a heading\n```\n")
    try:
        assert anchors(handle.name) == {"blast-radius-the-drain-budget", "gpugate-sweep-and-2-node-pairs-pairs--true",
                                        "usage", "usage-1"}
    finally:
        os.unlink(handle.name)
