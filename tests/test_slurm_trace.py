"""Issue 24 review (nice-to-have b): GPUGATE_SLURM_TRACE names a file root
appends the pyslurm backend's calls (and either backend's one-RPC node
reads) to.  A path from the environment: never
through a symlink planted there, never into a FIFO (a hang) or a file of
someone else's; created 0600."""

import os
import stat
import threading

from gpugate.slurm import trace


def _trace(path, op, args):
    """What the pyslurm backend does for each call."""
    trace.write(path, trace.in_scontrol_words(op, args))


def test_the_trace_is_appended_to_a_file_of_root_s_created_0600(tmp_path):
    path = str(tmp_path / "calls.log")
    old = os.umask(0)
    try:
        _trace(path, "nodes", ("gpu01",))
        _trace(path, "unreserve", ("r1",))
        _trace(path, "own_record", ("gpu02",))
        os.environ["GPUGATE_SLURM_TRACE"] = path
        trace.append(("libslurm", "show", "node", "gpu03"))  # the command backend's one-RPC read
    finally:
        os.umask(old)
        os.environ.pop("GPUGATE_SLURM_TRACE", None)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert [line.split(" ", 1)[1] for line in open(path).read().splitlines()] == [
        "scontrol show node gpu01", "scontrol delete ReservationName=r1", "libslurm show node gpu02",
        "libslurm show node gpu03"]


def test_a_planted_symlink_fifo_or_someone_else_s_file_is_not_written(tmp_path):
    victim = tmp_path / "root-only"
    victim.write_text("precious\n")
    link = tmp_path / "link.log"
    link.symlink_to(victim)
    _trace(str(link), "nodes", ("",))
    assert victim.read_text() == "precious\n"  # before: root appended through the link

    fifo = str(tmp_path / "fifo.log")
    os.mkfifo(fifo)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (_trace(fifo, "nodes", ("",)), done.set()), daemon=True)
    worker.start()
    assert done.wait(5)  # never blocks in open()

    theirs = tmp_path / "theirs.log"
    theirs.write_text("")
    if os.geteuid() == 0:
        os.chown(str(theirs), 65534, 65534)
        _trace(str(theirs), "nodes", ("",))
        assert theirs.read_text() == ""
