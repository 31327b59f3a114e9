"""The AMD judges (gpugate.vendors.amd.judge, judge_gpus): one finding per fault with
its exact reason, the same reason grammar and budget classes as NVIDIA's,
and unknown never taken for good.  Facts are built as the probes build
them (gpugate.vendors.amd.facts records)."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpugate.vendors.amd.facts import AmdFacts, AmdGpu
from gpugate.model.baseline import parse_baseline
from gpugate.errors import ConfigError
from gpugate.model.facts import NodeFacts, Pcie, ProbeFailure, from_jsonable, to_jsonable
from gpugate.judges import judge
from gpugate.core.record import replace
from gpugate.model.verdict import decide

PRODUCT = "AMD Instinct MI300X OAM"
BASELINE = {
    "name": "mixed",
    "pin": {"kernel": "6.8.0-60-generic", "driver": "580.65.06", "amdgpu": "6.16.13", "rocm": "7.2.1",
            "vbios": {PRODUCT: "113-M3000108-103", "NVIDIA H100 80GB HBM3": "96.00.99.00.01"},
            "ifwi": {PRODUCT: "00159017"}},
    "nodes": {"mi[01-04]": {"vendor": "amd", "gpus": 8, "product": PRODUCT, "device_id": "0x74a1",
                            "compute_partition": "SPX", "memory_partition": "NPS1", "power_limit_watts": 750},
              "gpu[01-04]": {"gpus": 8, "product": "NVIDIA H100 80GB HBM3"}},
}
CLEAN = {b: (0, 0, 0) for b in ("umc", "sdma", "gfx", "mmhub", "athub", "pcie_bif", "hdp", "xgmi_wafl")}


def baseline(**health):
    data = dict(BASELINE)
    if health:
        data["health"] = health
    return parse_baseline(data, "baseline.toml")


def gpu(i, **changes):
    values = dict(index=i, bdf="0000:%02x:00.0" % (0x1b + i), device_id="0x74a1", bound=True, product=PRODUCT,
                  serial="6924%08d" % i, unique_id="%016x" % i, vbios="113-M3000108-103", compute_partition="SPX",
                  memory_partition="NPS1", power_cap_w=750.0, ras=dict(CLEAN), bad_pages=(0, 0, 0),
                  pcie=Pcie(5, 16, 5, 16), pcie_replays=0, ifwi="00159017", bad_page_threshold_exceeded=False,
                  xgmi=(7, 0, 0), firmware={"mec": "0x000000a6"})
    values.update(changes)
    return AmdGpu(**values)


def node(gpus=None, mode="healthcheck", **amd):
    values = dict(initstate="live", amdgpu_version="6.16.13", rocm_version="7.2.1", pci_functions=8,
                  gpus=tuple(gpus if gpus is not None else [gpu(i) for i in range(8)]), amd_smi_version="26.2.2")
    values.update(amd)
    facts = AmdFacts(**values)
    return NodeFacts(node="mi01", mode=mode, collected_at=0.0, kernel_release="6.8.0-60-generic",
                     pci_gpus=values["pci_functions"], amd=facts)


def reason(facts, b=None):
    verdict = decide(judge(b or baseline(), facts), "gpugate:")
    return verdict


def with_gpu(i, **changes):
    gpus = [gpu(k) for k in range(8)]
    gpus[i] = gpu(i, **changes)
    return node(gpus)


def test_a_healthy_mi300x_node_is_fit():
    verdict = reason(node())
    assert verdict.fit, verdict.reason


def test_uncorrectable_ras_errors_drain_with_the_issue_grammar():
    ras = dict(CLEAN, umc=(2, 5, 0))
    verdict = reason(with_gpu(3, ras=ras))
    assert verdict.reason == "gpugate: health ras:gpu3=umc=2 uncorrectable (want 0)"
    assert verdict.acute and verdict.findings[0].action == "reset_gpu"


def test_correctable_ras_errors_alone_never_drain():
    verdict = reason(with_gpu(1, ras=dict(CLEAN, xgmi_wafl=(0, 1533, 0))))
    assert verdict.fit


def test_a_block_the_policy_leaves_out_does_not_drain():
    b = baseline(ras_uncorrected_blocks=["umc"])
    assert reason(with_gpu(2, ras=dict(CLEAN, xgmi_wafl=(3, 0, 0))), b).fit
    assert not reason(with_gpu(2, ras=dict(CLEAN, umc=(1, 0, 0))), b).fit


def test_deferred_errors_and_bad_pages():
    assert reason(with_gpu(0, ras=dict(CLEAN, umc=(0, 0, 1)))).reason == \
        "gpugate: health ras_deferred:gpu0=umc=1 deferred (want <= 0)"
    assert reason(with_gpu(1, bad_pages=(3, 1, 0))).reason == "gpugate: health bad_pages:gpu1=1 pending (want none)"
    unres = reason(with_gpu(5, bad_pages=(3, 0, 2)))
    assert unres.reason == "gpugate: health bad_pages:gpu5=2 unreservable (want none)"
    assert unres.findings[0].action == "rma"
    assert reason(with_gpu(5, bad_page_threshold_exceeded=True)).reason == \
        "gpugate: health bad_pages:gpu5=threshold exceeded (want under the driver's threshold)"
    # A site's own limit of retired pages, below the driver's threshold.
    assert reason(with_gpu(4, bad_pages=(9, 0, 0)), baseline(bad_pages_retired_max=8)).reason == \
        "gpugate: health bad_pages:gpu4=9 retired (want <= 8)"
    assert reason(with_gpu(4, bad_pages=(9, 0, 0))).fit  # the driver's threshold is the default


def test_xgmi_link_down_and_pcie_below_the_gpus_own_maximum():
    assert reason(with_gpu(6, xgmi=(6, 1, 0))).reason == "gpugate: health xgmi:gpu6=1 of 7 down (want <= 0 down)"
    assert reason(with_gpu(2, pcie=Pcie(5, 8, 5, 16))).reason == "gpugate: health pcie_width:gpu2=x8 (want x16)"
    # An amd-smi before AMD SMI 25.3 cannot say: shown as unchecked, never a pass nor a drain.
    old = ProbeFailure("amd_smi", "unchecked", "this amd-smi has no xgmi --link-status")
    assert reason(node([gpu(i, xgmi=old) for i in range(8)])).fit


def test_unknown_is_never_good():
    na = ProbeFailure("amd_smi", "na", "ifwi: N/A (no /dev/kfd access)")
    verdict = reason(with_gpu(0, ifwi=na))
    assert verdict.reason == "gpugate: probe ifwi:gpu0=na (want answer)"
    assert not verdict.acute  # probe findings are budgeted
    ras = reason(with_gpu(7, ras=ProbeFailure("amdgpu_sysfs", "error", "ras/umc_err_count: garbled")))
    assert ras.reason == "gpugate: probe ras:gpu7=error (want answer)"


def test_driver_not_loaded_and_gpus_the_driver_does_not_drive():
    gone = node(initstate=ProbeFailure("amdgpu_sysfs", "missing", "/sys/module/amdgpu/initstate"),
                gpus=(), amdgpu_version=ProbeFailure("amdgpu_sysfs", "missing", "no module"))
    verdict = reason(gone)
    assert verdict.reason == "gpugate: broken module=amdgpu not loaded (want live)"
    assert verdict.acute
    half = node([gpu(i, bound=i < 6) for i in range(8)])
    verdict = reason(half)
    assert verdict.reason.startswith("gpugate: broken bound_gpus=6 of 8 on bus (want 8)")
    assert verdict.acute


def test_drift_of_the_amd_stack_is_budgeted():
    verdict = reason(node(amdgpu_version="6.12.12"))
    assert verdict.reason == "gpugate: drift amdgpu=6.12.12 (want 6.16.13)" and not verdict.acute
    verdict = reason(node([gpu(i, ifwi="00150000") for i in range(8)]))
    assert verdict.reason == "gpugate: drift ifwi=00150000 (want 00159017)"  # folded over every GPU
    verdict = reason(with_gpu(3, compute_partition="CPX"))
    assert verdict.reason == "gpugate: drift compute_partition:gpu3=CPX (want SPX)" and not verdict.acute
    verdict = reason(with_gpu(3, power_cap_w=600.0))
    assert verdict.reason == "gpugate: drift power_limit:gpu3=600 W (want 750 W)"


def test_a_secondary_die_without_a_power_reading_is_not_drift():
    assert reason(with_gpu(1, power_cap_w=None)).fit


def test_gpu_count_and_product_read_the_same_as_nvidia():
    verdict = reason(node([gpu(i) for i in range(7)], pci_functions=7))
    assert "gpu_count=7 (want 8)" in verdict.reason
    verdict = reason(with_gpu(0, product="AMD Instinct MI325X OAM", device_id="0x74a5"))
    assert "product:gpu0=AMD Instinct MI325X OAM (want AMD Instinct MI300X OAM)" in verdict.reason


def test_leftover_kfd_processes_after_a_job():
    facts = replace(node(mode="epilog"), amd=replace(node().amd, kfd_processes=(4242,)))
    assert reason(facts).reason == "gpugate: broken processes=1 left [pid 4242] (want none)"
    assert reason(replace(facts, mode="healthcheck")).fit  # a running job's process is not left over


def test_the_nvidia_nodes_of_the_same_baseline_are_judged_as_before():
    b = baseline()
    assert b.vendor_for("gpu01") == "nvidia" and b.vendor_for("mi01") == "amd"
    assert b.expect_for("mi01").gpus == 8 and b.amd_expect_for("mi01").compute_partition == "SPX"


@pytest.mark.parametrize("bad, words", [
    ({"nodes": {"mi1": {"vendor": "amd", "mig": True}}}, 'nodes."mi1".mig: not a key for a AMD nodeset'),
    ({"nodes": {"g1": {"compute_partition": "SPX"}}}, 'set vendor = "amd" in it'),
    ({"nodes": {"g1": {"gpus": 8}}, "pin": {"driver": "580.65.06", "rocm": "7.2.1"}},
     'pin.rocm: no nodeset has vendor = "amd"'),
    ({"nodes": {"mi1": {"vendor": "amd"}}, "pin": {"driver": "580.65.06"}}, 'pin.driver: every nodeset has vendor'),
    ({"nodes": {"mi1": {"vendor": "amd", "device_id": "74a1"}}, "pin": {}}, "expected a PCI device id"),
    ({"nodes": {"g1": {"gpus": 8}}, "pin": {"kernel": "6.1"}}, "pin.driver: required key is missing"),
    ({"nodes": {"gpu[01-99]": {"gpus": 8}, "gpu[03-04]": {"vendor": "amd"}}},
     'nodes."gpu[01-99]" (nvidia) and nodes."gpu[03-04]" (amd) both name gpu[03-04]: a node has one vendor'),
])
def test_a_baseline_that_mixes_the_vendors_up_is_refused(bad, words):
    data = {"pin": bad.get("pin", {"driver": "580.65.06"}), "nodes": bad["nodes"]}
    with pytest.raises(ConfigError, match=re.escape(words)):
        parse_baseline(data, "baseline.toml")


def test_an_amd_only_baseline_needs_no_nvidia_pin():
    b = parse_baseline({"pin": {"amdgpu": "inbox", "rocm": "7.2.1"}, "nodes": {"mi[1-2]": {"vendor": "amd"}}}, "b")
    assert b.pin.driver is None and b.vendor_for("mi2") == "amd"


def test_amd_facts_survive_the_json_round_trip():
    facts = with_gpu(3, ras=dict(CLEAN, umc=(2, 0, None)), xgmi=ProbeFailure("amd_smi", "na", "N/A"))
    back = from_jsonable(to_jsonable(facts))
    assert back == facts
    assert decide(judge(baseline(), back), "gpugate:").reason == decide(judge(baseline(), facts), "gpugate:").reason


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(sorted(CLEAN)), st.tuples(st.integers(0, 50), st.integers(0, 10 ** 6),
                                                                 st.one_of(st.none(), st.integers(0, 5)))),
       st.integers(0, 7))
def test_any_uncorrectable_error_in_a_listed_block_drains_and_correctables_never_do(ras, index):
    verdict = reason(with_gpu(index, ras=dict(CLEAN, **ras)))
    ue = sum(c[0] for c in ras.values())
    de = sum(c[2] or 0 for c in ras.values())
    assert verdict.fit == (ue == 0 and de == 0)
    if ue:
        assert verdict.findings[0].component == "ras" and verdict.findings[0].gpu == index and verdict.acute


def test_textfile_metrics_name_the_amd_stack_not_nvidias():
    from gpugate.model.facts import XidEvent
    from gpugate.node.metrics import component_states, kernel_log_samples

    b = baseline()
    facts = node(amdgpu_version="6.12.12")
    states = component_states(decide(judge(b, facts), "gpugate:"), facts, b, b.expect_for("mi01"), "amd")
    assert states == {"kernel": "matches", "amdgpu": "differs", "rocm": "matches", "vbios": "matches",
                      "ifwi": "matches"}  # no "driver: unreadable" on a node that has no NVIDIA driver
    na = node([gpu(i, ifwi=ProbeFailure("amd_smi", "na", "N/A")) for i in range(8)])
    assert component_states(decide(judge(b, na), "gpugate:"), na, b, b.expect_for("mi01"), "amd")["ifwi"] == "unreadable"
    event = XidEvent(xid=1533, pci_bus_id="0000:1b:00", text="", kind="amdgpu", where="ce:xgmi_wafl")
    assert kernel_log_samples((event,)) == [("gpugate_kernel_log_events", {"kind": "amdgpu", "code": "ce"}, 1)]


def test_baseline_diff_shows_the_amd_pins():
    from gpugate.fleet.review import diff, diff_text

    old = baseline()
    data = dict(BASELINE, pin=dict(BASELINE["pin"], rocm="7.2.2", ifwi={PRODUCT: "00160000"}))
    new = parse_baseline(data, "new.toml")
    changes = {c["component"]: (c["old"], c["new"]) for c in diff(old, new, None)["pin"]}
    assert changes == {"rocm": ("7.2.1", "7.2.2"), "ifwi[%s]" % PRODUCT: ("00159017", "00160000")}
    assert "rocm" in diff_text(diff(old, new, None))
