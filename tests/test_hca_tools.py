"""HCAs and IMEX around the judges: the audit and metrics per HCA, baseline
capture, and the simulated nodes' sysfs tree, keys and nvidia-imex-ctl."""

import os

from gpugate.model.facts import to_jsonable
from gpugate.judges import judge
from gpugate.probes.ib import read_hcas

from test_hca import _baseline, _facts, _ibstat_root, _sysfs_root


def test_audit_shows_hca_firmware_per_type_like_vbios(tmp_path):
    from gpugate.core.record import replace

    from gpugate.fleet.audit import fold, to_text

    hcas = read_hcas(_sysfs_root(tmp_path))
    flashed = (replace(hcas[0], fw_ver="28.39.1002"),) + hcas[1:]
    fleet = {"gpu01": to_jsonable(_facts(hcas)), "gpu02": to_jsonable(_facts(flashed)),
             "gpu03": to_jsonable(_facts(()))}
    audit = fold(fleet, _baseline(pin={"hca_firmware": {"MT4129": "28.41.1000"}}))
    rows = [(r.product, r.value, r.nodes, r.status) for r in audit.rows if r.component == "hca_firmware"]
    assert rows == [("MT4129", "28.41.1000", ("gpu01", "gpu02"), "pinned"),
                    ("MT4129", "28.39.1002", ("gpu02",), "DRIFT"),
                    ("MT41692", "32.38.3056", ("gpu01", "gpu02"), "unpinned")]
    assert "hca_firmware [MT4129]" in to_text(audit)

def test_node_metrics_per_hca_port(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    from gpugate.node.metrics import hca_families
    from gpugate.core.promtext import render

    hcas = read_hcas(_ibstat_root(tmp_path, "h100-roce400-cx7-2ports-down-disabled"))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(render(hca_families(_facts(hcas)))) for s in fam.samples}
    assert samples[("gpugate_ib_port_up", (("device", "mlx5_5"), ("port", "1")))] == 0
    assert samples[("gpugate_ib_port_up", (("device", "mlx5_0"), ("port", "1")))] == 1
    assert samples[("gpugate_ib_port_rate_gbps", (("device", "mlx5_1"), ("port", "1")))] == 100
    assert hca_families(_facts(None)) == []
    text = render(hca_families(_facts(read_hcas(_sysfs_root(tmp_path / "s")))))
    assert 'gpugate_ib_port_errors_total{counter="link_downed",device="mlx5_1",port="1"} 255' in text

def _sim_fleet(tmp_path, nodes, baseline_text):
    """A simulated fleet made with this baseline (`gpugate sim init`)."""
    from conftest import gpugate_cmd

    base = tmp_path / "baseline.toml"
    base.write_text('[pin]\ndriver = "580.65.06"\n' + baseline_text)
    fleet = str(tmp_path / "fleet")
    assert gpugate_cmd("sim", "init", fleet, "--nodes", nodes, "--baseline", str(base)).returncode == 0
    return fleet

def test_simulated_imex_members_only(tmp_path):
    import json

    from conftest import gpugate_cmd

    fleet = _sim_fleet(tmp_path, "gpu[01-03]", '[nodes."gpu[01-03]"]\ngpus = 8\n[nodes."gpu[01-02]"]\nimex = true\n')
    assert gpugate_cmd("sim", "set", fleet, "gpu01", "imex.domain=DOWN", "imex.peer.10.0.0.2=unavailable").returncode == 0
    assert gpugate_cmd("sim", "set", fleet, "gpu02", "imex.installed=0").returncode == 0
    bad = gpugate_cmd("sim", "set", fleet, "gpu03", "imex.domain=DOWN")
    assert bad.returncode == 2 and "not an IMEX member" in bad.stderr

    def check(node):
        out = gpugate_cmd("check", "--sim", fleet, "--node", node, "--json")
        return json.loads(out.stdout)

    one = check("gpu01")
    assert [(f["class"], f["component"], f["observed"]) for f in one["findings"]] == [
        ("health", "imex_domain", "DOWN")]
    assert "10.0.0.2 UNAVAILABLE" in one["findings"][0]["detail"]
    assert one["reason"] == "gpugate: health imex_domain=DOWN (want UP)"
    assert [(f["class"], f["component"]) for f in check("gpu02")["findings"]] == [("probe", "imex")]
    three = check("gpu03")  # not a member: never asked, no tool installed
    assert three["fit"] and three["facts"]["imex"] is None and three["facts"]["hcas"] == []
    assert not os.path.exists(os.path.join(fleet, "gpu03", "bin", "nvidia-imex-ctl"))

def test_simulated_hca_keys_change_the_sysfs_tree(tmp_path):
    import json

    from conftest import gpugate_cmd

    fleet = _sim_fleet(tmp_path, "gpu01", '[pin.hca_firmware]\nMT4129 = "28.41.1000"\n[nodes."gpu01"]\n'
                       'gpus = 8\nhca = { count = 8, types = ["MT4129"], rate = 400 }\n')
    healthy = json.loads(gpugate_cmd("check", "--sim", fleet, "--node", "gpu01", "--json").stdout)
    assert healthy["fit"] and len(healthy["facts"]["hcas"]) == 9
    assert gpugate_cmd("sim", "set", fleet, "gpu01", "ib.mlx5_0.gone=1", "ib.mlx5_1.rate=200",
                       "ib.mlx5_4.fw=28.39.1002").returncode == 0
    bad = gpugate_cmd("sim", "set", fleet, "gpu01", "ib.mlx5_77.state=DOWN")
    assert bad.returncode == 2 and "no HCA 'mlx5_77'" in bad.stderr
    root = os.path.join(fleet, "gpu01", "root", "sys", "class", "infiniband")
    assert not os.path.exists(os.path.join(root, "mlx5_0"))
    with open(os.path.join(root, "mlx5_1", "ports", "1", "rate")) as handle:
        assert handle.read() == "200 Gb/sec (4X HDR)\n"
    found = json.loads(gpugate_cmd("check", "--sim", fleet, "--node", "gpu01", "--json").stdout)["findings"]
    assert sorted((f["component"], f["observed"]) for f in found) == [
        ("hca_count", "7"), ("hca_firmware", "MT4129 28.39.1002"), ("hca_rate", "mlx5_1/1 200Gb/s")]

def test_simulated_converge_flashes_the_pinned_hca_firmware():
    from gpugate.sim import fleet as simfleet

    base = _baseline({"count": 8, "types": ["MT4129"]}, pin={"hca_firmware": {"MT4129": "28.41.1000"}})
    model = simfleet.new_model("gpu01", base)
    model["ib"][0]["fw_ver"] = "28.39.1002"
    model["ib"][1]["ports"][0]["state"] = "1: DOWN"
    simfleet.converge(model, base)
    assert {h["fw_ver"] for h in model["ib"] if h["hca_type"] == "MT4129"} == {"28.41.1000"}
    assert model["ib"][1]["ports"][0]["state"] == "1: DOWN"  # a link fault is not software

def test_capture_pins_hca_firmware_and_the_fabric(tmp_path):
    from gpugate.model.baseline import parse_baseline as parse
    from gpugate.fleet.capture import capture

    try:
        import tomllib as toml
    except ImportError:
        import tomli as toml

    hcas = read_hcas(_ibstat_root(tmp_path, "h100-roce400-cx7-2ports-down-disabled"))
    facts = to_jsonable(_facts(hcas))
    facts["nvml"] = {"driver_version": "580.65.06", "cuda_driver_version": "13.0", "gpu_count": 8, "gpus": []}
    b = parse(toml.loads(capture("gpu01", facts, "captured")), "captured")
    assert b.pin.hca_firmware == {"MT4125": "22.39.1002", "MT4129": "28.39.1002"}
    # The eight ConnectX-7 are the fabric, at the rate of those up: the two down are findings, not the norm.
    assert b.expect_for("gpu01").hca == {"count": 8, "types": ("MT4129",), "rate": 400.0, "link_layer": "Ethernet"}
    assert [f.component for f in judge(b, _facts(hcas))] == ["hca_port", "hca_port"]
