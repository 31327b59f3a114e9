"""gpugate.judges.operator_images: the images a GPU operator's pods run on
the node, held to the baseline's [operator] pins.  References in the shapes
the operators build them from ClusterPolicy's repository/image/version
(gpu-operator's values.yaml: "v0.17.1", "4.2.3-4.1.3-ubuntu22.04",
"1.7.2-ubuntu18.04", "v0.10.0-ubi8", a version given as "sha256:...";
OpenShift mirrors with a registry port)."""

import os

import pytest
from hypothesis import given, strategies as st

from gpugate.model.baseline import load_baseline, parse_baseline
from gpugate.errors import ConfigError
from gpugate.model.findings import DRIFT, PROBE
from gpugate.judges import operator_images as oi
from gpugate.model.reason import render
from gpugate.core.record import replace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(ROOT, "gpugate", "data", "demo-baseline.toml")
BASELINE = load_baseline(DEMO)  # driver 580.65.06
DIGEST = "sha256:e37404194fa2bc2275827411049422b93d1493991fb925957f170b4b842846ff"

# One node's gpu-operator pods (name, image), as `kubectl get pods -o wide` would list them.
PODS = [("nvidia-driver-daemonset-5.14.0-427-x7k2p", "nvcr.io/nvidia/driver:580.65.06-ubuntu22.04"),
        ("nvidia-container-toolkit-daemonset-7fq9d", "nvcr.io/nvidia/k8s/container-toolkit:v1.17.5-ubuntu20.04"),
        ("nvidia-device-plugin-daemonset-2xk8w", "nvcr.io/nvidia/k8s-device-plugin:v0.17.1"),
        ("gpu-feature-discovery-m5r2t", "nvcr.io/nvidia/k8s-device-plugin:v0.17.1"),
        ("nvidia-dcgm-exporter-9pl4c", "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04"),
        ("nvidia-operator-validator-bb7qv", "nvcr.io/nvidia/cloud-native/gpu-operator-validator:v25.3.0")]


def pinned(**pins):
    policy = dict(BASELINE.operator)
    policy.update(pins)
    return replace(BASELINE, operator=policy)


PINS = pinned(driver_image=True, container_toolkit="1.17.5", device_plugin="v0.17.1", dcgm_exporter="4.2.3-4.1.3")


def test_the_pinned_images_find_nothing_and_no_pins_read_nothing():
    assert oi.judge(PINS, "gpu01", PODS) == []
    assert oi.pins_for(BASELINE, "gpu01") == {} and oi.judge(BASELINE, "gpu01", None, "403 Forbidden") == []


def test_an_old_image_on_the_node_is_drift_with_a_precise_reason():
    old = [(p, i.replace("v0.17.1", "v0.16.2").replace("580.65.06", "570.172.08")) for p, i in PODS]
    found = oi.judge(PINS, "gpu01", old)
    assert [(f.cls, f.component, f.observed, f.expected) for f in found] == [
        (DRIFT, "operator_driver", "570.172.08-ubuntu22.04", "580.65.06"),
        (DRIFT, "operator_device_plugin", "v0.16.2", "v0.17.1")]  # GFD's pod: the same image, one finding
    assert render("gpugate:", DRIFT, found[1:]) == "gpugate: drift operator_device_plugin=v0.16.2 (want v0.17.1)"
    assert "nvidia-device-plugin-daemonset-2xk8w" in found[1].detail


def test_a_digest_pin_and_a_mirror_registry_with_a_port():
    ref = "registry.example.com:5000/openshift-mirror/nvidia/k8s/dcgm-exporter@" + DIGEST
    assert oi.parse_image(ref) == ("dcgm-exporter", "", DIGEST)
    assert oi.judge(pinned(dcgm_exporter=DIGEST), "gpu01", [("x", ref)]) == []
    other = oi.judge(pinned(dcgm_exporter=DIGEST), "gpu01", [("x", ref.replace("e374", "0000"))])
    assert [(f.component, f.observed) for f in other] == [("operator_dcgm_exporter", "@sha256:000004194fa2")]
    # A tag pin, an image by digest alone: not the pinned tag (unknown is never good).
    assert [f.observed for f in oi.judge(pinned(dcgm_exporter="4.2.3-4.1.3"), "gpu01", [("x", ref)])] == [
        "@sha256:e37404194fa2"]


def test_unreadable_pods_are_a_probe_where_images_are_pinned():
    found = oi.judge(PINS, "gpu01", None, "kubernetes GET /api/v1/namespaces/gpu-operator/pods: 403 Forbidden")
    assert [(f.cls, f.component, f.observed) for f in found] == [(PROBE, "operator_images", "unreadable")]
    assert "403" in found[0].detail


def test_an_amd_node_is_held_to_the_amd_pins():
    amd = parse_baseline({"name": "mixed", "pin": {"driver": "580.65.06", "amdgpu": "6.12.12"},
                          "nodes": {"mi[01-02]": {"vendor": "amd", "gpus": 8, "product": "AMD Instinct MI300X OAM"},
                                    "gpu[01-02]": {"gpus": 8}},
                          "operator": {"amd_device_plugin": "1.31.0.6", "device_plugin": "v0.17.1"}}, "(test)")
    pods = [("amd-gpu-device-plugin-x", "docker.io/rocm/k8s-device-plugin:1.31.0.5"),
            ("amd-metrics-exporter-y", "docker.io/rocm/device-metrics-exporter:v1.2.0")]
    assert [(f.component, f.observed) for f in oi.judge(amd, "mi01", pods)] == [
        ("operator_amd_device_plugin", "1.31.0.5")]
    # The NVIDIA nodes of the same baseline: held to the NVIDIA pin, not AMD's.
    assert [(f.component, f.observed) for f in oi.judge(amd, "gpu01", PODS[2:3] + pods[:1])] == [
        ("operator_device_plugin", "1.31.0.5")]


def test_image_pins_are_validated(tmp_path):
    text = open(DEMO).read()
    bad = tmp_path / "baseline.toml"
    bad.write_text(text + '\n[operator]\ndevice_plugin = "v0.17.1 latest"\n')
    with pytest.raises(ConfigError, match="device_plugin"):
        load_baseline(str(bad))


@given(st.from_regex(r"v?[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}(-[0-9]\.[0-9]\.[0-9])?", fullmatch=True),
       st.sampled_from(["", "-ubuntu22.04", "-ubi9", "-rhel9.4"]), st.booleans())
def test_a_pinned_tag_matches_with_or_without_v_and_any_os_suffix(version, suffix, v):
    pin = version.lstrip("v")
    tag = ("v" if v else "") + pin + suffix
    assert oi.matches(tag, "", pin) and oi.matches(tag, "", "v" + pin)
    assert not oi.matches(tag, "", pin + "1") and not oi.matches("", "", pin)


def test_no_operator_pod_on_the_node_is_a_probe_where_the_site_says_the_operator_runs_everywhere():
    # A wrong [kubernetes] operator_namespace lists nothing: with [operator] labels = true, a probe.
    strict = replace(PINS, operator=dict(PINS.operator, labels=True))
    found = oi.judge(strict, "gpu01", [])
    assert [(f.cls, f.component, f.observed) for f in found] == [(PROBE, "operator_images", "absent")]
    # Otherwise not held for it: its taint would keep the operator's pods off a node not yet given them.
    assert oi.judge(PINS, "gpu01", []) == []
