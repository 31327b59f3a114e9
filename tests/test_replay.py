"""Measured false alarms (issue 27): noisy but healthy nodes replayed
through the real entry points (health check, prolog, epilog, as slurmd
runs them, on simulated nodes with a real NDR400 capture's HCAs) drain
nothing, and each one's faulty twin is unfit with the exact reason.

Each scenario is a list of steps: ("sim", KEY=VALUE...) changes the node
as the fault or the noise would, ("healthcheck",) runs a health check,
("job", ID, KEY=VALUE...) runs a job: its prolog, the KEY=VALUEs while it
runs, its epilog.  The verdict is the last run's log line (no Slurm here:
an unfit node is what would be drained or, budgeted, held)."""

import json
import os

import pytest

from conftest import DEMO_BASELINE, gpugate_cmd
from test_node_side import run_entry

HCA = '\n[nodes."gpu[01-99]".hca]\ncount = 8\ntypes = ["MT4129"]\nrate = 400\nlink_layer = "InfiniBand"\n'
HC = ("healthcheck",)
LATER = ("sim", "clock.advance=600")  # NVML's clock ten minutes on: the next check's interval

SCENARIOS = {
    # A power brake on every node of the row for 30 s, seen by a sample too: 5% of the interval.
    "power brake, transient": (
        [HC, ("sim", "throttle.power_brake=+30", *["gpu.%d.clocks=power_brake" % i for i in range(8)]), LATER, HC, ("sim", *["gpu.%d.clocks=none" % i for i in range(8)]), LATER, HC],
        None),
    "power brake, sustained": (
        [HC, ("sim", "throttle.power_brake=+300"), LATER, HC],
        "gpugate: health clocks:gpu0=power_brake>="),
    # A reboot zeroes NVML's and the HCAs' counters: no interval, no rate, no flap from it.
    "counters reset by a reboot": (
        [HC, ("sim", "throttle.hw_thermal=+50", "ib.mlx5_7.counter.symbol_error=+100",
               "ib.mlx5_4.counter.link_downed=+3"), HC, ("sim", "reboot=1", "ib.mlx5_7.counter.symbol_error=0",
                                                         "ib.mlx5_4.counter.link_downed=0"), LATER, HC, HC],
        None),
    "a link that flaps": (
        [HC, ("sim", "ib.mlx5_4.counter.link_downed=+1"), HC, HC],
        "gpugate: health ib_flap=mlx5_4/1 1 flap (want none within 3600s)"),
    "symbol errors, a burst past the hour's allowance": (
        [HC, ("sim", "ib.mlx5_7.counter.symbol_error=+500"), HC],
        "gpugate: health ib_errors=mlx5_7/1 symbol_error over its rate (want <= 120 per hour)"),
    "symbol errors, a few": (
        [HC, ("sim", "ib.mlx5_7.counter.symbol_error=+20"), HC, ("sim", "ib.mlx5_7.counter.symbol_error=+20"), HC],
        None),
    # One user's job crash-looping on GPU 2: the application's Xid, many times, in one job.
    "an application crash loop in one job": (
        [HC, ("job", "501", *["gpu.2.xid=13"] * 6), HC, ("job", "502"), HC],
        None),
    "the application's Xid on one GPU across jobs": (
        [HC, ("job", "601", "gpu.2.xid=13"), ("job", "602", "gpu.2.xid=31"), ("job", "603", "gpu.2.xid=13"), HC],
        "gpugate: health xid_repeat:gpu2=xids in >=3 jobs (want < 3 jobs within 24h)"),
}


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("replay")
    baseline = tmp / "baseline-ib.toml"
    baseline.write_text(open(DEMO_BASELINE).read() + HCA)
    os.utime(str(baseline), (1, 1))
    fleet = str(tmp / "fleet")
    gpugate_cmd("sim", "init", fleet, "--nodes", "gpu[01-%02d]" % len(SCENARIOS), "--baseline", str(baseline),
                check=True)
    config = tmp / "gpugate.toml"
    config.write_text('baseline = "%s"\nstate_dir = "%s/state/{node}"\nlog = "file"\n[healthcheck]\n'
                      'boot_grace_seconds = 0\n[drain_budget]\njitter_seconds = 0\n[sim]\nfleet = "%s"\n'
                      '[slurm]\nbin_dir = "%s/no-slurm"\n' % (baseline, tmp, fleet, tmp))
    return {"config": str(config), "fleet": fleet, "state": str(tmp / "state")}


def _last(rig, node):
    with open(os.path.join(rig["state"], node, "gpugate.log")) as handle:
        return json.loads(handle.read().splitlines()[-1])


def replay(rig, node, steps):
    for step in steps:
        if step[0] == "sim":
            gpugate_cmd("sim", "set", rig["fleet"], node, *step[1:], check=True)
        elif step[0] == "healthcheck":
            run_entry("healthcheck", rig, node)
        else:
            # slurmd names the job's GPUs and user (each job its own here).
            job = {"SLURM_JOB_ID": step[1], "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7", "SLURM_JOB_UID": "1" + step[1]}
            run_entry("prolog", rig, node, job)
            if step[2:]:
                gpugate_cmd("sim", "set", rig["fleet"], node, *step[2:], check=True)
            run_entry("epilog", rig, node, job)
    return _last(rig, node)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_noise_drains_nothing_and_each_fault_drains_with_its_reason(rig, name):
    node = "gpu%02d" % (sorted(SCENARIOS).index(name) + 1)
    steps, reason = SCENARIOS[name]
    last = replay(rig, node, steps)
    if reason is None:
        assert last["verdict"] == "fit", (name, last.get("reason"))
    else:
        assert last["verdict"] == "unfit" and last["reason"].startswith(reason), (name, last.get("reason"))
