"""NVML facts.

A wedged GPU can hang NVML inside the driver, so the reading (gpugate.vendors.nvidia.nvmlread,
the only module that imports ``pynvml``) runs in a forked child that the
caller abandons at its deadline (see ``Pending``).
"""

from __future__ import annotations

from gpugate.vendors.nvidia import nvmlread
from gpugate.model.facts import ProbeFailure

TYPE_CHECKING = False
if TYPE_CHECKING:  # for annotations only: typing costs each prolog milliseconds
    from typing import Any, Callable, Optional, Sequence


def real_module():
    return nvmlread.binding("", "")


class Pending:
    """An NVML reading under way in a forked child (gpugate.safety.forked), which
    the check abandons at its deadline: a wedged GPU can hang NVML in the
    kernel.  Fork before starting threads.

    loader: makes the module in the child (pynvml, or a simulated node's),
    so that loading it runs while the caller goes on; it failing is a
    "missing" NVML, as a binding that cannot load.  started: a child
    already forked with gpugate.vendors.nvidia.nvmlread.reader (the prolog starts it first)."""

    def __init__(self, nvml: Any = None, gpus: Optional[Sequence[int]] = None, processes: bool = False,
                 loader: Optional[Callable[[], Any]] = None, started=None):
        from gpugate.safety.forked import Forked

        self.child = started or Forked(nvmlread.reader(nvml, loader, gpus, processes))

    def result(self, timeout: float):
        """NvmlFacts, or a ProbeFailure (init error, or timeout when NVML hangs)."""
        from gpugate.safety.forked import OK, TIMEOUT

        kind, value = self.child.result(timeout)
        if kind == OK:
            return facts_of(value)
        if kind == TIMEOUT:
            return ProbeFailure("nvml", "timeout", "no answer within %.1fs (wedged GPU?)" % timeout)
        return ProbeFailure("nvml", "error", value)


def facts_of(value):
    """The reader's answer (gpugate.vendors.nvidia.nvmlread's stand-ins) as gpugate.model.facts records."""
    from gpugate.model import facts

    if isinstance(value, tuple):
        if len(value) == 4 and value[0] == nvmlread.TAG and value[1] in nvmlread.KINDS:
            _, kind, args, kwargs = value
            return getattr(facts, kind)(*[facts_of(a) for a in args], **{k: facts_of(v) for k, v in kwargs.items()})
        return tuple(facts_of(v) for v in value)
    return value


def read(nvml: Any, timeout: float, gpus: Optional[Sequence[int]] = None, processes: bool = False):
    return Pending(nvml, gpus, processes).result(timeout)
