"""gpugate.judges.operator: what a GPU operator publishes on a Kubernetes
Node (GPU Feature Discovery's labels, AMD's node labeller), held to the
same baseline.  Label names and value shapes as GFD and AMD's operator
print them (GFD README "Generated Labels"; AMD GPU Operator node labeller)."""

import os

from hypothesis import given, strategies as st

from gpugate.model.baseline import load_baseline
from gpugate.model.findings import DRIFT, PENDING, PROBE
from gpugate.judges import operator as op
from gpugate.model.reason import render
from gpugate.core.record import replace
from gpugate.model.verdict import decide

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASELINE = load_baseline(os.path.join(ROOT, "gpugate", "data", "demo-baseline.toml"))  # driver 580.65.06, CUDA 13.0

# What GFD 0.17 publishes on a node running driver 580.65.06 (new and deprecated keys side by side).
GFD = {"nvidia.com/cuda.driver-version.full": "580.65.06", "nvidia.com/cuda.driver-version.major": "580",
       "nvidia.com/cuda.driver-version.minor": "65", "nvidia.com/cuda.driver-version.revision": "06",
       "nvidia.com/cuda.driver.major": "580", "nvidia.com/cuda.driver.minor": "65", "nvidia.com/cuda.driver.rev": "06",
       "nvidia.com/cuda.runtime-version.full": "13.0", "nvidia.com/cuda.runtime-version.major": "13",
       "nvidia.com/cuda.runtime-version.minor": "0", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
       "nvidia.com/gpu.count": "8", "nvidia.com/mig.strategy": "single", "nvidia.com/gfd.timestamp": "1795840000"}


def with_policy(**policy):
    return replace(BASELINE, operator=dict({"labels": False, "mig_strategy": ""}, **policy))


def test_labels_that_agree_with_the_pin_find_nothing():
    assert op.judge(BASELINE, "gpu01", GFD) == []


def test_another_driver_on_the_operator_s_labels_is_drift_with_a_precise_reason():
    labels = dict(GFD, **{"nvidia.com/cuda.driver-version.full": "570.172.08",
                          "nvidia.com/cuda.runtime-version.full": "12.8"})
    found = op.judge(BASELINE, "gpu01", labels)
    assert [(f.cls, f.component, f.observed, f.expected) for f in found] == [
        (DRIFT, "operator_driver", "570.172.08", "580.65.06"), (DRIFT, "operator_cuda", "12.8", "13.0")]
    assert render("gpugate:", DRIFT, found) == \
        "gpugate: drift operator_driver=570.172.08 (want 580.65.06); operator_cuda=12.8 (want 13.0)"


def test_an_older_gfd_s_split_labels_are_read_and_leading_zeros_are_numbers():
    old = {"nvidia.com/cuda.driver.major": "580", "nvidia.com/cuda.driver.minor": "65", "nvidia.com/cuda.driver.rev": "6",
           "nvidia.com/cuda.runtime.major": "13", "nvidia.com/cuda.runtime.minor": "0"}
    assert op.published(old)["driver"] == "580.65.6" and op.judge(BASELINE, "gpu01", old) == []
    bad = dict(old, **{"nvidia.com/cuda.driver.minor": "54", "nvidia.com/cuda.driver.rev": "15"})
    assert [(f.component, f.observed) for f in op.judge(BASELINE, "gpu01", bad)] == [("operator_driver", "580.54.15")]


def test_the_cuda_label_is_compared_by_major_and_minor():
    assert op.judge(BASELINE, "gpu01", dict(GFD, **{"nvidia.com/cuda.runtime-version.full": "13.0.1"})) == []


def test_the_mig_strategy_is_judged_only_where_the_baseline_names_one():
    assert op.judge(with_policy(mig_strategy="single"), "gpu01", GFD) == []
    found = op.judge(with_policy(mig_strategy="mixed"), "gpu01", GFD)
    assert [(f.component, f.observed, f.expected) for f in found] == [("mig_strategy", "single", "mixed")]
    unset = {k: v for k, v in GFD.items() if k != op.MIG_STRATEGY}
    assert op.judge(with_policy(mig_strategy="none"), "gpu01", unset) == []


def test_required_labels_absent_or_unreadable_are_a_probe_never_fit():
    required = with_policy(labels=True)
    absent = op.judge(required, "gpu01", {"kubernetes.io/hostname": "gpu01"})
    assert [(f.cls, f.component, f.observed) for f in absent] == [(PROBE, "operator_labels", "absent")]
    unreadable = op.judge(required, "gpu01", None, "kubernetes GET /api/v1/nodes/gpu01: 403 Forbidden")
    assert [(f.cls, f.observed) for f in unreadable] == [(PROBE, "unreadable")] and "403" in unreadable[0].detail
    # Not required: a Slurm node (no labels) or a node without an operator is judged on itself alone.
    assert op.judge(BASELINE, "gpu01", None, "") == [] and op.judge(BASELINE, "gpu01", {}) == []
    assert op.judge(BASELINE, "gpu01", None, "refused") == []


@given(st.lists(st.integers(0, 999), min_size=2, max_size=3), st.booleans())
def test_the_pinned_driver_in_any_label_shape_is_never_drift(parts, split):
    version = ".".join("%02d" % p if i == 2 else str(p) for i, p in enumerate(parts))
    pinned = replace(BASELINE, pin=replace(BASELINE.pin, driver=version))
    if split and len(parts) == 3:
        labels = dict(zip(("nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor",
                           "nvidia.com/cuda.driver.rev"), (str(p) for p in parts)))
    else:
        labels = {"nvidia.com/cuda.driver-version.full": version}
    assert [f for f in op.judge(pinned, "gpu01", labels) if f.component == "operator_driver"] == []
    other = dict(labels, **{"nvidia.com/cuda.driver-version.full": version + ".1"})
    assert [f.component for f in op.judge(pinned, "gpu01", other)] == ["operator_driver"]


def test_an_amd_node_is_held_to_its_amdgpu_pin_by_the_node_labeller_s_label():
    from gpugate.model.baseline import parse_baseline

    mixed = parse_baseline({"name": "mixed", "pin": {"driver": "580.65.06", "amdgpu": "6.12.12"},
                            "nodes": {"mi[01-02]": {"vendor": "amd", "gpus": 8, "product": "AMD Instinct MI300X OAM"},
                                      "gpu[01-02]": {"gpus": 8}}}, "baseline.toml")
    labeller = {"amd.com/gpu.driver-version": "6.12.12", "amd.com/gpu.family": "AI", "amd.com/gpu.device-id": "74b5"}
    assert op.judge(mixed, "mi01", labeller) == []
    found = op.judge(mixed, "mi01", dict(labeller, **{"amd.com/gpu.driver-version": "6.10.5"}))
    assert [(f.cls, f.component, f.observed, f.expected) for f in found] == [
        (DRIFT, "operator_amdgpu", "6.10.5", "6.12.12")]
    # GFD's labels mean nothing on an AMD node; the AMD label nothing on an NVIDIA one.
    assert op.judge(mixed, "mi01", dict(labeller, **{"nvidia.com/cuda.driver-version.full": "1.2.3"})) == []
    assert op.judge(mixed, "gpu01", {"amd.com/gpu.driver-version": "0.0.1"}) == []
    absent = op.judge(replace(mixed, operator={"labels": True}), "mi01", {"nvidia.com/cuda.driver-version.full": "x"})
    assert [f.observed for f in absent] == ["absent"] and "amd.com/gpu.driver-version" in absent[0].expected


def test_a_failed_driver_upgrade_of_the_operator_is_drift_one_in_progress_is_not():
    for state in ("upgrade-required", "cordon-required", "drain-required", "validation-required", "upgrade-done"):
        assert op.judge(BASELINE, "gpu01", dict(GFD, **{op.UPGRADE_STATE: state})) == []
    found = op.judge(BASELINE, "gpu01", dict(GFD, **{op.UPGRADE_STATE: "upgrade-failed"}))
    assert [(f.cls, f.component, f.observed) for f in found] == [(DRIFT, "operator_upgrade", "upgrade-failed")]


def test_during_a_rollout_labels_still_on_previous_are_pending_as_the_driver_nvml_reports_is():
    """[pin] 590.48.01 (CUDA 13.1), [previous] the demo's 580.65.06 (13.0): a
    node GFD still labels with the old driver is pending (reported, never
    drained), as gpugate.judges.versions judges NVML's driver; the new
    driver is fit; a third one, or the old one once the rollout is over, is drift."""
    new = replace(BASELINE.pin, driver="590.48.01", cuda_driver="13.1")
    rollout = replace(BASELINE, pin=new, previous=BASELINE.pin, rollout_in_progress=True)
    found = op.judge(rollout, "gpu01", GFD)
    assert [(f.cls, f.component, f.observed, f.expected) for f in found] == [
        (PENDING, "operator_driver", "580.65.06", "590.48.01"), (PENDING, "operator_cuda", "13.0", "13.1")]
    assert all("on the previous baseline; rollout in progress" in f.detail for f in found)
    verdict = decide(found, "gpugate:")
    assert verdict.fit and verdict.notes == tuple(found)
    upgraded = dict(GFD, **{"nvidia.com/cuda.driver-version.full": "590.48.01",
                            "nvidia.com/cuda.runtime-version.full": "13.1"})
    assert op.judge(rollout, "gpu01", upgraded) == []
    # An older GFD's split labels, leading zeros as numbers: [previous] too.
    split = {"nvidia.com/cuda.driver.major": "580", "nvidia.com/cuda.driver.minor": "65", "nvidia.com/cuda.driver.rev": "6"}
    assert [f.cls for f in op.judge(rollout, "gpu01", split)] == [PENDING]
    other = dict(GFD, **{"nvidia.com/cuda.driver-version.full": "570.172.08"})
    assert [(f.cls, f.component) for f in op.judge(rollout, "gpu01", other)] == [
        (DRIFT, "operator_driver"), (PENDING, "operator_cuda")]
    finished = replace(rollout, rollout_in_progress=False)
    assert [(f.cls, f.component) for f in op.judge(finished, "gpu01", GFD)] == [
        (DRIFT, "operator_driver"), (DRIFT, "operator_cuda")]
    # A failed upgrade stays drift during the rollout.
    failed = op.judge(rollout, "gpu01", dict(upgraded, **{op.UPGRADE_STATE: "upgrade-failed"}))
    assert [(f.cls, f.component) for f in failed] == [(DRIFT, "operator_upgrade")]


def test_during_a_rollout_the_amd_label_on_previous_is_pending():
    from gpugate.model.baseline import parse_baseline

    amd = parse_baseline({"name": "amd", "pin": {"amdgpu": "6.14.1"}, "previous": {"amdgpu": "6.12.12"},
                          "rollout": {"in_progress": True},
                          "nodes": {"mi[01-02]": {"vendor": "amd", "gpus": 8, "product": "AMD Instinct MI300X OAM"}}},
                         "baseline.toml")
    found = op.judge(amd, "mi01", {"amd.com/gpu.driver-version": "6.12.12"})
    assert [(f.cls, f.component, f.observed, f.expected) for f in found] == [
        (PENDING, "operator_amdgpu", "6.12.12", "6.14.1")]
    assert [f.cls for f in op.judge(amd, "mi01", {"amd.com/gpu.driver-version": "6.10.5"})] == [DRIFT]
