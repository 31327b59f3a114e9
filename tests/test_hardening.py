"""Rules that hold for the whole code base, checked on its syntax tree."""

import ast
import os

from conftest import ROOT

SOURCES = [os.path.join(d, f) for top in ("gpugate", "healthcheck", "prolog", "epilog", "bench")
           for d, _, files in os.walk(os.path.join(ROOT, top)) for f in files
           if f.endswith(".py") or f.startswith("gpugate-")]


def _calls(path):
    with open(path) as handle:
        tree = ast.parse(handle.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node


def _name(func) -> str:
    if isinstance(func, ast.Attribute):
        return "%s.%s" % (_name(func.value), func.attr)
    return func.id if isinstance(func, ast.Name) else ""


def test_sources_were_found():
    assert len(SOURCES) > 40


# gpugate.record builds each record's __init__ from its field names, as
# dataclasses does; the names are checked to be identifiers first.
EXEC_ALLOWED = {os.path.join(ROOT, "gpugate", "record.py")}


def test_no_shell_true_no_os_system_no_eval():
    offenders = []
    for path in SOURCES:
        for call in _calls(path):
            name = _name(call.func)
            if name == "exec" and path in EXEC_ALLOWED:
                continue
            if name in ("os.system", "os.popen", "eval", "exec", "subprocess.getoutput", "subprocess.getstatusoutput"):
                offenders.append("%s:%d %s" % (path, call.lineno, name))
            for kw in call.keywords:
                if kw.arg == "shell" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                    offenders.append("%s:%d shell=" % (path, call.lineno))
    assert offenders == []


def test_every_subprocess_call_in_the_library_has_a_timeout():
    """The library runs commands through gpugate.runner.run (timeout
    required); a direct subprocess.run/communicate elsewhere must pass one."""
    offenders = []
    for path in SOURCES:
        if os.sep + "bench" + os.sep in path:
            continue
        for call in _calls(path):
            name = _name(call.func)
            if name in ("subprocess.run", "subprocess.check_output", "subprocess.check_call", "subprocess.call"):
                if not any(kw.arg == "timeout" for kw in call.keywords):
                    offenders.append("%s:%d %s" % (path, call.lineno, name))
    assert offenders == []
