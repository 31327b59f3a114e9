"""InfiniBand/RoCE HCAs and IMEX: parsers (real captures), the probe on a
real sysfs capture, the judges (nodeset, history, counter deltas).  The
audit, metrics, capture and simulated nodes: test_hca_tools.py."""

import os
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpugate.model.baseline import parse_baseline
from gpugate.errors import ParseError
from gpugate.model.facts import NodeFacts, from_jsonable, to_jsonable
from gpugate.model.findings import is_acute
from gpugate.judges import judge
from gpugate.judges import hca
from gpugate.parsers import ib as ibparse
from gpugate.parsers import imex as imexparse
from gpugate.probes.ib import read_hcas
from gpugate.sim.ib import rate_text
from gpugate.model.toolfacts import Hca, HcaPort

from conftest import SAMPLES

SYSFS = os.path.join(SAMPLES, "sysfs-class-infiniband-h100-ndr400-FIXTURE-gpud", "sys-class-infiniband-h100.0")
IBSTAT = {name: os.path.join(SAMPLES, "ibstat-%s-gpud.txt" % name) for name in
          ("a100-roce200-fw28.37-all-active", "h100-ib-ndr400-cx7-fw28.41-all-active",
           "h100-roce400-cx7-2ports-down-disabled")}
IMEX = os.path.join(SAMPLES, "nvidia-imex-ctl-q-N-s-1node-gh200-imex570-domain-up.txt")


def _baseline(hca_table=None, imex_member=False, pin=None):
    data = {"pin": dict({"driver": "580.65.06"}, **(pin or {})), "nodes": {"gpu[01-04]": {"gpus": 8}}}
    if hca_table:
        data["nodes"]["gpu[01-04]"]["hca"] = hca_table
    if imex_member:
        data["nodes"]["gpu[01-04]"]["imex"] = True
    return parse_baseline(data, "test")


def _facts(hcas, boot_id="b1", imex_status=None):
    return NodeFacts(node="gpu01", mode="healthcheck", collected_at=0.0, boot_id=boot_id, hcas=hcas,
                     imex=imex_status)


# -- parsers, from real lines ------------------------------------------------

@pytest.mark.parametrize("text,want", [
    ("4: ACTIVE", "ACTIVE"), ("1: DOWN", "DOWN"), ("2: INIT", "INIT"), ("3: ARMED", "ARMED"),
    ("5: LinkUp", "LinkUp"), ("3: Disabled", "Disabled"), ("2: Polling", "Polling"),
    ("4: PortConfigurationTraining", "PortConfigurationTraining"), ("4: ACTIVE\n", "ACTIVE"),
])
def test_port_state_values(text, want):
    assert ibparse.parse_numbered(text, "state") == want


# The kernel prints "<Gb/s> Gb/sec (<width>X<speed>)", SDR without a speed name.
@pytest.mark.parametrize("text,want", [
    ("400 Gb/sec (4X NDR)", 400.0), ("200 Gb/sec (2X NDR)", 200.0), ("200 Gb/sec (4X HDR)", 200.0),
    ("100 Gb/sec (4X EDR)", 100.0), ("56 Gb/sec (4X FDR)", 56.0), ("2.5 Gb/sec (1X)", 2.5),
    ("10 Gb/sec (4X)", 10.0), ("40 Gb/sec (4X QDR)", 40.0),
])
def test_rate_values(text, want):
    assert ibparse.parse_rate(text) == want


@pytest.mark.parametrize("text", ["", "ACTIVE", "4 ACTIVE", ": ACTIVE"])
def test_bad_state_is_a_parse_error(text):
    with pytest.raises(ParseError):
        ibparse.parse_numbered(text, "state")


@pytest.mark.parametrize("name,count,down", [
    ("a100-roce200-fw28.37-all-active", 9, []),
    ("h100-ib-ndr400-cx7-fw28.41-all-active", 9, []),
    ("h100-roce400-cx7-2ports-down-disabled", 12, ["mlx5_11", "mlx5_5"]),
])
def test_ibstat_samples(name, count, down):
    cas = ibparse.parse_ibstat(open(IBSTAT[name]).read())
    assert len(cas) == count
    assert [c["name"] for c in cas if c["ports"][0]["state"] != "ACTIVE"] == down
    for c in cas:
        if c["name"] in down:
            assert (c["ports"][0]["phys_state"], c["ports"][0]["rate"]) == ("Disabled", 40.0)


def test_imex_sample():
    text = open(IMEX).read()
    assert imexparse.parse_domain(text) == ("UP", (("10.136.206.48", "READY"),))
    assert imexparse.parse_query("READY\n") == "READY"
    # The same output with the domain down and the peer unreachable.
    down = text.replace("Domain State: UP", "Domain State: DOWN").replace("- READY\n", "- UNAVAILABLE\n")
    assert imexparse.parse_domain(down) == ("DOWN", (("10.136.206.48", "UNAVAILABLE"),))
    with pytest.raises(ParseError):
        imexparse.parse_domain("Nodes:\nNode #0   - 10.0.0.1   - READY\n")


# -- the probe on real sysfs trees -------------------------------------------

def _sysfs_root(tmp_path, source=SYSFS):
    root = str(tmp_path / "root")
    shutil.copytree(source, os.path.join(root, "sys/class/infiniband"))
    return root


def _ibstat_root(tmp_path, name):
    """The sysfs tree an ibstat capture implies (the kernel's formats)."""
    root = tmp_path / "root"
    for ca in ibparse.parse_ibstat(open(IBSTAT[name]).read()):
        base = root / "sys/class/infiniband" / ca["name"]
        base.mkdir(parents=True)
        (base / "hca_type").write_text(ca["hca_type"] + "\n")
        (base / "fw_ver").write_text(ca["fw_ver"] + "\n")
        for p in ca["ports"]:
            port = base / "ports" / str(p["port"])
            port.mkdir(parents=True)
            (port / "state").write_text("%d: %s\n" % (ibparse.STATE_NUMBERS[p["state"]], p["state"]))
            (port / "phys_state").write_text("%d: %s\n" % (ibparse.PHYS_NUMBERS[p["phys_state"]], p["phys_state"]))
            (port / "rate").write_text(rate_text(p["rate"]) + "\n")
            (port / "link_layer").write_text(p["link_layer"] + "\n")
    return str(root)


def test_probe_reads_the_real_sysfs_capture(tmp_path):
    hcas = read_hcas(_sysfs_root(tmp_path))
    assert [h.name for h in hcas] == ["mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8",
                                      "mlx5_9", "mlx5_bond_0"]
    by = {h.name: h for h in hcas}
    assert (by["mlx5_0"].hca_type, by["mlx5_0"].fw_ver, by["mlx5_0"].board_id) == ("MT4129", "28.41.1000",
                                                                                    "MT_0000000838")
    port = by["mlx5_1"].ports[0]
    assert (port.state, port.phys_state, port.rate, port.link_layer) == ("ACTIVE", "LinkUp", 400.0, "InfiniBand")
    assert port.counters["link_downed"] == 255 and port.counters["port_rcv_errors"] == 14
    bond = by["mlx5_bond_0"]
    assert (bond.hca_type, bond.ports[0].rate, bond.ports[0].link_layer) == ("MT41692", 200.0, "Ethernet")
    # The facts survive the JSON round trip the state file and the audit use.
    facts = _facts(hcas)
    assert from_jsonable(to_jsonable(facts)).hcas == hcas


def test_no_infiniband_directory_is_zero_hcas_and_unreadable_files_are_probe_findings(tmp_path):
    assert read_hcas(str(tmp_path)) == ()
    root = _sysfs_root(tmp_path)
    os.unlink(os.path.join(root, "sys/class/infiniband/mlx5_4/ports/1/state"))
    with open(os.path.join(root, "sys/class/infiniband/mlx5_5/ports/1/rate"), "w") as handle:
        handle.write("garbage\n")
    hcas = read_hcas(root)
    base = _baseline({"count": 8, "types": ["MT4129"], "rate": 400})
    found = judge(base, _facts(hcas))
    probes = [f for f in found if f.component == "hca"]
    # The missing state, and the rate the nodeset pins that cannot be parsed: never taken for the right one.
    assert [f.cls for f in probes] == ["probe", "probe"]
    assert "mlx5_4" in probes[0].detail and "garbage" in probes[1].detail
    assert not any(f.component == "hca_rate" for f in found)


def test_nodeset_judges_the_roce_capture_with_two_ports_down(tmp_path):
    hcas = read_hcas(_ibstat_root(tmp_path, "h100-roce400-cx7-2ports-down-disabled"))
    base = _baseline({"count": 8, "types": ["MT4129"], "rate": 400, "link_layer": "Ethernet"})
    found = judge(base, _facts(hcas))
    assert [(f.component, f.observed) for f in found] == [
        ("hca_port", "mlx5_11/1 DOWN/Disabled"), ("hca_port", "mlx5_5/1 DOWN/Disabled")]
    assert not any(f.acute for f in found)  # from the file: budgeted
    # The 100G MT4125 ports are not the fabric: no rate finding for them.
    healthy = read_hcas(_ibstat_root(tmp_path / "b", "a100-roce200-fw28.37-all-active"))
    assert judge(_baseline({"count": 9, "types": ["MT4126"], "rate": 200}), _facts(healthy)) == []
    # That capture's eight fabric ports are InfiniBand, mlx5_0 alone Ethernet (its .src.txt says all RoCE).
    found = judge(_baseline({"count": 9, "rate": 200, "link_layer": "InfiniBand"}), _facts(healthy))
    assert [(f.component, f.observed) for f in found] == [("hca_link_layer", "mlx5_0/1 Ethernet")]


def test_count_rate_link_layer_and_firmware(tmp_path):
    hcas = read_hcas(_ibstat_root(tmp_path, "h100-ib-ndr400-cx7-fw28.41-all-active"))
    base = _baseline({"count": 9, "types": ["MT4129"], "rate": 800, "link_layer": "Ethernet"},
                     pin={"hca_firmware": {"MT4129": "28.43.1014", "MT41692": "32.38.3056"}})
    found = {f.component: f for f in judge(base, _facts(hcas))}
    assert (found["hca_count"].observed, found["hca_count"].expected) == ("8", "9")
    assert found["hca_rate"].expected == "800Gb/s" and found["hca_link_layer"].expected == "Ethernet"
    firmware = [f for f in judge(base, _facts(hcas)) if f.component == "hca_firmware"]
    # One finding for the eight ConnectX-7 off the pin; the BlueField-3 is on its pin.
    assert [(f.cls, f.observed, f.expected) for f in firmware] == [("drift", "MT4129 28.41.1000", "28.43.1014")]
    assert firmware[0].detail == "HCAs mlx5_0,mlx5_1,mlx5_4,mlx5_5,mlx5_6,mlx5_7,mlx5_8,mlx5_9"
    assert not any(f.acute for f in found.values())


# -- history: ports this node had ACTIVE, counter deltas -----------------------

def _port(state="ACTIVE", phys="LinkUp", counters=None, number=1):
    return HcaPort(port=number, state=state, phys_state=phys, rate=400.0, link_layer="InfiniBand",
                   counters=dict(counters or {}))


def _node(*ports, names=("mlx5_0",)):
    return tuple(Hca(name=n, hca_type="MT4129", fw_ver="28.41.1000", ports=(p,)) for n, p in zip(names, ports))


def test_port_lost_after_being_active_is_acute_and_sticks_until_it_returns():
    limits = {"symbol_error": 10}
    first = _facts(_node(_port()))
    assert hca.judge_history(None, first, limits) == []  # first sample: no history, no finding
    kept = hca.next_state(None, first)
    down = _facts(_node(_port("DOWN", "Disabled")))
    found = hca.judge_history(kept, down, limits)
    assert [(f.component, f.observed, f.acute) for f in found] == [("ib_port", "mlx5_0/1 DOWN/Disabled", True)]
    kept = hca.next_state(kept, down)
    assert hca.judge_history(kept, down, limits)  # still down: still drained
    up = _facts(_node(_port()))
    assert hca.judge_history(kept, up, limits) == []
    gone = _facts(())
    assert [f.observed for f in hca.judge_history(kept, gone, limits)] == ["mlx5_0/1 gone"]
    # A new boot forgets the history (device names may change).
    assert hca.judge_history(kept, _facts((), boot_id="b2"), limits) == []


def test_acute_port_supersedes_the_nodeset_finding():
    base = _baseline({"count": 1})
    down = _facts(_node(_port("DOWN", "Disabled")))
    kept = hca.next_state(None, _facts(_node(_port())))
    found = hca.supersede(judge(base, down) + hca.judge_history(kept, down, {}))
    assert [(f.component, f.acute) for f in found] == [("ib_port", True)]


def test_counter_growth_over_the_limit_is_acute_a_reset_is_not():
    limits = {"symbol_error": 10, "link_downed": 1}
    kept = hca.next_state(None, _facts(_node(_port(counters={"symbol_error": 5, "link_downed": 2}))))
    within = _facts(_node(_port(counters={"symbol_error": 15, "link_downed": 3})))
    assert hca.judge_history(kept, within, limits) == []
    over = _facts(_node(_port(counters={"symbol_error": 16, "link_downed": 4})))
    found = hca.judge_history(kept, over, limits)
    assert [(f.component, f.observed, f.expected) for f in found] == [
        ("ib_errors", "mlx5_0/1 link_downed +2", "<= 1 per check")]
    assert "symbol_error +11" in found[0].detail and is_acute("health", "ib_errors")
    reset = _facts(_node(_port(counters={"symbol_error": 0, "link_downed": 0})))
    assert hca.judge_history(kept, reset, limits) == []


counters = st.dictionaries(st.sampled_from(["symbol_error", "link_downed", "port_rcv_errors"]),
                           st.integers(0, 2 ** 64), max_size=3)


@settings(max_examples=200, deadline=None)
@given(before=counters, now=counters, limit=st.integers(0, 1000))
def test_counter_deltas_properties(before, now, limit):
    deltas = hca.counter_deltas(before, now)
    for name, delta in deltas.items():
        assert delta >= 0 and before[name] + delta == now[name]
    for name in now:
        if name not in deltas:  # missing before, or went backwards: restarts, never a finding
            assert name not in before or now[name] < before[name]
    limits = {name: limit for name in ("symbol_error", "link_downed", "port_rcv_errors")}
    kept = hca.next_state(None, _facts(_node(_port(counters=before))))
    found = hca.judge_history(kept, _facts(_node(_port(counters=now))), limits)
    assert bool(found) == any(d > limit for d in deltas.values())


@settings(max_examples=200, deadline=None)
@given(number=st.integers(0, 99), name=st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1))
def test_numbered_round_trip(number, name):
    assert ibparse.parse_numbered("%d: %s\n" % (number, name), "state") == name


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([2.5, 5, 10, 14, 25, 40, 50, 56, 100, 200, 400, 800]))
def test_rate_round_trip(gbps):
    assert ibparse.parse_rate(rate_text(gbps)) == gbps


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_parsers_take_any_text(text):
    for parse in (ibparse.parse_ibstat, imexparse.parse_domain, imexparse.parse_query):
        try:
            parse(text)
        except ParseError:
            pass


# -- IMEX -----------------------------------------------------------------------

def test_imex_judged_on_members_only_and_budgeted():
    from gpugate.model.facts import ProbeFailure
    from gpugate.model.toolfacts import ImexStatus

    degraded = ImexStatus(service="READY", domain="DEGRADED", nodes=(("10.0.0.1", "READY"), ("10.0.0.2", "UNAVAILABLE")))
    member, other = _baseline(imex_member=True), _baseline()
    assert judge(other, _facts((), imex_status=degraded)) == []
    found = judge(member, _facts((), imex_status=degraded))
    assert [(f.cls, f.component, f.observed) for f in found] == [("health", "imex_domain", "DEGRADED")]
    assert "10.0.0.2 UNAVAILABLE" in found[0].detail and not found[0].acute
    missing = ProbeFailure("nvidia-imex-ctl", "missing", "not found")
    assert [(f.cls, f.component) for f in judge(member, _facts((), imex_status=missing))] == [("probe", "imex")]
    up = ImexStatus(service="READY", domain="UP", nodes=(("10.0.0.1", "READY"),))
    assert judge(member, _facts((), imex_status=up)) == []


def test_baseline_counter_limits_merge_with_the_defaults_and_refuse_unknown_counters():
    from gpugate.errors import ConfigError

    b = parse_baseline({"pin": {"driver": "1.0"}, "health": {"ib_counter_max": {"symbol_error": 3}}}, "b.toml")
    # Per check: only what the site sets (the defaults are per hour: test_iblinks.py).
    assert b.health.ib_counter_max == {"symbol_error": 3}
    with pytest.raises(ConfigError, match="ib_counter_max.symbol_errors: unknown IB error counter"):
        parse_baseline({"pin": {"driver": "1.0"}, "health": {"ib_counter_max": {"symbol_errors": 3}}}, "b.toml")
    with pytest.raises(ConfigError, match="link_layer"):
        parse_baseline({"pin": {"driver": "1.0"}, "nodes": {"gpu1": {"hca": {"link_layer": "RoCE"}}}}, "b.toml")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(["ACTIVE", "DOWN", "INIT", "gone"]), min_size=1, max_size=8))
def test_port_history_property(states):
    """Within one boot: a finding exactly when the port was ACTIVE at some
    earlier check and is not ACTIVE now; never on the first sample."""
    kept, was_up = None, False
    for i, state in enumerate(states):
        hcas = () if state == "gone" else _node(_port(state, "LinkUp" if state != "DOWN" else "Disabled"))
        facts = _facts(hcas)
        found = hca.judge_history(kept, facts, {})
        assert bool(found) == (i > 0 and was_up and state != "ACTIVE")
        assert all(f.component == "ib_port" and f.acute for f in found)
        kept = hca.next_state(kept, facts)
        was_up = was_up or state == "ACTIVE"
