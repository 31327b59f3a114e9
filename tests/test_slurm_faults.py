"""Fault matrix against a real slurmctld: Slurm's tools hanging, failing or
printing garbage; health check, prolog and epilog at once; reasons with
unusual characters.  In every case: no traceback, nothing hangs past its
budget, no drain is lost, nothing is wrongly resumed."""

import json
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import run_entry

from gpugate.testbed.files import rig_backend

pytestmark = pytest.mark.slurm
# Faults injected through the shims in front of scontrol/sinfo reach only
# the command backend.  The pyslurm backend's own faults (slurmctld stopped
# mid-call, its worker killed mid-call): tests/test_slurm_backend_rig.py;
# slurmctld down for both: test_slurm_healthcheck.py.
tools_only = pytest.mark.skipif(rig_backend() != "commands",
                                reason="faults injected through the scontrol/sinfo shims (commands backend)")
# slurmd runs the health check once at start; the tests run the entry points
# themselves, exactly as slurmd would, so each case is deterministic.
CLUSTER = {"nodes": 5, "interval": 600}

FAULTS = {
    "scontrol hangs": {"scontrol": "#!/bin/sh\nexec sleep 3600\n"},
    "scontrol fails": {"scontrol": "#!/bin/sh\necho 'scontrol: error: Unable to contact slurm controller "
                                   "(connect failure)' >&2\nexit 1\n"},
    # Reads of node state answer garbage (sinfo on 22.05, scontrol --json from 23.02); updates work.
    # A node reads itself through libslurm (one RPC, issue 34): [slurm] library
    # names a file dlopen refuses, so it falls back to the garbage-printing sinfo.
    "reads give garbage": {
        "sinfo": "#!/bin/sh\necho 'gpu01|%%garbage\\377|||'\necho '{\"nodes\": [tru'\n",
        "scontrol": "#!/bin/sh\nif [ \"$1\" = --all ]; then echo '{\"nodes\": [{\"name\": 7}'; exit 0; fi\n"
                    "exec /usr/bin/scontrol \"$@\"\n",
        "library": "/bin/true"},
}


def last_state(cluster, node):
    with open(cluster.path("state", node, "last-healthcheck.json")) as handle:
        return json.load(handle)


class Shims:
    """Swap the logging shims in front of scontrol/sinfo for faulty ones."""

    def __init__(self, cluster, scripts):
        self.cluster, self.scripts, self.saved = cluster, scripts, {}

    def __enter__(self):
        for tool, text in self.scripts.items():
            if tool == "library":  # gpugate.toml's [slurm] library, for the one-RPC read
                path = self.cluster.gpugate_conf
                with open(path) as handle:
                    self.saved[path] = handle.read()
                with open(path, "w") as handle:
                    handle.write(re.sub(r'(?m)^library = ".*"$', 'library = "%s"' % text, self.saved[path], 1))
                continue
            path = self.cluster.path("slurm-bin", tool)
            with open(path) as handle:
                self.saved[path] = handle.read()
            with open(path, "w") as handle:
                handle.write(text)
        return self

    def __exit__(self, *exc):
        for path, text in self.saved.items():
            with open(path, "w") as handle:
                handle.write(text)


def _sleepers(cluster):
    out = subprocess.run(["pgrep", "-f", "sleep 3600"], capture_output=True, text=True, timeout=10).stdout
    return [p for p in out.split() if p]


@tools_only
@pytest.mark.parametrize("fault", [
    pytest.param("scontrol hangs", marks=pytest.mark.slow),  # two full Slurm timeouts
    "scontrol fails", "reads give garbage"])
def test_slurm_tools_failing_lose_no_drain_and_block_no_budget(cluster, fault):
    node = {"scontrol hangs": "gpu01", "scontrol fails": "gpu02", "reads give garbage": "gpu03"}[fault]
    cluster.sim("set", "FLEET", node, "gpu.4.xid=79")
    with Shims(cluster, FAULTS[fault]):
        result, took = run_entry(cluster, "healthcheck", node)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert took < 40 + 5  # the health check's budget, whatever Slurm's tools do
        record = cluster.log_records(node)[-1]
        assert record["verdict"] == "unfit" and record["cls"] == "health"
        assert record["action"] in ("failed", "unknown") and record["slurm_error"]
        assert last_state(cluster, node)["pending_drain"] is True
        assert "drain" not in cluster.state(node)  # nothing could be applied...
        # ...and no job starts here meanwhile: the prolog refuses it.
        prolog, took = run_entry(cluster, "prolog", node, job="990001")
        assert prolog.returncode == 1 and "Traceback" not in prolog.stderr
        assert took < 30
    if fault == "scontrol hangs":
        assert not _sleepers(cluster)  # the hung tool was killed with its process group
    # Slurm's tools are back: the next health check applies the same drain.
    result, _ = run_entry(cluster, "healthcheck", node)
    assert result.returncode == 1
    assert "drain" in cluster.state(node)
    assert cluster.reason(node).startswith("gpugate: health xid:gpu4=79 (want none)")
    assert last_state(cluster, node)["pending_drain"] is False


@tools_only
def test_garbage_never_resumes_a_node(cluster):
    """A node gpugate drained for probe (self-clearing) that is fit again is
    undrained only on a state Slurm really reported."""
    node = "gpu04"
    dcgmi = os.path.join(cluster.fleet, node, "bin", "dcgmi")
    os.rename(dcgmi, dcgmi + ".away")
    run_entry(cluster, "healthcheck", node)
    assert cluster.reason(node).startswith("gpugate: probe dcgm=missing")
    os.rename(dcgmi + ".away", dcgmi)
    with Shims(cluster, FAULTS["reads give garbage"]):
        result, _ = run_entry(cluster, "healthcheck", node)
        assert result.returncode == 0 and "Traceback" not in result.stderr
        assert "drain" in cluster.state(node)  # not resumed on garbage
        assert cluster.log_records(node)[-1]["action"] in ("failed", "unknown")
    run_entry(cluster, "healthcheck", node)
    assert "drain" not in cluster.state(node) and cluster.reason(node) == ""  # a real state: resumed


def test_health_check_prolog_and_epilog_at_once(cluster):
    """slurmd does not serialise them: nine runs at once on a node that went
    bad agree on one drain with the right reason, and none fails but for
    running out of time waiting for the others."""
    node = "gpu05"
    cluster.sim("set", "FLEET", node, "gpu.1.ecc.uncorrected.volatile=2")
    before = len(cluster.log_records(node))
    runs = [("healthcheck", None), ("prolog", "990101"), ("epilog", "990101")] * 3
    with ThreadPoolExecutor(len(runs)) as pool:
        results = list(pool.map(lambda r: run_entry(cluster, r[0], node, r[1]), runs))
    for (mode, _), (result, took) in zip(runs, results):
        assert "Traceback" not in result.stderr, result.stderr
        assert took < 60, (mode, took)
    records = cluster.log_records(node)[before:]
    assert len(records) == len(runs)  # one line per run
    assert {r["verdict"] for r in records} <= {"unfit", "skipped"}
    # On a loaded machine (CI runs two release suites and a compile at once) a
    # run can spend its budget waiting for the others' Slurm calls: it says so
    # and exits unfit (Slurm drains or requeues on its own); none fails any other way.
    late = ("another gpugate run is acting on this node", "no time left in this run's budget", "timed out after")
    failed = [r for r in records if r.get("slurm_error")]
    assert all(any(m in r["slurm_error"] for m in late) for r in failed), failed
    assert len(failed) < len([r for r in records if r["verdict"] == "unfit"])  # one drained it
    assert cluster.reason(node) == "gpugate: health ecc:gpu1=2 uncorrected (want <= 0)"
    assert "drain" in cluster.state(node)


ODD_REASONS = [
    'rack 7 | PSU "B" died; ticket=42 (see wiki)',
    "Wartung: Netzteil getauscht \u00e4\u00f6\u00fc \u2013 bis Montag",
    "x" * 300,
]


@pytest.mark.parametrize("reason", ODD_REASONS)
def test_admin_reason_with_unusual_characters_is_kept_byte_for_byte(cluster, reason):
    node = "gpu01"
    cluster.scontrol("update", "NodeName=" + node, "State=RESUME", check=False)
    cluster.scontrol("update", "NodeName=" + node, "State=DRAIN", "Reason=" + reason)
    stored = cluster.reason(node)
    cluster.sim("set", "FLEET", node, "image_version=gpu|2026;(x) \u00fc")  # drift too
    result, _ = run_entry(cluster, "healthcheck", node)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert cluster.log_records(node)[-1]["action"] == "keep_admin"
    assert cluster.reason(node) == stored
    cluster.scontrol("update", "NodeName=" + node, "State=RESUME")
    cluster.sim("set", "FLEET", node, "reboot=1")


def test_our_reason_from_unusual_values_is_one_ascii_line(cluster):
    node = "gpu02"
    cluster.scontrol("update", "NodeName=" + node, "State=RESUME", check=False)
    cluster.sim("set", "FLEET", node, "reboot=1", "image_version=gpu|2026;(x) \u00fc\u00e4 " + "y" * 300)
    run_entry(cluster, "healthcheck", node)
    reason = cluster.reason(node)
    assert reason.startswith("gpugate: drift image=gpu|2026,[x] ??")
    assert reason.isascii() and "\n" not in reason and len(reason.encode()) <= 255
    sinfo = cluster.run(["/usr/bin/sinfo", "-R", "-h", "-o", "%E|%N"]).stdout
    assert "%s|%s" % (reason, node) in sinfo


@pytest.mark.slow  # each command waits out Slurm's own connect retries
def test_controller_commands_with_slurmctld_down_change_nothing_and_say_so(cluster):
    import sys

    gpugate = [sys.executable, "-m", "gpugate"]
    journal = cluster.path("state", "sweep.db")
    rows = 0
    if os.path.exists(journal):
        import sqlite3

        db = sqlite3.connect(journal)
        rows = db.execute("SELECT COUNT(*) FROM nodes").fetchone()[0]
        db.close()
    cluster.stop_slurmctld()
    try:
        for args in (["sweep", "--apply"], ["sweep"], ["status"], ["metrics"], ["audit"]):
            result = cluster.run(gpugate + args + ["--config", cluster.gpugate_conf], check=False, timeout=120)
            assert result.returncode == 3, (args, result.returncode, result.stderr)
            assert "is slurmctld up?" in result.stderr and "Traceback" not in result.stderr
        if os.path.exists(journal):  # opened, but no node enrolled: no sweep began
            import sqlite3

            db = sqlite3.connect(journal)
            try:
                assert db.execute("SELECT COUNT(*) FROM nodes").fetchone()[0] == rows
            finally:
                db.close()
    finally:
        cluster._spawn(["/usr/sbin/slurmctld", "-f", cluster.conf, "-i"], "slurmctld")
        cluster.wait_nodes_up(60)


def test_a_sweep_journal_others_could_write_is_refused(cluster, tmp_path):
    import sys

    journal_dir = tmp_path / "journal"
    journal_dir.mkdir(mode=0o777)
    journal_dir.chmod(0o777)
    config = tmp_path / "gpugate.toml"
    text = open(cluster.gpugate_conf).read()
    config.write_text(text.replace(cluster.path("state", "sweep.db"), str(journal_dir / "sweep.db")))
    config.chmod(0o644)
    result = cluster.run([sys.executable, "-m", "gpugate", "sweep", "--apply", "--config", str(config)],
                         check=False, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "must be owned by root and not writable by group or others" in result.stderr
    assert str(journal_dir) in result.stderr and not os.path.exists(journal_dir / "sweep.db")
