"""Can a job's user cause it?  One row per source of findings, each naming
the finding components it gives, whether a job's user can influence them
(their leftovers, their load on a shared node or link, their pods, labels,
ports, the kernel log), and therefore how they drain.

The rule: acute only where no user can; otherwise budgeted or bounded,
and never a step towards rma unless hardware evidence (a counter, a kernel
record, a diagnostic a user cannot disturb) stands beside it.  The code
holds to it (gpugate.model.findings: ACUTE, USER_CAUSED) and tests/
test_influence_table.py holds this table to the code: a component any
judge writes with no row here, an acute one a user can cause, or
docs/explanation/reliability.md's copy out of date fails CI.  Data only."""

from gpugate.core.record import dataclass

NO, YES = "no", "yes"


@dataclass(frozen=True)
class Source:
    source: str
    components: tuple  # finding components ("pcie_*": every one with that prefix)
    user: str  # NO | YES: can a job's user cause it?
    how: str  # why (not), in a few words
    drains: str  # how it drains
    rma: str  # what may take it to rma


ROWS = (
    Source("Kernel-facility records of the GPU driver (Xid, SXid, fallen off the bus, amdgpu events)",
           ("xid", "sxid", "fallen_off_bus", "amdgpu_event"), NO,
           "a user writes only the user facility to /dev/kmsg, which gpugate never reads as the driver's; "
           "application Xids (13, 31, 43, 45, ...) are judged apart (xid_repeat)",
           "acute", "the Xid policy (the record is the evidence)"),
    Source("Kernel-log records lost before gpugate read them", ("kernel_log",), YES,
           "a user can flood the ring", "never where a job runs (a metric and an alert); only the sweep's "
           "verification of a drained node waits on it", "never"),
    Source("Application Xids repeating on a GPU, or on several GPUs of a node, in several users' jobs",
           ("xid_repeat",), YES,
           "their applications raise them", "budgeted",
           "never on its own: the deep diagnostic failing is the evidence"),
    Source("AMD ring timeouts and GPU resets repeating on one GPU", ("amdgpu_repeat",), YES,
           "a job's kernels can hang the GPU's rings", "budgeted",
           "never on its own: the deep diagnostic failing is the evidence"),
    Source("GPU and HCA counters (NVML, sysfs, AMD RAS, DCGM health)",
           ("ecc", "ecc_aggregate", "retired_pages", "row_remap", "nvlink", "recovery", "gpu", "nvml", "ras",
            "ras_deferred", "bad_pages", "xgmi", "dcgm_health", "ib_port", "ib_errors", "pcie_gen", "pcie_width"), NO,
           "root's hardware counters; a user's load does not raise them", "acute",
           "the runbook's rungs, then the counter is the evidence"),
    Source("GPUs lost or the stack broken (module, DKMS, NVML, fabric, bound functions)",
           ("gpus_lost", "module", "dkms", "nvml_gpus", "fabric", "bound_gpus"), NO,
           "root's stack and the bus", "acute", "the sweep's verification failing"),
    Source("A job's own ECC and remaps (the epilog's deltas)", ("ecc_during_job", "remap_during_job"), NO,
           "hardware counters", "acute", "the counter is the evidence"),
    Source("Leftover processes on a job's GPUs after it ended", ("processes",), NO,
           "Slurm kills the job's processes; one that outlives it is stuck in the driver; another running "
           "job's process is that job's, never a leftover (judges.leftover)", "acute", "the sweep's verification"),
    Source("DCGM or RVS diagnostic (the preflight on the job's GPUs, the sweep's on a drained node)",
           ("dcgm_diag", "rvs"), NO,
           "a GPU's own test on GPUs no other job holds; on part of a node the tests another job's load can "
           "disturb (PCIe, NVLink bandwidth, power, stress) are undecided", "acute",
           "the failed test is the evidence"),
    Source("DCGM deployment tests of software (the preflight)", ("preflight_setup",), NO,
           "a package or setting pushed everywhere fails them everywhere", "budgeted", "the sweep's verification"),
    Source("The node's own all_reduce: wrong values", ("preflight",), NO,
           "values read and checked on the job's own GPUs", "acute", "the sweep's verification"),
    Source("The node's own all_reduce: bandwidth under the floor", ("preflight_busbw",), YES,
           "a floor is a file's, and a user's job beside it shares the node's links", "budgeted",
           "never on its own"),
    Source("The all_reduce across a job's nodes", ("preflight_across",), YES,
           "another job's traffic on a shared link, a user's leftovers (/dev/shm, /tmp) or their job beside it: "
           "errors, aborts and hangs are undecided, and a node whose environment fails never joins",
           "budgeted, at most [preflight] pins_per_hour a partition", "never on its own"),
    Source("Time spent slowed (clocks)", ("clocks",), YES,
           "a user's load drives power and thermal limits", "budgeted", "never on its own"),
    Source("The sweep's smoke job or Pod and its verification", ("smoke", "verify"), NO,
           "run in the sweep's own reservation on a drained node; on Kubernetes a smoke Pod that never ran "
           "is the site's (deferred), never the node's", "the sweep's (the node is already drained)",
           "failing twice"),
    Source("The GPUs a Node offers again after the sweep's reboot (Kubernetes: allocatable)", ("allocatable",), NO,
           "the sweep's reboot of a node it holds, no job's pod on it; the device plugin counts the GPUs it finds "
           "healthy, never the ones in use", "the sweep's (the node is already drained)",
           "still not back after the retry's reboot"),
    Source("Comparisons with the baseline and gpugate.toml (pins, counts, products, settings, services, HCA, "
           "IMEX, operator pods and labels)",
           ("gpu_count", "pci_gpus", "product", "device_id", "amdgpu", "amdgpu_firmware", "compute_mode",
            "persistence", "power_limit", "fabricmanager", "hold", "install", "uncovered", "baseline",
            "hca_count", "hca_firmware", "hca_link_layer", "hca_port", "hca_rate", "ib_flap", "imex_domain",
            "imex_service", "operator_*", "pcie_max_*"), NO,
           "root's files and settings, and pods in the operator's namespace", "budgeted",
           "never on its own (an escalation it causes counts in the budget)"),
    Source("The sweep's own notes in a reason (work, repeat offender, budgeted escalation)",
           ("sweep", "repeat", "budgeted"), NO, "written by the sweep", "the sweep's", "-"),
)


def row_for(component: str):
    """The row that names ``component`` (exactly, or by a ``prefix_*``), or None."""
    for row in ROWS:
        for name in row.components:
            if name == component or (name.endswith("*") and component.startswith(name[:-1])):
                return row
    return None


def render() -> str:
    """The table as docs/explanation/reliability.md shows it (GitHub Markdown)."""
    lines = ["| Finding source | Components | Can a job's user cause it? | How it drains | Towards rma |",
             "| --- | --- | --- | --- | --- |"]
    for row in ROWS:
        lines.append("| %s | %s | %s: %s | %s | %s |" % (
            row.source, ", ".join("`%s`" % c for c in row.components), row.user, row.how, row.drains, row.rma))
    return "\n".join(lines) + "\n"
