"""Know before you push (issue 12, items 2 and 7): `gpugate baseline check`
and the prediction in `baseline diff`, from an audit of simulated nodes; and
nodes no [nodes] section covers, in `gpugate check` and `gpugate audit`."""

import json
import os
import sys

import pytest
from hypothesis import given, settings, strategies as st

from conftest import DEMO_BASELINE, ROOT, gpugate_cmd, sim_config
from gpugate.model.baseline import load_baseline
from gpugate.budget.rules import allowance
from gpugate.fleet.predict import UNKNOWN, predict, tally

RECORDED = os.path.join(ROOT, "tests", "fixtures", "slurm", "24.11")


def fake_slurm(directory, partitions):
    """sinfo/scontrol that answer as Slurm 24.11 did (the recorded
    `scontrol --all --json show node`, one entry per node of ``partitions``:
    node -> its partitions).  The audit reads partitions from them."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(RECORDED, "scontrol-show-node.json")) as handle:
        recorded = json.load(handle)
    template = recorded["nodes"][0]
    recorded["nodes"] = [dict(template, name=node, hostname=node, partitions=parts)
                         for node, parts in sorted(partitions.items())]
    with open(os.path.join(directory, "nodes.json"), "w") as handle:
        json.dump(recorded, handle)
    with open(os.path.join(RECORDED, "sinfo-version.txt")) as handle:
        version = handle.read()
    scripts = {
        "sinfo": "import sys\nassert sys.argv[1:] == ['--version'], sys.argv\nprint(%r, end='')\n" % version,
        "scontrol": "import sys\nassert sys.argv[1:] == ['--all', '--json', 'show', 'node'], sys.argv\n"
                    "print(open(%r).read())\n" % os.path.join(directory, "nodes.json"),
    }
    for name, body in scripts.items():
        path = os.path.join(directory, name)
        with open(path, "w") as handle:
            handle.write("#!%s\n%s" % (sys.executable, body))
        os.chmod(path, 0o755)
    return directory


def demo_with(tmp_path, name, *edits):
    """The demo baseline with text replaced; every edit must apply."""
    with open(DEMO_BASELINE) as handle:
        text = handle.read()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    """8 simulated nodes of the demo cluster, partition gpu (gpu[01-06])
    and debug (gpu[07-08]), gpu08 also in gpu; gpu09 is a Slurm node that
    does not answer.  Audited once: (directory, config path)."""
    tmp = tmp_path_factory.mktemp("predict")
    fleet = str(tmp / "fleet")
    gpugate_cmd("sim", "init", fleet, "--nodes", "gpu[01-08]", "--baseline", DEMO_BASELINE, check=True)
    parts = {"gpu%02d" % i: ["gpu"] for i in range(1, 7)}
    parts.update({"gpu07": ["debug"], "gpu08": ["debug", "gpu"], "gpu09": ["debug"]})
    slurm = fake_slurm(str(tmp / "slurm"), parts)
    config = sim_config(tmp, fleet, '[drain_budget]\nmax_share = 0.25\n[slurm]\nbin_dir = "%s"\n' % slurm)
    result = gpugate_cmd("audit", "--config", config, "--json")
    assert result.returncode == 0, result.stderr + result.stdout
    return tmp, config



def check(config, new, *extra):
    return gpugate_cmd("baseline", "check", new, "--config", config, *extra)


def test_four_gpus_on_an_8_gpu_fleet_is_over_budget_naming_the_partitions(audited, tmp_path):
    tmp, config = audited
    new = demo_with(tmp_path, "four.toml", ("gpus = 8", "gpus = 4"))
    result = check(config, new)
    assert result.returncode == 1, result.stderr
    assert ("partition gpu: 7 of 7 nodes would be unfit (budget 1): gpu_count=8 (want 4) on gpu[01-06,08]"
            in result.stdout)
    assert ("partition debug: 2 of 3 nodes would be unfit (budget 1): gpu_count=8 (want 4) on gpu[07-08]"
            in result.stdout)
    assert "partition debug, gpu" in result.stderr
    assert "+ health  gpu_count=8 (want 4)  budgeted     8  gpu[01-08]" in result.stdout
    assert "Unknown (not predicted, not fine): 1  gpu09" in result.stdout

    data = json.loads(check(config, new, "--json").stdout)
    nodes = data["prediction"]["nodes"]
    assert nodes["gpu09"]["status"] == UNKNOWN and not nodes["gpu09"]["budgeted"]
    for i in range(1, 9):
        added = nodes["gpu%02d" % i]["added"]
        assert [(f["class"], f["component"], f["observed"], f["expected"], f["kind"]) for f in added] == [
            ("health", "gpu_count", "8", "4", "budgeted")]
    parts = {p["partition"]: p for p in data["prediction"]["partitions"]}
    assert (parts["gpu"]["members"], parts["gpu"]["unfit"], parts["gpu"]["allowance"]) == (7, 7, 1)
    assert (parts["debug"]["members"], parts["debug"]["unfit"], parts["debug"]["unknown"]) == (3, 2, 1)
    assert parts["gpu"]["over_budget"] and data["exit_code"] == 1


def test_a_wrong_driver_pin_predicts_drift_in_diff_and_check(audited, tmp_path):
    tmp, config = audited
    new = demo_with(tmp_path, "r590.toml", ('driver = "580.65.06"', 'driver = "590.44.01"'),
                    ('fabricmanager = "580.65.06"', 'fabricmanager = "590.44.01"'))
    result = gpugate_cmd("baseline", "diff", DEMO_BASELINE, new, "--config", config, "--json")
    assert result.returncode == 0, result.stderr
    rows = {(r["change"], r["class"], r["finding"], r["kind"], r["nodes"])
            for r in json.loads(result.stdout)["prediction"]["changes"]}
    assert ("+", "drift", "driver=580.65.06 (want 590.44.01)", "budgeted", "gpu[01-08]") in rows
    assert ("+", "drift", "fabricmanager=580.65.06 (want 590.44.01)", "budgeted", "gpu[01-08]") in rows
    text = gpugate_cmd("baseline", "diff", DEMO_BASELINE, new, "--config", config).stdout
    assert "OVER BUDGET" in text and "driver=580.65.06 (want 590.44.01)" in text
    result = check(config, new)
    assert result.returncode == 1
    assert "partition gpu: 7 of 7 nodes would be unfit (budget 1): " in result.stdout


def test_within_budget_exits_0(audited, tmp_path):
    tmp, config = audited
    same = check(config, DEMO_BASELINE)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "adds and removes no finding" in same.stdout
    one = demo_with(tmp_path, "one.toml", ("# [nodes.\"gpu[120-128]\"]", '[nodes."gpu03"]\ngpus = 4\n#'))
    result = check(config, one)
    assert result.returncode == 0, result.stdout
    assert "+ health  gpu_count=8 (want 4)  budgeted     1  gpu03" in result.stdout
    assert "within budget" in result.stdout and "OVER" not in result.stdout


def test_broken_new_baseline_exits_2_with_the_loaders_error(audited, tmp_path):
    tmp, config = audited
    bad = demo_with(tmp_path, "bad.toml", ('fabricmanager = "580.65.06"', 'fabricmanager = "575.1.1"'))
    result = check(config, bad)
    assert result.returncode == 2
    assert "bad.toml: pin.fabricmanager: must equal pin.driver (580.65.06), got 575.1.1" in result.stderr
    assert result.stdout == ""


def test_no_audit_or_one_without_partitions_exits_2_saying_what_to_do(audited, tmp_path):
    tmp, config = audited
    conf = tmp_path / "gpugate.toml"
    conf.write_text('baseline = "%s"\n[sweep]\njournal = "%s/sweep.db"\n' % (DEMO_BASELINE, tmp_path))
    result = check(str(conf), DEMO_BASELINE)
    assert result.returncode == 2
    assert "no audit at %s/audit.json: run gpugate audit first" % tmp_path in result.stderr
    result = check(str(conf), DEMO_BASELINE, "--audit", str(tmp_path / "nowhere.json"))
    assert result.returncode == 2 and "no such audit file" in result.stderr
    saved = json.load(open(os.path.join(str(tmp), "audit.json")))
    del saved["partitions"]
    (tmp_path / "audit.json").write_text(json.dumps(saved))
    result = check(str(conf), DEMO_BASELINE)
    assert result.returncode == 2
    assert "records no partitions" in result.stderr and "run gpugate audit again" in result.stderr
    saved["partitions"] = {"gpu01": "gpu"}
    (tmp_path / "audit.json").write_text(json.dumps(saved))
    result = check(str(conf), DEMO_BASELINE)
    assert result.returncode == 2 and "must map each node to its partitions" in result.stderr


def test_audit_without_slurm_keeps_no_partitions_and_says_so(tmp_path):
    fleet = str(tmp_path / "fleet")
    gpugate_cmd("sim", "init", fleet, "--nodes", "gpu01", "--baseline", DEMO_BASELINE, check=True)
    config = sim_config(tmp_path, fleet, '[slurm]\nbin_dir = "%s/none"\n' % tmp_path)
    result = gpugate_cmd("audit", "--config", config, "-w", "gpu01")
    assert result.returncode == 0, result.stderr
    assert "no partitions recorded" in result.stderr
    assert json.load(open(tmp_path / "audit.json"))["partitions"] is None


# ---------------------------------------------------------------------------
# uncovered nodes (item 7)


def test_uncovered_nodes_in_check_audit_and_prediction(audited, tmp_path):
    tmp, config = audited
    part = demo_with(tmp_path, "part.toml", ('[nodes."gpu[01-99]"]', '[nodes."gpu[01-06]"]'))
    result = gpugate_cmd("check", "--config", config, "--node", "gpu07", "--baseline", part, "--json")
    assert result.returncode == 1, result.stderr
    verdict = json.loads(result.stdout)
    assert verdict["class"] == "probe"
    assert verdict["reason"].startswith("gpugate: probe uncovered=gpu07 (want a [nodes] section in /")
    assert [(f["class"], f["component"], f["observed"]) for f in verdict["findings"]] == [
        ("probe", "uncovered", "gpu07")]
    assert part in verdict["findings"][0]["expected"]
    covered = gpugate_cmd("check", "--config", config, "--node", "gpu06", "--baseline", part)
    assert covered.returncode == 0, covered.stdout

    result = gpugate_cmd("audit", "--config", config, "-b", part, "--max-age", "3600")
    assert result.returncode == 1
    row = [line for line in result.stdout.splitlines() if line.startswith("UNCOVERED")]
    assert len(row) == 1 and " 3  gpu[07-09]" in row[0] and part in row[0]
    data = json.loads(gpugate_cmd("audit", "--config", config, "-b", part, "--json", "--max-age", "3600").stdout)
    assert data["uncovered"] == {"count": 3, "nodes": "gpu[07-09]", "baseline": part}
    gpugate_cmd("audit", "--config", config, "--max-age", "3600", check=True)  # leave the shared audit as it was

    result = check(config, part)
    assert "Uncovered (no [nodes] section of the new baseline names them): 3  gpu[07-09]" in result.stdout
    assert "+ probe   uncovered=gpu07" in result.stdout
    assert result.returncode == 1  # debug: gpu[07-08] unfit, budget 1
    assert "partition debug: 2 of 3 nodes would be unfit (budget 1)" in result.stdout


def test_the_prolog_cache_keeps_whether_the_node_is_covered(tmp_path):
    from gpugate.model.baseline import from_resolved

    part = load_baseline(demo_with(tmp_path, "part.toml", ('[nodes."gpu[01-99]"]', '[nodes."gpu[01-06]"]')))
    assert part.covers("gpu06") and not part.covers("gpu07")
    for node in ("gpu06", "gpu07"):
        cached = json.loads(json.dumps(part.resolved_for(node)))
        assert from_resolved(cached).covers(node) is part.covers(node)
        del cached["covered"]
        with pytest.raises(KeyError):  # a cache of an older gpugate: the TOML is read instead
            from_resolved(cached)


def test_the_prolog_cache_keeps_the_preflights_floors():
    """The prolog's preflight holds its all_reduce to the baseline's floors;
    it reads them from the cache the health check left (a cache without
    them, from before, is not used: the TOML is read)."""
    from gpugate.model.baseline import from_resolved

    full = load_baseline(DEMO_BASELINE)
    cached = from_resolved(json.loads(json.dumps(full.resolved_for("gpu01"))))
    assert cached.smoke_min_busbw == full.smoke_min_busbw == {"NVIDIA H100 80GB HBM3": 350.0}
    assert cached.smoke_min_pair_busbw == full.smoke_min_pair_busbw == {"NVIDIA H100 80GB HBM3": 50.0}
    older = full.resolved_for("gpu01")
    del older["smoke"]
    with pytest.raises(KeyError):
        from_resolved(older)


# ---------------------------------------------------------------------------
# the prediction is what `gpugate check` says


def test_prediction_of_a_node_is_what_check_says_and_acute_is_not_budgeted(fleet, tmp_path):
    from gpugate.fleet.predict import UNFIT, predict_node

    gpugate_cmd("sim", "set", fleet, "gpu02", "driver=550.54.15", check=True)
    gpugate_cmd("sim", "set", fleet, "gpu03", "gpu.3.xid=79", check=True)
    demo = load_baseline(DEMO_BASELINE)
    for node in ("gpu01", "gpu02", "gpu03"):
        result = gpugate_cmd("check", "--sim", fleet, "--node", node, "--baseline", DEMO_BASELINE, "--json")
        said = json.loads(result.stdout)
        got = predict_node(node, None, demo, said["facts"], "gpugate:")
        assert [f.to_json() for f in got.findings] == said["findings"], node
        assert (got.status == UNFIT) is (not said["fit"])
    xid = predict_node("gpu03", None, demo, said["facts"], "gpugate:")
    assert xid.acute and not xid.budgeted
    assert predict_node("gpu03", None, demo, "ssh: no route", "gpugate:").status == UNKNOWN
    assert predict_node("gpu03", None, demo, {"nvml": 5}, "gpugate:").status == UNKNOWN
    assert predict_node("gpu04", None, demo, said["facts"], "gpugate:").status == UNKNOWN  # gpu03's facts


# ---------------------------------------------------------------------------
# per partition: members, allowance, over budget


NODES = ["n%d" % i for i in range(12)]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(NODES), st.lists(st.sampled_from(["a", "b", "c"]), max_size=3)),
       st.sets(st.sampled_from(NODES)), st.sets(st.sampled_from(NODES)), st.sets(st.sampled_from(NODES)),
       st.sets(st.sampled_from(NODES)), st.floats(0, 1))
def test_every_partition_counts_its_members_once_against_its_allowance(parts, budgeted, before, acute,
                                                                       unknown, share):
    result = {p.partition: p for p in tally(parts, budgeted, before, acute, unknown, share)}
    assert set(result) == {p for ps in parts.values() for p in ps}
    for name, p in result.items():
        members = {n for n, ps in parts.items() if name in ps}
        assert p.members == len(members)
        assert p.allowance == max(1, int(share * len(members) + 1e-9)) == allowance(len(members), share)
        assert set(p.unfit) == members & budgeted and len(p.unfit) == len(set(p.unfit))
        assert set(p.new) == members & budgeted - before
        assert set(p.acute) == members & acute and set(p.unknown) == members & unknown
        assert p.over == (len(members & budgeted) > p.allowance and bool(members & budgeted - before))
        if share >= 1:
            assert not p.over  # a share of 1 switches the budget off


def test_predict_without_partitions_and_with_members_the_audit_missed(tmp_path):
    demo = load_baseline(DEMO_BASELINE)
    four = load_baseline(demo_with(tmp_path, "four.toml", ("gpus = 8", "gpus = 4")))
    result = predict(demo, four, {"gpu01": "unreachable"}, None, 0.1, "gpugate:")
    assert result.partitions is None and result.over == ()
    result = predict(demo, four, {"gpu01": "unreachable"}, {"gpu01": ["p"], "gpu02": ["p"]}, 0.1, "gpugate:")
    assert {n: p.status for n, p in result.nodes.items()} == {"gpu01": UNKNOWN, "gpu02": UNKNOWN}
    assert result.partitions[0].unknown == ("gpu01", "gpu02") and not result.over
