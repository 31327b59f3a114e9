"""The preflight pins' own allowance ([preflight] pins_per_hour): which
published pins the keeper must not drain yet.  Pure: the fleet's states
and the keeper's record of the pins it drained (gpugate.budget.keeper_pins) in,
{node: why} out.  Apart from gpugate.budget.rules, whose allowance counts every
budgeted finding: a pin also waits for this one."""

from typing import Mapping, Optional

from gpugate.model import reason as reasons
from gpugate.budget.rules import _budgeted, published

__all__ = ["PIN_COMPONENT", "PIN_WINDOW", "pin_only", "pins_held"]

PIN_COMPONENT = "preflight_across"
PIN_WINDOW = 3600.0


def pin_only(text: str, tag: str) -> bool:
    """A reason a preflight pin alone accounts for: the pin and nothing
    budgeted besides that a job's user cannot cause (a drift beside it
    drains on its own account)."""
    from gpugate.model.findings import USER_CAUSED

    ours = reasons.parse(text, tag)
    if ours is None:
        return False
    components = {f.component for f in ours.findings}
    return PIN_COMPONENT in components and components <= USER_CAUSED


def pins_held(states: Mapping[str, object], tag: str, now: float, per_hour: int,
              spans: Optional[Mapping[str, object]] = None, drained_pins=()) -> dict:
    """{node: why} for the published pins the keeper must not drain now:
    in each partition, at most ``per_hour`` nodes drained for a pin in the
    last hour, oldest published first; the rest wait (held and said).
    What was drained for a pin is the keeper's record (``drained_pins``:
    gpugate.budget.keeper_pins entries; the sweep rewrites a pinned node's reason
    and a RESUME clears it) and any node Slurm shows drained for a pin
    alone with a reason stamped in the hour; ``drained_pins`` None (a
    record that cannot be read) holds every pin.  Pure.  spans: as
    published's."""
    recent: dict = {}
    counted = set()
    for entry in drained_pins or ():
        if now - PIN_WINDOW <= float(entry["at"]) <= now + 60 and entry["node"] not in counted:
            counted.add(entry["node"])
            for part in entry["partitions"]:
                recent[part] = recent.get(part, 0) + 1
    waiting = []
    memo: dict = {}
    pins: dict = {}  # reason -> a pin alone?  A fleet-wide event gives 100,000 nodes one reason: parsed once

    def only_pin(text):
        found = pins.get(text)
        if found is None:
            found = pins[text] = pin_only(text, tag)
        return found

    if spans is not None:  # the keeper's: only a node in spans can be published (published's rule)
        drained = [s for s in states.values() if "DRAIN" in s.flags]
        pinned = {r for r in {seen.reason for seen in spans.values()} if _budgeted(r, tag, memo) and only_pin(r)}
        if pinned:
            waiting = [(seen.since, name, states[name]) for name, seen in spans.items()
                       if seen.reason in pinned and name in states and "DRAIN" not in states[name].flags]
    else:
        drained = [s for s in states.values() if s.drain]
        for state in states.values():
            if not state.drain:
                seen = published(state, tag, memo, spans)
                if seen is not None and only_pin(seen.reason):
                    waiting.append((seen.since, state.name, state))
    for state in drained:
        if state.name not in counted and state.reason and only_pin(state.reason) and state.reason_time is not None \
                and now - PIN_WINDOW <= state.reason_time <= now + 60:
            for part in state.partitions:
                recent[part] = recent.get(part, 0) + 1
    held = {}
    if drained_pins is None:
        return {name: ("the keeper's record of the pins it drained (%s) cannot be read: every preflight pin "
                       "waits until it can, or until it is removed" % "budget-keeper-pins.json")
                for _since, name, _state in waiting}
    for _since, name, state in sorted(waiting, key=lambda w: (w[0], w[1])):
        full = [p for p in state.partitions if recent.get(p, 0) >= per_hour]
        if full:
            held[name] = ("preflight allowance of partition %s spent: %d node%s drained for a preflight pin in the "
                          "last hour ([preflight] pins_per_hour = %d)" % (
                              full[0], recent.get(full[0], 0), "" if recent.get(full[0], 0) == 1 else "s", per_hour))
            continue
        for part in state.partitions:
            recent[part] = recent.get(part, 0) + 1
    return held

