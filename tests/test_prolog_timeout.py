"""Issue 44, item 4: the slurm.conf fragment and the audit agree with the
prolog's worst case (gpugate.slurm.prologtimeout): slurmd must not kill a
preflight's prolog, which drains every node of the job "Prolog error"."""

import json
import os
import re
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from gpugate.model.config import load_settings
from gpugate.node.check import ACT_RESERVE
from gpugate.slurm import prologtimeout as pt

from conftest import DEMO_BASELINE, _require_slurm, gpugate_cmd

seconds = st.floats(min_value=5, max_value=3600, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(timeout=seconds, across=seconds, prolog=st.floats(min_value=0.5, max_value=600, allow_nan=False),
       multi=st.booleans(), partitions=st.booleans(), dcgm=st.integers(0, 4), allreduce=st.booleans())
def test_the_written_timeout_covers_the_prologs_worst_case(timeout, across, prolog, multi, partitions, dcgm,
                                                           allreduce):
    cfg = {"partitions": ("train",) if partitions else (), "job_word": "gpugate-preflight", "dcgm_level": dcgm,
           "allreduce": ("/x",) if allreduce else (), "allreduce_multi": ("/y", "{rank}") if multi else (),
           "timeout_seconds": timeout, "across_seconds": across}
    written = pt.prolog_timeout(cfg, {"prolog": prolog})
    assert isinstance(written, int) and written >= pt.DEFAULT
    assert written >= prolog + ACT_RESERVE["prolog"] + pt.MARGIN_SECONDS  # the gate and its drain, always
    if dcgm or allreduce or multi:  # a preflight can run (the job word: any job may ask)
        assert written >= prolog + timeout + ACT_RESERVE["prolog"] + pt.MARGIN_SECONDS
    if multi:  # the run across nodes ends across_seconds after the proof's deadline, then the job note
        assert written >= prolog + timeout + across + pt.NOTE_SECONDS + ACT_RESERVE["prolog"] + pt.MARGIN_SECONDS
    total, said = pt.worst_case(cfg, {"prolog": prolog})
    assert written == max(pt.DEFAULT, -(-total // 1)) and said.endswith("= %g s" % total)


def test_the_margin_is_the_prologs_own_parts():
    """The numbers the rule adds are the ones the prolog spends: its drain's
    reserve, the job note's connection deadline, the run across nodes'
    deadline from the preflight's start."""
    import inspect

    from gpugate.node import prolog
    from gpugate.preflight import cross

    assert "connect(settings, deadline=time.monotonic() + NOTE_SECONDS)" in inspect.getsource(prolog._note_job)
    assert ('deadline = started + float(cfg["timeout_seconds"]) + float(cfg["across_seconds"])'
            in inspect.getsource(cross.prove_across))
    defaults = load_settings(None, missing_ok=True)
    assert pt.worst_case(defaults.preflight, defaults.budgets)[0] == 8 + 120 + 3 + 4
    assert pt.prolog_timeout(dict(defaults.preflight, allreduce_multi=("/y",)), defaults.budgets) == 440


def _timeout_line(text):
    return [line for line in text.splitlines() if line.startswith("PrologEpilogTimeout=")]


def test_slurm_conf_writes_the_worst_case_of_the_configured_preflight(tmp_path):
    config = tmp_path / "gpugate.toml"
    config.write_text('baseline = "%s"\n[preflight]\npartitions = ["train"]\ntimeout_seconds = 120\n'
                      'across_seconds = 300\nallreduce_multi = ["/opt/gpugate/allreduce-rank", "{rank}", "{nranks}"]\n'
                      % DEMO_BASELINE)
    result = gpugate_cmd("slurm-conf", "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert _timeout_line(result.stdout) == ["PrologEpilogTimeout=440"]
    assert "120 s the node's proof + 300 s across nodes + 5 s the job note + 3 s the drain" in result.stdout
    assert "timeout_seconds + 8" not in result.stdout  # the old, second rule
    # No run across nodes: the node's own proof only.
    config.write_text('baseline = "%s"\n[preflight]\ntimeout_seconds = 300\n' % DEMO_BASELINE)
    assert _timeout_line(gpugate_cmd("slurm-conf", "--config", str(config)).stdout) == ["PrologEpilogTimeout=315"]
    # Nothing to run: the gate's own (never under 120).
    config.write_text('baseline = "%s"\n[preflight]\ndcgm_level = 0\nallreduce = []\n' % DEMO_BASELINE)
    assert _timeout_line(gpugate_cmd("slurm-conf", "--config", str(config)).stdout) == ["PrologEpilogTimeout=120"]


def test_the_shipped_texts_give_one_rule():
    from conftest import ROOT

    fragment = open(os.path.join(ROOT, "slurm_conf", "slurm.conf.fragment")).read()
    defaults = load_settings(None, missing_ok=True)
    assert _timeout_line(fragment) == ["PrologEpilogTimeout=%d" % pt.prolog_timeout(defaults.preflight,
                                                                                      defaults.budgets)]
    for name in ("README.md", os.path.join("slurm_conf", "gpugate.example.toml"),
                 os.path.join("slurm_conf", "slurm.conf.fragment")):
        text = open(os.path.join(ROOT, name)).read()
        assert not re.search(r"timeout_seconds\s*\+\s*8|above this \+ 8", text), name


def test_scontrol_show_config_is_read_as_slurm_prints_it():
    # 22.05: one key; "65534" is NO_VAL16, no limit.
    assert pt.parse_show_config("PrologEpilogTimeout     = 65534\nPrologFlags = Alloc\n") == (True, None)
    assert pt.parse_show_config("PrologEpilogTimeout     = 120\n") == (True, 120)
    # 25.05+: both printed where they differ; the prolog's wins.
    assert pt.parse_show_config("EpilogTimeout = 600\nPrologTimeout = 300\n") == (True, 300)
    assert pt.parse_show_config("PrologFlags = Alloc\n") == (False, None)
    assert pt.judge(None, 440) is None and pt.judge(440, 440) is None
    assert "set PrologEpilogTimeout=440" in pt.judge(120, 440)


def _audit(cluster):
    result = subprocess.run([sys.executable, "-m", "gpugate", "audit", "--config", cluster.gpugate_conf, "--json"],
                            capture_output=True, text=True, env=cluster.env, timeout=120)
    return result.returncode, json.loads(result.stdout or "{}"), result.stderr


@pytest.mark.slurm
def test_the_audit_flags_a_prolog_timeout_under_the_worst_case(tmp_path):
    """The real cluster, PrologEpilogTimeout=120 and a preflight across nodes
    (timeout 120, across 300): the audit says what to set and exits 1; once
    slurm.conf has it (scontrol reconfigure), the audit passes."""
    from gpugate.testbed import Cluster

    _require_slurm()

    class Short(Cluster):
        timeout = 120

        def rig_slurm_conf(self, ports):
            self.ports = ports
            return super().rig_slurm_conf(ports) + "PrologEpilogTimeout=%d\n" % self.timeout

    cluster = Short(str(tmp_path / "c"), nodes=2, health_interval=30)
    extra = ("[drain_budget]\nmax_share = 0.5\n[preflight]\npartitions = [\"gpu\"]\ntimeout_seconds = 120\n"
             "across_seconds = 300\nallreduce_multi = [\"/opt/gpugate/allreduce-rank\", \"{rank}\"]\n")
    with open(DEMO_BASELINE) as handle:
        cluster.write(handle.read(), extra)
    try:
        cluster.start()
        code, data, err = _audit(cluster)
        assert code == 1, (data, err)
        timeout = data["prolog_timeout"]
        assert timeout["slurm"] == 120 and timeout["needed"] == 440, timeout
        assert "set PrologEpilogTimeout=440" in timeout["short"]
        text = subprocess.run([sys.executable, "-m", "gpugate", "audit", "--config", cluster.gpugate_conf],
                              capture_output=True, text=True, env=cluster.env, timeout=120).stdout
        assert "PROLOG TIMEOUT: PrologEpilogTimeout=120 (Slurm) is under" in text
        cluster.timeout = 440
        with open(cluster.conf, "w") as handle:
            handle.write(cluster.rig_slurm_conf(cluster.ports))
        cluster.scontrol("reconfigure")
        cluster.wait_for(lambda: _audit(cluster)[1].get("prolog_timeout", {}).get("slurm") == 440, 60,
                         "slurmctld reads PrologEpilogTimeout=440")
        code, data, err = _audit(cluster)
        assert code == 0 and "short" not in data["prolog_timeout"], (data, err)
    finally:
        cluster.stop()


def test_the_drain_reserve_is_the_prologs_own():
    """The formula's drain is the prolog's reserve for acting (node.check), copied, not imported:
    slurm/ stands below node/."""
    assert pt.DRAIN_SECONDS == ACT_RESERVE["prolog"]
