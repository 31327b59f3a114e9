"""The docs a newcomer reads: README.md stays short, every page under docs/ is
reachable from docs/README.md, pictures resolve, the flow picture is its
generator's output, and no page reads as a closing report.

Links and anchors between pages are checked by tests/test_docs_lint.py
(test_every_relative_link_and_anchor_resolves); this file checks images,
which that test leaves out, with the same reading of a page."""

import glob
import os
import re
import runpy

from conftest import ROOT
from test_docs_lint import FENCE, LINK, _prose, docs

IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
REPORT_WORDS = re.compile(r"\bissues? #?\d+|(?-i:\bStatus \()|\ba turn ago\b|\bthe review found\b", re.I)


def _read(path):
    with open(path) as handle:
        return handle.read()


def _targets(path, pattern):
    """Relative targets of ``pattern`` in the page's prose, resolved to paths."""
    found = []
    for line in _prose(_read(path)):
        for target in pattern.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("//"):
                continue
            file_part = target.partition("#")[0]
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
            found.append((target, resolved))
    return found


def test_readme_reads_in_ten_minutes():
    lines = _read(os.path.join(ROOT, "README.md")).count("\n")
    assert lines < 300, "README.md has %d lines: move the detail into docs/ (docs/README.md is the index)" % lines


def test_readme_keeps_the_two_commands():
    text = _read(os.path.join(ROOT, "README.md"))
    section = text.split("\n## The two commands\n", 1)[1].split("\n## ", 1)[0]
    assert "`scripts/demo`" in section and "`scripts/test`" in section, section


def test_every_image_resolves():
    broken = ["%s: %s" % (os.path.relpath(path, ROOT), target)
              for path in docs() for target, resolved in _targets(path, IMAGE) if not os.path.exists(resolved)]
    assert broken == [], broken


def test_the_index_links_every_page_under_docs():
    index = os.path.join(ROOT, "docs", "README.md")
    linked = {resolved for _, resolved in _targets(index, LINK)}
    pages = {os.path.normpath(p) for p in glob.glob(os.path.join(ROOT, "docs", "**", "*.md"), recursive=True)}
    orphans = sorted(os.path.relpath(p, ROOT) for p in pages - linked - {os.path.normpath(index)})
    assert orphans == [], "pages docs/README.md does not link (add each to the index): %s" % orphans


def test_the_readme_links_the_index():
    linked = {resolved for _, resolved in _targets(os.path.join(ROOT, "README.md"), LINK)}
    assert os.path.join(ROOT, "docs", "README.md") in linked


def test_the_flow_picture_is_its_generators_output():
    generator = runpy.run_path(os.path.join(ROOT, "docs", "flow.py"))
    assert _read(os.path.join(ROOT, "docs", "flow.svg")) == generator["render"](), \
        "docs/flow.svg differs from docs/flow.py's output: run python3 docs/flow.py"
    images = [resolved for _, resolved in _targets(os.path.join(ROOT, "README.md"), IMAGE)]
    assert os.path.join(ROOT, "docs", "flow.svg") in images, "README.md no longer shows docs/flow.svg"


def test_the_docs_say_what_is_true_now_not_how_it_was_built():
    """History (issue numbers, dated status lines, a review's findings) lives
    in CHANGELOG.md; README.md and docs/ speak to the people who run gpugate."""
    found = []
    for path in docs():
        for number, line in enumerate(_read(path).split("\n"), 1):
            for m in REPORT_WORDS.finditer(line):
                found.append("%s:%d: %s" % (os.path.relpath(path, ROOT), number, m.group()))
    assert found == [], "\n".join(found)


def test_the_checks_catch_what_they_look_for(tmp_path):
    """Each rule above fails on a page that breaks it."""
    page = tmp_path / "page.md"
    page.write_text("# t\n\nBuilt in issue 37. Status (2026-11-28): done.\n\n![flow](missing.svg)\n\n"
                    "```\n![not an image](in-a-fence.svg)\n```\n\n[a page](other.md)\n")
    assert [m.group() for m in REPORT_WORDS.finditer(page.read_text())] == ["issue 37", "Status ("]
    assert _targets(str(page), IMAGE) == [("missing.svg", str(tmp_path / "missing.svg"))]
    assert _targets(str(page), LINK) == [("other.md", str(tmp_path / "other.md"))]
    assert FENCE.match("```")
