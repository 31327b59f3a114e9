"""Clock events judged by time (gpugate.judges.throttle): NVML's cumulative
counters between two health checks, never one sample; counter resets
restart the interval; the finding is budgeted; the simulated NVML answers
the counters under the real field ids; the health check keeps them."""

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import DEMO_BASELINE, gpugate_cmd
from gpugate.vendors.nvidia import nvmlread
from gpugate.model.baseline import load_baseline, parse_baseline
from gpugate.errors import ConfigError
from gpugate.model.facts import GpuFacts, NodeFacts, NvmlFacts, ProbeFailure
from gpugate.model.findings import is_acute
from gpugate.judges import throttle
from gpugate.vendors.nvidia import nvml_sim
from test_node_side import metrics, node_env, run_entry  # noqa: F401  (the fixture)

POLICY = load_baseline(DEMO_BASELINE).health
S = 10 ** 9  # ns per second
US = 10 ** 6


def _gpu(index, counters):
    return GpuFacts(index, "H200", "GPU-%d" % index, "s", "bus", "v", None, True, 0, 0, None, None, (), None,
                    0, True, False, None, 0, clock_event_ns=counters)


def _facts(*counters):
    return NodeFacts(node="n", mode="healthcheck", collected_at=0.0,
                     nvml=NvmlFacts("580", "13.0", len(counters), tuple(_gpu(i, c) for i, c in enumerate(counters))))


def _sample(t_s, **slowed_s):
    out = {"t": int(t_s * US)}
    for name in ("sw_power_cap", "sync_boost", "sw_thermal", "hw_thermal", "power_brake"):
        out[name] = int(slowed_s.get(name, 0) * S)
    return out


def _run(samples, policy=POLICY):
    """Each check's findings for one GPU's sequence of samples."""
    state, seen = None, []
    for sample in samples:
        found, state = throttle.step(state, _facts(sample), policy)
        seen.append(found)
    return seen


def test_one_sample_never_drains_and_a_short_interval_is_not_judged():
    # All of the first minute slowed: still not judged (under clock_event_min_seconds).
    seen = _run([_sample(0), _sample(60, power_brake=60)])
    assert seen == [[], []]


def test_share_of_the_interval_over_the_limit_is_a_budgeted_clocks_finding():
    seen = _run([_sample(0), _sample(600, power_brake=120)])
    (finding,) = seen[1]
    assert (finding.cls, finding.component, finding.gpu) == ("health", "clocks", 0)
    assert finding.observed == "power_brake>=20%" and finding.expected == "<= 10%"
    assert "power_brake 120s slowed in 600s (20%)" in finding.detail
    assert not finding.acute and not is_acute("health", "clocks")


def test_under_the_limit_and_unjudged_reasons_pass():
    assert _run([_sample(0), _sample(600, power_brake=59, sw_power_cap=600, sync_boost=600)])[1] == []


def test_hw_slowdown_is_the_sum_of_its_causes_and_named_only_when_no_cause_is():
    (finding,) = _run([_sample(0), _sample(1000, hw_thermal=80, power_brake=80)])[1]
    assert finding.observed == "hw_slowdown>10%"
    (finding,) = _run([_sample(0), _sample(1000, hw_thermal=200)])[1]
    assert finding.observed == "hw_thermal>=20%"


def test_verdict_stands_until_the_next_interval_is_judged_then_clears():
    seen = _run([_sample(0), _sample(600, power_brake=300), _sample(660, power_brake=300),
                 _sample(1200, power_brake=300)])
    assert [len(s) for s in seen] == [0, 1, 1, 0]


def test_counter_reset_restarts_the_interval_without_alarm():
    # Reboot or driver reload: the counters start again from 0 (a decrease).
    seen = _run([_sample(0, power_brake=5000), _sample(600, power_brake=5000), _sample(1200, power_brake=1),
                 _sample(1800, power_brake=2)])
    assert seen == [[], [], [], []]


def test_clock_stepped_back_restarts_and_unsupported_counters_judge_nothing():
    assert _run([_sample(1000), _sample(10, power_brake=600), _sample(700, power_brake=610)]) == [[], [], []]
    found, state = throttle.step(None, _facts(None), POLICY)
    assert found == [] and state == {"gpus": {}}


def test_unreadable_counters_are_a_probe_finding_and_keep_the_reference():
    state = throttle.step(None, _facts(_sample(0)), POLICY)[1]
    found, kept = throttle.step(state, _facts(ProbeFailure("nvml.clock_event_ns", "nvml", "Unknown", 999)), POLICY)
    assert [(f.cls, f.component) for f in found] == [("probe", "clock_event_ns")]
    assert kept == state
    assert throttle.step(kept, _facts(_sample(600, power_brake=600)), POLICY)[0][0].component == "clocks"


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3600), st.floats(0, 0.0999), st.booleans()), min_size=1, max_size=30))
def test_no_healthy_sequence_drains(steps):
    """Monotone counters under the limit, with resets (reboots) anywhere: no finding."""
    t, slowed, samples = 0.0, 0.0, [_sample(0)]
    for gap, share, reset in steps:
        t += gap
        slowed = 0.0 if reset else slowed + gap * share
        samples.append(_sample(t, power_brake=slowed, hw_thermal=slowed / 2))
    policy = parse_baseline({"pin": {"driver": "1"}, "health": {"clock_event_reasons": ["power_brake"]}}, "b").health
    assert all(s == [] for s in _run(samples, policy))


@pytest.mark.parametrize("health,where", [
    ({"clock_event_share_max": 1.5}, "health.clock_event_share_max"),
    ({"clock_event_min_seconds": 0}, "health.clock_event_min_seconds"),
])
def test_limits_are_validated(health, where):
    with pytest.raises(ConfigError, match=where.replace(".", r"\.")):
        parse_baseline({"pin": {"driver": "1"}, "health": health}, "b.toml")


def test_sim_answers_the_counters_under_the_real_field_ids():
    gpu = {"name": "x", "clock_event_ns": {"power_brake": 7 * S, "hw_thermal": 3, "sw_power_cap": 5}}
    nv = nvml_sim.load({"gpus": [gpu], "clock_offset_s": 100})
    nv.nvmlInit()
    counters = nvmlread._clock_event_ns(nv, nv.nvmlDeviceGetHandleByIndex(0))
    assert counters["power_brake"] == 7 * S and counters["hw_thermal"] == 3 and "sw_thermal" not in counters
    values = nv.nvmlDeviceGetFieldValues(nv.nvmlDeviceGetHandleByIndex(0),
                                         [nv.NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN])
    assert values[0].valueType == nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG and values[0].value.ullVal == 7 * S
    viol = nv.nvmlDeviceGetViolationStatus(nv.nvmlDeviceGetHandleByIndex(0), nv.NVML_PERF_POLICY_POWER)
    assert isinstance(viol, nv.c_nvmlViolationTime_t) and viol.violationTime == 5


def _last(env, node="gpu01"):
    with open("%s/%s/last-healthcheck.json" % (env["state"], node)) as handle:
        return json.load(handle)


def test_health_check_judges_the_time_between_two_checks(node_env):  # noqa: F811
    fleet = node_env["fleet"]
    assert run_entry("healthcheck", node_env).returncode == 0
    gpugate_cmd("sim", "set", fleet, "gpu01", "throttle.power_brake=+40", "clock.advance=600", check=True)
    assert run_entry("healthcheck", node_env).returncode == 0  # 7%: under the limit
    gpugate_cmd("sim", "set", fleet, "gpu01", "gpu.3.throttle.hw_thermal=+300", "clock.advance=600", check=True)
    result = run_entry("healthcheck", node_env)
    assert result.returncode == 1, result.stderr
    last = _last(node_env)
    # 600 s of NVML's clock and the wall time between the two runs.
    assert re.match(r"gpugate: health clocks:gpu3=hw_thermal>=(50|40)% \(want <= 10%\)", last["reason"])
    assert last["clocks"]["gpus"]
    m = metrics(node_env["prom"])
    assert m[("gpugate_clock_event_over", (("reason", "hw_thermal"),))] == 1
    assert 0.49 < m[("gpugate_clock_event_share", (("reason", "hw_thermal"),))] <= 0.5
    assert m[("gpugate_clock_event_over", (("reason", "power_brake"),))] == 0
    # A reboot zeroes NVML's counters: the interval restarts, no alarm.
    gpugate_cmd("sim", "set", fleet, "gpu01", "reboot=1", check=True)
    gpugate_cmd("sim", "set", fleet, "gpu01", "clock.advance=600", check=True)
    assert run_entry("healthcheck", node_env).returncode == 0


def test_an_nvml_binding_without_the_counters_is_unchecked_never_silent():
    """nvidia-ml-py before 12.575 names no NVML_FI_DEV_CLOCKS_EVENT_REASON_*
    (setup.cfg allows 12.535): clock events cannot be judged by time there,
    and that is said (an unchecked fact), never a probe finding, never silence."""
    from gpugate.vendors.nvidia.probe_nvml import facts_of

    gpu = {"name": "x", "clock_event_ns": {"power_brake": 7 * S, "hw_thermal": 3}}
    for state, words in (({"gpus": [gpu], "binding": "12.535.161"}, "nvidia-ml-py 12.575"),
                         ({"gpus": [{"name": "x", "clock_event_ns": None}]}, "not supported")):
        nv = nvml_sim.load(state)
        nv.nvmlInit()
        got = facts_of(nvmlread._clock_event_ns(nv, nv.nvmlDeviceGetHandleByIndex(0)))  # the reader's stand-in
        assert isinstance(got, ProbeFailure) and got.kind == "unchecked" and words in got.detail, got
    reference = throttle.step(None, _facts(_sample(0)), POLICY)[1]
    found, kept = throttle.step(reference, _facts(got), POLICY)
    assert found == [] and kept == reference  # no probe finding; the reference waits for counters
    from gpugate.model.facts import unchecked_facts

    listed = dict(unchecked_facts(_facts(_sample(0), got)))
    assert listed["clock_events"].startswith("gpu1: this GPU or driver counts no clock event")


def test_check_and_metrics_list_clock_events_unchecked_on_an_old_binding(node_env):  # noqa: F811
    from test_check_sim import check

    fleet = node_env["fleet"]
    gpugate_cmd("sim", "set", fleet, "gpu01", "nvml.binding=12.535.161", check=True)
    data = check(fleet)
    assert data["fit"] is True, data["reason"]
    unchecked = {u["fact"]: u["why"] for u in data["unchecked"]}
    assert "no clock-event counter" in unchecked["clock_events"], data["unchecked"]
    shown = gpugate_cmd("check", "--sim", fleet, "--node", "gpu01", "--baseline", DEMO_BASELINE).stdout
    assert "unchecked clock_events: gpu0: this nvidia-ml-py names no clock-event counter" in shown, shown
    assert run_entry("healthcheck", node_env).returncode == 0
    m = metrics(node_env["prom"])
    assert m[("gpugate_fact_unchecked", (("fact", "clock_events"),))] == 1


def test_the_audit_says_where_clock_events_are_unchecked():
    from gpugate.model.facts import to_jsonable
    from gpugate.fleet.audit import PINNED, UNCHECKED, UNREADABLE, fold

    old = ProbeFailure("nvml", "unchecked", "this nvidia-ml-py names no clock-event counter")
    facts = {"gpu01": to_jsonable(_facts(_sample(0), _sample(0))),
             "gpu02": to_jsonable(_facts(_sample(0), old)),
             "gpu03": to_jsonable(_facts(ProbeFailure("nvml.clock_event_ns", "nvml", "Unknown", 999))),
             "gpu04": {"nvml": {"gpus": [{"name": "H100"}]}}}  # facts from before the counters: no row
    rows = {(r.value, r.nodes, r.status) for r in fold(facts).rows if r.component == "clock_events"}
    assert rows == {("counted", ("gpu01",), PINNED), ("(unchecked)", ("gpu02",), UNCHECKED),
                    ("(unreadable: nvml)", ("gpu03",), UNREADABLE)}
