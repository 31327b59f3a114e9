"""The prolog's NVML reader, forked before anything else of the prolog loads.

The reader's chain (fork, pynvml, NVML's answers) is the prolog's critical
path: the prolog itself loads its configuration and judges meanwhile and
then waits for the answer.  So the entry script forks it first thing, with
only this module, gpugate.safety.forked and two package __init__s loaded."""

from gpugate.safety.forked import Forked


def start_reader():
    """The reader (gpugate.safety.forked.Forked), or None when no process can be
    forked now (the prolog forks again, and reports NVML missing if it must)."""
    try:
        return Forked(_read_nvml, prepare=_prepare_reader)
    except OSError:
        return None


def _prepare_reader() -> None:
    from gpugate.vendors.nvidia import nvmlread  # noqa: F401 - the reading, which loads no records of gpugate's
    from gpugate.vendors.nvidia.pynvml_loader import import_pynvml

    import_pynvml()  # the binding (a simulated node's is built on it too)


def _read_nvml(orders: dict):
    """In the forked child: load the binding (pynvml, or the simulated
    node's) and read NVML of the job's GPUs."""
    from gpugate.vendors.nvidia import nvmlread

    binding = lambda: nvmlread.binding(orders["sim_fleet"], orders["node"], orders.get("sim_dir", ""))  # noqa: E731
    return nvmlread.reader(None, binding, orders["gpus"], False)()
