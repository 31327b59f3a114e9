"""The pyslurm worker: the only process that loads pyslurm (and libslurm).

gpugate starts it as ``python -m gpugate.slurm.pyslurm_worker`` and talks to
it over stdin and stdout (gpugate.slurm.wire).  It lives apart because
libslurm can hold the interpreter in a call that does not return
(slurmctld away: its own retries run for minutes, with the GIL held) and
exits the whole process on a slurm.conf it cannot read; gpugate kills a
worker that misses its deadline and starts another for the next call.

Answers are plain values only.  A request is ``(number, operation, args)``;
its answer ``(number, "ok", value)`` or ``(number, "error", kind, message)``
with kind ``"rpc"`` (slurmctld refused or did not answer), ``"refused"``
(gpugate will not send it) or ``"internal"``: gpugate checks the number, so
an answer never reaches another request.  The first frame, unasked, is
number 0: pyslurm's version, or why it does not load."""

import ctypes
import os
import sys
import time

from gpugate.slurm.wire import WireClosed, read_frame, write_frame

# sbatch options gpugate sets itself, from its own arguments.
_OWN_SBATCH = {"job-name", "J", "reservation", "nodelist", "w", "nodes", "N", "exclusive", "time", "t", "output",
               "o", "open-mode", "requeue", "no-requeue", "chdir", "D", "parsable", "wrap"}


RESERVATION_MINUTES = 365 * 24 * 60


class Refused(Exception):
    """A request gpugate will not send (e.g. an sbatch option pyslurm does not know)."""


class Api:
    """One method per operation; each returns plain values."""

    def __init__(self, pyslurm):
        self.pyslurm = pyslurm
        self._lib = None  # libslurm through ctypes, for op_own_record

    def op_hello(self):
        return {"pyslurm": self.pyslurm.__version__, "pid": os.getpid()}

    def op_nodes(self, name):
        """Every node (name None) or one node, as plain records."""
        ps = self.pyslurm
        if name:
            try:
                nodes = [ps.Node.load(name)]  # REQUEST_NODE_INFO_SINGLE and the partitions, as `sinfo -n`
            except ps.RPCError as exc:
                if "does not exist" in str(exc) or "Invalid node name" in str(exc):
                    return []
                raise
        else:
            nodes = list(ps.Nodes.load().values())
        return [_node_record(n) for n in nodes]

    def op_own_record(self, name):
        """One node in one RPC (gpugate.slurm.libslurm) on the libslurm
        pyslurm loaded: ["found", text, one line], ["missing"], ["failed",
        why] (slurmctld's), or ["older", why] (read it the older way)."""
        from gpugate.slurm import libslurm

        if self._lib is None:
            path = libslurm.loaded_library()
            if not path:
                return ["older", "no libslurm in this worker's maps"]
            try:
                # RTLD_NOLOAD: only the library pyslurm already runs on.
                lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL | os.RTLD_NOLOAD, use_errno=True)
                libslurm.bind(lib)
            except (OSError, AttributeError) as exc:
                return ["older", "libslurm %s: %s" % (path, exc)]
            self._lib = lib
        saved = os.environ.get("SLURM_TIME_FORMAT")
        os.environ["SLURM_TIME_FORMAT"] = "%s"  # the reason's time in epoch seconds (read per call)
        try:
            code, value = libslurm.read_node(self._lib, name)
        finally:
            if saved is None:
                del os.environ["SLURM_TIME_FORMAT"]
            else:
                os.environ["SLURM_TIME_FORMAT"] = saved
        if code == libslurm.FOUND:
            return ["found"] + list(value)
        return ["missing"] if code == libslurm.MISSING else ["failed", value]

    def op_update_nodes(self, names, state, reason):
        ps = self.pyslurm
        changes = ps.Node(state=state) if reason is None else ps.Node(state=state, reason=reason)
        ps.Node(names).modify(changes)

    def op_set_comment(self, name, comment):
        ps = self.pyslurm
        ps.Node(name).modify(ps.Node(comment=comment))

    def op_reservations(self):
        return {r.name: r.nodes or "" for r in self.pyslurm.Reservations.load().values()}

    def op_reserve(self, name, nodes, minutes=RESERVATION_MINUTES):
        ps = self.pyslurm
        flags = ps.ReservationFlags.MAINTENANCE | ps.ReservationFlags.IGNORE_RUNNING_JOBS
        # pyslurm turns a duration into an end time (UNLIMITED would end in
        # the year 10193): the sweep's bound (sweep.reservations.reservation_minutes), or
        # a year where none is given.
        ps.Reservation(name=name, nodes=nodes, users=["root"], start_time=int(time.time()),
                       duration=int(minutes), flags=flags).create()

    def op_update_reservation(self, name, nodes):
        ps = self.pyslurm
        ps.Reservation(name=name).modify(ps.Reservation(nodes=nodes))

    def op_unreserve(self, name):
        self.pyslurm.Reservation(name=name).delete()

    def op_submit(self, spec):
        """A batch job: spec holds what gpugate.slurm.jobs.submit decided."""
        ps = self.pyslurm
        desc = ps.JobSubmitDescription(
            name=spec["name"], reservations=spec["reservation"], required_nodes=spec["nodes"],
            nodes=spec["count"], resource_sharing="exclusive", time_limit=spec["minutes"],
            standard_output=spec["output"], log_files_open_mode="truncate", is_requeueable=False,
            working_directory=spec["chdir"], environment=spec["environment"], script=spec["script"])
        if spec.get("partition"):
            desc.partitions = spec["partition"]  # sbatch -p: the nodes' own partitions
        for opt, value in _sbatch_options(spec["extra"]):
            known = _sbatch_option(opt)
            if known is None or known.our_attr_name is None:
                raise Refused("pyslurm %s cannot submit the sbatch option --%s (it does not know it): drop it "
                              "from [sweep] smoke_sbatch, or set [slurm] backend = \"commands\" (sbatch knows "
                              "every option)" % (ps.__version__, opt))
            known.set(value, desc, True)
        return str(desc.submit())

    def op_jobs(self, job_ids):
        """job id -> (state, exit code, signal, reason), or None: slurmctld
        no longer knows the job (past MinJobAge, or never)."""
        ps = self.pyslurm
        found = {}
        for job_id in job_ids:
            try:
                job = ps.Job.load(int(job_id))
            except ps.RPCError as exc:
                if "Invalid job id" in str(exc):
                    found[job_id] = None
                    continue
                raise
            # pyslurm's exit code is not the batch script's for codes of 128
            # and over (it takes 128 off) nor for none (0): gpugate reads an
            # ended job's exit code with scontrol.
            found[job_id] = (job.state or "UNKNOWN", job.exit_code_signal or 0, job.state_reason or "")
        return found

    def op_cancel(self, job_ids):
        ps = self.pyslurm
        for job_id in job_ids:
            try:
                ps.Job(int(job_id)).cancel()
            except ps.RPCError as exc:
                if "already complet" not in str(exc) and "Invalid job id" not in str(exc):
                    raise

    def op_jobs_now(self):
        """Every job slurmctld knows: id -> (name, reservation, the nodes it
        was given ("" while pending: scancel --nodelist matches only those), state)."""
        return {str(job.id): (job.name or "", job.reservation or "", job.allocated_nodes or "", job.state or "")
                for job in self.pyslurm.Jobs.load().values()}


def _node_record(node) -> dict:
    return {"name": node.name, "state": node.state or "", "reason": node.reason or "",
            "reason_time": node.reason_time, "reason_user": node.reason_user or "",
            "partitions": list(node.partitions or []), "comment": getattr(node, "comment", None) or ""}


def _sbatch_options(argv):
    """(option, value) pairs from sbatch-style words: --opt=v, --opt v, -X v, --flag."""
    words = list(argv)
    while words:
        word = words.pop(0)
        if not word.startswith("-") or word in ("-", "--"):
            raise Refused("sbatch option expected, got %r" % word)
        name, eq, value = word.lstrip("-").partition("=")
        if not eq:
            value = words.pop(0) if words and not words[0].startswith("-") else None
        if name in _OWN_SBATCH:
            raise Refused("sbatch option --%s is gpugate's own (set from the sweep's job)" % name)
        yield name, value


def _sbatch_option(name):
    from pyslurm.core.job.sbatch_opts import SBATCH_OPTIONS

    for opt in SBATCH_OPTIONS:
        if name in (opt.short_opt, opt.long_opt):
            return opt
    return None


def _load():
    os.environ["PYSLURM_DISABLE_AUTO_INIT"] = "1"  # init below, with this run's slurm.conf
    import pyslurm

    pyslurm.slurm_init(os.environ.get("SLURM_CONF") or None)
    return Api(pyslurm)


def serve(requests_fd: int, answers_fd: int) -> int:
    try:
        api = _load()
        write_frame(answers_fd, (0, "ok", api.op_hello()))
    except Exception as exc:  # pyslurm missing or built for another Slurm
        write_frame(answers_fd, (0, "error", "import", "%s: %s" % (type(exc).__name__, exc)))
        return 1
    rpc_error = api.pyslurm.RPCError
    while True:
        try:
            number, op, args = read_frame(requests_fd)
        except WireClosed:
            return 0  # gpugate is done with us
        try:
            answer = (number, "ok", getattr(api, "op_" + op)(*args))
        except Refused as exc:
            answer = (number, "error", "refused", str(exc))
        except rpc_error as exc:
            answer = (number, "error", "rpc", str(exc))
        except Exception as exc:  # a bug here must reach gpugate as an error, not a dead pipe
            answer = (number, "error", "internal", "%s: %s" % (type(exc).__name__, exc))
        try:
            write_frame(answers_fd, answer)
        except ValueError:  # not plain values: a bug of ours, said as one
            write_frame(answers_fd, (number, "error", "internal", "unmarshallable answer to %s" % op))


def main() -> int:
    answers = os.dup(1)  # the protocol's own descriptor
    os.dup2(2, 1)  # whatever libslurm or pyslurm prints goes to stderr, not into a frame
    return serve(0, answers)


if __name__ == "__main__":
    sys.exit(main())
