"""The environment the benchmark measures: gpugate installed the way the
README installs it (a venv of its own, from a wheel), and the reference
interpreter that environment starts.

The reference must cost what the prolog's own interpreter costs before
gpugate's first import: a system Python whose site-packages load many .pth
files makes `python3 -c pass` slow and the ratio flattering."""

import json
import os
import shutil
import subprocess
import sys

_TIMEOUT = 900  # pip may download the dependencies


def create(work: str, root: str, python: str = "", wheelhouse: str = "") -> str:
    """A new venv (no system site-packages) under ``work`` with gpugate's
    wheel, built from ``root``, and its dependencies from the index (or
    only from the ``wheelhouse`` directory: a node with no index)."""
    venv = os.path.join(work, "venv")
    python = python or _base_python()
    subprocess.run([python, "-m", "venv", venv], check=True, timeout=_TIMEOUT)
    pip = [os.path.join(venv, "bin", "python3"), "-m", "pip", "-q", "--disable-pip-version-check"]
    index = ["--no-index", "--find-links", os.path.abspath(wheelhouse)] if wheelhouse else []
    wheels, tree = os.path.join(work, "wheels"), os.path.join(work, "tree")
    # Built from a copy: pip builds in the tree and would leave build/ there.
    shutil.copytree(root, tree, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__"))
    subprocess.run(pip + ["wheel", "--no-deps", "-w", wheels, tree] + index, check=True, timeout=_TIMEOUT,
                   stdout=subprocess.DEVNULL)
    (wheel,) = [os.path.join(wheels, w) for w in os.listdir(wheels) if w.startswith("gpugate-")]
    subprocess.run(pip + ["install", wheel] + index, check=True, timeout=_TIMEOUT, stdout=subprocess.DEVNULL)
    return venv


def _base_python() -> str:
    """The interpreter under this one's venv, if any: a venv made from a
    venv's python would still be a clean venv, but say which it is."""
    base = os.path.join(sys.base_prefix, "bin", "python3")
    return base if os.path.exists(base) else sys.executable


def interpreter(script: str) -> str:
    """The Python an installed entry point starts: what slurmd really runs.
    gpugate's own ("#!/bin/sh -e", the sh launcher) exec the python3 beside
    them; another script's #! line names it (pip rewrites it to the
    environment's python)."""
    with open(script, "rb") as handle:
        line = handle.readline().decode()
    if not line.startswith("#!"):
        raise RuntimeError("%s has no #! line" % script)
    if line.split()[0] == "#!/bin/sh":
        return os.path.join(os.path.dirname(os.path.realpath(script)), "python3")
    return line[2:].split()[0]


_PROBE = ("import json, site, sys, sysconfig; g = sysconfig.get_path; print(json.dumps({"
          "'path': sys.path, 'prefix': sys.prefix, 'base': sys.base_prefix, 'purelib': g('purelib'), "
          "'platlib': g('platlib'), 'stdlib': g('stdlib'), 'platstdlib': g('platstdlib'), "
          "'modules': sorted(sys.modules)}))")


def startup(python: str, env: dict) -> dict:
    out = subprocess.run([python, "-c", _PROBE], env=env, capture_output=True, text=True, check=True,
                         timeout=60).stdout
    return json.loads(out)


def foreign_site_packages(python: str, env: dict) -> list:
    """What the reference interpreter puts on sys.path beyond the standard
    library and its own environment's site-packages (a venv made with
    --system-site-packages, PYTHONPATH, a user site), or that it is no
    venv at all: empty, or the benchmark refuses to report."""
    info = startup(python, env)
    own = {info["purelib"], info["platlib"]}
    std = (info["stdlib"], info["platstdlib"], os.path.join(info["base"], "lib"))
    foreign = []
    for entry in info["path"]:
        if not entry or entry in own:
            continue  # "": the -c working directory
        if "site-packages" in entry or "dist-packages" in entry or not entry.startswith(std):
            foreign.append(entry)
    if info["prefix"] == info["base"]:
        foreign.append("(not a venv: %s is the system interpreter)" % python)
    return foreign
