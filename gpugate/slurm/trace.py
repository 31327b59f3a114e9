"""The pyslurm backend's calls in the words of the command that does the
same (GPUGATE_SLURM_TRACE): one trace reads the same whichever backend
made the calls."""

from typing import List

from .jobs import sbatch_argv


def in_scontrol_words(op: str, args: tuple) -> List[str]:
    if op == "nodes":
        return ["scontrol show node" + (" " + args[0] if args[0] else "")]
    if op == "update_nodes":
        names, state, reason = args
        return ["scontrol update NodeName=%s State=%s%s" % (names, state, "" if reason is None else
                                                             " Reason=" + reason)]
    if op == "set_comment":
        return ["scontrol update NodeName=%s Comment=%s" % args]
    if op == "reservations":
        return ["scontrol show reservation --oneliner"]
    if op == "reserve":
        duration = "%d" % args[2] if len(args) > 2 else "365-00:00:00"
        return ["scontrol create reservation ReservationName=%s Nodes=%s StartTime=now Duration=%s "
                "Users=root Flags=MAINT,IGNORE_JOBS" % (args[0], args[1], duration)]
    if op == "update_reservation":
        return ["scontrol update ReservationName=%s Nodes=%s" % args]
    if op == "unreserve":
        return ["scontrol delete ReservationName=%s" % args]
    if op == "submit":
        spec = dict(args[0])
        return ["sbatch " + " ".join(sbatch_argv({"name": spec["name"], "reservation": spec["reservation"],
                                                  "node": spec["nodes"], "minutes": spec["minutes"],
                                                  "output": spec["output"], "extra": spec["extra"],
                                                  "wrap": spec["script"].split("\n", 1)[1].strip()}))]
    if op == "jobs":
        return ["scontrol show job --oneliner %s" % job for job in args[0]]
    if op == "cancel":
        return ["scancel %s" % " ".join(args[0])] if args[0] else []
    if op == "jobs_now":
        return ["squeue --all"]
    return ["pyslurm %s %r" % (op, args)]
