"""nccl-tests output: the parser (gpugate.parsers.nccl) and the smoke verdict
(gpugate.judges.smoke).

Table tests read the real captures in tests/fixtures (each with a
.src.txt saying where it came from; the five the simulated nodes replay are
read from gpugate/data/smoke/, the same bytes, sources in its SOURCES.txt); the per-form tests build on real lines
from those captures and from public nccl-tests issues (quoted below), with
the launcher prefixes srun, Open MPI, MPICH and pdsh put before each line.
"""

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpugate.judges.smoke import SmokeVerdict, first_error, gbps, judge_smoke
from gpugate.parsers.nccl import MAX_ERRORS, NcclRow, NcclRun, parse_nccl_tests

from conftest import ROOT, SAMPLES

PROPS = settings(max_examples=150, deadline=None)
H100_MIN = 350.0  # a typical per-product minimum (the example) for a large-message all_reduce
GH200_MIN = 15.0  # a minimum a site would set for the 1 B..128 MB sweep of the GH200 capture

A3MEGA = "nccl-all_reduce_perf-2node-16xH100-a3mega-gcp-healthy.txt"
GH200 = "nccl-all_reduce_perf-2node-8xGH200-slingshot-nccl2.30.4-tests2.18.3-healthy.txt"
SHARP = "nccl-all_reduce_perf-2node-h100-ib-sharp-internal-error-abort-FRAGMENT.txt"
SRUN = "nccl-all_reduce_perf-2node-p5.48xlarge-h100-efa-srun-label-prefix-FRAGMENT.txt"
WRONG = "nccl-all_reduce_perf-4node-16xGH200-slingshot-wrong-nonzero-corruption-FRAGMENT.txt"
NVLINK = "nccl-all_reduce_perf-dgxh100-4gpu-nvlink-healthy-FRAGMENT.txt"
PCIE = "nccl-all_reduce_perf-dgxh100-4gpu-p2p-disabled-pcie-degraded-FRAGMENT.txt"


# Captures the package already carries for the simulated nodes' all_reduce_perf.
SMOKE = os.path.join(ROOT, "gpugate", "data", "smoke")
IN_PACKAGE = {A3MEGA: "pair-healthy.txt", GH200: "pair-slow.txt", SHARP: "nccl-abort.txt",
              NVLINK: "healthy.txt", PCIE: "pcie-degraded.txt"}


def sample(name):
    path = os.path.join(SMOKE, IN_PACKAGE[name]) if name in IN_PACKAGE else os.path.join(SAMPLES, name)
    with open(path) as handle:
        return handle.read()


# --------------------------------------------------------------------------
# Table: what the parser reads from each capture, and the verdict.

# name: (rows, first size, last (size, oop busbw, ip busbw), avg, oob, wrong_total, test, version, concluded)
READS = {
    A3MEGA: (31, 8, (8589934592, 338.82, 337.35), 70.742, 0, 0, None, None, False),
    GH200: (28, 1, (134217728, 101.70, 107.63), 17.8617, 0, 0, "all_reduce_perf", "2.30.4", True),
    SHARP: (0, None, None, None, None, None, None, None, False),
    SRUN: (32, 8, (17179869184, 487.09, 487.26), None, None, 0, None, None, False),
    WRONG: (28, 1, (134217728, 89.85, 83.23), None, None, 3935945, "all_reduce_perf", "2.29.2", False),
    NVLINK: (4, 1073741824, (8589934592, 370.70, 370.75), 369.941, 0, 0, None, None, False),
    PCIE: (4, 1073741824, (8589934592, 19.98, 19.98), 22.9255, 0, 0, None, None, False),
}


@pytest.mark.parametrize("name", sorted(READS))
def test_each_capture_parses_to_what_it_shows(name):
    rows, first, last, avg, oob, wrong, test, version, concluded = READS[name]
    run = parse_nccl_tests(sample(name))
    assert len(run.rows) == rows
    if rows:
        assert run.rows[0].size == first
        assert (run.rows[-1].size, run.rows[-1].oop_busbw_gbps, run.rows[-1].ip_busbw_gbps) == last
        assert all(r.root == -1 and r.redop == "sum" for r in run.rows)
    assert run.avg_busbw_gbps == avg
    assert run.out_of_bounds == oob
    assert run.wrong_total == wrong
    assert (run.test, run.nccl_version, run.concluded) == (test, version, concluded)
    assert run.min_bw_verdict is None  # none of them ran with NCCL_TESTS_MIN_BW
    assert bool(run.errors) == (name == SHARP)


# name: (want, passed, problem) for an exit code of 0
VERDICTS = {
    A3MEGA: [(H100_MIN, False, "busbw=70.7GB/s (want >= 350)"), (60.0, True, "")],
    GH200: [(GH200_MIN, True, ""), (H100_MIN, False, "busbw=17.8GB/s (want >= 350)")],
    SHARP: [(H100_MIN, False, "nccl error: h100-4: NCCL WARN Net : connecting to address with family 33621 is "
                              "neither AF_..")],
    SRUN: [(H100_MIN, False, "no result: no avg busbw")],
    WRONG: [(GH200_MIN, False, "wrong=3935945")],
    NVLINK: [(H100_MIN, True, ""), (None, True, "")],
    PCIE: [(H100_MIN, False, "busbw=22.9GB/s (want >= 350)"), (None, True, "")],
}


@pytest.mark.parametrize("name,want,passed,problem",
                         [(n, w, p, m) for n, cases in sorted(VERDICTS.items()) for w, p, m in cases])
def test_each_capture_gets_its_verdict(name, want, passed, problem):
    verdict = judge_smoke(parse_nccl_tests(sample(name)), 0, False, want)
    assert (verdict.passed, verdict.problem) == (passed, problem)
    assert verdict.busbw_gbps == READS[name][3]


def test_the_sharp_abort_keeps_every_failure_line_as_printed():
    run = parse_nccl_tests(sample(SHARP))
    assert run.errors == (
        "h100-4: Test NCCL failure common.cu:1057 'internal error / '",
        ".. h100-4 pid 739791: Test failure common.cu:893",
        "h100-4:739787:739914 [1] misc/socket.cc:397 NCCL WARN Net : connecting to address  with family 33621 "
        "is neither AF_INET(2) nor AF_INET6(10)",
        "h100-4: Test NCCL failure common.cu:1057 'internal error / '",
        ".. h100-4 pid 739787: Test failure common.cu:893",
    )


def test_the_corruption_fragment_names_its_rows():
    run = parse_nccl_tests(sample(WRONG))
    bad = [(r.size, r.oop_wrong, r.ip_wrong) for r in run.rows if r.oop_wrong or r.ip_wrong]
    assert bad[0] == (2097152, 18134, 9609)
    assert bad[-1] == (67108864, 113492, 0)
    assert len(bad) == 6


# --------------------------------------------------------------------------
# Forms: prefixes, old and new layouts, NCCL_TESTS_MIN_BW, -c 0.

# Open MPI --tag-output has no space after the colon; PRRTE (Open MPI 5) names the job.
PREFIXES = {
    "srun --label": lambda rank: "%d: " % rank,
    "srun --label, padded": lambda rank: "%2d: " % rank,
    "srun --label, het step": lambda rank: "P0 %d: " % rank,
    "mpirun --tag-output": lambda rank: "[1,%d]<stdout>:" % rank,
    "mpirun --tag-output, stderr": lambda rank: "[1,%d]<stderr>: " % rank,
    "prterun --output tag": lambda rank: "[prterun-gpu-1-1-221400@1,%d]<stdout>: " % rank,
    "mpich -prepend-rank": lambda rank: "[%d] " % rank,
    "pdsh/clush": lambda rank: "gpu-1-1: ",
    "srun --label around mpirun --tag-output": lambda rank: "0: [1,%d]<stdout>:" % rank,
}


def prefixed(text, prefix):
    return "".join(prefix + line for line in text.splitlines(True))


@pytest.mark.parametrize("style", sorted(PREFIXES))
@pytest.mark.parametrize("name", [GH200, A3MEGA, WRONG])
def test_a_prefix_style_changes_nothing(style, name):
    text = sample(name)
    assert parse_nccl_tests(prefixed(text, PREFIXES[style](0))) == parse_nccl_tests(text)


@pytest.mark.parametrize("style", sorted(set(PREFIXES) - {"pdsh/clush"}))
def test_error_lines_lose_the_launcher_prefix_only(style):
    text = sample(SHARP)
    assert parse_nccl_tests(prefixed(text, PREFIXES[style](3))).errors == parse_nccl_tests(text).errors


def test_the_srun_label_capture_reads_like_its_unlabelled_text():
    text = sample(SRUN)
    bare = "".join(line[3:] for line in text.splitlines(True))
    assert all(line.startswith("0: ") for line in text.splitlines())
    assert parse_nccl_tests(text) == parse_nccl_tests(bare)


def _with_footer(text, avg_line):
    return text.replace("# Avg bus bandwidth    : 17.8617 ", avg_line)


@pytest.mark.parametrize("suffix,verdict", [("OK", True), ("FAILED", False), ("", None)])
def test_nccl_tests_min_bw_suffix(suffix, verdict):
    run = parse_nccl_tests(_with_footer(sample(GH200), "# Avg bus bandwidth    : 17.8617 %s" % suffix))
    assert run.min_bw_verdict is verdict and run.avg_busbw_gbps == 17.8617


def test_a_min_bw_failure_fails_the_smoke_when_no_minimum_is_given():
    run = parse_nccl_tests(_with_footer(sample(GH200), "# Avg bus bandwidth    : 17.8617 FAILED"))
    verdict = judge_smoke(run, 1, False, None)
    assert verdict.problem == "exit 1"  # nccl-tests exits 1 on FAILED; the exit code comes first
    verdict = judge_smoke(run, 0, False, None)
    assert (verdict.passed, verdict.problem) == (False, "busbw=17.8GB/s (NCCL_TESTS_MIN_BW FAILED)")


# -c 0: nccl-tests prints "N/A" for #wrong (util.cu writeBenchmarkLineBody).
UNCHECKED = """\
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)
  1073741824     268435456     float     sum      -1   4367.9  245.83  368.74     N/A   4366.8  245.89  368.83     N/A
  2147483648     536870912     float     sum      -1   8707.5  246.62  369.94     N/A   8711.0  246.53  369.79     N/A
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 369.941
"""


def test_check_disabled_reads_as_unknown_wrong_and_is_not_a_pass():
    run = parse_nccl_tests(UNCHECKED)
    assert len(run.rows) == 2 and run.rows[0].oop_wrong is None and run.wrong_total is None
    verdict = judge_smoke(run, 0, False, H100_MIN)
    assert (verdict.passed, verdict.problem) == (False, "unchecked: #wrong N/A (run without -c 0)")
    # A site command that is not a proof of correctness may opt out.
    assert judge_smoke(run, 0, False, None, require_result=False).passed


# Older nccl-tests: no root column, an "error" column (a max relative error),
# "#   Rank  0 Pid" lines.  Lines from NVIDIA/nccl-tests issues #118 and #176.
OLD = """\
# nThread 1 nGpus 1 minBytes 10737418240 maxBytes 21474836480 step: 1048576(bytes) warmup iters: 5 iters: 20 validation: 1
#
# Using devices
#   Rank  0 Pid  26528 on  dgx-work01 device  0 [0x07] NVIDIA A100-SXM4-40GB
#   Rank  1 Pid  26529 on  dgx-work01 device  1 [0x0a] NVIDIA A100-SXM4-40GB
#
#                                                       out-of-place                       in-place          
#       size         count      type   redop     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)                       (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       
        4096          1024     float     sum    93.73    0.04    0.09  1e-06    93.15    0.04    0.09  1e-06
        8192          2048     float     sum    96.51    0.08    0.17  1e-06    95.46    0.09    0.17  1e-06
       16384          4096     float     sum    96.70    0.17    0.34  1e-06    94.98    0.17    0.34  1e-06
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 0.2 
#
"""


def test_the_old_layout_without_root_and_with_an_error_column():
    run = parse_nccl_tests(OLD)
    assert [r.size for r in run.rows] == [4096, 8192, 16384]
    row = run.rows[1]
    assert (row.root, row.oop_time_us, row.oop_busbw_gbps, row.ip_time_us, row.ip_busbw_gbps) == (
        None, 96.51, 0.17, 95.46, 0.17)
    assert (row.oop_wrong, row.oop_max_error, row.ip_max_error) == (None, 1e-06, 1e-06)
    assert run.wrong_total is None and run.out_of_bounds == 0 and run.test is None
    assert judge_smoke(run, 0, False, 0.1).passed  # the error column was checked: out of bounds 0
    bad = parse_nccl_tests(OLD.replace("values : 0 OK", "values : 2 FAILED"))
    assert judge_smoke(bad, 1, False, 0.1).problem == "out_of_bounds=2"


# broadcast_perf of that era: a root column but no redop, -c 0 ("validation: 0",
# error N/A), and a benign-looking NCCL WARN.  NVIDIA/nccl-tests issue #82.
OLD_BROADCAST = """\
# nThread 1 nGpus 1 minBytes 8 maxBytes 2147483648 step: 2(factor) warmup iters: 10 iters: 100 validation: 0 
#
# Using devices
#   Rank  0 Pid  14926 on v100-gpu-1 device  0 [0x00] Tesla V100-PCIE-16GB
#   Rank  1 Pid   9210 on v100-gpu-5 device  0 [0x00] Tesla V100-PCIE-16GB

v100-gpu-1:14926:14926 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]
NCCL version 2.9.6+cuda11.2

v100-gpu-5:9210:9210 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]
#
#                                                     out-of-place                       in-place          
#       size         count    type    root     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)                     (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       
           8             2   float       0    45.82    0.00    0.00    N/A    38.17    0.00    0.00    N/A
"""


def test_the_old_broadcast_layout_with_root_and_no_redop():
    run = parse_nccl_tests(OLD_BROADCAST)
    row = run.rows[0]
    assert (row.size, row.type, row.redop, row.root, row.oop_time_us, row.ip_time_us) == (
        8, "float", "none", 0, 45.82, 38.17)
    assert (row.oop_wrong, row.oop_max_error, run.wrong_total) == (None, None, None)
    assert run.nccl_version == "2.9.6" and len(run.errors) == 2
    # any NCCL warning fails the proof: NCCL prints none unless NCCL_DEBUG asks for them
    assert judge_smoke(run, 0, False, None).problem == (
        "nccl error: v100-gpu-1: NCCL WARN Failed to open libibverbs.so[.1]")


# Open MPI --tag-output as printed (aws/aws-k8s-tester PR #503, p5.48xlarge):
# no space after the colon, trailing blanks kept.
TAGGED = """\
[1,0]<stdout>:#                                                              out-of-place                     in-place     
[1,0]<stdout>:#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw  #wrong     
[1,0]<stdout>:#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)     
[1,0]<stdout>:           8             2     float     sum      -1    12.90    0.00    0.00      0    12.87    0.00    0.00      0
[1,0]<stdout>:          16             4     float     sum      -1    12.88    0.00    0.00      0    12.83    0.00    0.00      0
[1,0]<stdout>:          32             8     float     sum      -1    22.25    0.00    0.00      0    13.34    0.00    0.00      0
[1,0]<stdout>:# Out of bounds values : 0 OK
[1,0]<stdout>:# Avg bus bandwidth    : 92.3405 
"""


def test_open_mpi_tag_output_as_printed():
    run = parse_nccl_tests(TAGGED)
    assert [(r.size, r.oop_time_us, r.ip_time_us) for r in run.rows] == [(8, 12.90, 12.87), (16, 12.88, 12.83),
                                                                         (32, 22.25, 13.34)]
    assert (run.avg_busbw_gbps, run.out_of_bounds, run.wrong_total) == (92.3405, 0, 0)
    assert judge_smoke(run, 0, False, 90.0).passed


# A non-MPI build under mpirun -np 2: two processes, two tables, interleaved
# (NVIDIA/nccl-tests issue #182).
TWO_PROCESSES = """\
   134217728      33554432     float     sum      -1    29770    4.51    4.51      0    29873    4.49    4.49      0
   134217728      33554432     float     sum      -1    27666    4.85    4.85      0    27662    4.85    4.85      0
   268435456      67108864     float     sum      -1    55270    4.86    4.86      0    55213    4.86    4.86      0
testgpu1:2832:2832 [1] NCCL INFO comm 0x55c6f1c65b50 rank 0 nranks 2 cudaDev 0 busId 3000 - Destroy COMPLETE
testgpu1:2832:2832 [1] NCCL INFO comm 0x55c6f1c6a6c0 rank 1 nranks 2 cudaDev 1 busId 3020 - Destroy COMPLETE
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 1.7535
#

   268435456      67108864     float     sum      -1    59440    4.52    4.52      0    59568    4.51    4.51      0
testgpu2:3255:3255 [1] NCCL INFO comm 0x55bc161d6b40 rank 0 nranks 2 cudaDev 0 busId 3000 - Destroy COMPLETE
testgpu2:3255:3255 [1] NCCL INFO comm 0x55bc161db6b0 rank 1 nranks 2 cudaDev 1 busId 3020 - Destroy COMPLETE
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 1.6796
#
"""


def test_two_processes_printing_a_table_each():
    run = parse_nccl_tests(TWO_PROCESSES)
    assert [r.oop_time_us for r in run.rows] == [29770, 27666, 55270, 59440]
    assert (run.avg_busbw_gbps, run.out_of_bounds, run.errors) == (1.6796, 0, ())
    assert judge_smoke(run, 0, False, 1.7).problem == "busbw=1.67GB/s (want >= 1.7)"


def test_huge_wrong_counts_printed_with_g_are_counts():
    # "%6g" of 1234567 wrong elements is "1.23457e+06"
    line = ("     2097152        524288     float     sum      -1   6249.20    0.34    0.63  1.23457e+06"
            "   6142.32    0.34    0.64    9609")
    run = parse_nccl_tests(line)
    assert run.rows[0].oop_wrong == 1234570 and run.wrong_total == 1234570 + 9609


def test_per_iteration_and_timestamp_columns():
    # util.cu: with per-iteration timing each side has i_min i_max i_p99 i_cv% after #wrong;
    # with timestamps a "%Y-%m-%d %H:%M:%S" column ends the row.
    per_iter = ("  1073741824     268435456     float     sum      -1   4367.9  245.83  368.74       0"
                "   4301.2   4420.7   4419.9     0.61   4366.8  245.89  368.83       3   4300.1   4430.2   4429.0     0.64")
    stamped = ("  1073741824     268435456     float     sum      -1   4367.9  245.83  368.74       0"
               "   4366.8  245.89  368.83       0  2025-06-01 12:00:00")
    row = parse_nccl_tests(per_iter).rows[0]
    assert (row.oop_busbw_gbps, row.oop_wrong, row.ip_time_us, row.ip_busbw_gbps, row.ip_wrong) == (
        368.74, 0, 4366.8, 368.83, 3)
    assert parse_nccl_tests(stamped).rows[0].ip_busbw_gbps == 368.83


def test_nccl_info_lines_interleaved_with_the_table():
    # NCCL_DEBUG=INFO writes between rows; a row cut by another rank's line
    # is lost, never misread (NVIDIA/nccl issue #1453 shows such output).
    text = "\n".join([
        "[0] h100clust-worker-1:497888:497888 [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
        "[0]         4096          1024     float     sum      -1    75.38    0.05    0.10      0    74.12    0.06    0.10      0",
        "[0]         8192          2048     float     sum      -1[0] h100clust-worker-1:497888:497888 [0] NCCL INFO 8192 Bytes",
        "[0]     75.38    0.05    0.10      0",
    ])
    run = parse_nccl_tests(text)
    assert [r.size for r in run.rows] == [4096] and run.nccl_version == "2.21.5" and run.errors == ()


@pytest.mark.parametrize("line,shown", [
    ("gpu-1-1: Test CUDA failure common.cu:1110 'out of memory'",
     "gpu-1-1: Test CUDA failure common.cu:1110 'out of memory'"),
    ("nid006352: Test NCCL failure common.cu:958 'invalid usage (run with NCCL_DEBUG=WARN for details)",
     "nid006352: Test NCCL failure common.cu:958 'invalid usage (run with NCCL_DEBUG.."),
    (" .. gpu-1-1 pid 1234: Test failure common.cu:893", ".. gpu-1-1 pid 1234: Test failure common.cu:893"),
    # nccl-tests -T 60: its own deadline (common.cu testStreamSynchronize)
    ("gpu-1-1: Test timeout (60s) common.cu:389", "gpu-1-1: Test timeout (60s) common.cu:389"),
])
def test_failure_lines_are_errors(line, shown):
    run = parse_nccl_tests(sample(NVLINK) + line + "\n")
    assert run.errors == (line.strip(),)
    assert judge_smoke(run, 0, False, H100_MIN).problem == "nccl error: " + shown


@pytest.mark.parametrize("value", ["nan", "-nan", "inf"])
def test_an_average_that_is_not_a_number_is_no_average(value):
    # no row ran: nccl-tests divides by a zero count (NVIDIA/nccl-tests issue #294)
    run = parse_nccl_tests(_with_footer(sample(GH200), "# Avg bus bandwidth    : %s " % value))
    assert run.avg_busbw_gbps is None and len(run.rows) == 28
    assert judge_smoke(run, 0, False, None).problem == "no result: no avg busbw"


def test_a_long_log_keeps_the_first_errors_and_skips_huge_lines():
    abort = sample(SHARP).splitlines(True)
    run = parse_nccl_tests("".join(abort * 100) + "x" * 5000 + " NCCL WARN in a dumped environment\n")
    assert len(run.errors) == MAX_ERRORS and run.errors[:5] == parse_nccl_tests(sample(SHARP)).errors


def test_two_tables_in_one_output_take_the_lowest_average():
    # a non-MPI binary started once per rank prints one table each
    run = parse_nccl_tests(sample(NVLINK) + sample(PCIE))
    assert len(run.rows) == 8 and run.avg_busbw_gbps == 22.9255 and run.out_of_bounds == 0


# --------------------------------------------------------------------------
# The verdict's order and wording.

def test_order_of_problems():
    wrong = parse_nccl_tests(sample(WRONG) + "# Out of bounds values : 12 FAILED\n# Avg bus bandwidth    : 5.1 \n")
    sharp = parse_nccl_tests(sample(SHARP) + sample(WRONG))
    assert judge_smoke(wrong, 1, True, H100_MIN, deadline_s=600).problem == "timeout after 600s"
    assert judge_smoke(wrong, 1, True, H100_MIN).problem == "timeout after the deadline"
    assert judge_smoke(sharp, 1, False, H100_MIN).problem.startswith("nccl error: h100-4: NCCL WARN")
    assert judge_smoke(wrong, 1, False, H100_MIN).problem == "wrong=3935945"
    assert judge_smoke(parse_nccl_tests(""), 1, False, H100_MIN).problem == "no result"
    assert judge_smoke(None, 1, False, H100_MIN).problem == "no result"
    healthy = parse_nccl_tests(sample(NVLINK))
    assert judge_smoke(healthy, 1, False, H100_MIN).problem == "exit 1"
    assert judge_smoke(healthy, -9, False, H100_MIN).problem == "signal 9"
    assert judge_smoke(healthy, None, False, H100_MIN).problem == "exit unknown"
    assert judge_smoke(healthy, 0, False, 400).problem == "busbw=369.9GB/s (want >= 400)"


def test_a_site_command_is_judged_by_its_exit_code_when_no_result_is_required():
    quiet = parse_nccl_tests("checked 8 GPUs: fine\n")
    assert judge_smoke(quiet, 0, False, None, require_result=False) == SmokeVerdict(True, "", None)
    assert judge_smoke(quiet, 2, False, None, require_result=False).problem == "exit 2"
    assert judge_smoke(quiet, 0, False, None).problem == "no result"
    # a wanted busbw needs an average to compare with
    assert judge_smoke(quiet, 0, False, 100.0, require_result=False).problem == "no result"


def test_low_busbw_is_a_finding_in_the_reason_format():
    verdict = judge_smoke(parse_nccl_tests(sample(PCIE)), 0, False, H100_MIN)
    assert (verdict.component, verdict.observed, verdict.expected) == ("busbw", "22.9GB/s", ">= 350")
    assert verdict.problem == "%s=%s (want %s)" % (verdict.component, verdict.observed, verdict.expected)


@given(st.floats(min_value=0, max_value=1e6, allow_nan=False), st.integers(1, 10**8).map(lambda c: c / 100))
@PROPS
def test_the_shown_busbw_never_reaches_the_minimum_it_missed(observed, want):
    # a baseline's minimum has at most two decimals ("350", "22.5")
    shown = gbps(observed, down=True)
    assert float(shown) <= observed
    if observed < want:
        problem = judge_smoke(parse_nccl_tests(sample(NVLINK).replace("369.941", repr(observed))), 0, False, want)
        assert problem.problem == "busbw=%sGB/s (want >= %s)" % (shown, gbps(want))
        assert shown != gbps(want)


def test_first_error_prefers_the_cause():
    errors = ("h100-4: Test NCCL failure common.cu:1057 'internal error / '",
              "h100-4:739787:739914 [1] misc/socket.cc:397 NCCL WARN Net : oops")
    assert first_error(errors) == "h100-4: NCCL WARN Net : oops"
    assert first_error(errors[:1]) == "h100-4: Test NCCL failure common.cu:1057 'internal error / '"
    assert first_error(("something odd Test failure x",)) == "something odd Test failure x"


# --------------------------------------------------------------------------
# Properties: nothing but a complete, clean, checked result is a pass.

def _proven(run: NcclRun) -> bool:
    checked = run.wrong_total == 0 or (run.out_of_bounds == 0 and all(
        r.oop_max_error is not None and r.ip_max_error is not None for r in run.rows))
    return bool(run.rows) and run.avg_busbw_gbps is not None and not run.errors and checked


@given(st.text(max_size=2000), st.integers(-20, 300), st.booleans(),
       st.one_of(st.none(), st.floats(0, 1000)))
@PROPS
def test_arbitrary_text_is_never_a_pass_without_a_proven_result(text, code, timed_out, want):
    run = parse_nccl_tests(text)
    verdict = judge_smoke(run, code, timed_out, want)
    if verdict.passed:
        assert code == 0 and not timed_out and _proven(run)
    else:
        assert verdict.problem


_NUMS = st.one_of(st.floats(0, 1e5, allow_nan=False).map(lambda v: "%.2f" % v), st.sampled_from(
    ["0", "1e-06", "N/A", "1.2e+06", "-1", "nan", "x", "12", "0.00"]))
_ROW = st.builds(
    lambda size, count, dtype, redop, root, cols: "%12s  %12s  %8s  %6s  %6s  %s" % (
        size, count, dtype, redop, root, "  ".join(cols)),
    st.integers(0, 2**34).map(str), st.integers(0, 2**32).map(str),
    st.sampled_from(["float", "int8", "half", "bfloat16", "?"]), st.sampled_from(["sum", "max", "none"]),
    st.sampled_from(["-1", "0", ""]), st.lists(_NUMS, min_size=6, max_size=18))
_LINES = st.one_of(
    _ROW,
    st.sampled_from([  # real rows: clean, corrupt, unchecked (-c 0), older layout
        "           1             1      int8     sum      -1    26.95    0.00    0.00       0    22.40    0.00    0.00       0",
        "     2097152       2097152      int8     sum      -1  6249.20    0.34    0.63   18134  6142.32    0.34    0.64    9609",
        "  1073741824     268435456     float     sum      -1   4367.9  245.83  368.74     N/A   4366.8  245.89  368.83     N/A",
        "        4096          1024     float     sum    93.73    0.04    0.09  1e-06    93.15    0.04    0.09  1e-06",
    ]),
    st.sampled_from([
        "# nccl-tests version 2.18.3 nccl-headers=23004 nccl-library=23004",
        "# Collective test starting: all_reduce_perf",
        "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong",
        "#       size         count      type   redop     time   algbw   busbw  error     time   algbw   busbw  error",
        "# Out of bounds values : 0 OK", "# Out of bounds values : 7 FAILED",
        "# Avg bus bandwidth    : 369.941", "# Avg bus bandwidth    : 17.8617 OK",
        "# Avg bus bandwidth    : 1.5 FAILED", "# Avg bus bandwidth    : nan",
        "#", "# Collective test concluded: all_reduce_perf",
        "h100-4: Test NCCL failure common.cu:1057 'internal error / '",
        "h100-4:1:2 [1] misc/socket.cc:397 NCCL WARN Net : oops",
    ]),
    st.text(max_size=80))
_PREFIX = st.one_of(st.just(""), st.integers(0, 64).map(lambda r: "%d: " % r),
                    st.integers(0, 64).map(lambda r: "[1,%d]<stdout>:" % r),
                    st.integers(0, 64).map(lambda r: "[%d] " % r), st.text(max_size=6))


@given(st.lists(st.tuples(_PREFIX, _LINES), max_size=40), st.integers(-3, 3), st.booleans(),
       st.one_of(st.none(), st.floats(0, 500)))
@PROPS
def test_valid_looking_text_passes_only_with_a_proven_result(lines, code, timed_out, want):
    run = parse_nccl_tests("\n".join(prefix + line for prefix, line in lines))
    verdict = judge_smoke(run, code, timed_out, want)
    if verdict.passed:
        assert code == 0 and not timed_out and _proven(run)
        assert all(r.oop_wrong in (0, None) and r.ip_wrong in (0, None) for r in run.rows)
        assert want is None or run.avg_busbw_gbps >= want
        assert run.min_bw_verdict is not False and not run.out_of_bounds


@given(st.lists(st.tuples(st.integers(1, 2**33), st.floats(0, 999, allow_nan=False)), min_size=1, max_size=8),
       st.floats(0, 999, allow_nan=False), st.floats(0, 999, allow_nan=False), st.sampled_from(sorted(PREFIXES)))
@PROPS
def test_a_clean_checked_result_passes_exactly_when_fast_enough(values, avg, want, style):
    # the other side of the properties above: they would hold for a judge that never passes
    lines = ["%12d  %12d  %8s  %6s  %6d  %7.1f  %6.2f  %6.2f  %6d  %7.1f  %6.2f  %6.2f  %6d" % (
        size, size // 4, "float", "sum", -1, 10.0, busbw / 2, busbw, 0, 11.0, busbw / 2, busbw, 0)
        for size, busbw in values]
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : %g " % avg, "#"]
    text = prefixed("\n".join(lines) + "\n", PREFIXES[style](0))
    run = parse_nccl_tests(text)
    verdict = judge_smoke(run, 0, False, want)
    assert verdict.passed == (float("%g" % avg) >= want)
    assert verdict.passed or verdict.problem.startswith("busbw=")
    assert judge_smoke(run, 0, False, None).passed


@given(st.sampled_from(sorted(PREFIXES)), st.integers(0, 4095))
@PROPS
def test_a_healthy_capture_with_any_prefix_parses_the_same(style, rank):
    text = sample(GH200)
    assert parse_nccl_tests(prefixed(text, PREFIXES[style](rank))) == parse_nccl_tests(text)


@given(st.lists(st.tuples(st.integers(1, 2**33), st.floats(0, 999, allow_nan=False),
                          st.integers(0, 10**7), st.integers(0, 10**7)), min_size=1, max_size=12))
@PROPS
def test_a_table_of_random_values_reads_back(values):
    lines = ["%12d  %12d  %8s  %6s  %6d  %7.1f  %6.2f  %6.2f  %6d  %7.1f  %6.2f  %6.2f  %6d" % (
        size, size // 4, "float", "sum", -1, 10.0, busbw / 2, busbw, oop, 11.0, busbw / 2, busbw, ip)
        for size, busbw, oop, ip in values]
    run = parse_nccl_tests("\n".join(lines))
    assert [r.size for r in run.rows] == [v[0] for v in values]
    assert run.wrong_total == sum(v[2] + v[3] for v in values)
    assert [r.oop_busbw_gbps for r in run.rows] == [float("%.2f" % v[1]) for v in values]
    assert not judge_smoke(run, 0, False, None).passed  # a table without an average is no result


def test_row_type_is_a_frozen_record():
    row = parse_nccl_tests(sample(NVLINK)).rows[0]
    assert isinstance(row, NcclRow)
    with pytest.raises(Exception):
        row.size = 1
