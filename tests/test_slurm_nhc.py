"""LBNL NHC and gpugate from slurmd's one HealthCheckProgram, against a real
slurmctld: real NHC (built from the vendored tarball) run by
gpugate-healthcheck ([nhc] in gpugate.toml), marking nodes through its own
helpers and scontrol.  Each keeps its own reason; neither lifts the other's
drain; a hanging NHC is killed in time and gpugate's checks still run."""

import os
import re

import pytest
from conftest import make_cluster, require_vendored

from gpugate.testbed import nhcbuild

pytestmark = pytest.mark.slurm
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INTERVAL = 5
NHC_TIMEOUT = 3
BUDGET = 12
# Fail when DIR/fail-NODE exists (NHC's own file check), hang while DIR/hang-NODE does.
CHECKS = """\
* || check_file_test -! -e {dir}/fail-$HOSTNAME
* || check_test_hang {dir}/hang-$HOSTNAME
"""
HANG = 'function check_test_hang() {\n    [[ -e "$1" ]] && sleep 300\n    return 0\n}\n'


@pytest.fixture(scope="module")
def nhc_cluster(tmp_path_factory):
    tarball = require_vendored(nhcbuild.vendored(ROOT), "real LBNL NHC (nhc-*.tar.gz)")
    prefix = str(tmp_path_factory.mktemp("nhc"))
    flags = os.path.join(prefix, "flags")
    os.makedirs(flags)
    argv = nhcbuild.install(tarball, prefix, CHECKS.format(dir=flags), mark_offline=True)
    with open(os.path.join(prefix, "etc", "nhc", "scripts", "test_hang.nhc"), "w") as handle:
        handle.write(HANG)
    # HOSTNAME: these slurmd all run on one host (slurmd -N).
    argv += ["NHC_RM=slurm", "HOSTNAME={node}"]
    extra = "[budgets]\nhealthcheck = %d\n[nhc]\ncommand = [%s]\ntimeout_seconds = %d\n" % (
        BUDGET, ", ".join('"%s"' % a for a in argv), NHC_TIMEOUT)
    cluster = make_cluster(tmp_path_factory.mktemp("cluster"), nodes=4, interval=INTERVAL, extra=extra)
    cluster.flags = flags
    cluster.nhc_log = os.path.join(prefix, "nhc.log")
    # Every case's first fault at once: their waits overlap.
    _flag(cluster, "fail", "gpu01", True)
    cluster.sim("set", "FLEET", "gpu02", "gpu.3.xid=79")
    _flag(cluster, "fail", "gpu03", True)
    _flag(cluster, "hang", "gpu04", True)
    cluster.sim("set", "FLEET", "gpu04", "driver=550.54.15")
    yield cluster
    cluster.stop()


def _flag(cluster, kind, node, present):
    path = os.path.join(cluster.flags, "%s-%s" % (kind, node))
    if present:
        open(path, "w").close()
    elif os.path.exists(path):
        os.unlink(path)


def _runs(cluster, node):
    return [r for r in cluster.log_records(node) if r.get("mode") == "healthcheck"]


def _after_runs(cluster, node, count=2):
    """The health-check records of the next ``count`` runs on ``node``."""
    before = len(_runs(cluster, node))
    cluster.wait_for(lambda: len(_runs(cluster, node)) >= before + count, count * INTERVAL + 20,
                     "%d more health checks on %s" % (count, node))
    return _runs(cluster, node)[before:]


def _run_where(cluster, node, predicate, what):
    """The first health-check record written from now on that ``predicate`` accepts."""
    seen = len(_runs(cluster, node))
    found = []

    def check():
        nonlocal seen
        runs = _runs(cluster, node)
        found.extend(r for r in runs[seen:] if predicate(r))
        seen = len(runs)
        return bool(found)
    cluster.wait_for(check, 3 * INTERVAL + 20, "%s: a health check where %s" % (node, what))
    return found[0]


def _nhc_failed(record):
    return record.get("nhc", {}).get("result") == "failed"


def _drained_with(cluster, node, prefix, by=None):
    """``node`` drained with a reason starting with ``prefix``, and the line
    of the run that drained it written: a run writes it as it ends, after
    the drain Slurm already shows.  ``by`` accepts that line; by default,
    gpugate's drain with that reason."""
    cluster.wait_for(lambda: "drain" in cluster.state(node) and cluster.reason(node).startswith(prefix),
                     3 * INTERVAL + 15, "%s drained by %r" % (node, prefix))
    by = by or (lambda r: r.get("action") == "drain" and (r.get("reason") or "").startswith(prefix))
    cluster.records_when(node, lambda r: r.get("mode") == "healthcheck" and by(r))
    return cluster.reason(node)


# long: ~19 s; out of the default run for its ten minutes (CI runs it on every release).
@pytest.mark.long
def test_nhc_failing_alone_gpugate_keeps_hands_off(nhc_cluster):
    c = nhc_cluster
    reason = _drained_with(c, "gpu01", "NHC:", _nhc_failed)
    assert "fail-gpu01" in reason
    later = _after_runs(c, "gpu01", 3)
    assert c.reason("gpu01") == reason and "drain" in c.state("gpu01")
    # A run that found slurmd's own check still running judged nothing (skipped); on a loaded
    # machine NHC can pass its 3 s and be killed (timed out): neither lifts the drain.
    judged = [r for r in later if r["verdict"] != "skipped"]
    assert judged and all(r["verdict"] == "fit" for r in judged), later
    assert {r["nhc"]["result"] for r in judged} <= {"failed", "timed out"}, later
    failed = [r for r in judged if r["nhc"]["result"] == "failed"]
    assert failed and all(r["why"] == "NHC failed: gpugate lifts no drain this run" for r in failed), later
    # NHC's fault clears: NHC lifts its own drain.
    _flag(c, "fail", "gpu01", False)
    c.wait_for(lambda: c.state("gpu01") == "idle", 3 * INTERVAL + 15, "gpu01 resumed by NHC")


# slow: the default run keeps the NHC-alone and hanging cases (ten-minute budget).
@pytest.mark.slow
def test_gpugate_failing_alone_nhc_keeps_hands_off(nhc_cluster):
    c = nhc_cluster
    reason = _drained_with(c, "gpu02", "gpugate: health xid:gpu3=79")
    # The Xid is reported once: gpugate is fit again, but its health drain
    # waits for the sweep, and NHC passes: its own online helper runs and
    # refuses a reason not its own.
    later = _after_runs(c, "gpu02")
    assert all(r["verdict"] == "fit" and r["action"] == "keep" and r["nhc"]["result"] == "passed" for r in later)
    assert c.reason("gpu02") == reason and "drain" in c.state("gpu02")
    with open(c.nhc_log) as handle:
        assert "Not onlining gpu02:  Down for non-NHC reason (gpugate: health" in handle.read()
    # NHC fails now too: its offline helper keeps gpugate's reason.
    _flag(c, "fail", "gpu02", True)
    _run_where(c, "gpu02", lambda r: r["nhc"]["result"] == "failed", "NHC failed")
    assert c.reason("gpu02") == reason


# slow: the default run keeps the NHC-alone and hanging cases (ten-minute budget).
@pytest.mark.slow
def test_both_failing_first_reason_stays_each_lifts_only_its_own(nhc_cluster):
    c = nhc_cluster
    reason = _drained_with(c, "gpu03", "NHC:", _nhc_failed)
    c.sim("set", "FLEET", "gpu03", "gpu.3.xid=79")
    record = _run_where(c, "gpu03", lambda r: r["verdict"] == "unfit", "gpugate unfit")
    # The first reason (NHC's) stays; gpugate's stands behind it.
    assert c.reason("gpu03") == reason
    assert record["action"] == "keep_admin" and record["nhc"]["result"] == "failed"
    assert record["reason"].startswith("gpugate: health xid:gpu3=79")
    # NHC clears while gpugate still fails: NHC may not lift, the node stays out.
    _flag(c, "fail", "gpu03", False)
    record = _run_where(c, "gpu03", lambda r: r["nhc"]["result"] == "passed", "NHC passed")
    assert record["verdict"] == "unfit" and record["action"] == "keep_admin"
    assert "drain" in c.state("gpu03") and c.reason("gpu03") == reason
    # gpugate clears too: NHC lifts its own drain.
    c.sim("set", "FLEET", "gpu03", "reboot=1")
    c.wait_for(lambda: c.state("gpu03") == "idle", 3 * INTERVAL + 15, "gpu03 resumed by NHC")


def test_nhc_hanging_is_killed_in_time_gpugate_still_checks(nhc_cluster):
    c = nhc_cluster
    reason = _drained_with(c, "gpu04", "gpugate: drift driver=550.54.15")
    hung = [r for r in _runs(c, "gpu04") if r.get("nhc", {}).get("result") == "timed out"]
    # The drain came from a run in which NHC hung.
    assert [r for r in hung if r["action"] == "drain"]
    for record in hung:
        # NHC gets its timeout or what is left of the run's budget, if less
        # (gpugate's own checks came first and may have taken long here).
        limit = re.fullmatch(r"NHC timed out after (\d+\.\d) s \(killed\)", record["nhc"]["error"])
        assert limit and 0 < float(limit.group(1)) <= NHC_TIMEOUT, record["nhc"]
        assert record["nhc"]["seconds"] >= float(limit.group(1)) - 0.05, record["nhc"]
        # Well before slurmd's kill (60 s), and gpugate's own checks ran.
        assert record["duration"] < BUDGET and record["verdict"] in ("fit", "unfit") and record["durations"]
    # Not NHC's reason, not a gpugate finding: only gpugate's own drift.
    assert reason.startswith("gpugate: drift driver=550.54.15") and "NHC" not in reason
    _flag(c, "hang", "gpu04", False)


@pytest.mark.slow
def test_gpugate_probe_drain_waits_for_failing_nhc(nhc_cluster):
    c = nhc_cluster
    _flag(c, "fail", "gpu01", False)  # the first case's fault, should this run alone
    c.wait_for(lambda: c.state("gpu01") == "idle", 3 * INTERVAL + 15, "gpu01 in service")
    dcgmi = os.path.join(c.fleet, "gpu01", "bin", "dcgmi")
    os.rename(dcgmi, dcgmi + ".away")
    reason = _drained_with(c, "gpu01", "gpugate: probe dcgm=missing")
    _flag(c, "fail", "gpu01", True)
    _run_where(c, "gpu01", lambda r: r["nhc"]["result"] == "failed", "NHC failed")
    # gpugate's probe drain would clear itself, but NHC fails: it stays.
    os.rename(dcgmi + ".away", dcgmi)
    record = _run_where(c, "gpu01", lambda r: r["verdict"] == "fit", "gpugate fit")
    assert record["nhc"]["result"] == "failed" and record["why"] == "NHC failed: gpugate lifts no drain this run"
    assert "drain" in c.state("gpu01") and c.reason("gpu01") == reason
    _flag(c, "fail", "gpu01", False)
    c.wait_for(lambda: c.state("gpu01") == "idle", 3 * INTERVAL + 15, "gpu01 undrained by gpugate")
    # The undrain's line, written as that run ends.
    assert c.records_when("gpu01", lambda r: r.get("mode") == "healthcheck" and r.get("action") == "undrain")
