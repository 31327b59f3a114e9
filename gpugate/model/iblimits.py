"""[health] keys for the InfiniBand error counters (gpugate.judges.hca and
gpugate.judges.iblinks): which counters gpugate reads, the most one may
grow between two health checks (a site's own limit, none by default), its
rate per hour, and how long a link flap keeps a port suspect.

Defaults follow NVSentinel's nic-health-monitor: any rise of link_downed is
a flap, symbol_error above 120 per hour is fatal.  The other rates are
gpugate's: a link that retrains (link_error_recovery) or loses integrity
(local_link_integrity_errors) a dozen times an hour is failing; receive
errors at the symbol-error rate."""

from gpugate.model.schema import MapOf, Number, Int

# The IB error counters (ports/N/counters, IBTA PortCounters) gpugate reads.
IB_COUNTERS = ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
               "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "port_xmit_discards",
               "port_xmit_constraint_errors", "port_rcv_constraint_errors", "local_link_integrity_errors",
               "excessive_buffer_overrun_errors", "VL15_dropped")
# Per check: none by default (a burst in one check is judged by its rate).
DEFAULT_IB_COUNTER_MAX = {}
# Per hour (link_downed is a flap: any rise).
DEFAULT_IB_RATE_MAX = {"symbol_error": 120, "port_rcv_errors": 120, "port_rcv_remote_physical_errors": 120,
                       "excessive_buffer_overrun_errors": 120, "link_error_recovery": 12,
                       "local_link_integrity_errors": 12}


def _known(key: str):
    return None if key in IB_COUNTERS else "unknown IB error counter; known: %s" % ", ".join(IB_COUNTERS)


HEALTH_KEYS = {
    # Most an IB error counter may grow between two health checks (judges.hca).
    "ib_counter_max": (MapOf(Int(0), _known), dict),
    # Most it may grow per hour (judges.iblinks); a key overrides its default.
    "ib_error_rate_max": (MapOf(Number(0.0), _known), dict),
    # How long a port that flapped (link_downed rose, or it came back up) stays suspect.
    "ib_flap_window_seconds": (Number(0.0, 30 * 86400.0), 3600.0),
}
