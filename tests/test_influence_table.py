"""docs/explanation/reliability.md's "Can a job's user cause it?" table (gpugate.model.influence)
held to the code: every finding component a judge writes has a row, no
acute component is one a job's user can cause, the user-caused ones are
exactly gpugate.model.findings.USER_CAUSED (never acute, never counted towards a
repeat offender), and the docs' copy is the table's."""

import ast
import os

from conftest import ROOT
from gpugate.model import influence
from gpugate.model.findings import ACUTE, USER_CAUSED

# Components built at run time, each with a row by prefix or name.
_DYNAMIC = {"'operator_' + key": "operator_x", "'pcie_' + name": "pcie_gen", "'pcie_max_' + name": "pcie_max_gen"}


def _constants(tree):
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = node.value.value
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple) and isinstance(node.targets[0], ast.Tuple):
            for target, value in zip(node.targets[0].elts, node.value.elts):
                if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
                    out[target.id] = value.value
    return out


def written_components():
    """Every component a Finding(...) in gpugate/ is made with, where the code names it."""
    found = set()
    for folder, _, files in os.walk(os.path.join(ROOT, "gpugate")):
        for name in files:
            if not name.endswith(".py"):
                continue
            tree = ast.parse(open(os.path.join(folder, name)).read())
            consts = _constants(tree)
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Finding" and len(node.args) > 1):
                    continue
                arg = node.args[1]
                if isinstance(arg, ast.Constant):
                    found.add(arg.value)
                elif isinstance(arg, ast.Name) and arg.id in consts:
                    found.add(consts[arg.id])
                elif ast.unparse(arg) in _DYNAMIC:
                    found.add(_DYNAMIC[ast.unparse(arg)])
    return found


def test_the_scan_sees_the_judges():
    seen = written_components()
    assert {"xid", "ecc", "preflight_across", "xid_repeat", "clocks", "dcgm_health", "operator_x"} <= seen
    assert len(seen) > 60


def test_every_component_a_judge_writes_has_a_row():
    missing = sorted(c for c in written_components() | set().union(*ACUTE.values()) if influence.row_for(c) is None)
    assert missing == [], "a finding with no row in gpugate.model.influence (docs/explanation/reliability.md): %s" % missing


def test_acute_only_where_no_user_can_cause_it():
    for cls, components in ACUTE.items():
        for component in components:
            row = influence.row_for(component)
            assert row.user == influence.NO, (cls, component, row.source)
            assert row.drains == "acute" or cls != "health" or component in ("nvml",), (component, row.drains)


def test_the_user_caused_rows_are_exactly_the_code_s():
    rows = {c for r in influence.ROWS if r.user == influence.YES for c in r.components}
    assert rows == set(USER_CAUSED), rows ^ set(USER_CAUSED)
    for row in influence.ROWS:
        if row.user == influence.YES:
            assert row.drains != "acute" and row.rma.startswith("never"), row.source


def test_the_docs_show_the_table_as_the_code_has_it():
    text = open(os.path.join(ROOT, "docs", "explanation", "reliability.md")).read()
    start, end = "<!-- influence table: gpugate.model.influence.render() -->\n", "<!-- /influence table -->"
    assert start in text and end in text, "docs/explanation/reliability.md lost its influence table markers"
    shown = text.split(start, 1)[1].split(end, 1)[0]
    assert shown == influence.render(), "docs/explanation/reliability.md's table is out of date: paste gpugate.model.influence.render()"


def test_every_test_docs_reliability_cites_exists():
    """A row of docs/explanation/reliability.md names the test that shows it: that test
    must exist (``file.py::test_name``, and ``::test_name`` after it for the
    same file)."""
    import re

    defined = {}
    for name in os.listdir(os.path.join(ROOT, "tests")):
        if name.endswith(".py"):
            source = open(os.path.join(ROOT, "tests", name)).read()
            defined[name] = set(re.findall(r"^(?:async )?def (test_\w+)", source, re.M))
    missing = []
    for line in open(os.path.join(ROOT, "docs", "explanation", "reliability.md")).read().splitlines():
        current = None
        for m in re.finditer(r"(test_\w+\.py)(?:::(test_\w+))?|::(test_\w+)", line):
            if m.group(1):
                current = m.group(1)
                if current not in defined:
                    missing.append(current)
                elif m.group(2) and m.group(2) not in defined[current]:
                    missing.append("%s::%s" % (current, m.group(2)))
            elif current is None or m.group(3) not in defined.get(current, ()):
                missing.append("%s::%s" % (current, m.group(3)))
    assert missing == [], "docs/explanation/reliability.md cites tests that do not exist: %s" % missing
