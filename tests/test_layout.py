"""The house stays easy to walk (docs/explanation/layout.md): no import cycle in gpugate/,
no module over 400 lines.

Imports are read from the source (AST), not by importing.  Function-level
imports count as much as module-level ones: a module-level cycle breaks at
import time, and a cycle through the lazy imports that keep the prolog fast
is still two modules a reader cannot understand one without the other."""

import ast
import os

from conftest import ROOT

PACKAGE = os.path.join(ROOT, "gpugate")
MAX_LINES = 400
# Modules allowed over MAX_LINES while being split (none now).  The test
# fails when an entry is no longer over, so this list cannot go stale.
PENDING_SPLIT = set()


def _modules():
    """{dotted name: (path, the package its relative imports start from)}"""
    found = {}
    for directory, dirs, files in os.walk(PACKAGE):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            path = os.path.join(directory, name)
            dotted = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
            if dotted.endswith(".__init__"):
                dotted = dotted[: -len(".__init__")]
                found[dotted] = (path, dotted)
            else:
                found[dotted] = (path, dotted.rsplit(".", 1)[0])
    return found


def _imports(path, package, modules):
    """The gpugate modules one file imports, anywhere in it."""
    out = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:  # `from . import x`: x a module, or a name of the package
                sub = base + "." + alias.name
                out.add(sub if sub in modules else base)
    return {name for name in out if name in modules}


def import_graph():
    modules = _modules()
    return {name: _imports(path, package, modules) - {name} for name, (path, package) in modules.items()}


def find_cycle(graph):
    """One import cycle as a list of modules (first == last), or None."""
    state = {}  # 1: on the current path, 2: done
    path = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 80 and "gpugate.node.check" in graph["gpugate.node.prolog"]  # the walk sees the imports
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: %s" % " -> ".join(cycle)


def test_find_cycle_names_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_gate_does_not_depend_on_the_test_cluster():
    """gpugate.testbed (the real-Slurm rig, the real kube-apiserver) is for
    the tests and `gpugate demo` (its Kubernetes part: demo_kube)."""
    graph = import_graph()
    users = {name for name, imports in graph.items() if not name.startswith("gpugate.testbed")
             and any(i == "gpugate.testbed" or i.startswith("gpugate.testbed.") for i in imports)}
    assert "gpugate.testbed.cluster" in graph["gpugate.testbed"]  # the walk sees the package
    assert users == {"gpugate.cli.demo", "gpugate.cli.demo_kube"}


def test_no_module_over_400_lines():
    sizes = {}
    for path, _ in _modules().values():
        with open(path, encoding="utf-8") as f:
            sizes[os.path.relpath(path, ROOT)] = sum(1 for _ in f)
    over = {path: n for path, n in sizes.items() if n > MAX_LINES and path not in PENDING_SPLIT}
    assert not over, "modules over %d lines (split along a line a reader would draw): %s" % (MAX_LINES, over)
    stale = {path for path in PENDING_SPLIT if sizes.get(path, 0) <= MAX_LINES}
    assert not stale, "no longer over %d lines, drop from PENDING_SPLIT: %s" % (MAX_LINES, stale)
