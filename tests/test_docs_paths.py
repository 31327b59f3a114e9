"""Where README.md and docs/ cite gpugate's code, the code is there: every
`gpugate/....py` path names a file, and every dotted `gpugate.x.y` name a
module (or a name a module defines). A page that still cites a module the
package tree no longer has fails here, naming page, line and name."""

import os
import re

from conftest import ROOT
from test_docs_lint import docs

PATH = re.compile(r"(?<![\w/.-])(gpugate/[\w/.-]*?\.py)\b")
DOTTED = re.compile(r"(?<![\w.$/-])gpugate(?:\.[A-Za-z_]\w*)+")
# Dotted words that are not module names: a file name and a jq path.
NOT_CODE = {
    "gpugate.fish": "fish's completion file (how-to/install-slurm.md)",
    "gpugate.drift": "a jq path into `gpugate status --json` (reference/cli.md)",
}
SUFFIXES = {"py", "toml", "md", "io", "json", "yml", "yaml", "prom", "service", "timer", "log", "key"}


def _defines(source_path, name):
    with open(source_path) as handle:
        text = handle.read()
    return re.search(r"^\s*(?:def|class)\s+%s\b|^%s\s*[:=]|^\s*(?:from\s+\S+\s+)?import\s.*\b%s\b"
                     % ((re.escape(name),) * 3), text, re.M) is not None


def resolves(dotted, root=ROOT):
    """The longest prefix of ``dotted`` that is a module or package; the
    rest, at most one name, defined in it."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        base = os.path.join(root, *parts[:i])
        source = base + ".py" if os.path.isfile(base + ".py") else os.path.join(base, "__init__.py")
        if not os.path.isfile(source):
            continue
        rest = parts[i:]
        return not rest or (len(rest) == 1 and _defines(source, rest[0]))
    return False


def cited(paths):
    """(page, line number, kind, name) for each path and dotted name cited."""
    for page in paths:
        with open(page) as handle:
            for number, line in enumerate(handle, 1):
                for match in PATH.finditer(line):
                    yield page, number, "path", match.group(1)
                for match in DOTTED.finditer(line):
                    name = match.group(0)
                    if name not in NOT_CODE and name.rsplit(".", 1)[1] not in SUFFIXES:
                        yield page, number, "module", name


def broken(paths, root=ROOT):
    out = []
    for page, number, kind, name in cited(paths):
        ok = os.path.isfile(os.path.join(root, name)) if kind == "path" else resolves(name, root)
        if not ok:
            out.append("%s:%d: %s %s" % (os.path.relpath(page, root), number, kind, name))
    return out


def test_every_cited_path_and_module_exists():
    pages = docs()
    assert len(list(cited(pages))) > 50, "found almost no citations: the patterns no longer match the pages"
    assert broken(pages) == []


def test_the_check_catches_a_moved_module(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("See `gpugate/judges/amdevents.py` and `gpugate.node.lock.RunLock`;\n"
                    "`gpugate/safety/lock.py` holds `gpugate.safety.lock.RunLock` (`gpugate.safety`).\n")
    assert broken([str(page)]) == ["%s:1: path gpugate/judges/amdevents.py" % os.path.relpath(str(page), ROOT),
                                   "%s:1: module gpugate.node.lock.RunLock" % os.path.relpath(str(page), ROOT)]
    assert resolves("gpugate.safety.lock.RunLock") and not resolves("gpugate.safety.lock.NoSuchName")
