"""Issue 13, item 4: MIG nodes can be verified.  What DCGM refuses on MIG
GPUs is reported as not run, with DCGM's words: neither a failure nor a
pass; the node is verified on everything else.  The real refusals in
tests/fixtures are replayed by a simulated node's dcgmi."""

import json
import os
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import DEMO_BASELINE, SAMPLES, gpugate_cmd
from gpugate.errors import ParseError
from gpugate.model.toolfacts import NOT_RUN
from gpugate.parsers import dcgm

MIG_SAMPLE = "dcgmi-diag-r3-mig-incompatible-a100-pcie-DCGM-issue94.txt"
# DCGM's own words (NvidiaValidationSuite::BuildCommonGpusList, DCGM 3.x-4.x).
REFUSALS = [
    ("GPU 2's MIG configuration is incompatible with the diagnostic because it prevents access to the "
     "entire GPU.", 2),
    ("Cannot run diagnostic: CUDA does not support enumerating GPUs with MIG mode enabled, yet GPU 1 is MIG "
     "enabled and the diagnostic is attempting to run on 8 GPUs.", 1),
    ("Cannot run diagnostic: MIG is enabled, but no compute instances are configured. CUDA needs to execute "
     "on a compute instance if MIG is enabled.", None),
    ("Cannot run diagnostic: CUDA does not support enumerating GPUs when one more GPUs has MIG mode enabled "
     "and one or more GPUs has MIG mode disabled.", None),
]


def sample_runs(name):
    """(command, output) of each command in a captured terminal session: the
    first line is a command without prompt, later ones follow `user@host:~$ `."""
    path = os.path.join(SAMPLES, name)
    with open(path, encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    runs, command, output = [], lines[0], []
    for line in lines[1:]:
        prompt = re.match(r"^\S+@\S+:\S*\$ ?(.*)$", line)
        if prompt:
            runs.append((command, "\n".join(output) + "\n"))
            command, output = prompt.group(1), []
        else:
            output.append(line)
    if command:
        runs.append((command, "\n".join(output) + "\n"))
    return runs


def _diag_runs():
    return [(c, out) for c, out in sample_runs(MIG_SAMPLE) if "dcgmi diag" in c]


# ---------------------------------------------------------------- parser

def test_every_refusal_of_the_real_sample_is_not_run_with_dcgms_words():
    runs = _diag_runs()
    assert len(runs) == 3  # -g 0 twice (MIG), -g 1 (an empty group)
    for command, output in runs:
        if "-g 0" in command:
            diag = dcgm.parse_diag_json(output, 3, 226)
            (result,) = diag.results  # printed twice, one refusal
            assert (result.status, result.gpu, result.test) == (NOT_RUN, 0, "diagnostic")
            assert result.message == ("not run on MIG: GPU 0's MIG configuration is incompatible with the "
                                      "diagnostic because it prevents access to the entire GPU.")
            assert diag.failures == () and not any(r.status == "Pass" for r in diag.results)
        else:  # the empty group is not a MIG refusal: never read as one
            with pytest.raises(ParseError):
                dcgm.parse_diag_json(output, 3, 226)


@pytest.mark.parametrize("words, gpu", REFUSALS)
@pytest.mark.parametrize("form", ["text", "json3", "json4"])
def test_each_refusal_in_text_and_json_forms(words, gpu, form):
    if form == "text":
        text = words + "\n"
    elif form == "json3":  # DCGM 2.x/3.x Diag::HelperDisplayFailureMessage
        text = json.dumps({"DCGM GPU Diagnostic": {"runtime_error": words}}, indent="\t")
    else:  # DCGM 4.x adds the version
        text = json.dumps({"DCGM Diagnostic": {"version": "4.2.3", "runtime_error": words}}, indent=3)
    diag = dcgm.parse_diag_json(text, 2, 226)
    assert [(r.status, r.gpu, r.message) for r in diag.results] == [(NOT_RUN, gpu, "not run on MIG: " + words)]
    assert diag.not_run == diag.results and diag.failures == ()


@pytest.mark.parametrize("text", [
    "GPU 0's MIG configuration is incompatible with the diagnostic because it prevents access to the entire GPU.\n"
    "Error: Unable to complete diagnostic for group 1.\n",  # a refusal and something else
    '{"DCGM Diagnostic": {"runtime_error": "The GPU is busy"}}',
    '{"DCGM Diagnostic": {"runtime_error": "Unable to connect to DCGM: MIG configuration is incompatible"}}',
    "mig configuration is incompatible\n",
])
def test_other_errors_are_not_refusals(text):
    with pytest.raises(ParseError):
        dcgm.parse_diag_json(text, 2, 226)


_refusal_lines = st.sampled_from([w for w, _ in REFUSALS])
_noise = st.text(min_size=1).filter(lambda t: t.strip() and dcgm.parse_diag_refusal(t) is None)


@given(st.lists(_refusal_lines, min_size=1, max_size=4), st.lists(_noise, max_size=2))
def test_a_refusal_is_never_a_pass_or_failure_and_any_other_line_spoils_it(lines, noise):
    diag = dcgm.parse_diag_json("\n".join(lines), 2, 226)
    assert diag.results and all(r.status == NOT_RUN for r in diag.results)
    assert diag.failures == () and len(diag.results) == len(set(lines))
    if noise:
        assert dcgm.parse_diag_refusal("\n".join(lines + noise)) is None


# ---------------------------------------------------------------- node

def _mig_baseline(tmp_path):
    """The demo baseline with gpu01 a MIG node (a later section wins)."""
    with open(DEMO_BASELINE) as handle:
        text = handle.read()
    text = text.replace("\n[health]", '\n[nodes."gpu01"]\nmig = true\n\n[health]', 1)
    path = tmp_path / "mig-baseline.toml"
    path.write_text(text)
    return str(path)


def _check(fleet, baseline, mode="verify", node="gpu01", *extra):
    result = gpugate_cmd("check", "--sim", fleet, "--node", node, "--baseline", baseline, "--mode", mode,
                         "--json", *extra)
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


def _sim(*args):
    result = gpugate_cmd("sim", *args)
    assert result.returncode == 0, result.stderr


ALL_MIG = ["gpu.%d.mig=1" % g for g in range(8)]


def test_a_mig_node_is_verified_on_everything_else_and_says_what_was_not(fleet, tmp_path):
    baseline = _mig_baseline(tmp_path)
    _sim("set", fleet, "gpu01", *ALL_MIG)
    data = _check(fleet, baseline)
    assert data["fit"] is True and data["findings"] == [] and data["reason"] is None
    (nv,) = data["not_verified"]
    assert (nv["class"], nv["component"], nv["expected"]) == ("not_run", "dcgm_diag", "pass (r1)")
    assert nv["observed"] == "not run on MIG (MIG on gpus 0,1,2,3,4,5,6,7)"
    assert nv["detail"].startswith("not run on MIG: GPU 0's MIG configuration is incompatible")
    assert data["facts"]["dcgm_diag"]["results"][0]["status"] == "NotRun"
    text = gpugate_cmd("check", "--sim", fleet, "--node", "gpu01", "--baseline", baseline, "--mode", "verify")
    assert "FIT" in text.stdout and "NOT VERIFIED dcgm_diag" in text.stdout
    explain = gpugate_cmd("explain", "--sim", fleet, "--node", "gpu01", "--baseline", baseline, "--mode", "verify")
    assert "not verified" in explain.stdout and "MIG configuration is incompatible" in explain.stdout
    # Outside verify no diagnostic runs: nothing is claimed either way.
    assert _check(fleet, baseline, "healthcheck")["not_verified"] == []


@pytest.mark.parametrize("code", [226, 0, 255])
def test_the_real_refusal_replayed_by_a_simulated_dcgmi(fleet, tmp_path, code):
    """Whatever dcgmi exits with (DCGM_ST_NVVS_ERROR is -30, exit 226)."""
    baseline = _mig_baseline(tmp_path)
    _sim("set", fleet, "gpu01", *ALL_MIG)
    for n, (command, output) in enumerate(_diag_runs()):
        path = tmp_path / ("out%d" % n)
        path.write_text(output)
        _sim("replay", fleet, "gpu01", "--stdout-file", str(path), "--exit-code", str(code),
             "--", "dcgmi", "diag", "-r", "1", "-j")  # verify runs -r 1 first
        data = _check(fleet, baseline)
        if "-g 0" in command:
            assert data["fit"] is True and [f["component"] for f in data["not_verified"]] == ["dcgm_diag"]
            assert "GPU 0's MIG configuration" in data["not_verified"][0]["detail"]
        else:  # "the specified group is empty": could not tell, never a pass
            assert data["fit"] is False and data["class"] == "probe" and data["not_verified"] == []


def test_a_refusal_while_nvml_shows_no_mig_is_probe_not_a_pass(fleet, tmp_path):
    path = tmp_path / "out"
    path.write_text(REFUSALS[0][0] + "\n")
    _sim("replay", fleet, "gpu01", "--stdout-file", str(path), "--exit-code", "226",
         "--", "dcgmi", "diag", "-r", "1", "-j")  # verify runs -r 1 first
    data = _check(fleet, DEMO_BASELINE)
    assert data["fit"] is False and data["class"] == "probe"
    assert data["findings"][0]["observed"] == "refused for MIG, NVML shows no MIG GPU"


def test_mig_against_a_baseline_without_mig_is_still_drift(fleet):
    _sim("set", fleet, "gpu01", "gpu.0.mig=1")
    data = _check(fleet, DEMO_BASELINE)
    assert data["fit"] is False and data["class"] == "drift"
    assert {f["component"] for f in data["findings"]} == {"mig"}
    assert [f["component"] for f in data["not_verified"]] == ["dcgm_diag"]


def test_dcgm_diag_mig_disable_is_refused_until_built(tmp_path):
    from gpugate.model.baseline import load_baseline
    from gpugate.errors import ConfigError

    text = open(DEMO_BASELINE).read().replace("[health]\n", '[health]\ndcgm_diag_mig = "disable"\n', 1)
    path = tmp_path / "b.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="dcgm_diag_mig.*not built"):
        load_baseline(str(path))
    assert load_baseline(DEMO_BASELINE).health.dcgm_diag_mig == "skip"
