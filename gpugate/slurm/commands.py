"""The default Slurm backend: the scontrol and sinfo commands (present on
every Slurm host, every version).  The only code that runs them."""

import json
import os
import re
import sys
import time
from typing import Dict, List, Optional, Tuple

from gpugate.errors import CommandError, ParseError, SlurmError
from gpugate.safety.runner import run
from gpugate.slurm import libslurm
from gpugate.slurm.base import NodeUpdates
from gpugate.slurm.jobs import GONE, JobState, parse_sbatch, parse_show_job, sbatch_argv
from gpugate.slurm.nodestate import SCONTROL_JSON_ARGV, SCONTROL_TEXT_ARGV, SCONTROL_TEXT_ENV, SINFO_JSON_ARGV, SINFO_TEXT_ARGV, SINFO_TEXT_ENV, NodeState, parse_nodes_json, parse_nodes_text
from gpugate.slurm.nodestate.show_text import parse_show_node
from gpugate.slurm.trace import append as trace_append
from gpugate.slurm.wire import MAX_FRAME

_OLDER = object()  # own_record: read the node the older way
_VERSION_RE = re.compile(r"slurm[- ](?:wlm )?(\d+)\.(\d+)")


# A call with less time than this left is not started: it could only time out.
MIN_CALL_SECONDS = 0.5
# A read slurmctld dropped half-way is tried once more after this pause: the
# messages of Slurm's slurm_errno.c for a connection that broke or a
# controller busy for a moment.  Not "(connect failure)": the client has
# already retried that one itself for MessageTimeout (slurmctld is down);
# nor "Socket timed out on send/recv operation": that is MessageTimeout
# spent, a timeout like gpugate's own (a stopped slurmctld costs one).
RETRY_PAUSE = 1.0
TRANSIENT = ("Unexpected missing socket error",
             "Zero Bytes were transmitted or received", "Message send failure", "Message receive failure",
             "Unable to contact slurm controller (send failure)",
             "Unable to contact slurm controller (receive failure)",
             "Unable to contact slurm controller (shutdown failure)",
             "Rate limit exceeded, please retry momentarily", "Header lengths are longer than data received")


class CommandSlurm(NodeUpdates):
    name = "commands"

    def __init__(self, bin_dir: str = "/usr/bin", env: Optional[Dict[str, str]] = None, timeout: float = 10.0,
                 deadline: Optional[float] = None, library: str = ""):
        self.bin_dir = bin_dir.rstrip("/")
        self.library = library  # [slurm] library; "" = found beside bin_dir
        # How own_record read the node last: "libslurm", or the older read and why.
        self.node_read = ""
        self.fleet_read = ""  # how fleet() last read the fleet, and why
        self.env = dict(env or {"PATH": "/usr/bin:/bin", "LC_ALL": "C"})
        self.timeout = timeout
        self.deadline = deadline  # time.monotonic(): no call outlives it
        self._version: Optional[Tuple[int, int]] = None
        self.calls = 0  # commands run: the sweep's benchmark counts them
        self.slowest = 0.0  # seconds of the slowest call so far
        self.retried = 0  # reads tried a second time (_read)

    def close(self) -> None:
        """Nothing to let go (the pyslurm backend stops its worker)."""

    def time_left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()

    def _run(self, tool: str, args, env_extra=None, timeout=None) -> str:
        return self._exec([self.bin_dir + "/" + tool] + list(args), tool, env_extra, timeout).stdout

    def _exec(self, argv, what: str, env_extra=None, timeout=None, ok_codes=(0,), pass_fds=()):
        env = dict(self.env)
        env.update(env_extra or {})
        limit = min(timeout or self.timeout, self.time_left())
        if limit < MIN_CALL_SECONDS:
            raise SlurmError("%s %s not started: no time left in this run's budget (gpugate retries on its "
                             "next run)" % (what, argv[1] if len(argv) > 1 else ""))
        self.calls += 1
        started = time.monotonic()
        try:
            # A whole fleet's node table (sinfo --json: a few KB a node) may pass
            # the cap of a node's tools: the pyslurm worker's frame limit.
            return run(argv, limit, env=env, max_stdout=MAX_FRAME, ok_codes=ok_codes, pass_fds=pass_fds)
        except CommandError as exc:
            hint = ""
            if exc.timed_out or "Unable to contact slurm controller" in exc.stderr \
                    or "Connection refused" in exc.stderr:
                hint = " (is slurmctld up? gpugate retries on its next run)"
            raise SlurmError("%s%s" % (exc, hint)) from exc
        finally:
            self.slowest = max(self.slowest, time.monotonic() - started)

    def _read(self, tool: str, args, env_extra=None) -> str:
        """A read-only call (never a write: one may have landed before the
        connection broke), tried once more after RETRY_PAUSE where it failed
        for a moment: the client killed by a signal it did not ask for
        (sinfo by SIGPIPE when slurmctld drops its socket), or one of
        TRANSIENT.  Never a timeout: a slurmctld that did not answer in
        [slurm] timeout_seconds is not busy for a moment, and a wait again on
        every node at once would double the load of a controller already
        slow; a stopped slurmctld costs one timeout (the error says so)."""
        try:
            return self._run(tool, args, env_extra)
        except SlurmError as exc:
            if not self._worth_a_retry(exc.__cause__) or self.time_left() < RETRY_PAUSE + MIN_CALL_SECONDS:
                raise
            first = exc
        time.sleep(RETRY_PAUSE)
        self.retried += 1
        try:
            return self._run(tool, args, env_extra)
        except SlurmError as exc:
            raise SlurmError("%s (tried twice; the first: %s)" % (exc, str(first)[:200])) from exc

    def _worth_a_retry(self, cause) -> bool:
        if not isinstance(cause, CommandError) or cause.missing or cause.refused or cause.overflow \
                or cause.timed_out:
            return False
        return (cause.rc is not None and cause.rc < 0) or any(text in cause.stderr for text in TRANSIENT)

    def version(self) -> Tuple[int, int]:
        if self._version is None:
            out = self._read("sinfo", ["--version"])
            m = _VERSION_RE.search(out)
            if not m:
                raise SlurmError("cannot read the Slurm version from %r" % out.strip()[:80])
            self._version = (int(m.group(1)), int(m.group(2)))
        return self._version

    def nodes(self, names: Optional[str] = None, lean: bool = False) -> Dict[str, NodeState]:
        """Node states (all nodes, or a hostlist).  JSON first; the text
        format when JSON is unavailable or unreadable.  lean: accepted for
        the seam's sake; the budget keeper's lean read is fleet()."""
        # One node: `sinfo -n NODE` is the only read slurmctld answers with
        # that node alone (REQUEST_NODE_INFO_SINGLE); `scontrol show node`
        # and `sinfo --json` load every node and filter here (Slurm's
        # scontrol/info_node.c, sinfo/sinfo.c).  A node's own check uses it.
        # Each of them reads the partitions too: two RPCs, on every release
        # (tests/test_slurm_node_read.py; issue 34's one is not reachable).
        single = bool(names) and not any(c in names for c in "[],")
        try:
            if not single and self.version() >= (23, 2):
                found = parse_nodes_json(self._read("scontrol", SCONTROL_JSON_ARGV + ([names] if names else [])))
                return _only(found, names)
            if not names:
                return parse_nodes_json(self._read("sinfo", SINFO_JSON_ARGV))
            # 22.05 `sinfo --json` ignores -n and dumps the whole fleet: for a
            # few nodes the text form with -n is cheaper.
        except ParseError:
            pass
        args = list(SINFO_TEXT_ARGV) + (["-n", names] if names else [])
        try:
            return parse_nodes_text(self._read("sinfo", args, SINFO_TEXT_ENV))
        except ParseError as exc:
            raise SlurmError("cannot read node states: %s" % exc) from None

    def fleet(self):
        """The budget keeper's full read: a gpugate.slurm.nodestate.lean.Fleet,
        records for the nodes that decide alone, from `scontrol show node`'s
        text (gpugate.slurm.nodestate.show_fleet: its cost grows with the
        fleet, where `sinfo --Node`'s grows with its square).  Text it
        refuses (a value with a line break, a reason of several lines) is
        read the full way instead (nodes(): JSON), and ``fleet_read`` says
        why.  The text is one read of the fleet (the node table and the
        partitions: two RPCs); a refusal costs a second one, and a job's
        user can cause it (an MCS label with a line break on the node its
        job runs on): slower, once a run, never another decision."""
        from gpugate.slurm.nodestate.lean import of_states
        from gpugate.slurm.nodestate.show_fleet import read_show_text

        text = self._read("scontrol", list(SCONTROL_TEXT_ARGV), SCONTROL_TEXT_ENV)
        try:
            fleet = read_show_text(text)
        except ParseError as exc:
            fleet = of_states(self.nodes())
            self.fleet_read = "full read (scontrol show node: %s)" % str(exc)[:200]
            return fleet
        self.fleet_read = "scontrol show node"
        return fleet

    def own_record(self, name: str) -> Optional[NodeState]:
        """One node's record (None: slurmctld has no such node) in one RPC,
        REQUEST_NODE_INFO_SINGLE alone (gpugate.slurm.libslurm), for a node
        reading itself and the keeper's re-read before a drain.  Its
        ``partitions`` are empty: slurmctld does not send them.  Where
        libslurm cannot be used, or its answer not read exactly, the older
        read (`sinfo -n`: the node and the partition table), and
        ``node_read`` says why.  slurmctld refusing or not answering is a
        SlurmError either way: the older read would only wait again."""
        found = self._libslurm_read(name)
        if found is not _OLDER:
            self.node_read = "libslurm"
            return found
        return self.nodes(name).get(name)

    def _libslurm_read(self, name: str):
        try:
            fd, path = libslurm.open_library(self.bin_dir, self.library)
        except libslurm.Unusable as exc:
            self.node_read = "sinfo -n (%s)" % exc
            return _OLDER
        try:
            trace_append(("libslurm", "show", "node", name))
            argv = libslurm.command(sys.executable, "/proc/self/fd/%d" % fd, name)
            try:
                result = self._exec(argv, "libslurm", {"SLURM_TIME_FORMAT": "%s"},
                                    ok_codes=(libslurm.FOUND, libslurm.MISSING), pass_fds=(fd,))
            except SlurmError as exc:
                cause = exc.__cause__
                if not isinstance(cause, CommandError) or cause.timed_out or cause.rc == libslurm.RPC_FAILED:
                    raise
                # The library would not load, or the child died (another
                # release's ABI, libslurm's fatal() on its slurm.conf).
                self.node_read = "sinfo -n (libslurm %s: %s)" % (path, str(exc)[:200])
                return _OLDER
        finally:
            os.close(fd)
        if result.rc == libslurm.MISSING:
            return None
        try:
            answer = json.loads(result.stdout)
            return parse_show_node(answer["text"], answer["oneline"], name)
        except (ValueError, KeyError, TypeError, ParseError, RecursionError) as exc:
            self.node_read = "sinfo -n (libslurm's answer: %s)" % str(exc)[:200]
            return _OLDER

    def update(self, names: str, state: str, reason: Optional[str] = None, extra=()) -> None:
        args = ["update", "NodeName=" + names, "State=" + state]
        if reason is not None:
            args.append("Reason=" + reason)
        self._run("scontrol", args + list(extra))

    def set_comment(self, name: str, comment: str) -> None:
        """The node's whole Comment (gpugate.slurm.pending builds it)."""
        self._run("scontrol", ["update", "NodeName=" + name, "Comment=" + comment])

    def show_config(self) -> str:
        """`scontrol show config`: slurmctld's running configuration, as text."""
        return self._read("scontrol", ["show", "config"])

    def note_job(self, job: str, text: str) -> None:
        """The job's AdminComment (root's, shown by scontrol show job and
        sacct; the user's --comment is left as it is)."""
        self._run("scontrol", ["update", "JobId=" + job, "AdminComment=" + text])

    def requeue_job(self, job: str) -> None:
        """Put a running (or starting) batch job back in the queue."""
        self._run("scontrol", ["requeue", job])

    def cancel_jobs(self, names: str) -> None:
        """Cancel every job on these nodes (the sweep's --force)."""
        self._run("scancel", ["--nodelist=" + names, "--full"])

    def reserve(self, name: str, names: str, minutes: Optional[int] = None) -> None:
        """A maintenance reservation: no job starts on these nodes, whatever
        state Slurm gives them (e.g. ReturnToService=2 after a reboot); it
        ends by itself after ``minutes`` (the sweep's bound; None: never)."""
        duration = "%d" % minutes if minutes else "UNLIMITED"
        self._run("scontrol", ["create", "reservation", "ReservationName=" + name, "Nodes=" + names,
                               "StartTime=now", "Duration=" + duration, "Users=root", "Flags=MAINT,IGNORE_JOBS"])

    def update_reservation(self, name: str, names: str) -> None:
        """The reservation's nodes, as the full list (`Nodes+=` is newer than 22.05)."""
        self._run("scontrol", ["update", "ReservationName=" + name, "Nodes=" + names])

    def unreserve(self, name: str) -> None:
        self._run("scontrol", ["delete", "ReservationName=" + name])

    def reservations(self) -> Dict[str, str]:
        """name -> hostlist of every reservation."""
        out = self._read("scontrol", ["show", "reservation", "--oneliner"])
        found = {}
        for line in out.splitlines():
            fields = dict(tok.split("=", 1) for tok in line.split() if "=" in tok)
            if "ReservationName" in fields:
                found[fields["ReservationName"]] = fields.get("Nodes", "")
        return found

    def reboot(self, names: str, reason: str, next_state: Optional[str] = None) -> None:
        args = ["reboot", "ASAP"]
        if next_state:
            args.append("nextstate=" + next_state)
        args += ["reason=" + reason, names]
        self._run("scontrol", args)

    # Batch jobs: gpugate.slurm.jobs decides what, these send it.

    def submit_job(self, spec: dict) -> str:
        return parse_sbatch(self._run("sbatch", sbatch_argv(spec)))

    def job_states(self, jobs: List[str]) -> Dict[str, JobState]:
        """One call per job: `scontrol show job` takes one id."""
        states = {}
        for job in jobs:
            try:
                out = self._read("scontrol", ["show", "job", "--oneliner", job])
            except SlurmError as exc:
                if "Invalid job id" in str(exc):
                    states[job] = JobState(job, GONE)
                    continue
                raise
            states[job] = parse_show_job(out).get(job, JobState(job, GONE))
        return states

    def cancel_job_ids(self, jobs: List[str]) -> None:
        self._run("scancel", list(jobs))

    def cancel_named(self, name: str, reservation: str) -> None:
        self._run("scancel", ["--name=" + name, "--reservation=" + reservation])


def _only(found: Dict[str, NodeState], names: Optional[str]) -> Dict[str, NodeState]:
    if not names:
        return found
    if not any(c in names for c in "[],"):  # one node: no hostlist expansion needed
        return {names: found[names]} if names in found else {}
    from ClusterShell.NodeSet import NodeSet

    wanted = set(NodeSet(names))
    return {name: state for name, state in found.items() if name in wanted}
