"""The pyslurm backend: Slurm's C API through pyslurm, in a worker process.

Same interface and rules as the command backend (gpugate.slurm.commands):
every call has a deadline, cut to the run's; a call with less than
MIN_CALL_SECONDS left is not started; errors are SlurmError.  pyslurm runs
in gpugate.slurm.pyslurm_worker, a child this process kills when a call
misses its deadline (libslurm retries an absent slurmctld for minutes
inside one call, and exits the process on a slurm.conf it cannot read);
the next call starts a new worker.

What libslurm has no call for goes through the site's tools, under the same
deadline: `scontrol reboot` (scontrol builds REQUEST_REBOOT_NODES itself,
src/scontrol/reboot_node.c; slurm.h declares no reboot function), and the
Slurm release this host runs (`sinfo --version`), which pyslurm's own
major.minor must equal."""

import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional, Tuple

from gpugate.errors import ParseError, SlurmError
from gpugate.slurm import trace
from gpugate.slurm.base import NodeUpdates
from gpugate.slurm.commands import MIN_CALL_SECONDS, CommandSlurm, _only
from gpugate.slurm.jobs import ENDED, GONE, JobState
from gpugate.slurm.nodestate import NodeState
from gpugate.slurm.nodestate.records import parse_node_records
from gpugate.slurm.nodestate.show_text import parse_show_node
from gpugate.slurm.wire import WireClosed, WireTimeout, read_frame, write_frame

# The worker's own start (interpreter, pyslurm, slurm.conf) gets at least
# this long, whatever the call's share: a cold start on a busy controller.
START_SECONDS = 5.0


class PyslurmMismatch(SlurmError):
    """pyslurm does not import, or was built for another Slurm release."""

    ask_again = False  # the same read meets the same pyslurm


# The oldest pyslurm this backend was proven with (against Slurm 25.11.7).
OLDEST = (25, 11)


def check_release(pyslurm_version: str, running: Tuple[int, int], bin_dir: str) -> None:
    """pyslurm X.Y.Z is built for Slurm X.Y (its versioning): refuse any
    other, and any older than the one this backend was proven with."""
    parts = pyslurm_version.split(".")
    built_for = ".".join(parts[:2])
    here = "%d.%d" % running
    try:
        release = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        raise PyslurmMismatch("pyslurm says its version is %r: not X.Y.Z" % pyslurm_version) from None
    if release < OLDEST:
        raise PyslurmMismatch("pyslurm %s is older than gpugate's pyslurm backend supports (%d.%d and later, with "
                              "the Slurm release of the same number): set [slurm] backend = \"commands\""
                              % (pyslurm_version, OLDEST[0], OLDEST[1]))
    if built_for != here:
        raise PyslurmMismatch(
            "pyslurm %s is built for Slurm %s, but this host runs Slurm %s (%s/sinfo --version): rebuild it "
            "against this Slurm (pip install 'pyslurm==%s.*' with SLURM_INCLUDE_DIR and SLURM_LIB_DIR set) or "
            "set [slurm] backend = \"commands\"" % (pyslurm_version, built_for, here, bin_dir, here))


class PyslurmSlurm(NodeUpdates):
    name = "pyslurm"

    def __init__(self, bin_dir: str = "/usr/bin", env: Optional[Dict[str, str]] = None, timeout: float = 10.0,
                 deadline: Optional[float] = None, python: str = sys.executable):
        self.tools = CommandSlurm(bin_dir, env, timeout, deadline)
        self.env = dict(self.tools.env)
        self.timeout = timeout
        self.deadline = deadline
        self.python = python
        self.calls = 0  # requests answered or failed, worker starts not counted
        self.slowest = 0.0
        self.pyslurm_version = ""
        self.node_read = ""  # as CommandSlurm's
        self._proc: Optional[subprocess.Popen] = None
        self._stderr = None
        # One request in flight on the worker's pipes: callers in threads wait their turn.
        self._lock = threading.Lock()
        self._sent = 0  # requests sent; the worker echoes each one's number
        # Every call, in scontrol's words, appended to this file: what a
        # logging shim in front of scontrol shows of the command backend.
        self.trace = os.environ.get("GPUGATE_SLURM_TRACE", "")

    # -- the worker --------------------------------------------------------

    def time_left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()

    def start(self, timeout: Optional[float] = None) -> str:
        """Start the worker and check pyslurm against this host's Slurm:
        pyslurm's version.  PyslurmMismatch when it cannot be used."""
        if self._proc is not None:
            return self.pyslurm_version
        limit = min(max(timeout or self.timeout, START_SECONDS), self.time_left())
        if limit < MIN_CALL_SECONDS:
            raise SlurmError("pyslurm worker not started: no time left in this run's budget")
        ends = time.monotonic() + limit
        env = dict(self.env)
        self._stderr = tempfile.TemporaryFile()
        try:
            # -I: no PYTHON* variables, no user site, no current directory on
            # sys.path (slurmd starts node-side runs in its log directory).
            self._proc = subprocess.Popen([self.python, "-I", "-m", "gpugate.slurm.pyslurm_worker"],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                          env=env, close_fds=True, start_new_session=True)
        except OSError as exc:
            self._stderr.close()
            raise PyslurmMismatch("cannot start the pyslurm worker (%s): %s" % (self.python, exc)) from None
        try:
            hello = read_frame(self._proc.stdout.fileno(), ends)  # request 0, unasked
        except (WireClosed, WireTimeout) as exc:
            why = self._abandon()
            if isinstance(exc, WireTimeout):
                raise SlurmError("pyslurm worker did not start within %.1f s%s" % (limit, why)) from None
            raise PyslurmMismatch("pyslurm worker exited at start%s" % why) from None
        except BaseException:  # interrupted: a worker never checked is never used
            self._abandon()
            raise
        try:
            if hello[1] != "ok":
                raise PyslurmMismatch("pyslurm does not load: %s" % hello[-1])
            version = str(hello[2]["pyslurm"])
            check_release(version, self.tools.version(), self.tools.bin_dir)
        except (IndexError, KeyError, TypeError) as exc:
            self._abandon()
            raise PyslurmMismatch("the pyslurm worker's first answer is not its version (%s)" % exc) from None
        except BaseException:
            self._abandon()
            raise
        self.pyslurm_version = version
        return version

    def close(self) -> None:
        """Let the worker go: it leaves when its requests pipe closes."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()
            proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            self._kill(proc)
        finally:
            proc.stdout.close()
            if self._stderr is not None:
                self._stderr.close()

    def _abandon(self) -> str:
        """Kill the worker: ": <the end of what it printed>" (or "")."""
        proc, self._proc = self._proc, None
        if proc is None:
            return ""
        self._kill(proc)
        for pipe in (proc.stdin, proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        said = ""
        if self._stderr is not None:
            try:
                self._stderr.seek(max(0, os.fstat(self._stderr.fileno()).st_size - 600))  # its last words only
                said = self._stderr.read(600).decode("utf-8", "replace").strip()
            finally:
                self._stderr.close()
                self._stderr = None
        said = " ".join(said.split())[-300:]
        return ": %s" % said if said else " (exit status %s)" % proc.returncode

    @staticmethod
    def _kill(proc) -> None:
        try:
            os.killpg(proc.pid, 9)  # the worker and anything it started
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass  # stuck in the kernel: the kernel reaps it later

    def _call(self, op: str, *args, timeout: Optional[float] = None):
        with self._lock:
            return self._call_alone(op, args, timeout)

    def _call_alone(self, op: str, args: tuple, timeout: Optional[float]):
        started = time.monotonic()
        self.start(self._limit(op, timeout))
        limit = self._limit(op, timeout)  # the call's own time, after a start that took some
        self.calls += 1
        self._sent += 1
        if self.trace:
            trace.write(self.trace, trace.in_scontrol_words(op, args))
        try:
            write_frame(self._proc.stdin.fileno(), (self._sent, op, args))
            answer = read_frame(self._proc.stdout.fileno(), time.monotonic() + limit)
        except WireTimeout:
            why = self._abandon()
            raise SlurmError("pyslurm %s: no answer within %.1f s (is slurmctld up? gpugate retries on its next "
                             "run)%s" % (op, limit, why if why.startswith(":") else "")) from None
        except (WireClosed, OSError) as exc:
            why = self._abandon()
            raise SlurmError("pyslurm worker died during %s (%s)%s" % (op, exc, why)) from None
        except BaseException:
            # Interrupted (ctrl-C, ...) with an answer on its way: this worker
            # would hand it to the next call.  It goes; the next call starts another.
            self._abandon()
            raise
        finally:
            self.slowest = max(self.slowest, time.monotonic() - started)
        if not isinstance(answer, tuple) or len(answer) < 3 or answer[0] != self._sent:
            self._abandon()
            raise SlurmError("pyslurm %s: the worker answered another request (%r): worker replaced" % (
                op, answer[:1] if isinstance(answer, tuple) else type(answer).__name__))
        if answer[1] == "ok":
            return answer[2]
        kind, message = answer[2], answer[3] if len(answer) > 3 else ""
        hint = ""
        if kind == "rpc" and ("Unable to contact slurm controller" in message or "Connection refused" in message):
            hint = " (is slurmctld up? gpugate retries on its next run)"
        raise SlurmError("pyslurm %s: %s%s" % (op, message, hint))

    def _limit(self, op: str, timeout: Optional[float]) -> float:
        """This call's time: its timeout cut to the run's; SlurmError when
        too little is left to start it."""
        limit = min(timeout or self.timeout, self.time_left())
        if limit < MIN_CALL_SECONDS:
            raise SlurmError("pyslurm %s not started: no time left in this run's budget (gpugate retries on its "
                             "next run)" % op)
        return limit

    # -- the interface every backend has ------------------------------------

    def version(self) -> Tuple[int, int]:
        return self.tools.version()

    def nodes(self, names: Optional[str] = None, lean: bool = False) -> Dict[str, NodeState]:
        """lean: accepted for the commands' sake; the worker's records are lean already."""
        single = bool(names) and not any(c in names for c in "[],")
        records = self._call("nodes", names if single else None)
        try:
            return _only(parse_node_records(records), names)
        except ParseError as exc:  # as the command backend says of output it cannot read
            raise SlurmError("cannot read node states: %s" % exc) from None

    def own_record(self, name: str) -> Optional[NodeState]:
        """As the command backend's (one RPC, no partitions), in the worker."""
        answer = self._call("own_record", name)
        why = "the worker's answer %r" % (answer[:1],)
        if isinstance(answer, list) and answer:
            if answer[0] == "missing":
                return None
            if answer[0] == "failed" and len(answer) == 2:
                hint = " (is slurmctld up? gpugate retries on its next run)" if (
                    "Unable to contact slurm controller" in str(answer[1])) else ""
                raise SlurmError("pyslurm own_record: %s%s" % (answer[1], hint))
            if answer[0] == "found" and len(answer) == 3:
                try:
                    found = parse_show_node(answer[1], answer[2], name)
                    self.node_read = "libslurm"
                    return found
                except ParseError as exc:
                    why = "libslurm's answer: %s" % exc
            elif answer[0] == "older" and len(answer) == 2:
                why = str(answer[1])
        self.node_read = "Node.load (%s)" % why[:200]
        return self.nodes(name).get(name)

    def update(self, names: str, state: str, reason: Optional[str] = None) -> None:
        self._call("update_nodes", names, state, reason)

    def set_comment(self, name: str, comment: str) -> None:
        """The node's whole Comment (gpugate.slurm.pending builds it).  An
        empty one goes through scontrol: pyslurm sends "" as NULL, which
        slurmctld reads as "no change" (pyslurm's cstr.fmalloc), so it could
        never clear a comment."""
        if comment:
            self._call("set_comment", name, comment)
            return
        self.tools.deadline = self.deadline
        self.tools.set_comment(name, comment)

    def note_job(self, job: str, text: str) -> None:
        """The job's AdminComment, through scontrol: pyslurm's job update
        sends a whole job description, which is more than a note needs."""
        self.tools.deadline = self.deadline
        self.tools.note_job(job, text)

    def requeue_job(self, job: str) -> None:
        """Through scontrol, as note_job."""
        self.tools.deadline = self.deadline
        self.tools.requeue_job(job)

    def cancel_jobs(self, names: str) -> None:
        """Cancel every job on these nodes (the sweep's --force)."""
        from ClusterShell.NodeSet import NodeSet

        wanted = NodeSet(names)
        doomed = [job for job, (_, _, nodes, state) in self._call("jobs_now").items()
                  if state not in ENDED and nodes and NodeSet(nodes) & wanted]
        self._call("cancel", doomed)

    def reserve(self, name: str, names: str, minutes: Optional[int] = None) -> None:
        self._call("reserve", name, names, *([minutes] if minutes else []))

    def update_reservation(self, name: str, names: str) -> None:
        self._call("update_reservation", name, names)

    def unreserve(self, name: str) -> None:
        self._call("unreserve", name)

    def reservations(self) -> Dict[str, str]:
        return dict(self._call("reservations"))

    def reboot(self, names: str, reason: str, next_state: Optional[str] = None) -> None:
        self.tools.deadline = self.deadline
        self.tools.reboot(names, reason, next_state)  # no reboot call in libslurm's API (module docstring)

    # -- batch jobs (gpugate.slurm.jobs decides what, the backend sends it) --

    def submit_job(self, spec: dict) -> str:
        return str(self._call("submit", self._submit_spec(spec)))

    def _submit_spec(self, spec: dict) -> dict:
        """What the worker needs of what gpugate.slurm.jobs.submit decided;
        the job gets the environment sbatch would pass (this run's)."""
        return {"name": spec["name"], "reservation": spec["reservation"], "nodes": spec["node"],
                "count": len(spec["node"].split(",")), "minutes": spec["minutes"], "output": spec["output"],
                "chdir": os.path.dirname(spec["output"]), "environment": dict(self.env),
                "script": "#!/bin/sh\n" + spec["wrap"] + "\n", "extra": list(spec["extra"]),
                "partition": spec.get("partition", "")}

    def job_states(self, jobs: List[str]) -> Dict[str, JobState]:
        found = self._call("jobs", list(jobs))
        states, ended = {}, []
        for job in jobs:
            info = found.get(job)
            states[job] = JobState(job, GONE) if info is None else JobState(job, info[0], None, info[1], info[2])
            if info is not None and states[job].ended:
                ended.append(job)
        if ended:
            # pyslurm takes 128 off an exit code of 128 and over, and reads
            # none as 0: the script's own code comes from scontrol, once.
            for job, told in self.tools.job_states(ended).items():
                if told.state != GONE:
                    states[job] = told
        return states

    def cancel_job_ids(self, jobs: List[str]) -> None:
        if jobs:
            self._call("cancel", list(jobs))

    def cancel_named(self, name: str, reservation: str) -> None:
        doomed = [job for job, (job_name, resv, _, state) in self._call("jobs_now").items()
                  if state not in ENDED and job_name == name and resv == reservation]
        self._call("cancel", doomed)
