"""LBNL NHC from the vendored source (../shared/vendor/nhc-*.tar.gz),
installed into a temporary prefix: the reference the prolog benchmark
compares with (a trivial four-check nhc.conf), and the real NHC the tests run
beside gpugate (tests/test_slurm_nhc.py).  Test and benchmark code only.

NHC is bash scripts only: its `make install` (Makefile.am) copies `nhc` to
sbin, the check scripts to etc/nhc/scripts and the helpers to libexec/nhc.
This does the same without autotools, so the benchmark needs nothing but
bash, which every Debian machine has."""

import glob
import os
import shutil
import stat
import tarfile

# Cheap checks of the kind every NHC site starts with: one mount, memory,
# one file, the load average.
TRIVIAL_CHECKS = """\
* || check_fs_mount_rw -f /
* || check_hw_mem_free 1mb
* || check_file_test -r -f /etc/passwd
* || check_ps_loadavg 1000
"""


def vendored(root: str) -> str:
    """The vendored NHC tarball next to this repository, or ""."""
    found = sorted(glob.glob(os.path.join(os.path.dirname(root), "shared", "vendor", "nhc-*.tar.gz")))
    return found[-1] if found else ""


def install(tarball: str, prefix: str, checks: str = TRIVIAL_CHECKS, mark_offline: bool = False) -> list:
    """Install NHC under ``prefix`` with ``checks`` as its nhc.conf; the argv
    that runs them as slurmd would run NHC as its HealthCheckProgram.  No
    node marking by default (gpugate's healthy path makes no controller call
    either); mark_offline: NHC drains and resumes through its own helpers."""
    if not shutil.which("bash", path="/bin:/usr/bin"):
        raise RuntimeError("NHC needs bash")
    src = os.path.join(prefix, "src")
    with tarfile.open(tarball) as archive:
        # Our own vendored file: extract it as it is (Python 3.12+ asks for a
        # filter and warns without one; older releases have no such argument).
        trusted = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
        archive.extractall(src, **trusted)  # noqa: S202
    (top,) = [os.path.join(src, d) for d in os.listdir(src)]
    conf = os.path.join(prefix, "etc", "nhc")
    helpers = os.path.join(prefix, "libexec", "nhc")
    for directory in (os.path.join(prefix, "sbin"), os.path.join(conf, "scripts"), helpers,
                      os.path.join(prefix, "run")):
        os.makedirs(directory, mode=0o755, exist_ok=True)
    _copy(os.path.join(top, "nhc"), os.path.join(prefix, "sbin", "nhc"), 0o755)
    for script in glob.glob(os.path.join(top, "scripts", "*.nhc")):
        _copy(script, os.path.join(conf, "scripts", os.path.basename(script)), 0o644)
    for helper in glob.glob(os.path.join(top, "helpers", "node-mark-*")):
        _copy(helper, os.path.join(helpers, os.path.basename(helper)), 0o755)
    with open(os.path.join(conf, "nhc.conf"), "w") as handle:
        handle.write(checks)
    return [os.path.join(prefix, "sbin", "nhc"), "-D", conf, "-c", os.path.join(conf, "nhc.conf"),
            "-l", os.path.join(prefix, "nhc.log"), "HELPERDIR=" + helpers,
            "MARK_OFFLINE=%d" % bool(mark_offline), "RESULTFILE=" + os.path.join(prefix, "run", "nhc.status")]


def _copy(source: str, target: str, mode: int) -> None:
    shutil.copyfile(source, target)
    os.chmod(target, mode)
    assert not os.stat(target).st_mode & stat.S_IWOTH
