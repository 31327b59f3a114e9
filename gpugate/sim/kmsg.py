"""A simulated node's kernel log (model["kmsg"], rendered as /dev/kmsg
records): appending a record as the kernel would, its ring bounded."""

import os
import time
from typing import Any, Dict

KMSG_RING = 1000  # records the simulated ring holds: older ones are overwritten, as the kernel's are
# A real ring holds more: its descriptors alone are 2^(LOG_BUF_SHIFT-5), 4096 at the
# smallest default (128 KiB).  Sim key kmsg.ring=N sets a node's (model["kmsg_ring"]).


def append(m: Dict[str, Any], message: str, pri: int = 6) -> None:
    seq = (m["kmsg"][-1]["seq"] + 1) if m["kmsg"] else 1000
    ts_us = int((time.time() - m["boot_time"]) * 1e6)
    record = {"seq": seq, "ts_us": ts_us, "msg": message}
    if pri != 6:
        record["pri"] = pri
    m["kmsg"].append(record)
    del m["kmsg"][:-int(m.get("kmsg_ring") or KMSG_RING)]


def flood(m: Dict[str, Any], count: int) -> None:
    """kmsg.flood=N: N records a job's user made the kernel log (a mount option
    tmpfs refuses, at kernel facility), overwriting the oldest of the ring."""
    for i in range(count):
        append(m, "tmpfs: Unknown parameter 'flood-%d'" % i, pri=3)


def set_ring(m: Dict[str, Any], size: int) -> None:
    """kmsg.ring=N: the ring holds N records from now on."""
    if not 100 <= size <= 100000:
        raise ValueError("kmsg.ring wants 100..100000 records, not %d" % size)
    m["kmsg_ring"] = size
    del m["kmsg"][:-size]


def ring_text(m: Dict[str, Any]) -> str:
    """The ring as /dev/kmsg records.  PRI 6: the kernel's facility (0), level
    info; a record's "pri": another level, or user space's (sim key kmsg.user)."""
    return "".join("%d,%d,%d,-;%s\n" % (r.get("pri", 6), r["seq"], r["ts_us"], r["msg"]) for r in m["kmsg"])


def write_ring(fleet: str, node: str, m: Dict[str, Any]) -> None:
    """Only the node's /dev/kmsg, atomically (a kernel logging fast: a
    flood's records land many times a second; sim.fleet.save renders the rest)."""
    from gpugate.safety.safeio import write_atomic

    write_atomic(os.path.join(fleet, node, "root", "dev", "kmsg"), ring_text(m).encode(), mode=0o644,
                 durable=False, exact_mode=True)
