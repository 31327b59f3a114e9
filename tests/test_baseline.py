"""Baseline and gpugate.toml loading: valid files load; anything else is a
ConfigError naming the file, the key path and what is allowed."""

import os
import pytest
from hypothesis import given, settings, strategies as st

from conftest import DEMO_BASELINE, EXAMPLE_BASELINE
from gpugate.model.baseline import load_baseline, parse_baseline
from gpugate.model.config import load_settings, parse_settings
from gpugate.errors import ConfigError


def test_example_baseline_loads():
    b = load_baseline(EXAMPLE_BASELINE)
    assert b.pin.driver == "580.65.06" and b.pin.gsp_firmware == "580.65.06"
    assert b.pin.vbios == {"NVIDIA H100 80GB HBM3": "96.00.99.00.01"}
    assert b.previous.driver == "570.133.20" and b.rollout_in_progress is False
    e = b.expect_for("gpu017")
    assert (e.gpus, e.nvswitch, e.mig, e.persistence) == (8, True, False, True)
    assert b.expect_for("login01").gpus is None
    assert b.health.xid_action(79) == "reboot" and b.health.xid_action(48) == "reset_gpu"


def test_later_nodeset_overrides_earlier():
    b = parse_baseline({"pin": {"driver": "1.0"}, "nodes": {
        "gpu[01-10]": {"gpus": 8, "mig": False}, "gpu[09-10]": {"mig": True}}}, "b.toml")
    assert (b.expect_for("gpu09").gpus, b.expect_for("gpu09").mig) == (8, True)
    assert b.expect_for("gpu01").mig is False


@pytest.mark.parametrize("data,where,what", [
    ({}, "pin", "required key is missing"),
    ({"pin": {"driver": 580}}, "pin.driver", "expected a string"),
    ({"pin": {"driver": "580", "colour": "red"}}, "pin.colour", "unknown key"),
    ({"pin": {"driver": "580", "fabricmanager": "570"}}, "pin.fabricmanager", "must equal pin.driver"),
    ({"pin": {"driver": "5 80"}}, "pin.driver", "version string"),
    ({"pin": {"driver": "1"}, "nodes": {"gpu[01-": {"gpus": 8}}}, 'nodes."gpu[01-"', "hostlist"),
    ({"pin": {"driver": "1"}, "nodes": {"gpu01": {"gpus": "8"}}}, "nodes.gpu01.gpus", "expected an integer"),
    ({"pin": {"driver": "1"}, "health": {"pcie_min_width": "wide"}}, "health.pcie_min_width", "'max'"),
    ({"pin": {"driver": "1"}, "health": {"clock_event_reasons": ["hot"]}}, "health.clock_event_reasons[0]",
     "one of"),
    ({"pin": {"driver": "1"}, "health": {"dcgm_diag": {"verify": 9}}}, "health.dcgm_diag.verify", "from 0 to 4"),
    ({"pin": {"driver": "1"}, "rollout": {"in_progress": True}}, "rollout.in_progress", "previous"),
])
def test_invalid_baseline_names_file_key_and_allowed(data, where, what):
    with pytest.raises(ConfigError) as info:
        parse_baseline(data, "/etc/gpugate/baseline.toml")
    message = str(info.value)
    assert message.startswith("/etc/gpugate/baseline.toml: ")
    assert where in message and what in message


def test_unparseable_and_missing_files(tmp_path):
    bad = tmp_path / "b.toml"
    bad.write_text("[pin\ndriver = 1")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_baseline(str(bad))
    with pytest.raises(ConfigError, match="not found"):
        load_baseline(str(tmp_path / "none.toml"))
    bad.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="UTF-8"):
        load_baseline(str(bad))


def test_settings_defaults_and_errors(tmp_path):
    s = parse_settings({}, "x")
    assert s.budgets["healthcheck"] < 60 and s.reason_tag == "gpugate:"
    assert s.state_dir("gpu01") == "/var/lib/gpugate"
    s = parse_settings({"state_dir": "/tmp/st/{node}"}, "x")
    assert s.state_dir("gpu01") == "/tmp/st/gpu01"
    for data, where in [({"state_dir": "relative"}, "state_dir"), ({"budgets": {"healthcheck": -1}}, "budgets.healthcheck"),
                        ({"commands": {"rm": "/bin/rm"}}, "commands.rm"), ({"reason_tag": "has space"}, "reason_tag"),
                        ({"slurm": {"backend": "rest"}}, "slurm.backend"),
                        ({"slurm": {"backend": "PySlurm"}}, "slurm.backend")]:
        with pytest.raises(ConfigError, match=where.replace(".", r"\.")):
            parse_settings(data, "gpugate.toml")


def test_config_owned_by_others_is_refused(tmp_path):
    path = tmp_path / "gpugate.toml"
    path.write_text("log = 'file'\n")
    path.chmod(0o666)
    with pytest.raises(ConfigError, match="not writable by group or others"):
        load_settings(str(path))
    path.chmod(0o644)
    assert load_settings(str(path)).log == "file"


toml_values = st.recursive(
    st.one_of(st.booleans(), st.integers(-10**20, 10**20), st.floats(allow_nan=True), st.text(max_size=20)),
    lambda children: st.one_of(st.lists(children, max_size=4),
                               st.dictionaries(st.text(max_size=12), children, max_size=4)),
    max_leaves=25)
keys = st.sampled_from(["pin", "previous", "rollout", "nodes", "health", "name", "driver", "gpus", "dcgm_diag",
                        "vbios", "xid_actions", "gpu[01-02]", "in_progress"])
structured = st.recursive(toml_values, lambda c: st.dictionaries(keys, c, max_size=5), max_leaves=30)


@settings(max_examples=150, deadline=None)  # test_fuzz.py covers the documents further
@given(st.dictionaries(keys, structured, max_size=6))
def test_arbitrary_structures_give_a_baseline_or_config_error(data):
    try:
        parse_baseline(data, "fuzz.toml")
    except ConfigError as exc:
        assert str(exc).startswith("fuzz.toml: ")
    try:
        parse_settings(data, "fuzz.toml")
    except ConfigError as exc:
        assert str(exc).startswith("fuzz.toml: ")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_gives_a_baseline_or_config_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("fuzz") / "baseline.toml"
    path.write_text(text)
    os.utime(str(path), (1, 1))  # settled: load_toml waits on a file written this instant
    try:
        load_baseline(str(path))
    except ConfigError as exc:
        assert str(exc).startswith(str(path))


def test_demo_baseline_matches_example_but_for_node_names():
    demo = load_baseline(DEMO_BASELINE)
    example = load_baseline(EXAMPLE_BASELINE)
    assert demo.pin == example.pin and demo.health == example.health
    assert demo.expect_for("gpu01") == example.expect_for("gpu001")
