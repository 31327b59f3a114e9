"""The site's LBNL NHC, run by gpugate's health check ([nhc] in gpugate.toml).

Slurm runs one HealthCheckProgram; gpugate-healthcheck runs NHC as a child,
between judging the node and acting on it, so that:
- NHC marks the node itself, with its own "NHC:" reason, through its own
  helpers (node-mark-offline keeps a reason that is not NHC's; node-mark-online
  resumes only a node whose reason starts with "NHC:"), and gpugate never
  reads, writes or lifts an NHC reason (gpugate.model.ownership: not ours);
- NHC ends by its share of the run's budget: at the deadline its whole
  session is killed, reported here as "timed out", never as a gpugate finding;
- while gpugate wants the node drained, NHC runs with ONLINE_NODE=: (it cannot
  lift its own drain under gpugate's fault), and while NHC fails or cannot
  answer, the health check does not lift gpugate's drain (see healthcheck)."""

import os
import re
import signal
import subprocess
import time

PASSED, FAILED, TIMED_OUT, NOT_RUN = "passed", "failed", "timed out", "not run"  # as metrics.NHC_RESULTS
# Below this there is no point starting NHC: it counts as not answered.
_MIN_SECONDS = 1.0
_OUTPUT = 300
_MAX_OUTPUT = 1 << 20  # what NHC may print (its log goes to its own file): beyond, it is killed


def configured(settings) -> bool:
    return bool(settings.nhc and settings.nhc["command"])


def argv(settings, node: str, keep_drain: bool) -> list:
    """The configured command, "{node}" replaced by the node's name; with
    ONLINE_NODE=: when NHC must not lift its drain in this run."""
    args = [str(a).replace("{node}", node) for a in settings.nhc["command"]]
    return args + ["ONLINE_NODE=:"] if keep_drain else args


def run(settings, node: str, keep_drain: bool, deadline: float) -> dict:
    """Run NHC until it exits or ``deadline`` (time.monotonic()); returns
    {"result": PASSED|FAILED|TIMED_OUT|NOT_RUN, "seconds", and "exit" or "error"}."""
    started = time.monotonic()
    limit = min(float(settings.nhc["timeout_seconds"]), deadline - started)
    if limit < _MIN_SECONDS:
        return {"result": NOT_RUN, "seconds": 0.0, "error": "no time left in the health check's budget"}
    command = argv(settings, node, keep_drain)
    # NHC runs as root like every tool gpugate starts: the same trust walk
    # (only root can change the file, its directories and its #! interpreter).
    # The file checked is the file run (/proc/self/fd/N, as gpugate.safety.runner),
    # whatever the path names by the time it starts.
    from gpugate.safety.trust import Untrusted, open_executable
    try:
        fd = open_executable(command[0], "[nhc] command")
    except (Untrusted, OSError) as exc:
        return {"result": NOT_RUN, "seconds": 0.0, "error": "NHC not run: %s" % exc}
    env = dict(settings.slurm_env)  # slurmd gives none: NHC's scontrol needs SLURM_CONF
    env["SLURMD_NODENAME"] = node
    try:
        # Its own session: at the deadline the whole tree goes (NHC's checks,
        # its watchdog, a hung scontrol), never gpugate's own processes.
        child = subprocess.Popen(_named(command), executable="/proc/self/fd/%d" % fd, pass_fds=(fd,),
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 env=env, start_new_session=True, close_fds=True)
    except OSError as exc:
        return {"result": NOT_RUN, "seconds": 0.0, "error": "cannot start NHC: %s" % exc}
    finally:
        os.close(fd)
    from gpugate.errors import CommandError
    from gpugate.safety.runner import read_output

    try:
        output = read_output(child, command, started + limit, (_MAX_OUTPUT, 0), kill=_kill_session)[0]
        child.wait(max(started + limit - time.monotonic(), 0.001))
    except CommandError as exc:  # printing without end: killed, and no answer
        return {"result": NOT_RUN, "seconds": round(time.monotonic() - started, 3), "error": str(exc)}
    except subprocess.TimeoutExpired:
        _kill_session(child)
        output = b""
        if child.poll() is None or child.returncode < 0:
            return {"result": TIMED_OUT, "seconds": round(time.monotonic() - started, 3),
                    "error": "NHC timed out after %.1f s (killed)" % limit}
        # NHC had exited; something it left behind held its output open.
    seconds = round(time.monotonic() - started, 3)
    outcome = {"result": PASSED if child.returncode == 0 else FAILED, "seconds": seconds, "exit": child.returncode}
    text = output.decode("utf-8", "replace").strip()
    if child.returncode and text:
        outcome["error"] = text[-_OUTPUT:]  # NHC's "ERROR: ... Health check failed: ..." line
    return outcome


def _named(command: list) -> list:
    """Run from /proc/self/fd/N, NHC's $0 is "/proc/self/fd/N" and it would
    name itself "N" (NAME=${0##*/}: /etc/sysconfig/N, /etc/nhc/N.conf):
    NAME= its file's own name, unless the command names it (NAME=, -n)."""
    name = os.path.basename(command[0])
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name) or any(a.startswith(("NAME=", "-n")) for a in command[1:]):
        return command
    return command + ["NAME=" + name]


def _kill_session(child) -> None:
    """SIGKILL every process of NHC's session: its process group, and the
    watchdog NHC starts in a group of its own."""
    for pid in [child.pid] + _session_members(child.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass  # already gone
    try:
        child.communicate(timeout=2)
    except (subprocess.TimeoutExpired, OSError):
        pass  # a grandchild holding the pipe in D state: do not wait for it


def _session_members(sid: int) -> list:
    from gpugate.safety.safeio import SMALL_CAP, read_capped

    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = read_capped("/proc/%s/stat" % name, SMALL_CAP).rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # After "(comm)": state ppid pgrp session ...
        if len(stat) > 3 and stat[3] == str(sid).encode():
            found.append(int(name))
    return found
