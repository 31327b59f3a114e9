"""Issue 24 review (nice-to-have d): the job's GPUs as slurmd gives them to
the prolog and epilog.  A value that names no GPU of the node ("," , "-1",
an index past any node's count) must mean "check every GPU", never "check
none": the old parser returned [] for "," and kept negative indices."""

from hypothesis import given
from hypothesis import strategies as st

from gpugate.node.jobenv import MAX_GPUS, job_gpus


def test_slurm_lists_are_read_as_indices():
    assert job_gpus({"SLURM_JOB_GPUS": "3,1,1"}) == [1, 3]
    assert job_gpus({"SLURM_JOB_GPUS": " 0 , 2"}) == [0, 2]
    assert job_gpus({"CUDA_VISIBLE_DEVICES": "GPU-6f0e-uuid", "SLURM_STEP_GPUS": "4"}) == [4]
    assert job_gpus({}) is None


def test_empty_negative_or_out_of_range_means_every_gpu():
    for value in (",", " , ", "1,,2", "-1", "0,-3", "%d" % MAX_GPUS, "99999999999999999999", "1e3", "٣",
                  "GPU-6f0e-uuid", "MIG-1/2/3"):
        assert job_gpus({"SLURM_JOB_GPUS": value}) is None, value


@given(st.text(max_size=30))
def test_never_an_empty_list_nor_an_index_outside_0_to_max(value):
    gpus = job_gpus({"SLURM_JOB_GPUS": value})
    assert gpus is None or (gpus and all(0 <= g < MAX_GPUS for g in gpus) and gpus == sorted(set(gpus)))


def test_a_job_gpu_the_node_does_not_have_reads_every_gpu():
    """An index within MAX_GPUS but past the node's count: every GPU is
    read (gpugate.vendors.nvidia.nvmlread), not none."""
    from gpugate.vendors.nvidia import nvmlread

    class Fake:
        class NVMLError(Exception):
            value = 999  # not NOT_SUPPORTED: a failed call, recorded as such

        def __getattr__(self, name):
            raise self.NVMLError(name)

        def nvmlInit(self):
            pass

        def nvmlDeviceGetCount(self):
            return 2

    read = []
    original = nvmlread._gpu
    nvmlread._gpu = lambda nvml, index, processes: read.append(index) or index
    try:
        nvmlread._read(Fake(), [7], False)
        assert read == [0, 1]
        del read[:]
        nvmlread._read(Fake(), [1], False)
        assert read == [1]
    finally:
        nvmlread._gpu = original
