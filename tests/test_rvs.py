"""The ROCm Validation Suite's verdict (gpugate.parsers.rvs): real outputs in
tests/fixtures/amd/rvs-* (each with its .src.txt: AMD's RVS user guide
samples, an RVS issue, a device-metrics-exporter PR) and two CONSTRUCTED
inputs that say so (the -q layout and the -j JSON, built from RVS's code).
Truncated and failing variants are made here from the real captures, each
change named where it is made."""

import os
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpugate.model.facts import ProbeFailure
from gpugate.parsers.rvs import parse, parse_json, summary_gpus
from gpugate.model.toolfacts import DcgmDiag

from conftest import SAMPLES

AMD = os.path.join(SAMPLES, "amd")
PROPS = settings(max_examples=200, deadline=None)

GST = "rvs-gst-fp4-MI355X-rocm7.2.1-rvsdocs.FRAGMENT.txt"
IET = "rvs-iet-pass-MI355X-rocm7.2.1-rvsdocs.FRAGMENT.txt"
PEQT = "rvs-peqt-pass-MI355X-rocm7.2.1-rvsdocs.FRAGMENT.txt"
PBQT = "rvs-pbqt-pass-MI355X-rocm7.2.1-rvsdocs.FRAGMENT.txt"
RCQT = "rvs-rcqt-pass-MI355X-rocm7.2.1-rvsdocs.FRAGMENT.txt"
SMQT = "rvs-smqt-fail-unknownGPU-unknown-rvsdocs.txt"
NOPLATFORM = "rvs-m-gst-noplatform-gfx1151-rocm7.14-rvs1263.txt"
UNCLOSED = "rvs-summary-unclosed-MI210-rocm7.2-dme373.FRAGMENT.txt"
QUIET = "rvs-r2-quiet-babel-fail-CONSTRUCTED.txt"
JSON = "rvs-json-r3-gst-babel-CONSTRUCTED.json"

# The MI355X of the user guide, as its own summary lists it: KFD gpu_id -> index.
MI355X = {"42583": 0, "27226": 1, "36479": 2, "17010": 3, "1590": 4, "51771": 5, "11806": 6, "57875": 7}


def sample(name):
    with open(os.path.join(AMD, name), newline="") as handle:
        return handle.read()


def passed(diag):
    """What the shared judge (gpugate.judges.dcgm.diagnostic) passes: a report,
    exit 0, no failed test, at least one passed."""
    return (isinstance(diag, DcgmDiag) and diag.exit_code == 0 and not diag.failures
            and any(r.status == "Pass" for r in diag.results))


def test_every_capture_has_its_source():
    names = [n for n in os.listdir(AMD) if n.startswith("rvs-") and not n.endswith(".src.txt")]
    assert len(names) == 10
    for name in names:
        assert os.path.exists(os.path.join(AMD, name + ".src.txt")), name
        source = sample(name + ".src.txt")
        assert "URL: https://github.com/" in source or source.startswith("CONSTRUCTED")


# --------------------------------------------------------------------------
# Each capture: its verdict, its results, its GPUs.

# name: (passed, results, passes, failed tests, GPUs named (None: a per-action result))
READS = {
    GST: (True, 5, 5, [], [0, 1, 6, 7, None]),  # 4 "met: TRUE" lines left by the abridging, and the summary row
    IET: (True, 9, 9, [], [0, 1, 2, 3, 4, 5, 6, 7, None]),  # 8 "pass: TRUE" (one "[GPU::  1590]"), the row
    PEQT: (True, 2, 2, [], [None]),  # "[pcie_act_1] peqt true", the row
    PBQT: (True, 1, 1, [], [None]),  # bandwidth lines carry no verdict: the summary row only
    RCQT: (True, 1, 1, [], [None]),  # Missing packages : 0 twice, the row
    SMQT: (False, 3, 0, ["action_1"] * 3, [None]),  # three "pass: false", no summary (an older RVS)
    QUIET: (False, 4, 3, ["hbm_basic"], [None]),  # -q: rows redrawn after "\r", FAIL in red
}


@pytest.mark.parametrize("name", sorted(READS))
def test_each_capture_reads_as_it_shows(name):
    want_passed, count, passes, failed, gpus = READS[name]
    diag = parse(sample(name), 0, 3, MI355X)
    assert isinstance(diag, DcgmDiag)
    assert (diag.level, diag.exit_code) == (3, 0)
    assert passed(diag) is want_passed
    assert len(diag.results) == count
    assert sum(r.status == "Pass" for r in diag.results) == passes
    assert [r.test for r in diag.failures] == failed
    assert sorted(set(r.gpu for r in diag.results), key=str) == sorted(gpus, key=str)
    assert all(0 < len(r.message) <= 203 for r in diag.results)


def test_the_gst_lines_name_their_gpus_and_their_words():
    diag = parse(sample(GST), 0, 3, MI355X)
    met = [r for r in diag.results if r.gpu is not None]
    assert [(r.test, r.gpu) for r in met] == [("gst-Tflops-2K2K2K-trig-fp4", g) for g in (0, 1, 6, 7)]
    assert met[0].message == ("[RESULT] [302017.167195] [gst-Tflops-2K2K2K-trig-fp4] [GPU:: 42583] "
                              "GFLOPS 1063560 Target GFLOPS: 0 met: TRUE")
    row = [r for r in diag.results if r.gpu is None]
    assert [r.message for r in row] == ["| gst-Tflops-2K2K2K-trig-fp4       | GST            | PASS            |"]


def test_an_id_not_mapped_names_no_gpu():
    # RVS prints the KFD gpu_id, not an index: without a mapping there is no GPU to name.
    diag = parse(sample(IET), 0, 3)
    assert passed(diag) and all(r.gpu is None for r in diag.results)
    one = parse(sample(IET), 0, 3, {"1590": 4})  # RVS pads the id: "[GPU::  1590]"
    assert [r.gpu for r in one.results] == [None, None, None, None, 4, None, None, None, None]
    assert one.results[4].message.endswith("[iet-stress-1400W-true] [GPU::  1590] pass: TRUE")


def test_the_smqt_failures_name_the_gpus_it_printed():
    diag = parse(sample(SMQT), 0, 2, {"3254": 0, "50599": 1, "33367": 2})
    assert [(r.gpu, r.status) for r in diag.results] == [(0, "Fail"), (1, "Fail"), (2, "Fail")]


def test_the_summary_lists_the_gpus_with_their_ids():
    assert summary_gpus(sample(GST))[0] == ("42583", 0, 2, "0000:05:00.0", "AMD Instinct MI355X")
    assert {g[0]: g[1] for g in summary_gpus(sample(IET))} == MI355X
    # one GPU: the odd layout, its labels beside it
    assert summary_gpus(sample(UNCLOSED)) == (("35824", 0, 2, "0000:cc:00.0", "AMD Instinct MI210"),)
    assert summary_gpus(sample(SMQT)) == ()


# --------------------------------------------------------------------------
# No result, truncated, failed: never a pass.

def test_no_result_line_at_all_is_an_error_never_a_pass():
    refused = parse(sample(NOPLATFORM), 255, 3)
    assert isinstance(refused, ProbeFailure) and refused.kind == "error"
    assert refused.source == "rvs -r 3"
    assert refused.detail == ("no result line (exit 255): RVS-ERROR [CLI] No platform support for the detected GPU "
                              "or no GPU detected !")
    for text in ("", "\n\n", sample(UNCLOSED), "Segmentation fault (core dumped)\n"):
        failure = parse(text, 0, 2)
        assert isinstance(failure, ProbeFailure) and failure.kind == "error"
        assert failure.detail.startswith("no result line (exit 0)")


def test_a_run_cut_before_its_summary_closed_did_not_finish():
    text = sample(IET)
    before_summary = text[:text.index("\n+====")]  # killed after the last pass: TRUE
    unclosed = text[:text.rindex("+-----")]  # the row printed, the closing boundary not
    for cut in (before_summary, unclosed):
        failure = parse(cut, 0, 4, MI355X)
        assert isinstance(failure, ProbeFailure) and failure.kind == "error"
        assert "did not finish" in failure.detail
    # a failure already seen stands, finished or not
    failing = before_summary.replace("[GPU:: 17010] pass: TRUE", "[GPU:: 17010] pass: FALSE")
    diag = parse(failing, 0, 4, MI355X)
    assert [(r.test, r.gpu) for r in diag.failures] == [("iet-stress-1400W-true", 3)]


def test_any_false_verdict_fails_the_run_whatever_the_exit_code():
    gst = sample(GST)
    # the 27226 line of the real run, its verdict turned
    met_false = gst.replace("GFLOPS 1068301 Target GFLOPS: 0 met: TRUE", "GFLOPS 1068301 Target GFLOPS: 0 met: FALSE")
    row_fail = gst.replace("| GST            | PASS ", "| GST            | FAIL ")
    peqt_false = sample(PEQT).replace("[pcie_act_1] peqt true", "[pcie_act_1] peqt false")
    for text, gpu in ((met_false, 1), (row_fail, None), (peqt_false, None)):
        for rc in (0, 255):
            diag = parse(text, rc, 3, MI355X)
            assert isinstance(diag, DcgmDiag) and not passed(diag)
            assert [r.gpu for r in diag.failures] == [gpu]


def test_rcqt_missing_packages_fail_though_its_row_says_pass():
    # rcqt returns success with packages missing (packageHandler.cpp): its counts are the verdict.
    text = sample(RCQT).replace("Missing packages             : 0", "Missing packages             : 3", 1)
    diag = parse(text, 0, 1)
    assert [(r.test, r.status) for r in diag.results] == [("metapackage-validation", "Fail"),
                                                          ("metapackage-validation", "Pass")]
    mismatch = sample(RCQT).replace("Version mismatch packages    : 0", "Version mismatch packages    : 1", 1)
    assert not passed(parse(mismatch, 0, 1))


def test_the_action_failed_error_on_stderr_fails_that_action():
    # ROCm >= 7.0 logs a failed action on stderr and goes on (exit 0): the caller may append stderr.
    text = sample(PBQT) + "RVS-ERROR [pbqt] [xgmi_d2d_unidir_bandwidth] Action failed to run successfully.\n"
    diag = parse(text, 0, 2)
    assert [(r.test, r.status) for r in diag.failures] == [("xgmi_d2d_unidir_bandwidth", "Fail")]


def test_a_nonzero_exit_is_kept_for_the_judge():
    diag = parse(sample(PEQT), 255, 2)
    assert isinstance(diag, DcgmDiag) and diag.exit_code == 255 and not diag.failures
    assert not passed(diag)


def test_colours_and_spinner_redraws_are_read_as_the_last_redraw():
    text = sample(QUIET)
    assert "\r" in text and "\x1b[31m" in text
    diag = parse(text, 0, 2)
    assert [r.message for r in diag.failures] == ["| hbm_basic                        | BABEL          | FAIL            |"]
    # cut while hbm_basic's spinner still turned: no row for it, the table unclosed
    cut = text[:text.index("| hbm_basic")] + "| hbm_basic                        | BABEL          | ||||            |"
    assert isinstance(parse(cut, 0, 2), ProbeFailure)


# --------------------------------------------------------------------------
# The -j file.

def test_the_json_file_reads_each_record_with_a_pass():
    diag = parse_json(sample(JSON), 0, 3, MI355X)
    assert isinstance(diag, DcgmDiag)
    assert [(r.test, r.status, r.gpu) for r in diag.results] == [
        ("babel-float-256MiB", "Pass", 0), ("babel-float-256MiB", "Pass", 0),
        ("babel-float-256MiB", "Fail", 1), ("babel-float-256MiB", "Pass", 1),
        ("gst-1000Tflops-4K4K8K-rand-fp8", "Pass", 0), ("gst-1000Tflops-4K4K8K-rand-fp8", "Pass", 1)]
    assert diag.failures[0].message.startswith("subtest=Copy, mbytes_per_sec=1200000.0")


@pytest.mark.parametrize("text,words", [
    ("", "not JSON"),
    ('{"version":"1.0","gst":{"a":[{"gpu_id":"1","pass":"true"}', "not JSON"),  # a run cut short
    ('{"version":"1.0","gst":{"a":[{"gpu_id":"1"}]}}', "no record"),
    ('{"version":"1.0"}', "no record"),
    ('[{"pass":"true"}]', "one JSON object"),
    ('{"gst":{"a":[{"pass":"true"}]}} trailing', "one JSON object"),
    ("[" * 5000, "not JSON"),
])
def test_json_that_says_nothing_is_an_error(text, words):
    failure = parse_json(text, 0, 2)
    assert isinstance(failure, ProbeFailure) and failure.kind == "error" and words in failure.detail


def test_json_forms_rvs_writes():
    # smqt: std::to_string(bool) and an int "gpu"; an action run twice (-n 2) keeps both; extra braces.
    text = ('{"version":"1.0","smqt":{"action_1":[{"gpu":3254,"pass":"0"}],'
            '"action_1":[{"gpu":3254,"pass":"1"}]}}}}')
    diag = parse_json(text, 0, 2, {"3254": 5})
    assert [(r.status, r.gpu) for r in diag.results] == [("Fail", 5), ("Pass", 5)]
    odd = parse_json('{"gst":{"a":[{"gpu_id":"7","pass":"maybe"}]}}', 0, 2)
    assert [r.status for r in odd.results] == ["Fail"]  # a value we cannot read is not a pass


# --------------------------------------------------------------------------
# Properties: random lines never pass without a positive verdict line; a
# false one always fails.

_REAL = [line for name in (GST, IET, PEQT, PBQT, RCQT, SMQT, UNCLOSED) for line in sample(name).split("\n")]
NEUTRAL = [line for line in _REAL if not re.search(r"(pass|met)\s*:\s*(true|false)\s*$|peqt (true|false)$|"
                                                     r"\| *(PASS|FAIL) *\|", line, re.I)]
POSITIVE = ["[RESULT] [302347.742768] [iet-stress-1400W-true] [GPU:: 57875] pass: TRUE",
            "[RESULT] [302017.167195] [gst-Tflops-2K2K2K-trig-fp4] [GPU:: 42583] GFLOPS 1063560 Target GFLOPS: 0 "
            "met: TRUE",
            "[RESULT] [302695.289685] [pcie_act_1] peqt true",
            "| pcie_act_1                       | PEQT           | PASS            |"]
NEGATIVE = ["[RESULT] [257936.568920] [action_1]  smqt 3254 pass: false",
            "[RESULT] [302017.167195] [gst-Tflops-2K2K2K-trig-fp4] [GPU:: 42583] GFLOPS 1 Target GFLOPS: 9 met: FALSE",
            "[RESULT] [302695.289685] [pcie_act_1] peqt false",
            "| pcie_act_1                       | PEQT           | FAIL            |"]
SUMMARY_OPEN = ["| Action Name                      | Module         | Result          |",
                "+=====================================================================+"]
CLOSE = "+---------------------------------------------------------------------+"

_noise = st.one_of(st.sampled_from(NEUTRAL), st.text(max_size=80),
                   st.text(alphabet="[]|:-+= RESULTpasmetrufl0123456789GPU\r\x1b", max_size=60))


def _positive(line):
    return re.search(r"(pass|met)\s*:\s*true\s*$|peqt true\s*$|\|\s*PASS\s*\|", line.split("\r")[-1], re.I)


@PROPS
@given(st.lists(st.one_of(_noise, st.sampled_from(SUMMARY_OPEN + [CLOSE])), max_size=40),
       st.sampled_from([0, 1, 25, 255]))
def test_random_lines_never_pass(lines, rc):
    result = parse("\n".join(lines), rc, 3, MI355X)
    assert isinstance(result, (DcgmDiag, ProbeFailure))
    if passed(result):
        assert any(_positive(line) for line in lines)


@PROPS
@given(st.lists(st.one_of(_noise, st.sampled_from(POSITIVE)), max_size=30),
       st.lists(st.one_of(_noise, st.sampled_from(POSITIVE)), max_size=30),
       st.sampled_from(NEGATIVE), st.booleans(), st.sampled_from([0, 255]))
def test_a_false_verdict_always_fails(before, after, negative, closed, rc):
    if negative.startswith("|"):  # a row counts inside the summary table
        lines = before + SUMMARY_OPEN + [negative] + ([CLOSE] if closed else []) + after
    else:  # a verdict line counts anywhere (under -q the table opens before the actions run)
        lines = before + [negative] + after + (SUMMARY_OPEN + [CLOSE] if closed else [])
    result = parse("\n".join(lines), rc, 3, MI355X)
    assert isinstance(result, DcgmDiag) and result.failures and not passed(result)


@PROPS
@given(st.text(max_size=400), st.integers(min_value=-300, max_value=300))
def test_any_text_gives_a_result_or_a_probe_failure(text, rc):
    for result in (parse(text, rc, 2), parse_json(text, rc, 2)):
        assert isinstance(result, (DcgmDiag, ProbeFailure))
        if isinstance(result, DcgmDiag):
            assert all(len(r.message) <= 203 for r in result.results)
