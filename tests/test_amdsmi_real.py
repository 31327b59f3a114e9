"""Debian's real AMD SMI on a node without an AMD GPU (issue 29: "the real
library's failure paths run for real in a Debian root file system that has
it (a GPU-less node is a clear probe finding, never a crash or a hang)").

Debian trixie ships amd-smi 6.1.2 (package amd-smi: the CLI, libamd_smi and
its Python binding); scripts/rootfs installs it in the trixie root file
system, where `scripts/test --release 24.11` runs the tests marked
``amdsmi`` under chroot: no GPU, no amdgpu module, no /sys.  Every amd-smi
subcommand gpugate runs goes through gpugate's own runner (deadline, its own
process group, trust walk) with the environment gpugate gives tools, and
must end fast in a clear probe finding of gpugate.vendors.amd.parse_smi.failure:
never a crash, a hang, or an answer read as one.  The binding's
amdsmi_init() must raise the library's own error, fast.  gpugate itself
runs the CLI and never imports the binding (docs/explanation/amd-design.md 1.3): the
binding runs here only as the real library's failure path.

Where there is no amd-smi (this machine's bookworm has none; a bare clone
has no root file system) the real runs skip, saying where they run; in the
trixie root file system scripts/chroot-run sets GPUGATE_REQUIRE_AMDSMI, and
a missing amd-smi fails them.  The captures of the same runs are in
tests/fixtures/amd/debian-trixie-* (each with its .src.txt): the parser's
verdict on those is checked everywhere, a bare clone included.
"""

import glob
import json
import os
import re
import time

import pytest

from conftest import SAMPLES

from gpugate.safety.runner import run

AMD_SMI = "/usr/bin/amd-smi"
# Debian installs the binding off sys.path (amd-smi appends this directory itself).
BINDING = "/usr/share/amd_smi"
PYTHON = "/usr/bin/python3"
# What gpugate gives every tool (gpugate.probes.commands.ENV).
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
ANY_EXIT = tuple(range(256))  # read every exit code; a death by signal stays a CommandError
# A hang is killed at TIMEOUT (the runner's deadline, process group and
# all); an answer is "fast" under FAST: captured at 0.07-0.17 s a run.
TIMEOUT = 30.0
FAST = 10.0
# The subcommands gpugate and its sweep run (docs/explanation/amd-design.md 6), and those
# issue 29 names; amd-smi 6.1.2 answers each the same on a GPU-less node.
SUBCOMMANDS = [
    ("static", "--json"),
    ("version", "--json"),
    ("list", "--json"),
    ("metric", "--ecc", "--ecc-blocks", "--pcie", "--json"),
    ("bad-pages", "--json"),
    ("xgmi", "--json"),
    ("xgmi", "--link-status", "--json"),
    ("firmware", "--json"),
    ("reset", "-G", "-g", "0"),
]
# AMDSMI_STATUS_DRIVER_NOT_LOADED (amdsmi_wrapper.py).
DRIVER_NOT_LOADED = 34
# Also captured: amdgpu "live" with no GPU bound and /dev/kfd unopenable,
# simulated from the host (the .src.txt says how), where amd-smi says "Driver
# not loaded (amdgpu not found in modules)".  Not rerun here: faking /sys
# from inside the chroot would need mounts over ones shared with the host's.
CAPTURES = sorted(glob.glob(os.path.join(SAMPLES, "amd", "debian-trixie-amd-smi-*.stderr.txt")))

# The binding's init, reporting what it raised on stdout as one JSON line
# (python3 -I: the binding's directory goes on sys.path as amd-smi puts it).
_INIT = r"""
import json, sys
sys.path.append(sys.argv[2])
from amdsmi import amdsmi_interface as smi
flag = getattr(smi.AmdSmiInitFlags, sys.argv[1])
try:
    smi.amdsmi_init(flag)
except smi.AmdSmiLibraryException as exc:
    print(json.dumps({"raised": type(exc).__name__, "code": exc.get_error_code(),
                      "info": exc.get_error_info()}))
else:
    print(json.dumps({"raised": None}))
    smi.amdsmi_shut_down()
"""


def _require_amd_smi():
    missing = [path for path in (AMD_SMI, os.path.join(BINDING, "amdsmi", "__init__.py"), PYTHON)
               if not os.path.exists(path)]
    if missing:
        message = ("Debian's amd-smi is not installed here (%s): these run in Debian trixie's root file "
                   "system, `scripts/test --release 24.11` (scripts/rootfs installs package amd-smi there)"
                   % ", ".join(missing))
        if os.environ.get("GPUGATE_REQUIRE_AMDSMI"):
            pytest.fail(message + "; GPUGATE_REQUIRE_AMDSMI: this root file system must have it "
                        "(an old cache? scripts/rootfs rebuilds one without /usr/bin/amd-smi)", pytrace=False)
        pytest.skip(message)
    if os.path.exists("/sys/module/amdgpu"):
        pytest.skip("this machine has the amdgpu module: these tests are for a node without one")


def _failure(rc, stdout, stderr):
    from gpugate.vendors.amd import parse_smi as parser

    return parser.failure(rc, stdout, stderr)


def _assert_driver_not_loaded(found, what):
    assert found is not None, "%s: the parser would read this output as an answer" % what
    assert (found.source, found.kind) == ("amd_smi", "missing"), (what, found)
    assert found.detail.startswith("driver not loaded"), (what, found)


def _timed_run(argv):
    start = time.monotonic()
    result = run(argv, TIMEOUT, env=ENV, ok_codes=ANY_EXIT)
    return result, time.monotonic() - start


@pytest.mark.amdsmi
@pytest.mark.parametrize("args", SUBCOMMANDS, ids=lambda args: " ".join(args))
def test_real_amd_smi_without_a_gpu_is_a_fast_probe_finding(args):
    _require_amd_smi()
    result, took = _timed_run((AMD_SMI,) + args)
    what = "amd-smi %s (exit %d, stdout %r, stderr %r)" % (" ".join(args), result.rc, result.stdout[:200],
                                                          result.stderr[:300])
    assert took < FAST, "%s took %.1fs" % (what, took)
    # amd-smi 6.1.2 finds no live amdgpu, never calls amdsmi_init(), fails to
    # list devices and sys.exit(-1)s before parsing its arguments (captured:
    # tests/fixtures/amd/debian-trixie-amd-smi-*.stderr.txt).
    assert result.rc == 255, what
    assert result.stdout == "", what  # no JSON, not even half a document
    assert "driver not initialized (amdgpu not found in modules)" in result.stderr, what
    _assert_driver_not_loaded(_failure(result.rc, result.stdout, result.stderr), what)


@pytest.mark.amdsmi
@pytest.mark.parametrize("flag, code", [("INIT_AMD_GPUS", DRIVER_NOT_LOADED),
                                        ("INIT_ALL_PROCESSORS", DRIVER_NOT_LOADED)])
def test_real_library_init_without_a_gpu_raises_driver_not_loaded(flag, code):
    _require_amd_smi()
    result, took = _timed_run((PYTHON, "-I", "-c", _INIT, flag, BINDING))
    assert took < FAST, "amdsmi_init(%s) took %.1fs: %r" % (flag, took, result)
    assert result.rc == 0, result  # the exception was raised and caught: no crash
    said = json.loads(result.stdout.strip().splitlines()[-1])
    assert said["raised"] == "AmdSmiLibraryException", said
    assert said["code"] == code, said
    assert "AMDSMI_STATUS_DRIVER_NOT_LOADED" in said["info"], said
    # The library reports its own failure on stderr (rsmi_init), not stdout.
    assert "rsmi_init" in result.stderr, result.stderr


def _exit_code(source):
    with open(source) as handle:
        found = re.search(r"^exit code: (-?\d+)$", handle.read(), re.M)
    assert found, "%s says no exit code" % source
    return int(found.group(1))


def test_the_real_captures_are_there():
    # A bare clone has them too (tests/fixtures/amd): the verdict below runs everywhere.
    names = {os.path.basename(path) for path in CAPTURES}
    assert "debian-trixie-amd-smi-static-json.stderr.txt" in names, sorted(names)
    assert len(CAPTURES) >= len(SUBCOMMANDS), sorted(names)


@pytest.mark.parametrize("path", CAPTURES, ids=os.path.basename)
def test_captured_real_amd_smi_without_a_gpu_is_driver_not_loaded(path):
    """The same real runs, captured (stdout empty in every one: its .src.txt)."""
    source = path + ".src.txt"
    with open(source) as handle:
        assert re.search(r"^stdout: 0 bytes$", handle.read(), re.M), source
    with open(path) as handle:
        stderr = handle.read()
    rc = _exit_code(source)
    assert rc == 255, source
    _assert_driver_not_loaded(_failure(rc, "", stderr), os.path.basename(path))
