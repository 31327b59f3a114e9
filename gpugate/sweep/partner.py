"""An in-service partner for the odd one out of the smoke pairs
([sweep] pair_with_in_service = true).

The job is never submitted outside the batch's reservation: the partner, an
idle in-service node of the same partition, is added to the reservation
(`scontrol update ReservationName=R Nodes=<the full list>`, which every
supported Slurm takes; `Nodes+=` is newer) for the pair job only, and the
reservation is set back to its own nodes afterwards, whatever happened.  A
partner that took a job between the read and the update is given back at
once ("pair not run"): the pair job would wait for that job and time out,
failing the repaired node for its partner's work.  Should the sweeper die
in between, the partner stays out of service only until the batch's
reservation is deleted (its end, or the next run's cleanup).
"""

from typing import Dict, Iterable, Optional

from gpugate.errors import SlurmError

IDLE = "IDLE"


def pick(states: Dict[str, object], odd: str, exclude: Iterable[str]) -> Optional[str]:
    """The first (by name) idle, responding, undrained, reason-free node
    sharing a partition with ``odd``, outside ``exclude``; None if none."""
    mine = states.get(odd)
    if mine is None:
        return None
    skip = set(exclude) | {odd}
    for name in sorted(states):
        st = states[name]
        if name in skip or not set(st.partitions) & set(mine.partitions):
            continue
        # No flag at all: in another reservation, draining, rebooting, powered
        # down or anything unknown, a node is no partner.
        if st.state == IDLE and not st.flags and not st.reason:
            return name
    return None


def still_free(st) -> bool:
    """Idle after it joined our reservation (which adds MAINTENANCE, RESERVED only)."""
    return st is not None and st.state == IDLE and not (set(st.flags) - _OURS) and not st.reason


_OURS = {"MAINT", "MAINTENANCE", "RESERVED"}  # MAINTENANCE: what 22.05 shows


class Lender:
    """Borrows partners into one reservation and gives them all back."""

    def __init__(self, slurm, reservation: str, batch, say=lambda text: None):
        from gpugate.sweep.steps import hostlist

        self.slurm, self.reservation, self.batch, self.say = slurm, reservation, list(batch), say
        self.hostlist = hostlist
        self.lent = []
        try:
            self.own = slurm.reservations().get(reservation)  # None: unknown, so nothing is lent
        except SlurmError as exc:
            say("  no in-service partner: %s" % exc)
            self.own = None

    def __call__(self, odd: str) -> Optional[str]:
        """A partner for ``odd``, in the reservation now; None if there is none."""
        from ClusterShell.NodeSet import NodeSet

        if not self.own:
            return None
        try:
            partner = pick(self.slurm.nodes(), odd, self.batch + self.lent)
            if partner is None:
                return None
            self.lent.append(partner)
            self.slurm.update_reservation(self.reservation, self.hostlist(list(NodeSet(self.own)) + self.lent))
            if not still_free(self.slurm.nodes(partner).get(partner)):
                self.give_back()
                return None
        except SlurmError as exc:  # e.g. it overlaps another reservation: no partner, no failure
            self.say("  %s: no in-service partner: %s" % (odd, exc))
            self.give_back()
            return None
        self.say("  %s: pairs with %s (in service), added to reservation %s" % (odd, partner, self.reservation))
        return partner

    def give_back(self) -> None:
        """The reservation's own nodes again; should Slurm refuse, the
        partner is held only until the batch's reservation is deleted."""
        if self.lent:
            lent, self.lent = self.lent, []
            try:
                self.slurm.update_reservation(self.reservation, self.own)
            except SlurmError as exc:
                self.say("  %s stays in reservation %s until it is deleted: %s" % (
                    ",".join(lent), self.reservation, exc))


__all__ = ["pick", "Lender"]
