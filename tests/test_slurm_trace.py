"""Issue 24 review (nice-to-have b): GPUGATE_SLURM_TRACE names a file root
appends the pyslurm backend's calls to.  A path from the environment: never
through a symlink planted there, never into a FIFO (a hang) or a file of
someone else's; created 0600."""

import os
import stat
import threading

from gpugate.slurm.pyslurm_backend import _trace


def test_the_trace_is_appended_to_a_file_of_root_s_created_0600(tmp_path):
    path = str(tmp_path / "calls.log")
    old = os.umask(0)
    try:
        _trace(path, "nodes", ("gpu01",))
        _trace(path, "unreserve", ("r1",))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert [line.split(" ", 1)[1] for line in open(path).read().splitlines()] == [
        "scontrol show node gpu01", "scontrol delete ReservationName=r1"]


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
