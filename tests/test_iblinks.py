"""InfiniBand links over time (gpugate.judges.iblinks): flaps (link_downed
rising, a port back up) stay for a window; error counters judged per hour;
resets and wraps restart without alarm; property tests over counter
sequences (monotone, reset, wrap): no healthy sequence drains."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpugate.model.baseline import parse_baseline
from gpugate.errors import ConfigError
from gpugate.model.facts import NodeFacts
from gpugate.model.findings import is_acute
from gpugate.judges import iblinks
from gpugate.model.toolfacts import Hca, HcaPort

POLICY = parse_baseline({"pin": {"driver": "1"}}, "b").health


def _facts(counters, state="ACTIVE", boot="b1", at=0.0):
    phys = "LinkUp" if state == "ACTIVE" else "Disabled"
    port = HcaPort(port=1, state=state, phys_state=phys, rate=400.0, link_layer="InfiniBand", counters=dict(counters))
    return NodeFacts(node="gpu01", mode="healthcheck", collected_at=at, boot_id=boot,
                     hcas=(Hca(name="mlx5_0", hca_type="MT4129", fw_ver="28.41.1000", ports=(port,)),))


def _run(samples, policy=POLICY):
    """samples: (at, counters[, state[, boot]]) -> each check's findings."""
    state, seen = None, []
    for sample in samples:
        at, counters = sample[0], sample[1]
        facts = _facts(counters, *(sample[2:] or ("ACTIVE",)), at=at) if len(sample) < 4 else \
            _facts(counters, sample[2], sample[3], at=at)
        found, state = iblinks.step(state, facts, policy, at)
        seen.append(found)
    return seen


def test_defaults_follow_nvsentinel_and_are_validated():
    assert POLICY.ib_error_rate_max["symbol_error"] == 120 and POLICY.ib_flap_window_seconds == 3600
    assert POLICY.ib_counter_max == {}  # a burst in one check is judged by its rate
    b = parse_baseline({"pin": {"driver": "1"}, "health": {"ib_error_rate_max": {"symbol_error": 10}}}, "b")
    assert b.health.ib_error_rate_max["symbol_error"] == 10 and b.health.ib_error_rate_max["port_rcv_errors"] == 120
    with pytest.raises(ConfigError, match=r"ib_error_rate_max\.symbol_errors: unknown IB error counter"):
        parse_baseline({"pin": {"driver": "1"}, "health": {"ib_error_rate_max": {"symbol_errors": 1}}}, "b")
    with pytest.raises(ConfigError, match=r"health\.ib_flap_window_seconds"):
        parse_baseline({"pin": {"driver": "1"}, "health": {"ib_flap_window_seconds": -1}}, "b")


def test_link_downed_rise_is_a_flap_that_stays_until_it_ages_out():
    seen = _run([(0, {"link_downed": 3}), (300, {"link_downed": 4}), (600, {"link_downed": 4}),
                 (3800, {"link_downed": 4}), (3950, {"link_downed": 4})])
    assert [[f.observed for f in s] for s in seen] == [[], ["mlx5_0/1 1 flap"], ["mlx5_0/1 1 flap"],
                                                       ["mlx5_0/1 1 flap"], []]
    flap = seen[1][0]
    assert (flap.cls, flap.component, flap.expected) == ("health", "ib_flap", "none within 3600s")
    assert "link_downed +1" in flap.detail and not flap.acute and not is_acute("health", "ib_flap")


def test_a_port_back_up_after_being_up_is_a_flap_and_one_never_up_is_not():
    seen = _run([(0, {}, "DOWN"), (300, {}, "ACTIVE")])  # up for the first time (a slow subnet manager)
    assert seen == [[], []]
    seen = _run([(0, {}, "ACTIVE"), (300, {}, "DOWN"), (600, {}, "ACTIVE")])
    assert seen[1] == [] and [f.observed for f in seen[2]] == ["mlx5_0/1 1 flap"]
    assert "came back up" in seen[2][0].detail


def test_flaps_count_within_the_window_and_a_new_boot_forgets_them():
    seen = _run([(0, {"link_downed": 0}), (300, {"link_downed": 1}), (600, {"link_downed": 3}),
                 (900, {"link_downed": 0}, "ACTIVE", "b2")])
    assert [f.observed for f in seen[2]] == ["mlx5_0/1 2 flaps"] and seen[3] == []


def test_error_rate_per_hour():
    # 100 symbol errors in 20 minutes: under an hour's allowance (120), not judged yet.
    seen = _run([(0, {"symbol_error": 0}), (1200, {"symbol_error": 100}), (3600, {"symbol_error": 110})])
    assert seen == [[], [], []]
    # A burst that spends the hour's allowance at once is judged at once (acute, the node's own counters).
    (finding,) = _run([(0, {"symbol_error": 5}), (300, {"symbol_error": 505})])[1]
    assert (finding.component, finding.observed, finding.expected, finding.acute) == (
        "ib_errors", "mlx5_0/1 symbol_error over its rate", "<= 120 per hour", True)
    assert finding.detail == "symbol_error +500 within 1h"
    # 400 over 3 hours is 133/hour.
    (finding,) = _run([(0, {"symbol_error": 0}), (3 * 3600, {"symbol_error": 400})])[1]
    assert finding.detail == "symbol_error +400 in 3.0h"
    assert _run([(0, {"symbol_error": 0}), (3 * 3600, {"symbol_error": 350})])[1] == []


def test_rate_verdict_stands_until_the_next_interval_is_judged():
    seen = _run([(0, {"symbol_error": 0}), (3600, {"symbol_error": 200}), (4000, {"symbol_error": 200}),
                 (7300, {"symbol_error": 210})])
    assert [len(s) for s in seen] == [0, 1, 1, 0]


def test_reset_and_wrap_restart_without_alarm():
    seen = _run([(0, {"symbol_error": 60000, "link_downed": 250}), (300, {"symbol_error": 3, "link_downed": 1}),
                 (600, {"symbol_error": 4, "link_downed": 1})])
    assert seen == [[], [], []]


# -- properties over counter sequences ------------------------------------------------

WIDTH = {"symbol_error": 2 ** 16, "link_downed": 2 ** 8, "port_rcv_errors": 2 ** 16}


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2 ** 16 - 1),
       st.lists(st.tuples(st.integers(60, 7200), st.floats(0, 0.9), st.sampled_from(["up", "reset", "wrap", "reboot"])),
                min_size=1, max_size=40))
def test_no_healthy_sequence_drains(start, steps):
    """Error counters growing under their hourly limit, link_downed never
    rising, with resets, wraps and reboots anywhere: no finding, ever."""
    at, boot, value, link_downed, samples = 0.0, 0, start, 7, []
    samples.append((at, {"symbol_error": value, "port_rcv_errors": value, "link_downed": 7}, "ACTIVE", "b0"))
    for gap, share, event in steps:
        at += gap
        grown = int(120 * share * gap / 3600)  # under 120 per hour
        if event == "reset":
            value = 0
        elif event == "wrap":
            value = (value + grown) % WIDTH["symbol_error"]
        elif event == "reboot":
            boot, value = boot + 1, grown
        else:
            value = value + grown
        link_downed = 0 if event in ("reset", "reboot") else link_downed
        samples.append((at, {"symbol_error": value, "port_rcv_errors": value, "link_downed": link_downed},
                        "ACTIVE", "b%d" % boot))
    assert all(s == [] for s in _run(samples))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2 ** 8 - 1), st.integers(60, 2400)), min_size=2, max_size=20))
def test_a_flap_finding_exactly_while_a_link_downed_rise_is_within_the_window(steps):
    """A finding at a check if and only if link_downed rose at some check
    less than ib_flap_window_seconds before it (both halves: a rise is a
    flap, and no finding without one in the window); it counts at least
    the rises within the window."""
    window, times, at = POLICY.ib_flap_window_seconds, [], 0.0
    for _, gap in steps:
        times.append(at)
        at += gap
    values = [v for v, _ in steps]
    seen = _run([(t, {"link_downed": v}) for t, v in zip(times, values)])
    assert seen[0] == []
    for i in range(1, len(values)):
        rises = [k for k in range(1, i + 1) if values[k] > values[k - 1] and times[i] - times[k] < window]
        assert bool(seen[i]) == bool(rises), (i, rises, seen[i])
        if rises:
            (finding,) = seen[i]
            assert finding.component == "ib_flap" and int(finding.observed.split()[1]) >= len(rises)


# -- the health check, on a simulated node with a real NDR400 capture's HCAs -------------

HCA = '\n[nodes."gpu[01-99]".hca]\ncount = 8\ntypes = ["MT4129"]\nrate = 400\nlink_layer = "InfiniBand"\n'


def test_health_check_sees_a_flap_and_an_error_burst_and_keeps_its_window(tmp_path):
    import json

    from conftest import DEMO_BASELINE, gpugate_cmd
    from test_node_side import run_entry

    baseline = tmp_path / "baseline-ib.toml"
    baseline.write_text(open(DEMO_BASELINE).read() + HCA)
    fleet = str(tmp_path / "fleet")
    gpugate_cmd("sim", "init", fleet, "--nodes", "gpu01", "--baseline", str(baseline), check=True)
    config = tmp_path / "gpugate.toml"
    config.write_text('baseline = "%s"\nstate_dir = "%s/state/{node}"\nlog = "file"\n[healthcheck]\n'
                      'boot_grace_seconds = 0\n[drain_budget]\njitter_seconds = 0\n[sim]\nfleet = "%s"\n'
                      '[slurm]\nbin_dir = "%s/no-slurm"\n' % (baseline, tmp_path, fleet, tmp_path))
    env = {"config": str(config)}

    def last():
        with open(str(tmp_path / "state" / "gpu01" / "last-healthcheck.json")) as handle:
            return json.load(handle)

    assert run_entry("healthcheck", env).returncode == 0
    # Noise: 60 symbol errors in minutes is half an hour's allowance.
    gpugate_cmd("sim", "set", fleet, "gpu01", "ib.mlx5_7.counter.symbol_error=+60", check=True)
    assert run_entry("healthcheck", env).returncode == 0
    gpugate_cmd("sim", "set", fleet, "gpu01", "ib.mlx5_4.counter.link_downed=+1", check=True)
    assert run_entry("healthcheck", env).returncode == 1
    assert last()["reason"].startswith("gpugate: health ib_flap=mlx5_4/1 1 flap (want none within 3600s)")
    assert run_entry("healthcheck", env).returncode == 1  # the window stays
    assert last()["ib_links"]["flaps"]["mlx5_4/1"]["why"] == "link_downed +1"
