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


# gpugate.core.record builds each record's __init__ from its field names, as
# dataclasses does; the names are checked to be identifiers first.
EXEC_ALLOWED = {os.path.join(ROOT, "gpugate", "core", "record.py")}


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
    """The library runs commands through gpugate.safety.runner.run (timeout
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


# Issue 24 review: the ways root takes a lock, starts a program or makes a
# directory each have one checked place; the test and demo tools (the
# simulator, the testbed, `gpugate demo`, the vendored NHC's installer) are
# not run by slurmd and may use the plain calls.
def _library(path) -> bool:
    rel = os.path.relpath(path, ROOT)
    return rel.startswith("gpugate" + os.sep) and not rel.startswith(
        tuple(os.path.join("gpugate", d) + os.sep for d in ("sim", "testbed"))) and rel not in (
        os.path.join("gpugate", "cli", "demo.py"), os.path.join("gpugate", "testbed", "nhcbuild.py")) and not (
        # a vendor's simulation (gpugate.vendors.<vendor>.sim_*) is the simulator's, not the library's
        rel.startswith(os.path.join("gpugate", "vendors") + os.sep) and os.path.basename(rel).startswith("sim_"))


def _g(*parts):
    return os.path.join(ROOT, "gpugate", *parts)


GUARDED = {
    # a lock anyone can open is a lock anyone can hold: 0600 files in a 0700 locks/ (safety/lock.py)
    "flock": ({"fcntl.flock", "fcntl.lockf"}, {
        _g("safety", "lock.py"): "RunLock: the one lock only root can take",
    }),
    # programs start from the descriptor the trust walk checked, with a byte cap on their output
    "subprocess": ({"subprocess.Popen", "subprocess.run", "subprocess.call", "subprocess.check_call",
                    "subprocess.check_output", "os.execv", "os.execve", "os.execvp", "os.spawnv", "os.posix_spawn"}, {
        _g("safety", "runner.py"): "every tool: trust walk, /proc/self/fd/N, byte caps, process group killed",
        _g("node", "nhc.py"): "NHC in its own session (its watchdog), from the checked fd like runner.py",
        _g("slurm", "pyslurm_backend.py"): "the pyslurm worker: this interpreter, -I -m gpugate.slurm.pyslurm_worker",
    }),
    # directories get their mode whatever the umask (safeio.makedirs)
    "makedirs": ({"os.makedirs"}, {}),
}


def test_locks_programs_and_directories_go_through_their_one_checked_place():
    offenders = []
    for path in SOURCES:
        if not _library(path):
            continue
        names = {_name(call.func): call.lineno for call in _calls(path)}
        for what, (calls, allowed) in GUARDED.items():
            for name in calls & set(names):
                if path not in allowed:
                    offenders.append("%s:%d %s (%s)" % (os.path.relpath(path, ROOT), names[name], name, what))
    assert offenders == []


def test_the_guard_s_exceptions_still_exist():
    for what, (calls, allowed) in GUARDED.items():
        for path in allowed:
            assert os.path.exists(path), (what, path)
            assert calls & {_name(call.func) for call in _calls(path)}, (what, path)
