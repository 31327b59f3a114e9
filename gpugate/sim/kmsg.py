"""A simulated node's kernel log (model["kmsg"], rendered as /dev/kmsg
records): appending a record as the kernel would, its ring bounded."""

import time
from typing import Any, Dict

KMSG_RING = 1000  # records the simulated ring holds: older ones are overwritten, as the kernel's are


def append(m: Dict[str, Any], message: str, pri: int = 6) -> None:
    seq = (m["kmsg"][-1]["seq"] + 1) if m["kmsg"] else 1000
    ts_us = int((time.time() - m["boot_time"]) * 1e6)
    record = {"seq": seq, "ts_us": ts_us, "msg": message}
    if pri != 6:
        record["pri"] = pri
    m["kmsg"].append(record)
    del m["kmsg"][:-KMSG_RING]
