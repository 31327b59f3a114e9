"""gpugate.kube.paired's order of writes, with a recording Slurm backend and
Node store in place of slurmctld and the API server (test_kube_slinky runs
the same class against both for real; here, the failures they cannot be
made to give on cue: a Node that refuses the lift)."""

import pytest

from gpugate.kube.client import KubeError
from gpugate.kube.paired import PairedNodes, node_name
from gpugate.slurm.nodestate.record import NodeState

TAG = "gpugate:"
REASON = "gpugate: health xid:gpu3=79 (want none)"


def state(name, reason=""):
    return NodeState(name=name, state="IDLE", flags=frozenset({"DRAIN"} if reason else ()), reason=reason,
                     reason_time=None, reason_user="", partitions=("gpu",), comment="")


class Recorder:
    def __init__(self, calls, side):
        self.calls, self.side = calls, side
        self.name, self.why, self.tag = "commands", "configured", TAG
        self.held = {}
        self.refuse = False
        self.resv = {}  # Slurm's reservations: name -> hostlist

    def reservations(self):
        return dict(self.resv)

    def own_record(self, name):
        return state(name, self.held.get(name, ""))

    def drain(self, names, reason):
        self.calls.append((self.side, "drain", names))
        self.held[names] = reason

    def undrain(self, names):
        if self.refuse:
            raise KubeError("kubernetes: 503 the API server is unavailable")
        self.calls.append((self.side, "undrain", names))
        self.held.pop(names, None)

    resume = undrain

    def report_verdict(self, name, verdict, st):
        self.calls.append((self.side, "report", name))

    def close(self):
        pass


@pytest.fixture
def pair():
    calls = []
    return PairedNodes(Recorder(calls, "slurm"), Recorder(calls, "kube"), "{node}-k8s"), calls


def test_hold_slurm_first_then_the_node_and_lift_the_node_first(pair):
    paired, calls = pair
    paired.drain("gpu01", REASON)
    assert calls == [("slurm", "drain", "gpu01"), ("kube", "drain", "gpu01-k8s")]
    del calls[:]
    paired.resume("gpu01")
    assert calls == [("kube", "undrain", "gpu01-k8s"), ("slurm", "undrain", "gpu01")]


def test_a_node_that_refuses_the_lift_keeps_its_slurm_node_drained(pair):
    paired, calls = pair
    paired.drain("gpu01", REASON)
    paired.kube.refuse = True
    with pytest.raises(KubeError, match="stays drained"):
        paired.resume("gpu01")
    assert paired.slurm.held == {"gpu01": REASON}


def test_the_smoke_jobs_undrain_leaves_the_node_held(pair):
    paired, calls = pair
    paired.drain("gpu01", REASON)
    paired.undrain_in_reservation("gpu01")
    assert paired.kube.held == {"gpu01-k8s": REASON} and paired.slurm.held == {}


def test_a_run_that_wrote_nothing_puts_the_node_in_line_with_slurm(pair):
    paired, calls = pair
    paired.slurm.held["gpu01"] = REASON  # drained in Slurm; its mirror was lost
    paired.report_verdict("gpu01", None, paired.slurm.own_record("gpu01"))
    assert paired.kube.held == {"gpu01-k8s": REASON}
    # Slurm no longer held by gpugate (an admin's reason there): gpugate's Node hold goes.
    other = PairedNodes(paired.slurm, paired.kube, "{node}-k8s")
    other.report_verdict("gpu01", None, state("gpu01", "bad cable, ticket 4411"))
    assert paired.kube.held == {}


def test_a_health_check_during_the_sweep_never_lifts_the_sweeps_hold(pair):
    """The sweep lifts Slurm's drain on purpose while it works (the smoke
    job in its reservation; a 22.05 reboot clears it): a health check or a
    prolog that reads Slurm in service then leaves the Node held."""
    paired, calls = pair
    work = "gpugate: drift sweep=reconverge batch 1 attempt 1 (want verified)"
    paired.drain("gpu01", work)
    paired.slurm.resv["gpugate_sweep_r3_b1"] = "gpu[01-02]"  # made before its reboot and smoke
    paired.undrain_in_reservation("gpu01")
    check = PairedNodes(paired.slurm, paired.kube, "{node}-k8s")  # the next run, on the node
    check.report_verdict("gpu01", None, state("gpu01"))
    assert paired.kube.held == {"gpu01-k8s": work}
    check.resume("gpu01")  # the sweep's resume, after the proof
    assert paired.kube.held == {}


def test_the_sweeps_hold_goes_once_the_sweep_has_let_go(pair):
    """An admin resumed in Slurm a node the sweep escalated (or left): no
    reservation of the sweep's, no reboot under way.  The next health check
    lifts the Node's hold too; another's reservation does not keep it."""
    paired, calls = pair
    paired.drain("gpu01", "gpugate: rma sweep=deferred batch 1 attempt 3 (want verified)")
    paired.slurm.resv["maint_rack7"] = "gpu01"
    paired.slurm.held.clear()  # scontrol update NodeName=gpu01 State=RESUME
    check = PairedNodes(paired.slurm, paired.kube, "{node}-k8s")
    rebooting = NodeState(name="gpu01", state="DOWN", flags=frozenset({"REBOOT_ISSUED"}), reason="",
                          reason_time=None, reason_user="", partitions=("gpu",), comment="")
    check.report_verdict("gpu01", None, rebooting)
    assert "gpu01-k8s" in paired.kube.held  # a reboot under way: the sweep may still have it
    PairedNodes(paired.slurm, paired.kube, "{node}-k8s").report_verdict("gpu01", None, state("gpu01"))
    assert paired.kube.held == {}


def test_node_name_is_the_slurm_name_through_the_template():
    class Settings:
        scheduler = "slurm+kubernetes"
        kubernetes = {"node_name": "{node}.cluster.example.com"}

    assert node_name(Settings, "gpu07") == "gpu07.cluster.example.com"
    Settings.scheduler = "kubernetes"
    assert node_name(Settings, "gpu07") == "gpu07"
