"""Is the code gpugate runs as root root's alone?  The trust walk
(gpugate.safety.trust) applied to the installation itself.

slurmd runs gpugate's entry points as root, and they import code: a module
someone else could replace, or a directory where they could add one, hands
them root at the next health check.  Walked here, with the rules of
gpugate.safety.trust (owned by root, not writable by group or others, and so every
directory above it):
  - the interpreter (sys.executable, its symlinks followed) and its directory;
  - every entry of the sys.path the entry points get under ``-I`` (the
    standard library, lib-dynload, the environment's site-packages, and what
    their .pth files add); a missing one only where others could not create
    it first;
  - every .pth file in those directories (the interpreter runs their
    ``import`` lines at every start);
  - gpugate's package and the packages it imports (click, ClusterShell,
    pynvml, tomli, pyslurm where installed), every file and directory in
    them, __pycache__ included;
  - then every module this process has imported (sys.modules, those with a
    __file__: the standard library's packages such as json/ and concurrent/,
    other packages' subpackages): its file, its compiled file, and its
    directory with every directory above it up to "/" (each directory walked
    once per check, cached).  Packages installed but never imported are not
    walked file by file (a venv holds thousands): their directories below
    site-packages are not walked either, only what is imported matters.

Checked by `gpugate slurm-conf` (it refuses) and by the health check and
verify (NodeFacts.install, ~3 ms: a probe finding, and `gpugate facts`);
never on the prolog's path (tests/test_hotpath.py)."""

from __future__ import annotations

import importlib.machinery
import os
import stat
import sys

from gpugate.safety import trust

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only
    from typing import Dict, FrozenSet, Iterator, List, Optional, Sequence

# What gpugate imports, by top-level name (setup.cfg install_requires).
PACKAGES = ("gpugate", "click", "ClusterShell", "pynvml", "tomli", "pyslurm")  # pyslurm: slurm/pyslurm_worker.py
_WHAT = "installed code gpugate runs as root"
TRUSTED, UNTRUSTED = "trusted", "untrusted"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def isolated_path() -> List[str]:
    """sys.path as the entry points get it: run isolated (-I), they have no
    script directory, no PYTHONPATH entries and no user site.  Outside an
    isolated process (the gpugate command), this process's sys.path less
    those."""
    path = list(sys.path)
    if sys.flags.isolated:
        return path
    if path and not getattr(sys.flags, "safe_path", False):
        path = path[1:]  # the script's directory, or the current one (-c, -m)
    import site

    left_out = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    if site.ENABLE_USER_SITE:
        left_out.add(os.path.abspath(site.getusersitepackages()))
    return [p for p in path if p and os.path.abspath(p) not in left_out]


def check_install(owners: Optional[FrozenSet[int]] = None, path: Optional[Sequence[str]] = None,
                  packages: Sequence[str] = PACKAGES, modules: Optional[Dict[str, object]] = None) -> int:
    """Walk the installation, then every module imported (modules: by
    default sys.modules); the number of paths checked.  Raises
    trust.Untrusted naming the first path others could change and the fix,
    or OSError when one cannot be read."""
    owners = trust.trusted_owners() if owners is None else owners
    checked = 0
    for kind, where in _targets(path if path is not None else isolated_path(), packages):
        checked += _check(kind, where, owners)
    return checked + _check_imported(owners, sys.modules if modules is None else modules)


def fact(owners: Optional[FrozenSet[int]] = None, path: Optional[Sequence[str]] = None):
    """The node fact (NodeFacts.install): TRUSTED, or a ProbeFailure
    "untrusted" naming the path and the fix ("error" when a path cannot be
    read)."""
    from gpugate.model.facts import ProbeFailure

    try:
        check_install(owners, path)
    except trust.Untrusted as exc:
        return ProbeFailure("install", UNTRUSTED, str(exc).replace(". Nothing was read or run", ""))
    except OSError as exc:
        return ProbeFailure("install", "error", "%s: %s" % (getattr(exc, "filename", "") or "", exc.strerror or exc))
    return TRUSTED


def vouch_install() -> None:
    """`gpugate slurm-conf`: ConfigError (exit 2) naming the first path of
    the installation others could change, and the fix."""
    from gpugate.errors import ConfigError

    found = fact()
    if found != TRUSTED:
        raise ConfigError("%s. slurmd would run this code as root: fix it before pointing slurm.conf at gpugate"
                          % found.detail)


# gpugate's own entry points: "#!/bin/sh -e", then sh lines (a string to
# Python) that exec the Python beside the script with -I.  pip installs such
# a script as it is; a "#!python -I" line it rewrites, dropping the -I.  (The
# "-e": the sed older READMEs gave, adding -I to a bare "#!" line, leaves it.)
_SH, _OPEN, _CLOSE = b"#!/bin/sh -e\n", b"''':'\n", b"'''\n"
_EXEC = b'[ -x "$d/python3" ] && exec "$d/python3" -I -- "$0" "$@"\n'


def isolated_shebang(script: str) -> bool:
    """Does the script start Python isolated: its "#!" line with -I (or a
    cluster of flags holding I, such as -IS), or gpugate's sh launcher
    (its exec with -I before the first line of Python)?"""
    with open(script, "rb") as handle:
        line = handle.readline(512)
        if line == _SH:
            head = [handle.readline(512) for _ in range(16)]
            return head[0] == _OPEN and _CLOSE in head and _EXEC in head[:head.index(_CLOSE)]
    words = line[2:].split() if line.startswith(b"#!") else []
    return any(w.startswith(b"-") and not w.startswith(b"--") and b"I" in w for w in words[1:])


def shebang_fix(scripts: Sequence[str]) -> str:
    """The command that gives the entry points whose "#!" line lacks -I
    their -I back ("" when none lacks it).  pip drops it when it installs a
    script (it rewrites "#!python -I" to the bare interpreter)."""
    late = [s for s in scripts if os.path.exists(s) and not isolated_shebang(s)]
    if not late:
        return ""
    return "sed -i '1s|^#!\\([^ ]*\\)$|#!\\1 -I|' %s" % " ".join(late)


def vouch_shebangs(scripts: Sequence[str]) -> None:
    """`gpugate slurm-conf`: ConfigError (exit 2) while an entry point's "#!"
    lacks -I.  The re-exec guard makes the second interpreter isolated, but
    the first one has already run site: a sitecustomize.py on slurmd's
    PYTHONPATH (or a PYTHON* variable) ran as root before it."""
    from gpugate.errors import ConfigError

    fix = shebang_fix(scripts)
    if fix:
        raise ConfigError("these entry points start Python without -I (pip drops it when it installs a script), "
                          "so slurmd's PYTHONPATH and PYTHON* variables reach the interpreter that runs as root "
                          "before it isolates itself. Fix it, as root, after every pip install:\n  %s" % fix)


def _targets(path: Sequence[str], packages: Sequence[str]) -> Iterator[tuple]:
    yield trust.EXECUTABLE, sys.executable
    for entry in path:
        if not entry:
            continue  # "" (the current directory) never appears under -I
        yield "entry", os.path.abspath(entry)
    imported = list(packages)
    for entry in path:
        if entry and os.path.isdir(entry):
            for name in sorted(os.listdir(entry)):
                if name.endswith(".pth"):
                    yield trust.FILE, os.path.join(entry, name)
                    imported += [m for m in _pth_imports(os.path.join(entry, name)) if m not in imported]
    for name in imported:
        where = _locate(name, path)
        if where:
            yield "tree", where


def _pth_imports(pth: str) -> List[str]:
    """The modules a .pth file's ``import`` lines load at every start (an
    editable install's finder, setuptools' distutils shim)."""
    with open(pth, "rb") as handle:
        text = handle.read(1 << 16).decode("utf-8", "replace")
    names = []
    for line in text.splitlines():
        if line.startswith(("import ", "import\t")):
            for part in line[len("import"):].split(";")[0].split(","):
                name = part.split(" as ")[0].strip().split(".")[0]
                if name.isidentifier() and name not in names:
                    names.append(name)
    return names


def _locate(name: str, path: Sequence[str]) -> Optional[str]:
    """The package directory (or module file) ``import name`` would load
    from ``path``; the loaded module's for one an import hook provides (an
    editable install).  None when it is not installed (tomli on 3.11+)."""
    spec = importlib.machinery.PathFinder.find_spec(name, [p for p in path if p])
    origin = spec.origin if spec is not None and spec.has_location else None
    if origin is None and name in sys.modules:
        origin = getattr(sys.modules[name], "__file__", None)
    if origin is None:
        return None
    origin = os.path.abspath(origin)
    return os.path.dirname(origin) if os.path.basename(origin) == "__init__.py" else origin


def _check(kind: str, where: str, owners: FrozenSet[int]) -> int:
    what = "%s (%s)" % (_WHAT, "the interpreter" if kind == trust.EXECUTABLE else "its sys.path"
                        if kind == "entry" else "a .pth file" if kind == trust.FILE else "an imported package")
    if kind == trust.EXECUTABLE:
        os.close(trust.open_executable(where, what, owners))
        return 1
    if kind == trust.FILE:
        trust.check_file(where, what, missing_ok=False, owners=owners)
        return 1
    if kind == "entry":  # a directory, a zip file, or a name others must not be able to create
        if os.path.isfile(where):
            trust.check_file(where, what, missing_ok=False, owners=owners)
        else:
            trust.check_dir(where, what, missing_ok=True, owners=owners)
        return 1
    if not os.path.isdir(where):  # a single-module package (tomli is a package; a .py may be one)
        trust.check_file(where, what, missing_ok=False, owners=owners)
        return 1
    fd = trust._walk(where, what, trust.DIRECTORY, owners, False)
    try:
        return 1 + _check_below(fd, where, what, owners)
    finally:
        os.close(fd)


def _check_imported(owners: FrozenSet[int], modules: Dict[str, object]) -> int:
    """Every imported module's file (and compiled file) and its directory
    with all above it: what the packages walk does not cover (pyslurm's or
    ClusterShell's subpackages, the standard library's json/ or
    concurrent/).  A directory is walked from "/" once (trust.check_dir);
    files are lstat'ed below it.  Modules in a zip file are covered by the
    sys.path entry naming the zip."""
    what = "%s (an imported module)" % _WHAT
    dirs: Dict[str, bool] = {}
    checked = 0
    for module in list(modules.values()):
        for attr in ("__file__", "__cached__"):
            name = getattr(module, attr, None)
            if not isinstance(name, str) or not name:
                continue
            name = os.path.abspath(name)
            directory = os.path.dirname(name)
            if directory not in dirs:
                dirs[directory] = os.path.isdir(directory)  # not one: a zip entry, or no __pycache__ yet
                if dirs[directory]:
                    trust.check_dir(directory, what, missing_ok=False, owners=owners)
                    checked += 1
            if not dirs[directory]:
                continue
            try:
                st = os.lstat(name)
            except FileNotFoundError:
                continue  # not compiled (yet), or removed since: nothing to import
            checked += 1
            if stat.S_ISLNK(st.st_mode):
                trust.check_file(name, what, missing_ok=True, owners=owners)
                continue
            problem = trust.object_problem(st, trust.FILE, owners)
            if problem:
                raise trust._refuse(name, what, name, problem, owners)
    return checked


def _check_below(parent_fd: int, where: str, what: str, owners: FrozenSet[int]) -> int:
    """Every entry below a checked directory: files and directories by the
    rules of gpugate.safety.trust, read through directory fds (no walk from "/"
    per file: gpugate's own package is some 250 of them)."""
    fd = os.open(".", _DIR_FLAGS, dir_fd=parent_fd)
    checked = 0
    try:
        for name in sorted(os.listdir(fd)):
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            here = os.path.join(where, name)
            checked += 1
            if stat.S_ISLNK(st.st_mode):  # as trusted as its target: walk that from "/"
                target = os.path.join(where, os.readlink(name, dir_fd=fd))
                kind = trust.DIRECTORY if os.path.isdir(target) else trust.FILE
                (trust.check_dir if kind == trust.DIRECTORY else trust.check_file)(
                    target, what, missing_ok=True, owners=owners)
                continue
            if stat.S_ISDIR(st.st_mode):
                problem = trust.directory_problem(st, owners, final=True)
            elif stat.S_ISREG(st.st_mode):
                problem = trust.object_problem(st, trust.FILE, owners)
            else:
                continue  # not code (a socket, a FIFO): nothing imports it
            if problem:
                raise trust._refuse(here, what, here, problem, owners)
            if stat.S_ISDIR(st.st_mode):
                child = os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
                try:
                    checked += _check_below(child, here, what, owners)
                finally:
                    os.close(child)
        return checked
    finally:
        os.close(fd)
