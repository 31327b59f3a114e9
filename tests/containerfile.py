"""deploy/container/Containerfile read as the builders read it, and
gpugate's wheel built as its wheel stage builds it: from a copy of only the
paths that stage copies (so the checkout gets no build/ of its own), offline
(no build isolation: setuptools and wheel, the test extra, are this
Python's)."""

import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONTAINERFILE = os.path.join(ROOT, "deploy", "container", "Containerfile")


def instructions(text):
    """[(KEYWORD, arguments, the comment lines just above)]: continuation
    lines joined, as the builders read them."""
    out, comments, pending = [], [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            if not pending:
                comments.append(stripped.lstrip("#").strip())
            continue
        if not stripped and not pending:
            comments = []
            continue
        pending += " " + stripped.rstrip("\\").strip() if pending else stripped.rstrip("\\").strip()
        if stripped.endswith("\\"):
            continue
        keyword, _, args = pending.partition(" ")
        out.append((keyword.upper(), args.strip(), comments))
        pending, comments = "", []
    return out


def stages(parsed):
    """[(FROM arguments, [instructions])], with the global ARG defaults substituted into FROM."""
    args, out = {}, []
    for keyword, rest, comments in parsed:
        if keyword == "ARG" and not out:
            name, _, default = rest.partition("=")
            args[name] = default
        elif keyword == "FROM":
            out.append((re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], rest), []))
        else:
            out[-1][1].append((keyword, rest, comments))
    return out


def copied_into_build(parsed):
    """The paths the wheel stage copies from the source tree."""
    paths = []
    for keyword, args, _ in parsed[0][1]:
        if keyword == "COPY" and not args.startswith("--from"):
            paths += args.split()[:-1]
    return paths


def wheel_stage_paths():
    with open(CONTAINERFILE) as handle:
        return copied_into_build(stages(instructions(handle.read())))


def build(paths, top: str) -> str:
    """The wheel's path, built from ``paths`` (relative to the checkout)
    copied into ``top``/src."""
    src, out = os.path.join(top, "src"), os.path.join(top, "wheels")
    os.makedirs(src)
    for path in paths:
        origin = os.path.join(ROOT, path)
        if os.path.isdir(origin):
            shutil.copytree(origin, os.path.join(src, path), ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(origin, os.path.join(src, path))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "--disable-pip-version-check", "-w", out, src], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise AssertionError("pip wheel failed: %s" % done.stderr[-2000:])
    wheels = os.listdir(out)
    assert len(wheels) == 1 and wheels[0].startswith("gpugate-"), wheels
    return os.path.join(out, wheels[0])
