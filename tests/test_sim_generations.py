"""A simulated node's change is one generation of its files (gpugate.model.simview,
gpugate.sim.generations): a run reads the one it began with, whole, while a
change is saved beside it; a change the run made itself it reads at once."""

import os
import subprocess
import sys

from conftest import ROOT, gpugate_cmd
from gpugate.sim import fleet as simfleet
from gpugate.model import simview

# A node-side run as gpugate.node.entry makes it: pinned to the generation it began with, then
# reading the loaded module's version (the sysroot) and the one on disk (modinfo, a replaying tool
# run as gpugate runs tools: /proc/self/fd/N) each time it is told to, and once after a change
# a tool of its own saved.
RUN = r"""
import os, sys
from gpugate.safety.runner import run
from gpugate.model import simview

fleet, node = sys.argv[1], sys.argv[2]
simview.pin(fleet, node)

def look():
    here = simview.node_dir(fleet, node)
    with open(os.path.join(here, "root", "sys", "module", "nvidia", "version")) as handle:
        loaded = handle.read().strip()
    disk = run([os.path.join(here, "bin", "modinfo"), "-F", "version", "nvidia"], 30).stdout.strip()
    print(loaded, disk, flush=True)

look()
sys.stdin.readline()
look()
run([sys.executable, "-m", "gpugate", "sim", "set", fleet, node, "driver=535.183.01"], 60)
look()
"""


def _versions(fleet, node):
    with open(os.path.join(fleet, node, "root", "sys", "module", "nvidia", "version")) as handle:
        loaded = handle.read().strip()
    return loaded, simfleet.load(fleet, node)["module"]["on_disk"]


def test_a_run_reads_the_generation_it_began_with_and_its_own_change(fleet):
    env = dict(os.environ, PYTHONPATH=ROOT)
    run = subprocess.Popen([sys.executable, "-c", RUN, fleet, "gpu01"], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert run.stdout.readline().split() == ["580.65.06", "580.65.06"], run.stderr.read()
        # Saved while the run reads: the next run sees it whole, this one not at all.
        simfleet.save(fleet, "gpu01", dict(simfleet.load(fleet, "gpu01"), module={
            "resident": "550.54.15", "on_disk": "550.54.15"}))
        assert _versions(fleet, "gpu01") == ("550.54.15", "550.54.15")
        out, err = run.communicate("go on\n", timeout=120)
    finally:
        run.kill()
    lines = [line.split() for line in out.splitlines()]
    assert run.returncode == 0, err
    assert lines[0] == ["580.65.06", "580.65.06"], (lines, err)
    # Its own tool's change (its child saved it) is read at once, as a GPU reset's would be.
    assert lines[1] == ["535.183.01", "535.183.01"], (lines, err)


def test_each_change_is_a_generation_and_a_node_kept_in_place_becomes_one(fleet, tmp_path):
    first = simview.generation(fleet, "gpu02")
    assert first and os.path.isfile(os.path.join(first, "node.json"))
    result = gpugate_cmd("sim", "set", fleet, "gpu02", "gpu.1.xid=79")
    assert result.returncode == 0, result.stderr
    second = simview.generation(fleet, "gpu02")
    assert second != first and os.path.isdir(first)  # the old one stays for a run still reading it
    # Unchanged files are the same file (hard-linked), changed ones are not.
    osrelease = os.path.join("root", "proc", "sys", "kernel", "osrelease")
    assert os.path.samefile(os.path.join(first, osrelease), os.path.join(second, osrelease))
    kmsg = os.path.join("root", "dev", "kmsg")
    assert not os.path.samefile(os.path.join(first, kmsg), os.path.join(second, kmsg))
    assert simfleet.nodes(fleet) == ["gpu01", "gpu02", "gpu03"]

    # A node made before generations (a directory in place) is saved into its first one.
    old = str(tmp_path / "old")
    os.makedirs(old)
    os.rename(first, os.path.join(old, "gpu02"))  # a whole directory, as sim init made it before
    os.unlink(os.path.join(fleet, "gpu02"))
    os.rename(os.path.join(old, "gpu02"), os.path.join(fleet, "gpu02"))
    assert simview.generation(fleet, "gpu02") == ""
    result = gpugate_cmd("sim", "set", fleet, "gpu02", "driver=550.54.15")
    assert result.returncode == 0, result.stderr
    assert simview.generation(fleet, "gpu02") and _versions(fleet, "gpu02") == ("550.54.15", "550.54.15")


def test_what_users_write_in_dev_shm_and_tmp_stays_across_changes(fleet):
    shm = os.path.join(fleet, "gpu03", "root", "dev", "shm")
    with open(os.path.join(shm, "nccl-leftover"), "w") as handle:
        handle.write("x" * 1024)
    assert os.stat(os.path.join(fleet, "gpu03", "root", "tmp")).st_mode & 0o7777 == 0o1777
    result = gpugate_cmd("sim", "set", fleet, "gpu03", "driver=550.54.15")
    assert result.returncode == 0, result.stderr
    assert os.path.getsize(os.path.join(shm, "nccl-leftover")) == 1024
    assert os.stat(os.path.join(fleet, "gpu03", "root", "tmp")).st_mode & 0o7777 == 0o1777


def test_a_generation_is_forgotten_ten_minutes_after_it_was_replaced_not_after_it_was_made(fleet):
    def change(value):
        result = gpugate_cmd("sim", "set", fleet, "gpu01", "gpu.1.xid=%d" % value)
        assert result.returncode == 0, result.stderr
        return simview.generation(fleet, "gpu01")

    first = simview.generation(fleet, "gpu01")
    hours_ago = os.path.getmtime(first) - 7200
    os.utime(first, (hours_ago, hours_ago))  # made long ago: a node left as it was for hours
    change(79)
    change(48)  # a run begun on the first one may still read it: replaced a moment ago
    assert os.path.isdir(first)
    os.utime(first, (hours_ago, hours_ago))  # replaced long ago
    change(31)
    assert not os.path.exists(first)
    assert len(os.listdir(os.path.join(fleet, simview.GENS, "gpu01"))) == 3


def test_a_change_made_under_another_umask_keeps_the_nodes_modes(fleet):
    """The testbed makes its nodes under umask 022, the CLI's changes run under 077 (what it
    creates is root's alone): a node's directories stay as they were made, so a job's user
    still reaches its /dev/shm through them."""
    first = simview.generation(fleet, "gpu02")
    rels = ("", "root", "root/dev", "root/proc/sys/kernel", "bin")
    for rel in rels:
        os.chmod(os.path.join(first, rel), 0o755)  # as made under umask 022
    result = gpugate_cmd("sim", "set", fleet, "gpu02", "gpu.1.xid=79")  # umask 077
    assert result.returncode == 0, result.stderr
    here = simview.generation(fleet, "gpu02")
    assert here != first
    assert {rel: os.stat(os.path.join(here, rel)).st_mode & 0o777 for rel in rels} == {rel: 0o755 for rel in rels}
