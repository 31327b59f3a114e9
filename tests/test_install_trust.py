"""The code gpugate runs as root is walked too, and its entry points run
Python isolated (issue 24, item 5).

The installation walked here is a copy of gpugate's package in a temporary
tree (the real install is never chmod'ed); the entry points run as pip
installs them, in a venv, with a hostile PYTHONPATH and current directory."""

import os
import shutil
import stat
import subprocess
import sys

import pytest
from click.testing import CliRunner

import gpugate
from gpugate.probes import install_trust
from gpugate.safety import trust
from gpugate.errors import ConfigError
from gpugate.model.facts import ProbeFailure

from conftest import ROOT

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the rules under test are root's")


def _refused_with_fix(message, culprit):
    assert culprit in message and "chown root %s; chmod go-w %s" % (culprit, culprit) in message, message


@pytest.fixture
def site(tmp_path):
    """site-packages with a copy of gpugate's package (its __pycache__ too)
    and a .pth file whose import line loads a module at every start."""
    path = tmp_path / "site-packages"
    shutil.copytree(os.path.dirname(gpugate.__file__), str(path / "gpugate"))
    (path / "hook.pth").write_text("import starthook; starthook.install()\n")
    (path / "starthook.py").write_text("def install():\n    pass\n")
    os.makedirs(str(path / "gpugate" / "__pycache__"), exist_ok=True)
    (path / "gpugate" / "__pycache__" / "verdict.cpython-311.pyc").write_bytes(b"\0")
    return path


def _check(site, extra=()):
    return install_trust.check_install(path=[str(site)] + list(extra), packages=("gpugate",))


def test_a_root_only_install_passes_and_every_file_of_the_package_is_walked(site):
    files = sum(len(dirs) + len(names) for _, dirs, names in os.walk(str(site / "gpugate")))
    assert _check(site) >= files + 4  # the interpreter, the entry, the .pth, the package and all below


@pytest.mark.parametrize("where, mode", [
    ("gpugate/judges", 0o777),  # a directory of the package: a new module there is imported as root
    ("gpugate/model/verdict.py", 0o664),  # a module
    ("gpugate/__pycache__", 0o775),  # compiled modules are code too
    ("gpugate/__pycache__/verdict.cpython-311.pyc", 0o666),
    ("hook.pth", 0o664),  # the interpreter runs its import line at every start
    ("starthook.py", 0o646),  # and the module that line imports
    (".", 0o777),  # site-packages itself
])
def test_a_path_of_the_install_others_can_write_is_refused_naming_it_and_the_fix(site, where, mode):
    culprit = os.path.normpath(str(site / where))
    os.chmod(culprit, mode)
    with pytest.raises(trust.Untrusted) as info:
        _check(site)
    _refused_with_fix(str(info.value), culprit)


@pytest.mark.parametrize("where, mode", [
    ("otherpkg/sub", 0o777),  # a subpackage of a package not in PACKAGES (pyslurm's, the stdlib's json/)
    ("otherpkg/sub/__init__.py", 0o666),
    ("otherpkg/sub/leaf.py", 0o646),
])
def test_a_subpackage_of_any_imported_package_others_can_write_is_refused(site, monkeypatch, where, mode):
    """Not only the packages named in PACKAGES: every module the process
    has imported, its file and every directory above it."""
    import importlib

    sub = site / "otherpkg" / "sub"
    sub.mkdir(parents=True)
    (site / "otherpkg" / "__init__.py").write_text("")
    (sub / "__init__.py").write_text("")
    (sub / "leaf.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(site))
    try:
        importlib.import_module("otherpkg.sub.leaf")
        _check(site)  # root's alone: passes
        culprit = str(site / where)
        os.chmod(culprit, mode)
        with pytest.raises(trust.Untrusted) as info:
            _check(site)
        _refused_with_fix(str(info.value), culprit)
    finally:
        for name in ("otherpkg.sub.leaf", "otherpkg.sub", "otherpkg"):
            sys.modules.pop(name, None)


def test_pyslurm_is_walked_like_gpugate_s_other_imports():
    assert "pyslurm" in install_trust.PACKAGES  # imported as root by gpugate/slurm/pyslurm_worker.py


def test_a_module_owned_by_someone_else_is_refused(site):
    module = str(site / "gpugate" / "core" / "names.py")
    os.chown(module, 65534, 65534)
    with pytest.raises(trust.Untrusted) as info:
        _check(site)
    assert "is owned by uid 65534" in str(info.value)
    _refused_with_fix(str(info.value), module)


def test_a_missing_sys_path_entry_others_could_create_is_refused(site, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(str(shared), 0o777)  # not sticky: anyone could create the zip the interpreter would import from
    with pytest.raises(trust.Untrusted) as info:
        _check(site, [str(shared / "python311.zip")])
    assert str(shared) in str(info.value)
    os.chmod(str(shared), 0o755)
    _check(site, [str(shared / "python311.zip")])  # only root could create it: fine


def test_the_untrusted_install_is_a_fact_a_probe_finding_and_a_refused_fragment(site, monkeypatch, fleet,
                                                                               settings_for):
    """`gpugate facts` / the health check report it (probe install=untrusted,
    budgeted like every probe); `gpugate slurm-conf` refuses, exit 2."""
    from gpugate.model.baseline import load_baseline
    from gpugate.cli.main import main
    from gpugate.node.check import run_check

    from conftest import DEMO_BASELINE

    os.chmod(str(site / "gpugate" / "judges"), 0o777)
    monkeypatch.setattr(install_trust, "isolated_path", lambda: [str(site)])
    found = install_trust.fact()
    assert isinstance(found, ProbeFailure) and found.kind == install_trust.UNTRUSTED
    assert "Nothing was read" not in found.detail
    _refused_with_fix(found.detail, str(site / "gpugate" / "judges"))

    result = run_check(settings_for(fleet), load_baseline(DEMO_BASELINE), "gpu01", "healthcheck")
    assert result.facts.install == found
    assert not result.verdict.fit and "probe install=untrusted" in result.verdict.reason
    assert "install" in result.facts.durations

    with pytest.raises(ConfigError) as info:
        install_trust.vouch_install()
    _refused_with_fix(str(info.value), str(site / "gpugate" / "judges"))
    out = CliRunner().invoke(main, ["slurm-conf"])
    assert out.exit_code == 2 and "HealthCheckProgram=" not in out.output
    assert "chown root %s" % (site / "gpugate" / "judges") in out.output

    os.chmod(str(site / "gpugate" / "judges"), 0o755)
    assert install_trust.fact() == install_trust.TRUSTED


def test_the_real_install_is_walked_whole():
    """Every file of the real install is looked at (its cost, for every
    health check, is measured by bench/bench_install_walk.py)."""
    path = install_trust.isolated_path()
    assert install_trust.check_install(path=path) > 100


# --------------------------------------------------- the entry points' -I
EVIL_MODULE = "open(%r, 'a').write(%r)\n"


def _install(tmp_path, old=False):
    """The three entry points as a wheel built from this tree and pip
    install them in a venv: setuptools' build_scripts turns a "#!...python
    FLAGS" line into "#!python FLAGS" in the wheel, and pip's own fix_script
    rewrites "#!python..." to the bare interpreter, dropping the flags; any
    other "#!" line both leave alone.  old=True: the entry points of a
    gpugate before the sh launcher ("#!/usr/bin/env -S python3 -I")."""
    try:  # setuptools before pip: pip imports distutils, which setuptools replaces
        from setuptools._distutils.command.build_scripts import first_line_re
    except ImportError:  # an older setuptools
        from distutils.command.build_scripts import first_line_re
    from pip._internal.operations.install.wheel import fix_script

    venv = tmp_path / ("venv-old" if old else "venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)],
                   check=True, timeout=120)
    python = str(venv / "bin" / "python")
    # gpugate as an install would have it, in the venv's own site-packages
    # (a .pth, which -I still reads): the tree under test may be installed in
    # another venv (the chroot runs) that --system-site-packages does not see.
    (site,) = (venv / "lib").glob("python3*/site-packages")
    (site / "gpugate-under-test.pth").write_text(ROOT + "\n")
    scripts = {}
    for mode in ("healthcheck", "prolog", "epilog"):
        with open(os.path.join(ROOT, mode, "gpugate-" + mode), "rb") as handle:
            first, rest = handle.read().split(b"\n", 1)
        if old:  # the Python after the launcher, under the old "#!" line
            first, rest = b"#!/usr/bin/env -S python3 -I", rest.split(b"\n" + b"'" * 3 + b"\n", 1)[1]
        match = first_line_re.match(first.decode())
        path = str(venv / "bin" / ("gpugate-" + mode))
        with open(path, "wb") as handle:
            handle.write((b"#!python" + (match.group(1) or "").encode() if match else first) + b"\n" + rest)
        os.chmod(path, 0o755)
        fix_script(path)
        if old:
            with open(path) as handle:
                first, rest = handle.read().split("\n", 1)
            assert first == "#!" + sys.executable  # pip's own interpreter, and the -I is gone
            with open(path, "w") as handle:  # in the venv, pip runs from the venv's
                handle.write("#!%s\n%s" % (python, rest))
        scripts[mode] = path
    return scripts


@pytest.fixture
def installed(tmp_path):
    return _install(tmp_path)


@pytest.fixture
def installed_old(tmp_path):
    return _install(tmp_path, old=True)


@pytest.fixture
def hostile(tmp_path):
    """A world-writable directory with a gpugate package and a
    sitecustomize that each leave a marker when imported."""
    evil = tmp_path / "evil"
    (evil / "gpugate").mkdir(parents=True)
    markers = {"gpugate": str(tmp_path / "evil-gpugate-ran"), "site": str(tmp_path / "evil-sitecustomize-ran")}
    (evil / "gpugate" / "__init__.py").write_text(EVIL_MODULE % (markers["gpugate"], "ran"))
    (evil / "sitecustomize.py").write_text(EVIL_MODULE % (markers["site"], "ran"))
    (evil / "usercustomize.py").write_text(EVIL_MODULE % (markers["site"], "ran"))
    os.chmod(str(evil), 0o777)
    return str(evil), markers


def _run(script, evil, extra_env=None):
    env = {"SLURMD_NODENAME": "gpu01", "PYTHONPATH": evil, "PYTHONSTARTUP": evil + "/sitecustomize.py"}
    env.update(extra_env or {})
    return subprocess.run([script, "--help"], cwd=evil, env=env, capture_output=True, text=True, timeout=60)


def test_as_pip_installs_them_the_entry_points_start_isolated_and_nothing_of_pythonpath_runs(installed, hostile):
    """Issue 34: installed as pip installs them, with no step after it, the
    entry points start their venv's Python isolated at once (the sh
    launcher's exec ... -I): no sitecustomize or usercustomize on slurmd's
    PYTHONPATH runs as root, no gpugate package in PYTHONPATH or the current
    directory, no PYTHON* variable counts, and no second interpreter starts
    (before: pip's bare "#!" interpreter ran site, then started again)."""
    evil, markers = hostile
    for mode, script in installed.items():
        assert open(script).readline() == "#!/bin/sh -e\n"  # as the wheel has it: pip leaves it alone
        assert install_trust.isolated_shebang(script)
        done = _run(script, evil, {"PYTHONINSPECT": "", "PYTHONHOME": evil})
        assert done.returncode == 0 and "usage: gpugate-%s" % mode in done.stdout, done.stderr
        assert not os.path.exists(markers["gpugate"]) and not os.path.exists(markers["site"]), mode
    assert install_trust.shebang_fix(list(installed.values())) == ""
    subprocess.run(["/bin/sh", "-c", "sed -i '1s|^#!\\([^ ]*\\)$|#!\\1 -I|' " + installed["prolog"]], check=True,
                   timeout=30)  # the fix older READMEs gave, run after an upgrade: changes nothing
    assert open(installed["prolog"]).readline() == "#!/bin/sh -e\n"
    # Started through a link elsewhere (a prolog.d directory): the Python beside the real file.
    link = os.path.join(evil, "prolog.d-gpugate")
    os.symlink(installed["prolog"], link)
    done = _run(link, evil)
    assert done.returncode == 0 and "usage: gpugate-prolog" in done.stdout, done.stderr
    assert not os.path.exists(markers["site"])


def test_an_older_install_re_executes_isolated_and_imports_nothing_from_pythonpath(installed_old, hostile):
    """An entry point of an older gpugate (pip dropped its "-I"): the script
    starts again isolated before anything of gpugate loads, so a gpugate
    package in PYTHONPATH or the current directory never runs.  A
    sitecustomize on slurmd's own PYTHONPATH still runs in that first
    interpreter, as root: so `gpugate slurm-conf` refuses such an install
    (tested below)."""
    evil, markers = hostile
    for mode, script in installed_old.items():
        assert not install_trust.isolated_shebang(script)
        done = _run(script, evil)
        assert done.returncode == 0 and "usage: gpugate-%s" % mode in done.stdout, done.stderr
        assert not os.path.exists(markers["gpugate"]), mode
    assert os.path.exists(markers["site"])  # why slurm-conf refuses it


def test_with_the_fix_applied_nothing_of_pythonpath_or_the_cwd_runs_at_all(installed_old, hostile):
    """The one-line fix `gpugate slurm-conf` prints puts -I back: the first
    interpreter is isolated, no sitecustomize or usercustomize runs, no
    restart."""
    evil, markers = hostile
    fix = install_trust.shebang_fix(list(installed_old.values()))
    assert fix.startswith("sed -i ") and all(s in fix for s in installed_old.values())
    subprocess.run(["/bin/sh", "-c", fix], check=True, timeout=30)
    subprocess.run(["/bin/sh", "-c", fix], check=True, timeout=30)  # idempotent
    assert install_trust.shebang_fix(list(installed_old.values())) == ""
    for mode, script in installed_old.items():
        assert open(script).readline().rstrip("\n").endswith(" -I")
        done = _run(script, evil, {"PYTHONINSPECT": "", "PYTHONHOME": evil})
        assert done.returncode == 0 and "usage: gpugate-%s" % mode in done.stdout, done.stderr
        assert not os.path.exists(markers["gpugate"]) and not os.path.exists(markers["site"]), mode


def test_slurm_conf_refuses_while_an_entry_point_starts_python_without_isolation(installed_old, monkeypatch):
    """Issue 24 review: a warning was not enough, the sitecustomize above
    ran as root.  Exit 2 with the sed line that fixes it; then the fragment."""
    import sysconfig

    from gpugate.cli.main import main

    fix = install_trust.shebang_fix(list(installed_old.values()) + ["/nonexistent/gpugate-prolog"])
    assert "/nonexistent" not in fix
    assert install_trust.isolated_shebang(os.path.join(ROOT, "prolog", "gpugate-prolog"))
    assert stat.S_IMODE(os.stat(installed_old["prolog"]).st_mode) == 0o755
    real = sysconfig.get_path
    bin_dir = os.path.dirname(installed_old["prolog"])
    monkeypatch.setattr(sysconfig, "get_path",
                        lambda name, *a, **k: bin_dir if name == "scripts" else real(name, *a, **k))
    out = CliRunner().invoke(main, ["slurm-conf"])
    assert out.exit_code == 2 and "HealthCheckProgram=" not in out.output, out.output
    assert "start Python without -I" in out.output and fix in out.output
    subprocess.run(["/bin/sh", "-c", fix], check=True, timeout=30)
    out = CliRunner().invoke(main, ["slurm-conf"])
    assert out.exit_code == 0 and "HealthCheckProgram=%s" % installed_old["healthcheck"] in out.output, out.output
