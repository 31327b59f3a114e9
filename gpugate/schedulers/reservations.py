"""The sweep's maintenance reservations: none outlives its sweep (issue 33).

Each batch's reservation (gpugate_sweep_r<run>_b<batch>, journal.enrol) is
made at its reset or reboot step (steps._reserve), for
reservation_minutes at most, so that one a sweeper killed -9 left
ends by itself.  A run deletes a batch's when the batch is done
(engine._release_reservations) and, however the run ends (an exception
included), every one it used whose nodes no longer need it (``at_exit``).
The next run deletes those an earlier sweep of its journal left with
nothing in flight (``stale``), never a reservation it did not make.
"""

from typing import Dict, List

PREFIX = "gpugate_sweep_r"  # every reservation a sweep makes is named so (journal.enrol)
_REBOOTING = {"REBOOT_REQUESTED", "REBOOT_ISSUED"}


def reservation_minutes(cfg) -> int:
    """How long a batch's maintenance reservation lasts: every time limit
    its batch may still spend once it is made, for three attempts (evidence,
    converge, reset, reboot, verification, smoke job and its cancel each),
    so that one a sweeper killed -9 left ends with the sweep's own deadline,
    not a year later (issue 33).  A sweep deletes it sooner: engine.py."""
    one = sum(float(cfg[k]) for k in ("evidence_timeout", "converge_timeout", "reboot_timeout", "verify_timeout",
                                      "smoke_deadline")) + 4 * float(cfg["reset_timeout"]) + 120
    return int(3 * one // 60) + 10


def stale(journal, existing: Dict[str, str]) -> List[str]:
    """Reservations sweeps of this journal made, with no node in flight."""
    flying = {r.reservation for r in journal.in_flight().values()}
    return sorted(name for name in existing if name not in flying and journal.owns(name))


def needless(records, states, existing: Dict[str, str], nodes) -> List[str]:
    """Of the reservations of these nodes, those that keep no job off a node
    that needs it: every node in it is finished, or drained (the drain keeps
    jobs off; a later run makes the reservation again for the smoke job) and
    not rebooting (22.05-23.11 clear the drain as slurmd registers).  Pure."""
    mine = {records[n].reservation for n in nodes if n in records} & set(existing)
    out = []
    for reservation in sorted(mine):
        flying = [r.node for r in records.values() if r.reservation == reservation and not r.finished]
        if all(n in states and states[n].drain and not states[n].flags & _REBOOTING for n in flying):
            out.append(reservation)
    return out


def at_exit(sweeper) -> None:
    """The run is over, however it ended: delete each reservation it used
    that no node needs now.  Never raises (the run's own error stands): one
    that cannot be deleted ends at its bounded time."""
    try:
        nodes = sorted(sweeper.report.outcomes)
        records = sweeper.journal.nodes()
        existing = sweeper.slurm.reservations() if nodes else {}
        flying = sorted({r.node for r in records.values() if not r.finished and r.reservation in existing})
        states = sweeper._states(flying)
        gone = needless(records, states, existing, nodes)
        for name in gone:
            sweeper.slurm.unreserve(name)
        kept = sorted({records[n].reservation for n in nodes if n in records} & set(existing) - set(gone))
        if kept:
            sweeper.say("reservation(s) %s kept for nodes still rebooting: each ends by itself within %d minutes"
                        % (", ".join(kept), reservation_minutes(sweeper.cfg)))
    except Exception as exc:  # noqa: BLE001 - the run's own outcome or error must stand
        sweeper.say("the batch reservations could not be checked at the end of the sweep (%s): each ends by "
                    "itself within %d minutes" % (exc, reservation_minutes(sweeper.cfg)))

