"""rccl-tests (nccl-tests hipified, ROCm/rccl-tests) read by the nccl-tests
parser unchanged (gpugate.parsers.nccl) and judged by the same smoke verdict
(gpugate.judges.smoke), on real AMD captures in tests/fixtures/amd/rccl-*
(each with its .src.txt) and the simulated AMD nodes' replays in
gpugate/data/smoke/rccl-* (sources in its rccl-SOURCES.txt).

What rccl-tests prints that nccl-tests does not: "rccl-tests: Version
develop:a7809b3" (no "#"), "# Errors with asterisks indicate errors that have
exceeded the maximum threshold.", "RCCL version : 2.22.3-..." / "HIP version"
/ "ROCm version" / "Hostname" / "Librccl path" lines, the device lines naming
"AMD Instinct MI300X" (or "... VF"), and a space after the average
("# Avg bus bandwidth    : 54.8575 ", src/common.cu "%g %s").  None of them
is a table row, an error or a result line, so none changes a reading.
"""

import os

import pytest

from gpugate.judges.smoke import judge_smoke
from gpugate.parsers.nccl import parse_nccl_tests

from conftest import ROOT, SAMPLES

AMD = os.path.join(SAMPLES, "amd")
SMOKE = os.path.join(ROOT, "gpugate", "data", "smoke")
MI300X_MIN = 300.0  # the design's per-product minimum for "AMD Instinct MI300X" (Azure gates 314 at 16 GiB)

HISOHARA = "rccl-tests-all_reduce_perf-MI300X-x8-unknown-hisohara.txt"
BLOG = "rccl-tests-all_reduce_perf-MI300X-x8-rocm6.3.0-rocmblog.txt"
VF = "rccl-tests-all_reduce_perf-MI300XVF-x8-rocm6.2.3-rccl1562.txt"
MI250X = "rccl-tests-all_reduce_perf-MI250X-16gcd-unknown-rccl929.FRAGMENT.txt"
MI210 = "rccl-tests-all_reduce_perf-fail-internalerror-MI210x4-unknown-rccltests50.txt"

# Replays of the simulated AMD nodes: the same bytes as a capture, or built from one.
REPLAYS = {"rccl-sweep-mi300x.txt": HISOHARA, "rccl-abort-mi210.txt": MI210}
HEALTHY = "rccl-healthy-mi300x.txt"


def sample(name):
    folder = SMOKE if name.startswith("rccl-") and not name.startswith("rccl-tests-") else AMD
    with open(os.path.join(folder, name), newline="") as handle:
        return handle.read()


def test_every_capture_has_its_source():
    names = [n for n in os.listdir(AMD) if n.startswith("rccl-") and not n.endswith(".src.txt")]
    assert sorted(names) == sorted([HISOHARA, BLOG, VF, MI250X, MI210])
    for name in names:
        assert "URL: https://github.com/" in sample(name + ".src.txt")


# --------------------------------------------------------------------------
# What the parser reads from each capture.

# name: (rows, first size, last (size, oop busbw, ip busbw), avg, out of bounds, wrong total, errors)
READS = {
    HISOHARA: (31, 8, (8589934592, 315.69, 315.91), 110.464, 0, 0, 0),
    BLOG: (32, 8, (17179869184, 318.98, 318.73), 116.669, 0, 0, 0),
    VF: (25, 8, (134217728, 293.07, 289.60), 54.8575, 0, 0, 0),
    MI250X: (8, 8, (1024, 0.06, 0.11), None, None, None, 0),
    MI210: (0, None, None, None, None, None, 2),
    HEALTHY: (1, 8589934592, (8589934592, 315.69, 315.91), 315.8, 0, 0, 0),
}


@pytest.mark.parametrize("name", sorted(READS))
def test_each_capture_parses_to_what_it_shows(name):
    rows, first, last, avg, oob, wrong, errors = READS[name]
    run = parse_nccl_tests(sample(name))
    assert len(run.rows) == rows
    if rows:
        assert run.rows[0].size == first
        assert (run.rows[-1].size, run.rows[-1].oop_busbw_gbps, run.rows[-1].ip_busbw_gbps) == last
        assert all(r.type == "float" and r.redop == "sum" for r in run.rows)
    assert run.avg_busbw_gbps == avg
    assert (run.out_of_bounds, run.wrong_total, len(run.errors)) == (oob, wrong, errors)
    # rccl-tests prints no "# nccl-tests version" line, no "# Collective test" line in these runs,
    # and "RCCL version : X" is not NCCL's "NCCL version X": no version is read
    assert (run.test, run.nccl_version, run.concluded) == (None, None, False)
    assert run.min_bw_verdict is None


def test_the_printed_average_is_the_mean_of_the_printed_busbw():
    # rccl-tests src/common.cu: bw[0] += busBw for every printed result, / bw_count: the
    # average over the whole sweep, small sizes included (and a check on the transcriptions).
    for name in (HISOHARA, BLOG, VF):
        run = parse_nccl_tests(sample(name))
        values = [v for r in run.rows for v in (r.oop_busbw_gbps, r.ip_busbw_gbps)]
        assert abs(sum(values) / len(values) - run.avg_busbw_gbps) < 0.005  # values printed to 0.01
        assert all(abs(r.oop_algbw_gbps * 1.75 - r.oop_busbw_gbps) <= 0.015 for r in run.rows)  # 8 ranks, both rounded


def test_the_rows_carry_root_and_wrong_columns_since_2023_and_the_error_column_before():
    for name in (HISOHARA, BLOG, VF):
        assert all(r.root == -1 and r.oop_wrong == 0 and r.ip_wrong == 0 for r in parse_nccl_tests(sample(name)).rows)
    old = parse_nccl_tests(sample(MI250X)).rows  # MI250X, 2023: no root, "error" = max relative error
    assert all(r.root is None and r.oop_wrong is None and r.ip_wrong is None for r in old)
    assert [(r.oop_max_error, r.ip_max_error) for r in old[:2]] == [(4e-07, 4e-07), (4e-07, 2e-07)]


def test_the_mi210_abort_keeps_both_failure_lines_as_printed():
    run = parse_nccl_tests(sample(MI210))
    assert run.errors == (
        "sharbox-ultra: Test NCCL failure common.cu:1285 'internal error - please report this issue to the NCCL "
        "developers'",
        ".. sharbox-ultra pid 117738: Test failure common.cu:1161",
    )


@pytest.mark.parametrize("prefix", ["0: ", " 3: ", "[1,0]<stdout>:", "[0] "])
@pytest.mark.parametrize("name", [HISOHARA, BLOG, VF, MI210])
def test_a_launcher_prefix_changes_nothing(name, prefix):
    text = sample(name)
    assert parse_nccl_tests("".join(prefix + line for line in text.splitlines(True))) == parse_nccl_tests(text)


# --------------------------------------------------------------------------
# The smoke verdict, and the per-product minimum.

# name: (problem with the MI300X minimum, problem with no minimum)
VERDICTS = {
    HISOHARA: ("busbw=110.4GB/s (want >= 300)", ""),
    BLOG: ("busbw=116.6GB/s (want >= 300)", ""),
    VF: ("busbw=54.8GB/s (want >= 300)", ""),
    MI250X: ("no result: no avg busbw", "no result: no avg busbw"),
    MI210: ("nccl error: sharbox-ultra: Test NCCL failure common.cu:1285 'internal error - please repor..",) * 2,
    HEALTHY: ("", ""),
}


@pytest.mark.parametrize("name", sorted(VERDICTS))
def test_each_capture_gets_its_verdict(name):
    run = parse_nccl_tests(sample(name))
    for want, problem in zip((MI300X_MIN, None), VERDICTS[name]):
        verdict = judge_smoke(run, 1 if name == MI210 else 0, False, want)
        assert (verdict.passed, verdict.problem) == (problem == "", problem)


def test_a_healthy_mi300x_passes_300_only_when_the_run_is_one_large_size():
    # The same healthy 8x MI300X: 315.7/315.9 GB/s at 8 GiB passes 300, its 8 B..8 GiB average does not.
    sweep = parse_nccl_tests(sample(HISOHARA))
    large = [r for r in sweep.rows if r.size == 8589934592][0]
    assert min(large.oop_busbw_gbps, large.ip_busbw_gbps) >= MI300X_MIN > sweep.avg_busbw_gbps
    assert not judge_smoke(sweep, 0, False, MI300X_MIN).passed
    single = judge_smoke(parse_nccl_tests(sample(HEALTHY)), 0, False, MI300X_MIN)
    assert (single.passed, single.busbw_gbps) == (True, 315.8)
    assert not judge_smoke(parse_nccl_tests(sample(HEALTHY)), 0, False, 320.0).passed
    # a healthy Azure MI300X VF whose sweep stops at 128 MiB never reaches 300 even at its largest size
    vf = parse_nccl_tests(sample(VF)).rows[-1]
    assert vf.size == 134217728 and max(vf.oop_busbw_gbps, vf.ip_busbw_gbps) < MI300X_MIN


def test_the_device_lines_name_the_product_the_minimum_is_for():
    # rccl-tests prints hipDeviceProp_t.name; amd-smi's market name may differ ("... OAM"), so the
    # judge takes the product from the node's facts, not from this output.
    for name, product in ((HISOHARA, "AMD Instinct MI300X"), (BLOG, "AMD Instinct MI300X"),
                          (VF, "AMD Instinct MI300X VF"), (MI210, "AMD Instinct MI210")):
        devices = [line.split("] ", 1)[1] for line in sample(name).splitlines() if line.lstrip("# ").startswith("Rank")]
        assert devices and set(devices) == {product}


# --------------------------------------------------------------------------
# The simulated nodes' replays.

@pytest.mark.parametrize("replay,capture", sorted(REPLAYS.items()))
def test_a_replay_is_its_capture_byte_for_byte(replay, capture):
    assert sample(replay) == sample(capture)


def test_the_healthy_replay_is_built_from_the_capture_as_its_sources_say():
    capture = sample(HISOHARA).splitlines()
    built = sample(HEALTHY).splitlines()
    changed = [line for line in built if line not in capture]
    assert changed == [
        "# nThread 1 nGpus 1 minBytes 8589934592 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20 "
        "agg iters: 1 validation: 1 graph: 0",
        "# Avg bus bandwidth    : 315.8",
    ]
    assert "%g" % ((315.69 + 315.91) / 2) == "315.8"  # rccl-tests' mean, printed as it prints it
    dropped = [line for line in capture if line not in built]
    assert len(dropped) == 30 + 2 and all(line.split()[0].isdigit() for line in dropped[1:-1])
    sources = sample("rccl-SOURCES.txt")
    for name in ("rccl-healthy-mi300x.txt", "rccl-sweep-mi300x.txt", "rccl-abort-mi210.txt"):
        assert name in sources
    assert "CONSTRUCTED" in sources
