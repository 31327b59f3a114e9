"""`gpugate baseline capture` and `gpugate baseline diff` (issue 5, part 3)."""

import copy
import json
import os
import subprocess
import sys
from gpugate.core.record import asdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpugate.model.baseline import load_baseline, parse_baseline
from gpugate.model.baseline_keys import PIN_COMPONENTS
from gpugate.errors import ConfigError
from gpugate.fleet.capture import capture
from gpugate.fleet.review import diff, diff_text

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO_BASELINE = os.path.join(ROOT, "gpugate", "data", "demo-baseline.toml")
H100 = "NVIDIA H100 80GB HBM3"


def gpugate(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "gpugate"] + list(args), capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def sim_fleet(tmp_path, nodes):
    path = str(tmp_path / "fleet")
    result = gpugate("sim", "init", path, "--nodes", nodes, "--baseline", DEMO_BASELINE)
    assert result.returncode == 0, result.stderr
    return path


def check_json(fleet, node, baseline):
    result = gpugate("check", "--sim", fleet, "--node", node, "--baseline", baseline, "--json")
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


def load_text(text, source="(test)"):
    return parse_baseline(tomllib.loads(text), source)


# ---------------------------------------------------------------------------
# capture from a simulated node


def test_capture_from_healthy_sim_node(tmp_path):
    fleet = sim_fleet(tmp_path, "gpu[01-02]")
    out = str(tmp_path / "captured.toml")
    result = gpugate("baseline", "capture", "--node", "gpu01", "--sim", fleet, "--output", out,
                     "--name", "captured-test")
    assert result.returncode == 0, result.stderr
    with open(out) as handle:
        text = handle.read()
    assert text.startswith("# gpugate baseline captured from node gpu01")
    assert "No [health] section" in text
    assert "[health]\n" not in text

    captured = load_baseline(out)
    demo = load_baseline(DEMO_BASELINE)
    assert captured.name == "captured-test"
    for component in PIN_COMPONENTS:
        if demo.pin.get(component) is not None:
            assert captured.pin.get(component) == demo.pin.get(component), component
    assert dict(captured.pin.vbios) == dict(demo.pin.vbios)
    assert "gsp_firmware = " not in text  # it equals the driver: the default says so
    assert asdict(captured.expect_for("gpu01")) == {"gpus": 8, "product": H100, "nvswitch": True,
                                                    "mig": False, "persistence": True, "ecc": True,
                                                    "compute_mode": "default", "power_limit_watts": 700,
                                                    "hca": None, "imex": None}
    assert captured.previous is None and captured.rollout_in_progress is False
    assert captured.health == parse_baseline({"pin": {"driver": "1"}}, "defaults").health

    # The node it was captured from is fit under it ...
    verdict = check_json(fleet, "gpu01", out)
    assert verdict["fit"] is True, verdict["reason"]
    # ... and a node drifted off its driver is not.
    result = gpugate("sim", "set", fleet, "gpu02", "driver=550.54.15")
    assert result.returncode == 0, result.stderr
    verdict = check_json(fleet, "gpu02", out)
    assert verdict["fit"] is False
    assert verdict["class"] == "drift"
    assert "driver=550.54.15 (want 580.65.06)" in verdict["reason"]


def test_capture_prints_toml_and_refuses_to_overwrite(tmp_path):
    fleet = sim_fleet(tmp_path, "gpu01")
    printed = gpugate("baseline", "capture", "--node", "gpu01", "--sim", fleet)
    assert printed.returncode == 0, printed.stderr
    assert load_text(printed.stdout).pin.driver == "580.65.06"
    assert load_text(printed.stdout).name.startswith("captured-gpu01-")

    out = tmp_path / "b.toml"
    out.write_text("keep me\n")
    refused = gpugate("baseline", "capture", "--node", "gpu01", "--sim", fleet, "--output", str(out))
    assert refused.returncode == 2
    assert "exists" in refused.stderr and "--force" in refused.stderr
    assert out.read_text() == "keep me\n"
    forced = gpugate("baseline", "capture", "--node", "gpu01", "--sim", fleet, "--output", str(out), "--force")
    assert forced.returncode == 0, forced.stderr
    assert load_baseline(str(out)).pin.driver == "580.65.06"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".b.toml")] == []  # no temporary left


def test_capture_refuses_gpus_disagreeing_on_vbios(tmp_path):
    fleet = sim_fleet(tmp_path, "gpu01")
    result = gpugate("sim", "set", fleet, "gpu01", "gpu.3.vbios=96.00.74.00.01")
    assert result.returncode == 0, result.stderr
    out = tmp_path / "b.toml"
    result = gpugate("baseline", "capture", "--node", "gpu01", "--sim", fleet, "--output", str(out))
    assert result.returncode == 2
    assert "disagree on the VBIOS" in result.stderr
    assert "gpu3=96.00.74.00.01" in result.stderr and "96.00.99.00.01" in result.stderr
    assert "not a good reference" in result.stderr
    assert not out.exists()


def test_capture_unknown_sim_node_is_a_config_error(tmp_path):
    fleet = sim_fleet(tmp_path, "gpu01")
    result = gpugate("baseline", "capture", "--node", "gpu09", "--sim", fleet)
    assert result.returncode == 2
    assert "gpu09" in result.stderr


# ---------------------------------------------------------------------------
# capture from facts dicts


def synthetic_facts(node="gpu01", kernel="6.1.0-27-amd64", driver="580.65.06", cuda="13.0", gsp=None,
                    fabricmanager="580.65.06", toolkit="1.17.8", dcgm="4.2.3", image="gpu-2026.11.1",
                    vbios=None, per_product=2, nvswitches=4, mig=False, persistence=True):
    """The JSON form of NodeFacts, the fields capture reads."""
    vbios = {H100: "96.00.99.00.01"} if vbios is None else vbios
    gpus = []
    for product, version in vbios.items():
        for _ in range(per_product):
            gpus.append({"index": len(gpus), "name": product, "vbios": version,
                         "gsp_firmware": driver if gsp is None else gsp,
                         "persistence_mode": persistence, "mig_enabled": mig})
    packages = {"container_toolkit": {"name": "nvidia-container-toolkit", "version": toolkit, "held": True},
                "fabricmanager": ({"name": "nvidia-fabricmanager-580", "version": fabricmanager, "held": True}
                                  if fabricmanager else None)}
    return {"node": node, "mode": "healthcheck", "collected_at": 1795312018.0, "kernel_release": kernel,
            "image": {"version": image, "built": "2026-11-01"}, "pci_gpus": len(gpus),
            "pci_nvswitches": nvswitches, "packages": packages, "dcgm_version": dcgm,
            "nvml": {"driver_version": driver, "cuda_driver_version": cuda, "gpu_count": len(gpus), "gpus": gpus}}


def _error(source, kind, code=None):
    return {"error": {"source": source, "kind": kind, "detail": "", "code": code}}


def test_capture_leaves_out_unreadable_facts_with_a_comment():
    facts = synthetic_facts(fabricmanager=None, nvswitches=0)
    facts["dcgm_version"] = _error("dcgmi", "missing")
    facts["image"] = _error("/etc/cluster-image.json", "missing")
    facts["nvml"]["gpus"][1]["mig_enabled"] = None
    text = capture("gpu01", facts, "n")
    assert "# dcgm: not captured (dcgmi missing)" in text
    assert "# fabricmanager: not captured (not installed)" in text
    assert "# image: not captured (/etc/cluster-image.json missing)" in text
    b = load_text(text)
    assert b.pin.dcgm is None and b.pin.image is None and b.pin.fabricmanager is None
    assert b.pin.driver == "580.65.06" and b.pin.container_toolkit == "1.17.8"
    expect = b.expect_for("gpu01")
    assert expect.nvswitch is False and expect.mig is None and expect.gpus == 2


def test_capture_nvml_failure_has_no_driver_to_pin():
    facts = synthetic_facts()
    facts["nvml"] = _error("nvml", "nvml", code=9)
    with pytest.raises(ConfigError, match="no driver version to pin"):
        capture("gpu01", facts, "n")


def test_capture_pins_gsp_only_when_it_differs_and_mixed_products():
    facts = synthetic_facts(gsp="580.65.07", vbios={H100: "96.00.99.00.01", "NVIDIA A100-SXM4-80GB": "92.00.45.00.06"})
    facts["nvml"]["gpus"][0]["mig_enabled"] = True
    b = load_text(capture("gpu01", facts, "n"))
    assert b.pin.gsp_firmware == "580.65.07"
    assert dict(b.pin.vbios) == {H100: "96.00.99.00.01", "NVIDIA A100-SXM4-80GB": "92.00.45.00.06"}
    expect = b.expect_for("gpu01")
    assert expect.product is None and expect.gpus == 4 and expect.mig is True and expect.persistence is True


def test_capture_refuses_a_fabricmanager_off_the_driver():
    with pytest.raises(ConfigError, match="fabricmanager 575.51.03 differs from driver 580.65.06"):
        capture("gpu01", synthetic_facts(fabricmanager="575.51.03"), "n")


def test_capture_refuses_disagreeing_vbios_naming_the_gpus():
    facts = synthetic_facts(per_product=4)
    facts["nvml"]["gpus"][2]["vbios"] = "96.00.74.00.01"
    with pytest.raises(ConfigError) as exc:
        capture("gpu01", facts, "n")
    assert "gpu2=96.00.74.00.01" in str(exc.value) and "gpu0,1,3=96.00.99.00.01" in str(exc.value)


versions = st.from_regex(r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}", fullmatch=True)
products = st.text(min_size=1, max_size=24).filter(lambda s: s.strip() == s and s)


@settings(max_examples=100, deadline=None)
@given(kernel=versions, driver=versions, cuda=versions, gsp=st.one_of(st.none(), versions), toolkit=versions,
       dcgm=versions, image=versions, vbios=st.dictionaries(products, versions, min_size=1, max_size=3),
       name=st.text(max_size=30), per_product=st.integers(1, 4))
def test_capture_round_trips_pins(kernel, driver, cuda, gsp, toolkit, dcgm, image, vbios, name, per_product):
    facts = synthetic_facts(kernel=kernel, driver=driver, cuda=cuda, gsp=gsp, fabricmanager=driver,
                            toolkit=toolkit, dcgm=dcgm, image=image, vbios=vbios, per_product=per_product)
    b = load_text(capture("gpu01", facts, name))
    assert b.name == name
    assert (b.pin.kernel, b.pin.driver, b.pin.cuda_driver, b.pin.fabricmanager, b.pin.container_toolkit,
            b.pin.dcgm, b.pin.image) == (kernel, driver, cuda, driver, toolkit, dcgm, image)
    assert b.pin.gsp_firmware == (gsp or driver)
    assert dict(b.pin.vbios) == vbios
    expect = b.expect_for("gpu01")
    assert expect.gpus == per_product * len(vbios)
    assert expect.product == (next(iter(vbios)) if len(vbios) == 1 else None)


# ---------------------------------------------------------------------------
# diff


def _demo_text():
    with open(DEMO_BASELINE) as handle:
        return handle.read()


def changed_baseline(driver="590.10.01"):
    """The demo baseline with driver + fabricmanager moved, a nodeset added
    and one health key changed."""
    text = _demo_text()
    text = text.replace('driver = "580.65.06"', 'driver = "%s"' % driver)
    text = text.replace('fabricmanager = "580.65.06"', 'fabricmanager = "%s"' % driver)
    text = text.replace("xid_window_seconds = 86400", "xid_window_seconds = 3600")
    text = text.replace("# [nodes.\"gpu[120-128]\"]", "[nodes.\"gpu[100-107]\"]\ngpus = 4\nmig = true\n# x")
    return load_text(text, "new.toml")


@pytest.fixture(scope="module")
def audit_fleet(tmp_path_factory):
    """Facts of a 3-node simulated fleet where gpu03 runs another driver
    (as `gpugate facts --json` prints them), and one unreachable node."""
    tmp = tmp_path_factory.mktemp("audit")
    fleet = sim_fleet(tmp, "gpu[01-03]")
    result = gpugate("sim", "set", fleet, "gpu03", "driver=550.54.15")
    assert result.returncode == 0, result.stderr
    config = tmp / "gpugate.toml"
    config.write_text('baseline = "%s"\n' % DEMO_BASELINE)
    out = {}
    for node in ("gpu01", "gpu02", "gpu03"):
        result = gpugate("facts", "--config", str(config), "--sim", fleet, "--node", node, "--json")
        assert result.returncode == 0, result.stderr
        out[node] = json.loads(result.stdout)["facts"]
    out["gpu04"] = "ssh: connect to host gpu04 port 22: Connection timed out"
    return out


def test_diff_lists_every_change():
    old, new = load_baseline(DEMO_BASELINE), changed_baseline()
    d = diff(old, new, None)
    assert d["pin"] == [
        {"component": "driver", "old": "580.65.06", "new": "590.10.01"},
        {"component": "gsp_firmware", "old": "580.65.06", "new": "590.10.01", "note": "follows the driver"},
        {"component": "fabricmanager", "old": "580.65.06", "new": "590.10.01"},
    ]
    assert d["previous"] == []
    assert d["rollout"] == {"old": False, "new": False}
    assert d["nodesets"] == [{"nodes": "gpu[100-107]", "change": "added", "old": None,
                              "new": {"gpus": 4, "mig": True}}]
    assert d["health"] == [{"key": "xid_window_seconds", "old": 86400.0, "new": 3600.0}]
    assert d["would_drift"] is None and d["would_drift_now"] is None and d["unreachable"] is None
    json.dumps(d)  # JSON as it is


def test_diff_of_identical_baselines_is_empty(audit_fleet):
    old = load_baseline(DEMO_BASELINE)
    d = diff(old, old, audit_fleet)
    assert d["pin"] == d["previous"] == d["nodesets"] == d["health"] == []
    assert d["would_drift"] == d["would_drift_now"]
    assert diff_text(d).startswith("The two baselines are the same.")


def test_diff_vbios_previous_rollout_and_removed_nodeset():
    old = load_baseline(DEMO_BASELINE)
    text = _demo_text().replace('"NVIDIA H100 80GB HBM3" = "96.00.99.00.01"',
                                '"NVIDIA H100 80GB HBM3" = "96.00.A0.00.01"\n"NVIDIA H200" = "97.00.01.00.01"')
    text = text.replace('dcgm = "4.1.1"', 'dcgm = "4.1.2"').replace("in_progress = false", "in_progress = true")
    text = text.replace('[nodes."gpu[01-99]"]', '[nodes."gpu[01-50]"]')
    text = text.replace('"120" = "reboot"', '"120" = "rma"')
    new = load_text(text)
    d = diff(old, new, None)
    assert d["pin"] == [{"component": "vbios[NVIDIA H100 80GB HBM3]", "old": "96.00.99.00.01", "new": "96.00.A0.00.01"},
                        {"component": "vbios[NVIDIA H200]", "old": None, "new": "97.00.01.00.01"}]
    assert d["previous"] == [{"component": "dcgm", "old": "4.1.1", "new": "4.1.2"}]
    assert d["rollout"] == {"old": False, "new": True}
    shape = {"gpus": 8, "product": H100, "nvswitch": True, "mig": False, "persistence": True,
             "ecc": True, "compute_mode": "default", "power_limit_watts": 700}
    assert d["nodesets"] == [{"nodes": "gpu[01-99]", "change": "removed", "old": shape, "new": None},
                             {"nodes": "gpu[01-50]", "change": "added", "old": None, "new": shape}]
    assert d["health"] == [{"key": "xid_actions.120", "old": "reboot", "new": "rma"}]
    text = diff_text(d)
    assert "pin.vbios[NVIDIA H200]" in text and "(none) -> 97.00.01.00.01" in text
    assert "rollout.in_progress" in text and "false -> true" in text
    assert 'nodes."gpu[01-99]"' in text and "removed" in text


@pytest.mark.parametrize("driver, would, now", [
    # Every node leaves the pin: gpu03 was already off it.
    ("590.10.01",
     {"driver": (3, "gpu[01-03]"), "module": (3, "gpu[01-03]"), "fabricmanager": (3, "gpu[01-03]"),
      "gsp_firmware": (3, "gpu[01-03]")},
     {"driver": (1, "gpu03"), "module": (1, "gpu03"), "gsp_firmware": (1, "gpu03")}),
    # Pinning gpu03's driver: gpu[01-02] drift on it, and all three on Fabric Manager
    # (gpu03's is still 580.65.06).
    ("550.54.15",
     {"driver": (2, "gpu[01-02]"), "module": (2, "gpu[01-02]"), "fabricmanager": (3, "gpu[01-03]"),
      "gsp_firmware": (2, "gpu[01-02]")},
     {"driver": (1, "gpu03"), "module": (1, "gpu03"), "gsp_firmware": (1, "gpu03")}),
])
def test_diff_predicts_drift(audit_fleet, driver, would, now):
    old, new = load_baseline(DEMO_BASELINE), changed_baseline(driver)
    d = diff(old, new, audit_fleet)
    assert {c: (v["count"], v["nodes"]) for c, v in d["would_drift"].items()} == would
    assert {c: (v["count"], v["nodes"]) for c, v in d["would_drift_now"].items()} == now
    assert d["would_drift_total"] == {"count": 3, "nodes": "gpu[01-03]"}
    assert d["would_drift_now_total"] == {"count": 1, "nodes": "gpu03"}
    assert d["unreachable"] == "gpu04"
    text = diff_text(d)
    assert "pin.driver" in text and "580.65.06 -> %s" % driver in text
    assert "Under the new baseline 3 nodes would drift:" in text
    assert "(now: 1 node drifts under the old baseline)" in text
    assert "Unreachable in the latest audit (not predicted): gpu04" in text
    lines = text.splitlines()
    start = lines.index("Under the new baseline 3 nodes would drift:")
    assert lines[start + 1].split() == ["driver", str(would["driver"][0]), would["driver"][1]]


def test_diff_rollout_makes_previous_pending_not_drift(audit_fleet):
    """gpu03 on the [previous] driver is pending, not drift, while a rollout is in progress."""
    text = _demo_text().replace('driver = "570.133.20"', 'driver = "550.54.15"')
    text = text.replace('fabricmanager = "570.133.20"', 'fabricmanager = "550.54.15"')
    old = load_text(text)
    new = load_text(text.replace("in_progress = false", "in_progress = true"))
    d = diff(old, new, audit_fleet)
    assert d["rollout"] == {"old": False, "new": True}
    assert "driver" not in d["would_drift"] and "gsp_firmware" not in d["would_drift"]
    assert d["would_drift_now"]["driver"] == {"count": 1, "nodes": "gpu03"}


# ---------------------------------------------------------------------------
# `gpugate baseline diff`


def _write_pair(tmp_path, driver="590.10.01"):
    old = tmp_path / "old.toml"
    old.write_text(_demo_text())
    new = tmp_path / "new.toml"
    new.write_text(_demo_text().replace("580.65.06", driver))
    return str(old), str(new)


def test_cli_diff_with_audit_file(tmp_path, audit_fleet):
    old, new = _write_pair(tmp_path)
    audit = tmp_path / "audit.json"
    audit.write_text(json.dumps({"at": 1795312018.0, "baseline": old, "facts": audit_fleet}))
    result = gpugate("baseline", "diff", old, new, "--audit", str(audit), "--json")
    assert result.returncode == 0, result.stderr
    d = json.loads(result.stdout)
    assert d["would_drift"]["driver"] == {"count": 3, "nodes": "gpu[01-03]"}
    assert d["would_drift_now"]["driver"] == {"count": 1, "nodes": "gpu03"}
    assert d["unreachable"] == "gpu04"
    assert d["audit"]["nodes"] == 4
    result = gpugate("baseline", "diff", old, new, "--audit", str(audit))
    assert result.returncode == 0, result.stderr
    assert "pin.driver" in result.stdout and "580.65.06 -> 590.10.01" in result.stdout
    assert "Under the new baseline 3 nodes would drift:" in result.stdout
    assert "(now: 1 node drifts under the old baseline)" in result.stdout


def test_cli_diff_default_audit_next_to_the_journal(tmp_path, audit_fleet):
    old, new = _write_pair(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    config = tmp_path / "gpugate.toml"
    config.write_text('[sweep]\njournal = "%s/sweep.db"\n' % state)
    result = gpugate("baseline", "diff", old, new, "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert "no audit yet: run gpugate audit" in result.stdout
    assert "would drift" not in result.stdout
    assert "pin.driver" in result.stdout
    as_json = json.loads(gpugate("baseline", "diff", old, new, "--config", str(config), "--json").stdout)
    assert as_json["audit"] is None and as_json["would_drift"] is None

    (state / "audit.json").write_text(json.dumps({"at": 1795312018.0, "baseline": old, "facts": audit_fleet}))
    result = gpugate("baseline", "diff", old, new, "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert "Under the new baseline 3 nodes would drift:" in result.stdout
    assert str(state / "audit.json") in result.stdout


def test_cli_diff_errors_exit_2(tmp_path):
    old, new = _write_pair(tmp_path)
    bad = tmp_path / "bad.toml"
    bad.write_text(_demo_text().replace('fabricmanager = "580.65.06"', 'fabricmanager = "575.1.1"'))
    result = gpugate("baseline", "diff", old, str(bad), "--audit", str(tmp_path / "none.json"))
    assert result.returncode == 2
    assert "pin.fabricmanager: must equal pin.driver" in result.stderr
    result = gpugate("baseline", "diff", old, new, "--audit", str(tmp_path / "none.json"))
    assert result.returncode == 2 and "no such audit file" in result.stderr
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    result = gpugate("baseline", "diff", old, new, "--audit", str(garbage))
    assert result.returncode == 2 and "cannot read the audit" in result.stderr


def test_capture_of_a_deep_copy_does_not_touch_the_facts():
    facts = synthetic_facts()
    before = copy.deepcopy(facts)
    capture("gpu01", facts, "n")
    assert facts == before
