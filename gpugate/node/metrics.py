"""Node-side metrics: a textfile for node_exporter's textfile collector
(verdict, class, per-component match with the pin, and whether each
component could be read at all).  The controller's are fleet/metrics.py.
Labels are bounded: classes and component names are fixed sets, Xid/SXid
codes the ones the driver defines."""

import time
from typing import Dict, Tuple

from gpugate.model.facts import failed, unchecked
from gpugate.model.findings import CHECK_CLASSES
from gpugate.core.promtext import render

# What a pinned component's reading was on this node.
MATCHES, DIFFERS, UNREADABLE, UNCHECKED = "matches", "differs", "unreadable", "unchecked"


def component_states(verdict, facts, baseline, expect, vendor: str = "nvidia") -> dict:
    """component -> matches | differs | unreadable | unchecked, for each
    pinned component.  Pure.  "matches" needs a value that was read: a
    fact that is an error or missing is unreadable, never a match.  Each
    vendor judges its own stack (gpugate.vendors.seam: NVIDIA's in
    gpugate.vendors.nvidia.metrics, AMD's in gpugate.vendors.amd.metrics)."""
    from gpugate.vendors.seam import part

    return part(vendor, "component_states")(verdict, facts, baseline, expect)


NHC_RESULTS = ("passed", "failed", "timed out", "not run")  # gpugate.node.nhc


def node_families(node: str, verdict, facts, baseline, held: bool = False, config_error: bool = False,
                  nhc: str = "", stuck=None) -> list:
    states = component_states(verdict, facts, baseline, baseline.expect_for(node), baseline.vendor_for(node))
    classes = {f.cls for f in verdict.findings}

    def per_component(name, state):
        return [(name, {"component": c}, 1 if s == state else 0) for c, s in sorted(states.items())]

    families = [
        ("gpugate_node_fit", "gauge", "1 when the node passed its last gpugate health check.",
         [("gpugate_node_fit", {}, 1 if verdict.fit else 0)]),
        ("gpugate_node_unfit", "gauge", "1 for each class of finding present on the node.",
         [("gpugate_node_unfit", {"class": c}, 1 if c in classes else 0) for c in CHECK_CLASSES]),
        ("gpugate_component_matches_pin", "gauge",
         "1 when the component was read and equals the baseline pin; 0 when it differs, could not be read "
         "or is not checked.", per_component("gpugate_component_matches_pin", MATCHES)),
        ("gpugate_component_unreadable", "gauge",
         "1 when the component could not be read (NVML error, a tool failing, timing out or missing; any GPU).",
         per_component("gpugate_component_unreadable", UNREADABLE)),
        ("gpugate_component_unchecked", "gauge",
         "1 when the component is pinned but not checked here (packages.manager = none, no NVSwitch, "
         "no GPU with a pinned product or with GSP).", per_component("gpugate_component_unchecked", UNCHECKED)),
        ("gpugate_drain_held", "gauge", "1 when the node is unfit but the partition's drain budget keeps it in service.",
         [("gpugate_drain_held", {}, 1 if held else 0)]),
        ("gpugate_config_error", "gauge",
         "1 when gpugate.toml or the baseline did not load and the node judges with its last good copy.",
         [("gpugate_config_error", {}, 1 if config_error else 0)]),
        ("gpugate_findings", "gauge", "Number of findings of the last check.",
         [("gpugate_findings", {}, len(verdict.findings))]),
        ("gpugate_last_check_timestamp_seconds", "gauge", "When the last health check ended.",
         [("gpugate_last_check_timestamp_seconds", {}, round(time.time(), 3))]),
        ("gpugate_check_duration_seconds", "gauge", "Wall time of the slowest probe of the last check.",
         [("gpugate_check_duration_seconds", {}, round(max(facts.durations.values() or [0.0]), 4))]),
        ("gpugate_kernel_log_events", "gauge",
         "Xids, SXids and fallen-off-the-bus reports in the kernel log within xid_window_seconds, by code: "
         "a rising count of non-fatal NVLink Xids/SXids shows a link degrading before it drains.",
         kernel_log_samples(facts.xids)),
        lock_stuck_family(stuck or {}),
    ] + kernel_log_families(facts) + hca_families(facts) + service_families(facts)
    if nhc:  # [nhc] configured: what the site's NHC said in the last health check
        families.append(("gpugate_nhc_result", "gauge",
                         "1 for the last result of the site's NHC run by the health check.",
                         [("gpugate_nhc_result", {"result": r}, 1 if r == nhc else 0) for r in NHC_RESULTS]))
    return families


LOCK_STUCK = "gpugate_lock_stuck_seconds"


NODE_LOCKS = ("healthcheck", "act")  # gpugate.node.locks.node_locks_stuck


def lock_stuck_family(stuck) -> tuple:
    """stuck: lock -> seconds held past its bound (a lock not named: 0)."""
    return (LOCK_STUCK, "gauge",
            "How long a run has held gpugate's lock when that is longer than the run's whole budget, else 0. "
            "While the health check's is stuck, no health check runs on the node; while the act lock is, "
            "no run drains or resumes it.",
            [(LOCK_STUCK, {"lock": lock}, round(stuck.get(lock, 0.0))) for lock in NODE_LOCKS])


def write_lock_stuck(path: str, stuck, seconds: float = 0.0) -> str:
    """The textfile with gpugate_lock_stuck_seconds set and the rest as the
    last check wrote it (a stuck lock means no check ran to rewrite it);
    "" when written, else why not (as write_node_textfile)."""
    from gpugate.safety.safeio import SYSTEM_CAP, read_capped

    if isinstance(stuck, str):  # one lock: (path, "healthcheck", seconds)
        stuck = {stuck: seconds}
    try:
        old = read_capped(path, SYSTEM_CAP, follow=False).decode("utf-8", "replace").splitlines()
    except OSError:
        old = []  # none yet, or unreadable: the stuck lock alone
    kept = [line for line in old if line.split(" ", 3)[2:3] != [LOCK_STUCK]
            and not line.startswith((LOCK_STUCK + "{", LOCK_STUCK + " "))]
    return _write_textfile(path, "".join(line + "\n" for line in kept) + render([lock_stuck_family(stuck)]))


SERVICE_STATES = ("running", "stopped", "unreadable", "unchecked")


def service_families(facts) -> list:
    """Per daemon gpugate reads ([services]): running, stopped, unreadable, or
    unchecked ([services] ROLE = "none"), never taken for running."""
    services = getattr(facts, "services", None)
    if services is None:  # not read in this mode
        return []
    samples = []
    for role in sorted(services) if isinstance(services, dict) else ("fabricmanager", "persistenced"):
        value = services.get(role) if isinstance(services, dict) else services
        state = (("unchecked" if unchecked(value) else "unreadable") if failed(value)
                 else "running" if value == "active" else "stopped")
        samples += [("gpugate_service", {"service": role, "state": s}, 1 if s == state else 0) for s in SERVICE_STATES]
    return [("gpugate_service", "gauge", "1 for the state of each NVIDIA daemon gpugate reads: running, stopped, "
             'unreadable, or unchecked ([services] ROLE = "none" in gpugate.toml).', samples)]


def kernel_log_samples(events) -> list:
    counts: Dict[Tuple[str, str], int] = {}
    for event in events if isinstance(events, tuple) else ():
        # amdgpu events: the event's name (its "xid" is the count the line reports, not a code)
        key = (event.kind, event.where.split(":")[0] if event.kind == "amdgpu" else str(event.xid))
        counts[key] = counts.get(key, 0) + 1
    return [("gpugate_kernel_log_events", {"kind": kind, "code": code}, n) for (kind, code), n in sorted(counts.items())]


def kernel_log_families(facts) -> list:
    """Records the ring lost since the last check (a user's flood can do it),
    those of them no follower read (Xids there may be missed), and the
    follower's own state (gpugate.probes.gpujournal.coverage).  Metrics
    only: none of it is a finding, a drain or a share of the budget."""
    lost = getattr(facts, "kernel_log_lost", None)
    cover = getattr(facts, "kernel_log_follower", None)
    if not isinstance(cover, dict):
        return []
    records = lost.get("records") if isinstance(lost, dict) else 0
    records = records if isinstance(records, int) else 1  # lost while read, count unknown: at least one
    unwatched = 0 if cover.get("covered", True) else records
    return [("gpugate_kernel_log_lost_records", "gauge",
             "Kernel-log records the ring overwrote before the last check read them (a flood of kernel records); "
             "never a drain: the follower's journal holds the GPU drivers' records.",
             [("gpugate_kernel_log_lost_records", {}, records)]),
            ("gpugate_kernel_log_unwatched_records", "gauge",
             "Of those, records the kernel-log follower did not read either (down, absent, or it lost them too): "
             "an Xid among them may be missed.", [("gpugate_kernel_log_unwatched_records", {}, unwatched)]),
            ("gpugate_kmsg_follower_up", "gauge",
             "1 when gpugate kmsg-follow's heartbeat of this boot is fresh.",
             [("gpugate_kmsg_follower_up", {}, 1 if cover.get("follower") == "following" else 0)]),
            ("gpugate_kmsg_follower_lost_records", "gauge",
             "Kernel-log records gpugate kmsg-follow itself could not read this boot (the ring overwrote them first).",
             [("gpugate_kmsg_follower_lost_records", {}, int(cover.get("follower_lost_records") or 0))]),
            ("gpugate_kmsg_follower_write_errors", "gauge",
             "Writes of its journal or heartbeat gpugate kmsg-follow saw fail this boot (a full disk, EIO); "
             "it freed its own journal parts and went on.",
             [("gpugate_kmsg_follower_write_errors", {}, int(cover.get("follower_write_errors") or 0))])] + (
        [("gpugate_kmsg_follower_last_write_error_timestamp_seconds", "gauge",
          "When gpugate kmsg-follow last saw a write of its journal fail (only after one, this boot).",
          [("gpugate_kmsg_follower_last_write_error_timestamp_seconds", {}, cover["follower_write_error_at"])])]
        if isinstance(cover.get("follower_write_error_at"), float) else [])


def hca_families(facts) -> list:
    """Per HCA port: up (ACTIVE/LinkUp), rate and the raw error counters (a
    counter: rate() them in Prometheus).  None when the HCAs were not read."""
    hcas = getattr(facts, "hcas", None)
    if not isinstance(hcas, tuple) or not hcas:
        return []
    up, rate, errors = [], [], []
    for hca in hcas:
        for port in hca.ports:
            if failed(port):
                continue
            labels = {"device": hca.name, "port": str(port.port)}
            up.append(("gpugate_ib_port_up", labels, 1 if (port.state, port.phys_state) == ("ACTIVE", "LinkUp") else 0))
            if isinstance(port.rate, float):
                rate.append(("gpugate_ib_port_rate_gbps", labels, port.rate))
            for name, value in sorted((port.counters or {}).items()):
                if isinstance(value, int):
                    errors.append(("gpugate_ib_port_errors_total", dict(labels, counter=name), value))
    return [("gpugate_ib_port_up", "gauge", "1 when the HCA port is ACTIVE/LinkUp (/sys/class/infiniband).", up),
            ("gpugate_ib_port_rate_gbps", "gauge", "The HCA port's rate in Gb/s.", rate),
            ("gpugate_ib_port_errors_total", "counter", "The HCA port's IB error counters as read.", errors)]


def write_node_textfile(path: str, node: str, verdict, facts, baseline, held: bool = False,
                        config_error: bool = False, nhc: str = "", clocks=None, stuck=None, preflight=None) -> str:
    """Write the textfile; "" when written, else why not (logged by the
    caller: a metrics write never changes the verdict or the drain).  Its
    directory (node_exporter's, often not root's) must pass the trust walk:
    root writes nothing where someone else could plant a symlink.
    ``clocks``: reason -> the highest share of an interval a GPU spent
    slowed, over the limit (judges.throttle.shares_over); None: not judged.
    ``preflight``: gpugate.preflight.memory.stats, or None."""
    families = node_families(node, verdict, facts, baseline, held, config_error, nhc, stuck)
    return _write_textfile(path, render(families + clock_families(clocks) + unchecked_families(facts)
                                        + preflight_families(preflight)))


def unchecked_families(facts) -> list:
    """1 per fact left unjudged on this node (facts.unchecked_facts: an
    nvidia-ml-py without clock-event counters, RAS off, a tool not
    installed): what `gpugate check` lists, where a dashboard sees it too."""
    from gpugate.model.facts import unchecked_facts

    samples = [("gpugate_fact_unchecked", {"fact": what}, 1) for what, _ in unchecked_facts(facts)] if facts else []
    return [("gpugate_fact_unchecked", "gauge",
             "1 for each fact this node cannot judge (gpugate check lists why): never taken for a good value.",
             samples)]


def preflight_families(stats) -> list:
    """What this node's job preflights came to (gpugate.preflight.memory):
    how many by outcome and the time they took; none before a first one."""
    if not stats:
        return []
    return [("gpugate_preflight_runs_total", "counter",
             "Job preflights this node ran, by outcome: passed, acute (drained, the job requeued), budgeted "
             "(published for the keeper, the job ran), undecided (nothing pinned on the node, the job ran).",
             [("gpugate_preflight_runs_total", {"outcome": o}, n) for o, n in sorted(stats["runs"].items())]),
            ("gpugate_preflight_across_total", "counter",
             "All_reduces across a job's nodes this node decided (as the job's first node), by outcome: passed, "
             "culprit (one node pinned and drained), undecided, not_run.",
             [("gpugate_preflight_across_total", {"outcome": o}, n) for o, n in sorted(stats["across"].items())]),
            ("gpugate_preflight_seconds_total", "counter", "Wall time this node's job preflights took, in all.",
             [("gpugate_preflight_seconds_total", {}, round(stats["seconds"], 3))])]


def clock_families(over) -> list:
    """Per clock-event reason: 1 when a GPU of this node spent more of the
    last judged interval slowed than [health] clock_event_share_max allows.
    Counted across nodes it tells the room (a power brake, a row's
    cooling) from one node (GpugateClockEventsRoomWide)."""
    if over is None:
        return []
    from gpugate.judges.throttle import COUNTERS

    return [("gpugate_clock_event_over", "gauge",
             "1 when a GPU spent more of the last judged interval slowed for this reason than "
             "[health] clock_event_share_max allows (NVML's clock-event counters).",
             [("gpugate_clock_event_over", {"reason": r}, 1 if r in over else 0) for r in sorted(COUNTERS)]),
            ("gpugate_clock_event_share", "gauge",
             "The highest share of the last judged interval a GPU spent slowed for this reason, when over the limit.",
             [("gpugate_clock_event_share", {"reason": r}, round(over.get(r, 0.0), 4)) for r in sorted(COUNTERS)])]


def _write_textfile(path: str, text: str) -> str:
    from gpugate.errors import ConfigError
    from gpugate.safety.safeio import write_in_checked_dir

    try:
        # Atomic (node_exporter must never read half a file) and 0644 whatever the umask.
        write_in_checked_dir(path, text.encode(), "[healthcheck] prometheus_textfile's directory")
    except ConfigError as exc:  # trust.Untrusted: the fix is named, nothing was written
        return str(exc)
    except OSError as exc:
        return "%s: cannot write the metrics textfile: %s" % (path, exc.strerror or exc)
    return ""
