"""The default Xid policy (gpugate.vendors.nvidia.xidcatalog) and how the judge applies it:
catalog parity, Xid 154 by its target, counted non-fatal NVLink Xids and
SXids, MIG attribution, "fallen off the bus", and momentary clock events."""

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import DEMO_BASELINE, ROOT
from gpugate.vendors.nvidia import xidcatalog
from gpugate.model.baseline import load_baseline
from gpugate.model.facts import NodeFacts
from gpugate.model.findings import is_acute
from gpugate.judges import xids
from gpugate.parsers import kernlog
from gpugate.model.runbook import steps

POLICY = load_baseline(DEMO_BASELINE).health
EXAMPLES = [DEMO_BASELINE, os.path.join(ROOT, "slurm_conf", "baseline.example.toml")]


def judge(lines, fresh_from=0, policy=POLICY, gpus=None):
    events = []
    scanner = kernlog.Scanner()
    for i, line in enumerate(lines):
        event = scanner.feed(line)
        if event is not None:
            gpu = (gpus or {}).get(event.pci_bus_id)
            events.append(event.__class__(**dict(event.__dict__, seq=i, fresh=i >= fresh_from, gpu=gpu)))
    return xids.judge(policy, NodeFacts(node="n", mode="healthcheck", collected_at=0.0, xids=tuple(events)))


@pytest.mark.parametrize("path", EXAMPLES)
def test_example_baselines_carry_the_catalog_table_verbatim(path):
    with open(path) as handle:
        text = handle.read()
    assert xidcatalog.baseline_block() in text
    assert tuple(load_baseline(path).health.drain_xids) == xidcatalog.default_drain_xids()
    assert load_baseline(path).health.xid_actions == xidcatalog.default_xid_actions()


def test_defaults_follow_the_catalog_and_every_deviation_says_why():
    drains = set(xidcatalog.default_drain_xids())
    assert {46, 62, 110, 136, 155, 156, 158} <= drains  # catalog: RESET_GPU
    assert not {92, 43, 13} & drains  # catalog: IGNORE / RESTART_APP
    for code, (ours, theirs, why) in xidcatalog.CATALOG.items():
        follows = (ours == "ignore") == (theirs in ("IGNORE", "RESTART_APP")) and ours != "nvlink"
        assert follows or ours == "recovery" or why, code
    assert POLICY.xid_action(79) == "reboot" and POLICY.xid_action(46) == "reset_gpu"


@pytest.mark.parametrize("code,action", [(54, "investigate"), (78, "investigate"), (109, "reset_gpu"),
                                         (151, "reboot")])
def test_catalog_actions_gpugate_had_no_word_for_are_decided(code, action):
    # 54 CHECK_MECHANICALS, 78 UPDATE_SWFW: a human; 109 RESET_GPU; 151 RESTART_VM: the node's reboot.
    assert code in xidcatalog.default_drain_xids() and POLICY.xid_action(code) == action
    (finding,) = judge(["NVRM: Xid (PCI:0000:9a:00): %d, pid=1, name=x, something" % code])
    assert (finding.component, finding.observed, finding.action, finding.acute) == ("xid", str(code), action, True)


@pytest.mark.parametrize("target,action", [
    ("0x1 (GPU Reset Required)", "reset_gpu"), ("0x2 (Node Reboot Required)", "reboot"),
    ("0x4 (Drain and Reset)", "reset_gpu")])
def test_xid_154_drains_for_what_it_changed_to(target, action):
    (finding,) = judge(["NVRM: Xid (PCI:0000:9a:00): 154, GPU recovery action changed from 0x0 (None) to " + target])
    assert (finding.component, finding.observed, finding.action) == ("xid", "154", action)
    assert target in finding.detail


def test_xid_154_back_to_none_means_recovered():
    assert judge(["NVRM: Xid (PCI:0000:9a:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) "
                  "to 0x0 (None)"]) == []


NONFATAL = "NVRM: Xid (PCI:0000:04:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000004 0x00000001)"
FATAL = "NVRM: Xid (PCI:0000:04:00): 145, RLW_REMAP Fatal XC1 i0 Link 10 (0x00000082 0x00000040)"


def test_nonfatal_nvlink_xids_drain_only_at_the_rate():
    below = POLICY.xid_nonfatal_max - 1
    assert judge([NONFATAL] * below) == []
    (finding,) = judge([NONFATAL] * (below + 1), gpus={"0000:04:00": 2})
    assert (finding.component, finding.gpu, finding.observed) == ("xid", 2, "145")
    assert finding.expected.startswith("< %d non-fatal" % POLICY.xid_nonfatal_max)
    # Over the rate, but nothing new since the cursor: an admin's resume sticks.
    assert judge([NONFATAL] * (below + 1), fresh_from=below + 1) == []
    (finding,) = judge([FATAL])  # a fatal sub-event drains on its own
    assert finding.observed == "145" and finding.expected == "none"


def test_sxid_fatal_drains_nonfatal_is_counted():
    fatal = "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up"
    nonfatal = "nvidia-nvswitch2: SXid (PCI:0000:86:00.0): 12028, Non-fatal, Link 46 egress non-posted PRIV error"
    (finding,) = judge([fatal])
    assert (finding.component, finding.observed, finding.gpu) == ("sxid", "nvswitch1 20034 fatal", None)
    assert finding.acute and finding.action == "reboot" and "0000:06:00" in finding.detail
    assert judge([nonfatal]) == []
    (finding,) = judge([nonfatal] * POLICY.xid_nonfatal_max)
    assert finding.observed == "nvswitch2 12028 non-fatal >=%d" % POLICY.xid_nonfatal_max
    assert finding.detail.startswith("%d non-fatal: " % POLICY.xid_nonfatal_max)
    assert judge([fatal], fresh_from=1) == []  # before the cursor: already acted on


def test_mig_xid_names_the_gpu_and_the_instance():
    (finding,) = judge(["NVRM: Xid (PCI:0000:01:00 GPU-I:05 GPU-CI:01): 48, pid=1, name=x, DBE"],
                       gpus={"0000:01:00": 0})
    assert (finding.gpu, finding.observed) == (0, "48")
    assert finding.detail.startswith("GPU-I:05 GPU-CI:01: ")
    assert judge(["NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9)."]) == []


def test_fallen_off_the_bus_drains_once_with_xid_79():
    split = ["NVRM: The NVIDIA GPU 0000:18:00.0", "NVRM: (PCI ID: 10de:20b0) installed in this system has",
             "NVRM: fallen off the bus and is not responding to commands."]
    (finding,) = judge(split, gpus={"0000:18:00": 5})
    assert (finding.component, finding.gpu, finding.action) == ("fallen_off_bus", 5, "reboot")
    assert finding.acute and steps(finding)[0].startswith("the GPU no longer answers")
    both = ["NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
            "NVRM: GPU 0000:91:00.0: GPU has fallen off the bus."]
    assert [f.component for f in judge(both)] == ["xid"]


@given(st.text(max_size=60).filter(lambda s: "fatal" not in s.lower()))
@settings(max_examples=100, deadline=None)
def test_severity_is_fatal_unless_the_line_says_non_fatal(rest):
    assert xids.fatal(rest) is True  # no word: unknown is not good news
    assert xids.fatal("Non-fatal, " + rest) is False and xids.fatal("RLW_CTRL Nonfatal XC0 " + rest) is False
    assert xids.fatal("Fatal, " + rest) is True and xids.fatal("NETIR_LINK_DOWN Fatal " + rest) is True


def test_runbook_and_acute_for_new_components():
    assert is_acute("health", "sxid") and is_acute("health", "fallen_off_bus")
    for component in ("sxid", "fallen_off_bus", "xid"):
        from gpugate.model.findings import Finding
        assert len(steps(Finding("health", component, "x", "none", "reboot"))) >= 1


# --------------------------------------------------------------------------
# Through `gpugate check` on a simulated node (the production path above NVML
# and the sysroot's /dev/kmsg).

def _check(fleet, mode="healthcheck"):
    from conftest import gpugate_cmd
    result = gpugate_cmd("check", "--sim", fleet, "--node", "gpu01", "--baseline", DEMO_BASELINE,
                         "--mode", mode, "--json")
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


def _set(fleet, *assignments):
    from conftest import gpugate_cmd
    result = gpugate_cmd("sim", "set", fleet, "gpu01", *assignments)
    assert result.returncode == 0, result.stderr


def test_sim_sxid_and_fallen_off_bus_reach_the_reason(fleet):
    _set(fleet, "sxid=12028:nonfatal@2")
    assert _check(fleet)["fit"] is True  # one non-fatal SXid: counted, no drain
    _set(fleet, "sxid=20034@1")
    data = _check(fleet)
    assert data["reason"].startswith("gpugate: health sxid=nvswitch1 20034 fatal (want none)")


def test_sim_fallen_off_bus_split_records(fleet):
    bus = _check(fleet)["facts"]["nvml"]["gpus"][3]["pci_bus_id"]
    short = bus.lower()[4:-2]  # "00000000:1b:00.0" -> "0000:1b:00"
    _set(fleet, "kmsg=NVRM: The NVIDIA GPU %s.0" % short, "kmsg=NVRM: (PCI ID: 10de:2330) installed in this "
         "system has", "kmsg=NVRM: fallen off the bus and is not responding to commands.")
    data = _check(fleet)
    assert data["reason"].startswith("gpugate: health fallen_off_bus:gpu3=%s (want on the bus)" % short)


def test_no_check_drains_on_a_momentary_clock_event(fleet):
    # One sample is a moment: clock events are judged by time (test_throttle.py).
    _set(fleet, "gpu.5.clocks=hw_thermal")
    for mode in ("prolog", "healthcheck", "epilog"):
        assert _check(fleet, mode)["fit"] is True


def test_metrics_count_kernel_log_events_by_kind_and_code():
    from gpugate.node.metrics import kernel_log_samples
    from gpugate.core.promtext import render
    lines = [NONFATAL] * 3 + ["nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up"]
    events = tuple(kernlog.parse_dmesg("\n".join(lines)))
    samples = kernel_log_samples(events)
    assert samples == [("gpugate_kernel_log_events", {"kind": "sxid", "code": "20034"}, 1),
                       ("gpugate_kernel_log_events", {"kind": "xid", "code": "145"}, 3)]
    assert 'gpugate_kernel_log_events{code="145",kind="xid"} 3' in render([("gpugate_kernel_log_events", "gauge",
                                                                           "h", samples)])
