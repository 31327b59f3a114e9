"""`gpugate status`: the summary and its text on hand-built snapshots, and
the command against the real Slurm test cluster."""

import json
import subprocess
import sys
import time

import pytest

from gpugate.fleet.status import format_age, render_text, summarize
from gpugate.slurm.nodestate import NodeState
from gpugate.sweep.journal import Journal
from gpugate.sweep.snapshot import take

from conftest import check_now, make_cluster

TAG = "gpugate:"
NOW = 1_800_000_000.0
H = 3600
WORK = "gpugate: drift sweep=reconverge batch 2 attempt 1 (want verified)"


def node(name, state="IDLE", flags=(), reason="", ago=None, parts=("gpu",)):
    return NodeState(name=name, state=state, flags=frozenset(flags), reason=reason,
                     reason_time=None if ago is None else int(NOW - ago), reason_user="root" if reason else "",
                     partitions=tuple(sorted(parts)))


def drained(name, reason, ago, parts=("gpu",), state="IDLE", flags=("DRAIN",)):
    return node(name, state, flags, reason, ago, parts)


FLEET = [
    node("gpu001"),
    node("gpu002", "MIXED", parts=("gpu", "debug")),
    node("gpu003", "ALLOCATED"),
    drained("gpu004", "gpugate: health xid:gpu3=79 (want none)", 2 * H + 3 * 60),
    drained("gpu005", "gpugate: broken module=550.54.15 (want 580.65.06)", 20 * 60),
    drained("gpu006", "gpugate: drift driver=550.54.15 (want 580.65.06)", 30 * 60, parts=("gpu", "debug")),
    drained("gpu007", WORK, 5 * 60),
    drained("gpu008", "gpugate: drift vbios:gpu0=96.00.74 (want 96.00.99)", 3 * H + 12 * 60),
    drained("gpu009", "gpugate: rma xid:gpu1=79 (want none); verify failed twice", 26 * H),
    drained("gpu010", "gpugate: probe dcgm=missing (want present)", 45),
    drained("gpu011", "rack maintenance", 5 * H),
    node("gpu012", "DOWN", ("NOT_RESPONDING",), "Not responding", 4 * 60, parts=("gpu", "debug")),
    # A busy node draining for gpugate: still gpugate's, not in service.
    drained("gpu013", "gpugate: drift driver=550.54.15 (want 580.65.06)", 60, state="MIXED"),
]


@pytest.fixture
def journal_nodes(tmp_path):
    journal = Journal(str(tmp_path / "state" / "sweep.db"))
    try:
        journal.start_run(["gpugate", "sweep", "--apply"])
        journal.enrol("gpu004", "reboot", 1, "gpugate: health xid:gpu3=79 (want none)")
        journal.record("gpu004", "verify", "started", attempt=1)
        journal.enrol("gpu007", "reconverge", 2, "gpugate: drift driver=550.54.15 (want 580.65.06)")
        journal.record("gpu007", "converge", "done")
        journal.enrol("gpu009", "reboot", 1, "gpugate: health xid:gpu1=79 (want none)")
        journal.record("gpu009", "escalate", "done", attempt=2, detail="verify failed twice")
        # Resumed by an earlier sweep, drained again later: the record is stale.
        journal.enrol("gpu005", "reboot", 1, "gpugate: broken module=550.54.15 (want 580.65.06)")
        journal.record("gpu005", "resume", "done")
        return journal.nodes()
    finally:
        journal.close()


@pytest.fixture
def summary(journal_nodes):
    states = {st.name: st for st in FLEET}
    # The journal's clock is the real one; the fleet's is NOW: shift the
    # stale record's time before gpu005's drain, the live ones after.
    shifted = {}
    for name, rec in journal_nodes.items():
        from gpugate.core.record import replace

        shifted[name] = replace(rec, updated=NOW - (H if name == "gpu005" else 1))
    return summarize(take(states, TAG, NOW), shifted, NOW, states=states)


def test_classes_in_severity_order_oldest_first(summary):
    got = {cls: [e["node"] for e in entries] for cls, entries in summary["gpugate"].items()}
    assert got == {"rma": ["gpu009"], "health": ["gpu004"], "broken": ["gpu005"],
                   "drift": ["gpu008", "gpu006", "gpu007", "gpu013"], "probe": ["gpu010"]}
    assert list(summary["gpugate"]) == ["rma", "health", "broken", "drift", "probe"]


@pytest.mark.parametrize("name, cls, reason, out_for, sweep", [
    ("gpu004", "health", "gpugate: health xid:gpu3=79 (want none)", 2 * H + 180, "verify started (attempt 1)"),
    ("gpu005", "broken", "gpugate: broken module=550.54.15 (want 580.65.06)", 1200, None),
    ("gpu007", "drift", WORK, 300, "converge done (attempt 1)"),
    ("gpu008", "drift", "gpugate: drift vbios:gpu0=96.00.74 (want 96.00.99)", 3 * H + 720, None),
    ("gpu009", "rma", "gpugate: rma xid:gpu1=79 (want none); verify failed twice", 26 * H,
     "escalate done (attempt 2): verify failed twice"),
    ("gpu010", "probe", "gpugate: probe dcgm=missing (want present)", 45, None),
    ("gpu013", "drift", "gpugate: drift driver=550.54.15 (want 580.65.06)", 60, None),
])
def test_gpugate_entries(summary, name, cls, reason, out_for, sweep):
    entry = next(e for e in summary["gpugate"][cls] if e["node"] == name)
    assert entry["reason"] == reason
    assert entry["since"] == int(NOW - out_for)
    assert entry["out_for"] == pytest.approx(out_for)
    assert entry["sweep"] == sweep


def test_draining_node_state(summary):
    entry = next(e for e in summary["gpugate"]["drift"] if e["node"] == "gpu013")
    assert entry["state"] == "MIXED+DRAIN"


@pytest.mark.parametrize("name, state, reason, ago", [
    ("gpu012", "DOWN+NOT_RESPONDING", "Not responding", 240),
    ("gpu011", "IDLE+DRAIN", "rack maintenance", 5 * H),
])
def test_others_listed(summary, name, state, reason, ago):
    others = {e["node"]: e for e in summary["others"]}
    assert set(others) == {"gpu011", "gpu012"}
    assert others[name]["state"] == state
    assert others[name]["reason"] == reason
    assert others[name]["since"] == int(NOW - ago)
    assert others[name]["sweep"] is None
    assert [e["node"] for e in summary["others"]] == ["gpu011", "gpu012"]  # oldest first


def test_counts_and_partitions(summary):
    assert summary["counts"] == {
        "total": 13, "in_service": 3, "gpugate": 8, "others": 2,
        "gpugate_by_class": {"rma": 1, "health": 1, "broken": 1, "drift": 4, "probe": 1}}
    assert summary["partitions"] == {
        "debug": {"members": 3, "in_service": 1, "gpugate": 1, "others": 1},
        "gpu": {"members": 13, "in_service": 3, "gpugate": 8, "others": 2},
    }


def test_json_ready(summary):
    assert json.loads(json.dumps(summary)) == summary


def test_sweep_reason_without_journal_record():
    states = {"gpu007": drained("gpu007", WORK, 300)}
    out = summarize(take(states, TAG, NOW), {}, NOW, states=states)
    assert out["gpugate"]["drift"][0]["sweep"] == "reconverge batch 2 attempt 1 (no journal record)"


def test_in_flight_node_out_for_another_reason_says_so(journal_nodes):
    # gpu004 rebooting in the sweep's hands: Slurm shows it DOWN with its own reason.
    states = {"gpu004": node("gpu004", "DOWN", ("REBOOT_ISSUED",), "Reboot ASAP", 30)}
    out = summarize(take(states, TAG, NOW), journal_nodes, NOW, states=states)
    assert out["gpugate"] == {}
    assert out["others"][0]["sweep"] == "verify started (attempt 1)"


def test_a_node_not_responding_with_no_reason_says_so_in_words():
    # The demo's end: a node whose slurmd restarts, no reason and no reason time (issue 25).
    states = {"gpu01": node("gpu01"), "gpu02": node("gpu02", "IDLE", ("NOT_RESPONDING",))}
    text = render_text(summarize(take(states, TAG, NOW), {}, NOW, states=states))
    (row,) = [line for line in text.splitlines() if line.startswith("others")]
    assert row.split()[:3] == ["others", "gpu02", "IDLE*"]
    assert row.endswith("no reason set: slurmd does not answer slurmctld (rebooting, stopped or unreachable)")
    assert "(?)" not in text and "(no reason)" not in text
    assert "(*: slurmd does not answer slurmctld: Slurm's NOT_RESPONDING, sinfo's mark)" in text


def test_everything_in_service():
    states = {n: node(n) for n in ("gpu01", "gpu02")}
    out = summarize(take(states, TAG, NOW), {}, NOW)
    assert out["gpugate"] == {} and out["others"] == []
    assert out["counts"] == {"total": 2, "in_service": 2, "gpugate": 0, "gpugate_by_class": {}, "others": 0}
    text = render_text(out)
    assert text.splitlines()[0].split() == "gpugate drains: 0 others out: 0 in service: 2/2".split()
    assert "(every node is in service)" in text


def test_other_tag_is_not_ours():
    states = {"gpu01": drained("gpu01", "gpugate: drift driver=1 (want 2)", 60)}
    out = summarize(take(states, "site-gate:", NOW), {}, NOW, states=states)
    assert out["gpugate"] == {} and [e["node"] for e in out["others"]] == ["gpu01"]


@pytest.mark.parametrize("seconds, text", [
    (None, "?"), (0, "0s"), (59, "59s"), (60, "1m"), (4 * 60 + 59, "4m"), (H, "1h00m"),
    (2 * H + 3 * 60, "2h03m"), (3 * H + 12 * 60 + 59, "3h12m"), (26 * H, "1d02h"), (-5, "0s"),
])
def test_format_age(seconds, text):
    assert format_age(seconds) == text


def test_render_text(summary):
    lines = render_text(summary).splitlines()
    assert lines[0].split() == ("gpugate drains: 8 (rma 1, health 1, broken 1, drift 4, probe 1) "
                                "others out: 2 in service: 3/13").split()
    rows = [line.split() for line in lines[1:11]]
    assert [r[:3] for r in rows] == [
        ["rma", "gpu009", "1d02h"], ["health", "gpu004", "2h03m"], ["broken", "gpu005", "20m"],
        ["drift", "gpu008", "3h12m"], ["drift", "gpu006", "30m"], ["drift", "gpu007", "5m"],
        ["drift", "gpu013", "1m"], ["probe", "gpu010", "45s"],
        ["others", "gpu011", "IDLE+DRAIN"], ["others", "gpu012", "DOWN*"]]
    health = lines[2]
    assert "xid:gpu3=79 (want none)" in health and "gpugate:" not in health
    assert health.rstrip().endswith("sweep: verify started (attempt 1)")
    assert "sweep=reconverge batch 2 attempt 1 (want verified)" in lines[6]
    assert lines[6].endswith("sweep: converge done (attempt 1)")
    assert lines[9].endswith("rack maintenance (5h00m)")
    assert lines[10].endswith("Not responding (4m)")
    # The "sweep:" column lines up.
    cols = {line.index("sweep:") for line in lines if "sweep:" in line}
    assert len(cols) == 1
    assert "partition debug  in service 1/3  gpugate 1  others 1" in lines
    assert "partition gpu    in service 3/13  gpugate 8  others 2" in lines


# --------------------------------------------------------------------------
# The real Slurm test cluster
# --------------------------------------------------------------------------

def _sinfo_reasons(cluster):
    """node -> reason, from `sinfo -R` (each line's hostlist expanded)."""
    from ClusterShell.NodeSet import NodeSet

    out = cluster.run(["/usr/bin/sinfo", "-R", "-h", "-o", "%E|%N"]).stdout
    reasons = {}
    for line in out.splitlines():
        text, _, nodes = line.rpartition("|")
        for name in NodeSet(nodes):
            reasons[name] = text
    return reasons


@pytest.mark.slurm
def test_status_matches_sinfo_and_leaves_others_alone(tmp_path):
    cluster = make_cluster(tmp_path, nodes=4, interval=5)
    try:
        cluster.sim("set", "FLEET", "gpu02", "driver=550.54.15")
        # Its health check run now as slurmd runs it, not at slurmd's next tick.
        cluster.wait_for(lambda: "drain" in cluster.state("gpu02") or check_now(cluster, "gpu02"), 60,
                         "gpu02 drained for drift")
        cluster.scontrol("update", "NodeName=gpu03", "State=DRAIN", "Reason=rack maintenance")
        result = subprocess.run([sys.executable, "-m", "gpugate", "status", "--config", cluster.gpugate_conf,
                                 "--json"], capture_output=True, text=True, timeout=60, env=cluster.env)
        assert result.returncode == 0, result.stderr
        summary = json.loads(result.stdout)

        sinfo = _sinfo_reasons(cluster)
        ours = {n: r for n, r in sinfo.items() if r.startswith(TAG + " ")}
        listed = {e["node"]: e["reason"] for entries in summary["gpugate"].values() for e in entries}
        assert listed == ours == {"gpu02": cluster.reason("gpu02")}
        assert [e["node"] for e in summary["gpugate"]["drift"]] == ["gpu02"]
        assert summary["gpugate"]["drift"][0]["reason"].startswith("gpugate: drift driver=550.54.15 (want ")
        assert summary["gpugate"]["drift"][0]["since"] <= time.time()

        assert [(e["node"], e["reason"]) for e in summary["others"]] == [("gpu03", "rack maintenance")]
        assert "DRAIN" in summary["others"][0]["state"].split("+")
        assert summary["counts"] == {"total": 4, "in_service": 2, "gpugate": 1, "others": 1,
                                     "gpugate_by_class": {"drift": 1}}
        assert summary["partitions"] == {"gpu": {"members": 4, "in_service": 2, "gpugate": 1, "others": 1}}

        text = subprocess.run([sys.executable, "-m", "gpugate", "status", "--config", cluster.gpugate_conf],
                              capture_output=True, text=True, timeout=60, env=cluster.env)
        assert text.returncode == 0, text.stderr
        assert text.stdout.splitlines()[0].split()[:4] == ["gpugate", "drains:", "1", "(drift"]

        assert cluster.reason("gpu03") == "rack maintenance"
        assert "drain" in cluster.state("gpu03")
    finally:
        cluster.stop()


def test_config_errors_from_the_latest_audit_are_shown_with_a_hostlist():
    from gpugate.fleet.audit import fold, to_json, to_text
    from gpugate.fleet.status import config_errors

    audit = {"at": NOW - 120, "facts": {}, "config_errors": {
        "gpu002": "baseline.toml: invalid TOML (judging with the last good baseline)",
        "gpu001": "baseline.toml: invalid TOML (judging with the last good baseline)"}}
    errors = config_errors(audit, NOW)
    assert errors["nodes"] == ["gpu001", "gpu002"] and errors["hostlist"] == "gpu[001-002]"
    assert errors["age"] == 120 and errors["first"].startswith("gpu001: baseline.toml: invalid TOML")
    summary = summarize(take({}, TAG, NOW), {}, NOW)
    summary["config_errors"] = errors
    text = render_text(summary)
    assert "CONFIG ERROR on 2 nodes (audit of 2m ago): gpu[001-002]" in text
    # No audit, or one without errors: nothing said.
    assert config_errors(None, NOW) is None
    summary["config_errors"] = config_errors({"at": NOW, "facts": {}}, NOW)
    assert "CONFIG ERROR" not in render_text(summary)
    folded = fold({}, None, audit["config_errors"])
    assert to_json(folded)["config_error"]["nodes"] == "gpu[001-002]"
    assert "CONFIG ERROR (last good copy in use)" in to_text(folded)


def test_repeat_offenders_are_listed_with_count_last_times_and_what_comes_next():
    from gpugate.fleet.status import repeat_offenders
    from gpugate.sweep.history import ESCALATED, FORGIVEN, RESUMED, Event

    now, day = 100 * 86400.0, 86400.0
    history = {
        "gpu001": tuple(Event("gpu001", RESUMED, now - d * day, frozenset({"xid"})) for d in (5, 3, 1)) + (
            Event("gpu001", ESCALATED, now - 60, frozenset({"xid"}), "repeat offender: ..."),),
        "gpu002": tuple(Event("gpu002", RESUMED, now - d * day, frozenset({"driver"})) for d in (6, 2, 1)),
        "gpu003": tuple(Event("gpu003", RESUMED, now - d * day, frozenset({"driver"})) for d in (4, 2)),
        "gpu004": (Event("gpu004", RESUMED, now - 2 * day, frozenset({"driver"})),),  # once: not a repeat
        "gpu005": tuple(Event("gpu005", RESUMED, now - d * day, frozenset({"ecc"})) for d in (4, 2)) + (
            Event("gpu005", FORGIVEN, now - day),),
    }
    out = repeat_offenders(history, now, 3, 7 * day)
    assert set(out["nodes"]) == {"gpu001", "gpu002", "gpu003"}
    assert out["nodes"]["gpu001"]["escalated"] and out["nodes"]["gpu001"]["count"] == 3
    assert out["nodes"]["gpu002"]["next_drain_escalates"] and out["nodes"]["gpu002"]["ago"] == [day, 2 * day, 6 * day]
    assert not out["nodes"]["gpu003"]["next_drain_escalates"]
    text = render_text({"counts": {"gpugate_by_class": {}, "others": 0, "in_service": 5, "total": 5},
                        "gpugate": {}, "others": [], "repeat_offenders": out})
    lines = text.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("Repeat offenders")))
    assert "within 7d; limit 3" in lines[start]
    assert lines[start + 1].split()[:3] == ["gpu001", "xid", "3x"] and lines[start + 1].endswith("ESCALATED rma")
    assert lines[start + 2].split()[:3] == ["gpu002", "driver", "3x"]
    assert "last 1d00h, 2d00h, 6d00h ago" in lines[start + 2] and lines[start + 2].endswith("escalates")
    assert "gpugate sweep forgive NODE" in lines[-1]
