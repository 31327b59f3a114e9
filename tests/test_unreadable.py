"""Issue 12 item 6: unknown is never shown as good.  A component gpugate
could not read is `unreadable` in the node textfile, the audit and the fleet
metrics, never "matches pin"; `gpugate metrics` with a bad baseline exits 2.
Simulated nodes (NVML and tools replayed) run the production probes."""

import os
from gpugate.core.record import replace
from types import SimpleNamespace

import pytest
from hypothesis import given, settings as hsettings, strategies as st
from prometheus_client.parser import text_string_to_metric_families

from conftest import DEMO_BASELINE, gpugate_cmd
from gpugate.model.baseline import load_baseline
from gpugate.model.baseline_keys import PIN_COMPONENTS
from gpugate.model.facts import UNCHECKED, ProbeFailure, to_jsonable
from gpugate.model.findings import CHECK_CLASSES
from gpugate.fleet.audit import DRIFT, STATUSES, UNCHECKED as AUDIT_UNCHECKED, UNREADABLE, fold
from gpugate.fleet.metrics import fleet_families
from gpugate.node.metrics import MATCHES, SERVICE_STATES, UNREADABLE as NODE_UNREADABLE, component_states, node_families
from gpugate.core.promtext import render
from gpugate.node.check import run_check

BASELINE = load_baseline(DEMO_BASELINE)
COMPONENTS = set(PIN_COMPONENTS) | {"vbios"}
NVML_COMPONENTS = {"driver", "cuda_driver", "gsp_firmware", "vbios"}


def sim(fleet, *args):
    result = gpugate_cmd("sim", *args[:1], fleet, *args[1:])
    assert result.returncode == 0, result.stderr


def check(settings_for, fleet, node="gpu01", **extra):
    return run_check(settings_for(fleet, **extra), BASELINE, node, "healthcheck")


def textfile(result, node="gpu01"):
    """The node's textfile, read back with Prometheus' own parser (a format
    error raises): name -> {component: value}."""
    text = render(node_families(node, result.verdict, result.facts, BASELINE))
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = dict(sample.labels)
            if sample.name == "gpugate_service":  # per daemon, in fixed states: (service, state) -> 0/1
                assert labels["service"] in ("fabricmanager", "persistenced") and labels["state"] in SERVICE_STATES
                out.setdefault(sample.name, {})[(labels["service"], labels["state"])] = sample.value
                continue
            if sample.name == "gpugate_lock_stuck_seconds":  # per lock, not per component (gpugate.safety.lock)
                assert set(labels) == {"lock"}
                continue
            assert set(labels) <= {"component", "class"}
            assert labels.get("component", "vbios") in COMPONENTS  # a fixed set
            assert labels.get("class", "drift") in CHECK_CLASSES
            out.setdefault(sample.name, {})[labels.get("component")] = sample.value
    return out


def test_healthy_node_every_pinned_component_matches_and_is_read(fleet, settings_for):
    m = textfile(check(settings_for, fleet))
    pinned = {c for c in PIN_COMPONENTS if BASELINE.pin.get(c)} | {"vbios"}
    assert m["gpugate_component_matches_pin"] == {c: 1 for c in pinned}
    assert m["gpugate_component_unreadable"] == {c: 0 for c in pinned}
    assert m["gpugate_component_unchecked"] == {c: 0 for c in pinned}


def test_nvml_error_18_is_unreadable_for_every_nvml_component_never_a_match(fleet, settings_for):
    """What was seen: NVML failing with error 18 and matches_pin 1 for driver,
    cuda_driver, gsp and vbios."""
    sim(fleet, "set", "gpu01", "nvml.init_error=18")
    result = check(settings_for, fleet)
    m = textfile(result)
    for c in NVML_COMPONENTS:
        assert (m["gpugate_component_matches_pin"][c], m["gpugate_component_unreadable"][c]) == (0, 1), c
    assert m["gpugate_component_matches_pin"]["kernel"] == 1  # still read: still shown
    audit = fold({"gpu01": to_jsonable(result.facts)}, BASELINE)
    status = {r.component: r.status for r in audit.rows}
    assert {status[c] for c in NVML_COMPONENTS} == {UNREADABLE}  # vbios and gsp rows too, not left out


@pytest.mark.parametrize("function, component", [
    ("nvmlDeviceGetVbiosVersion", "vbios"),
    ("nvmlDeviceGetGspFirmwareVersion", "gsp_firmware"),
    ("nvmlDeviceGetName", "vbios"),  # without the product, no VBIOS pin applies
])
def test_one_gpu_unreadable_makes_its_per_gpu_component_unreadable(fleet, settings_for, function, component):
    sim(fleet, "set", "gpu01", "gpu.5.nvml_error.%s=999" % function)
    result = check(settings_for, fleet)
    m = textfile(result)
    assert m["gpugate_component_unreadable"][component] == 1
    assert m["gpugate_component_matches_pin"][component] == 0
    audit = fold({"gpu01": to_jsonable(result.facts)}, BASELINE)
    assert UNREADABLE in {r.status for r in audit.rows if r.component == component}


@pytest.mark.parametrize("how", ["fails", "missing", "garbage"])
def test_a_failing_or_missing_tool_is_unreadable(fleet, settings_for, tmp_path, how):
    if how == "missing":
        os.unlink(os.path.join(fleet, "gpu01", "bin", "dcgmi"))
    else:
        out = tmp_path / "out"
        out.write_text("Error: unable to establish a connection to the host engine\n" if how == "fails"
                       else "dcgmi what\n")
        sim(fleet, "replay", "gpu01", "--stdout-file", str(out), "--exit-code", "255" if how == "fails" else "0",
            "--", "dcgmi", "--version")
    result = check(settings_for, fleet)
    assert [f.cls for f in result.verdict.findings if f.component == "dcgm"] == ["probe"]
    m = textfile(result)
    assert (m["gpugate_component_matches_pin"]["dcgm"], m["gpugate_component_unreadable"]["dcgm"]) == (0, 1)
    rows = [r for r in fold({"gpu01": to_jsonable(result.facts)}, BASELINE).rows if r.component == "dcgm"]
    assert [r.status for r in rows] == [UNREADABLE]


def test_a_tool_timing_out_is_unreadable(fleet, settings_for):
    sim(fleet, "replay", "gpu01", "--hang", "--", "dpkg-query", "-W", "*")
    from gpugate.probes import Budget

    result = run_check(settings_for(fleet), BASELINE, "gpu01", "healthcheck", budget=Budget(3.0))
    m = textfile(result)
    for c in ("container_toolkit", "fabricmanager"):
        assert (m["gpugate_component_matches_pin"][c], m["gpugate_component_unreadable"][c]) == (0, 1), c
    rows = fold({"gpu01": to_jsonable(result.facts)}, BASELINE).rows
    assert {r.status for r in rows if r.component in ("container_toolkit", "fabricmanager")} == {UNREADABLE}


def test_drift_is_a_read_value_that_differs(fleet, settings_for):
    sim(fleet, "set", "gpu01", "driver=550.54.15")
    m = textfile(check(settings_for, fleet))
    assert (m["gpugate_component_matches_pin"]["driver"], m["gpugate_component_unreadable"]["driver"]) == (0, 0)


def test_package_manager_none_is_unchecked_in_the_check_the_textfile_and_the_audit(fleet, settings_for):
    base = settings_for(fleet)
    result = check(settings_for, fleet, packages=dict(base.packages, manager="none"))
    assert result.verdict.fit, result.verdict.findings  # not "absent" drift
    m = textfile(result)
    for c in ("container_toolkit", "fabricmanager"):
        assert m["gpugate_component_unchecked"][c] == 1
        assert m["gpugate_component_matches_pin"][c] == 0 and m["gpugate_component_unreadable"][c] == 0
    audit = fold({"gpu01": to_jsonable(result.facts)}, BASELINE)
    rows = {(r.component, r.value, r.status) for r in audit.rows if r.component in ("container_toolkit",
                                                                                      "fabricmanager")}
    assert rows == {("container_toolkit", "(unchecked)", AUDIT_UNCHECKED),
                    ("fabricmanager", "(unchecked)", AUDIT_UNCHECKED)}
    assert not audit.drift


# --------------------------------------------------------------------------
# The property: whatever facts fail, a failed fact is never "matches".

_HEALTHY = {}


def _healthy(tmp_path_factory):
    if not _HEALTHY:
        fleet = str(tmp_path_factory.mktemp("prop") / "fleet")
        gpugate_cmd("sim", "init", fleet, "--nodes", "gpu01", "--baseline", DEMO_BASELINE, check=True)
        from gpugate.model.config import parse_settings

        settings = replace(parse_settings({}, "(test)"), sim_fleet=fleet, baseline=DEMO_BASELINE)
        _HEALTHY["facts"] = run_check(settings, BASELINE, "gpu01", "healthcheck").facts
    return _HEALTHY["facts"]


_FAIL = ProbeFailure("test", "error", "injected")
_NODE_FIELDS = {"kernel_release": "kernel", "image": "image", "dcgm_version": "dcgm"}


@hsettings(max_examples=200, deadline=None)
@given(node_fields=st.sets(st.sampled_from(sorted(_NODE_FIELDS))),
       nvml_fails=st.booleans(),
       gpu_fields=st.sets(st.tuples(st.integers(0, 7), st.sampled_from(["vbios", "gsp_firmware", "name"]))),
       packages=st.sampled_from(["ok", "whole", "toolkit", "fm", "unchecked"]))
def test_a_failed_fact_is_never_a_match(tmp_path_factory, node_fields, nvml_fails, gpu_fields, packages):
    facts = _healthy(tmp_path_factory)
    changes = {f: _FAIL for f in node_fields}
    expected_bad = {_NODE_FIELDS[f] for f in node_fields}
    if nvml_fails:
        changes["nvml"] = ProbeFailure("nvml", "nvml", "mismatch", 18)
        expected_bad |= NVML_COMPONENTS
    elif gpu_fields:
        gpus = list(facts.nvml.gpus)
        for index, field in gpu_fields:
            gpus[index] = replace(gpus[index], **{field: _FAIL})
            expected_bad.add("vbios" if field == "name" else field)
        changes["nvml"] = replace(facts.nvml, gpus=tuple(gpus))
    pk = dict(facts.packages)
    if packages == "whole":
        changes["packages"] = ProbeFailure("packages", "timeout")
        expected_bad |= {"container_toolkit", "fabricmanager"}
    elif packages in ("toolkit", "fm"):
        role = "container_toolkit" if packages == "toolkit" else "fabricmanager"
        pk[role] = _FAIL
        changes["packages"] = pk
        expected_bad.add(role)
    elif packages == "unchecked":
        changes["packages"] = {r: ProbeFailure("packages", UNCHECKED) for r in pk}
    broken = replace(facts, **changes)
    from gpugate.judges import judge
    from gpugate.model.verdict import decide

    verdict = decide(judge(BASELINE, broken), "gpugate:")
    states = component_states(verdict, broken, BASELINE, BASELINE.expect_for("gpu01"))
    assert {c for c, s in states.items() if s == NODE_UNREADABLE} == expected_bad
    assert all(states[c] != MATCHES for c in expected_bad)
    if packages == "unchecked":
        assert states["container_toolkit"] == states["fabricmanager"] == "unchecked"
    render(node_families("gpu01", verdict, broken, BASELINE))  # renders whatever failed


# --------------------------------------------------------------------------
# The controller: fleet metrics and `gpugate metrics`.

def _json_facts(driver="580.65.06", nvml_error=None, dcgm="4.2.3", packages=None):
    gpus = [{"name": "NVIDIA H100 80GB HBM3", "vbios": "96.00.99.00.01", "gsp_firmware": driver}] * 8
    nvml = ({"error": {"kind": "nvml", "code": nvml_error}} if nvml_error else
            {"driver_version": driver, "cuda_driver_version": "13.0", "gpus": gpus})
    return {"kernel_release": "6.1.0-27-amd64", "module_resident": driver, "dcgm_version": dcgm,
            "image": {"version": "gpu-2026.11.1"}, "nvml": nvml,
            "packages": packages or {
                "container_toolkit": {"name": "nvidia-container-toolkit", "version": "1.17.8"},
                "fabricmanager": {"name": "nvidia-fabricmanager-580", "version": "580.65.06"}}}


def _fleet_samples(fleet_facts):
    snapshot = SimpleNamespace(nodes={})
    text = render(fleet_families(snapshot, {}, {"at": 1.0, "facts": fleet_facts}, BASELINE))
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_fleet_metrics_count_unreadable_and_unchecked_apart_from_pinned_and_drift():
    unchecked = {r: {"error": {"kind": "unchecked"}} for r in ("container_toolkit", "fabricmanager")}
    fleet_facts = {"gpu01": _json_facts(), "gpu02": _json_facts(nvml_error=18),
                   "gpu03": _json_facts(driver="550.54.15"),
                   "gpu04": _json_facts(dcgm={"error": {"kind": "timeout"}}, packages=unchecked),
                   "gpu05": "ssh: no route to host"}
    m = _fleet_samples(fleet_facts)

    def count(component, state):
        return m[("gpugate_audit_component_nodes", (("component", component), ("state", state)))]

    assert [count("driver", s) for s in ("pinned", "drift", "unreadable")] == [2, 1, 1]
    assert [count("vbios", s) for s in ("pinned", "unreadable")] == [3, 1]
    assert [count("dcgm", s) for s in ("pinned", "unreadable")] == [3, 1]
    assert [count("container_toolkit", s) for s in ("pinned", "unchecked", "drift")] == [3, 1, 0]
    assert m[("gpugate_audit_drift_nodes", (("component", "driver"),))] == 1  # the existing name still works
    assert m[("gpugate_audit_unreachable_nodes", ())] == 1
    for component in ("driver", "vbios", "gsp_firmware", "dcgm", "kernel"):
        # Every reachable node is counted once per component, in one state.
        assert sum(count(component, s.lower()) for s in STATUSES) == 4, component


@hsettings(max_examples=100, deadline=None)
@given(st.dictionaries(st.from_regex(r"n[0-9]{1,3}", fullmatch=True),
                       st.tuples(st.sampled_from(["580.65.06", "550.54.15", None]),
                                 st.sampled_from(["4.2.3", "3.3.5", "timeout"])), max_size=40))
def test_fleet_states_partition_the_reachable_nodes(spec):
    fleet_facts = {n: _json_facts(driver=d or "580.65.06", nvml_error=None if d else 18,
                                  dcgm={"error": {"kind": "timeout"}} if v == "timeout" else v)
                   for n, (d, v) in spec.items()}
    m = _fleet_samples(fleet_facts)
    for component in ("driver", "gsp_firmware", "vbios", "dcgm"):
        by_state = {s: m[("gpugate_audit_component_nodes", (("component", component), ("state", s.lower())))]
                    for s in STATUSES}
        assert sum(by_state.values()) == len(spec)
        assert by_state["pinned"] <= len(spec) - by_state["unreadable"]
    assert m[("gpugate_audit_component_nodes", (("component", "driver"), ("state", "unreadable")))] == \
        sum(1 for d, _ in spec.values() if d is None)
    assert m[("gpugate_audit_drift_nodes", (("component", "driver"),))] == \
        m[("gpugate_audit_component_nodes", (("component", "driver"), ("state", DRIFT.lower())))]


def test_metrics_with_a_bad_baseline_exits_2_and_leaves_the_textfile_as_it_was(tmp_path):
    bad = tmp_path / "baseline.toml"
    bad.write_text('[pin]\ndriver = "580.65.06"\nfabricmanager = "575.1.1"\n')
    prom = tmp_path / "out" / "gpugate_fleet.prom"
    prom.parent.mkdir()
    prom.write_text("# the previous run's exposition\n")
    config = tmp_path / "gpugate.toml"
    # No Slurm there: reaching it would be exit 3, not 2.
    config.write_text('baseline = "%s"\n[slurm]\nbin_dir = "%s/no-slurm"\n'
                      '[sweep]\njournal = "%s/sweep.db"\n' % (bad, tmp_path, tmp_path))
    result = gpugate_cmd("metrics", "--config", str(config), "-o", str(prom))
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert str(bad) in result.stderr and "pin.fabricmanager" in result.stderr
    assert prom.read_text() == "# the previous run's exposition\n"
    assert os.listdir(prom.parent) == ["gpugate_fleet.prom"]
    assert result.stdout == ""
