"""Issue 33, item 4, where Slurm tracks jobs without cgroups
(ProctrackType=proctrack/linuxproc or proctrack/pgid): another running
job's process has no job cgroup, read "in no job", and the epilog drained
it as a leftover, acute.  A process in no job's cgroup is now the job of
the slurmstepd above it (PPid chain, as Slurm's linuxproc find_ancestor;
under pgid, its process group's leader's too); one reparented to init stays
a leftover."""

import os
import subprocess
import sys
import tempfile

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from gpugate.errors import ParseError
from gpugate.judges.leftover import leftovers
from gpugate.parsers.proctree import ancestry_job, stat_pgrp, status_fields, step_job
from gpugate.probes import owners
from test_job_processes import NOBODY, _epilog, _sim
from test_node_side import node_env, run_entry  # noqa: F401 - fixture

LEFT = "broken processes:gpu1=1 left [pid 5555] (want none)"


# --- the attack, through the epilog slurmd runs ---------------------------------

def _nobodys(env, pid=5555):
    """The attacker's process: uid 65534's (its /proc entry and real uid)."""
    d = os.path.join(env["fleet"], "gpu01", "root", "proc", str(pid))
    status = os.path.join(d, "status")
    with open(status) as handle:
        text = handle.read().replace("Uid:\t1000\t1000\t1000\t1000", "Uid:\t%d\t%d\t%d\t%d" % ((NOBODY,) * 4))
    with open(status, "w") as handle:
        handle.write(text)
    os.chown(d, NOBODY, NOBODY)


def test_another_running_jobs_process_without_job_cgroups_drains_nothing(node_env):  # noqa: F811
    """Job 201 (nobody's) and job 202 share gpu01, ConstrainDevices=no, no job cgroups (linuxproc,
    pgid): 201's process, under 201's task under 201's slurmstepd, sits on 202's GPU 1 when 202 ends.
    Before: "in no job", drained acute."""
    assert run_entry("healthcheck", node_env).returncode == 0
    for tracking in ("linuxproc", "pgid"):
        for layout in ("v2", "v1"):
            _sim(node_env, "slurm.constrain_devices=no", "slurm.proctrack=" + tracking, "slurm.cgroup=" + layout,
                 "slurm.jobs=201", "gpu.1.processes=5555", "slurm.process.5555=201")
            _nobodys(node_env)
            assert _epilog(node_env, 202, "1") == (0, None), (tracking, layout)


def test_a_reparented_orphan_without_job_cgroups_still_drains(node_env):  # noqa: F811
    """Job 201's process, double-forked to init while 201 runs: under linuxproc Slurm no longer
    tracks it (a leftover); under pgid it is still in 201's process group (Slurm signals it: 201's);
    under cgroup tracking still in 201's cgroup (201's).  This job's own and an ended job's drain."""
    assert run_entry("healthcheck", node_env).returncode == 0
    cases = [("linuxproc", "orphan:201", "201", True), ("pgid", "orphan:201", "201", False),
             ("cgroup", "orphan:201", "201", False), ("linuxproc", "202", "201,202", True),
             ("pgid", "200", "201", True), ("linuxproc", "none", "201", True)]
    for tracking, owner, running, drains in cases:
        _sim(node_env, "slurm.constrain_devices=no", "slurm.proctrack=" + tracking, "slurm.jobs=" + running,
             "gpu.1.processes=5555", "slurm.process.5555=" + owner)
        _nobodys(node_env)
        code, reason = _epilog(node_env, 202, "1")
        assert (code, reason and LEFT in reason) == ((1, True) if drains else (0, None)), (tracking, owner)


# --- the probe on a node's file-system root ----------------------------------

def _proc(root, pid, ppid, comm="python3", cmdline="python3\0", uid=None, pgrp=None, cgroup="0::/system.slice/x\n"):
    d = os.path.join(root, "proc", str(pid))
    os.makedirs(d, exist_ok=True)
    uid = os.stat(os.path.join(root, "proc")).st_uid if uid is None else uid
    files = {"cgroup": cgroup, "comm": comm + "\n", "cmdline": cmdline,
             "status": "Name:\t%s\nPPid:\t%s\nUid:\t%d\t%d\t%d\t%d\n" % ((comm, ppid) + (uid,) * 4),
             "stat": "%d (%s) S %s %d %d\n" % (pid, comm, ppid, pid if pgrp is None else pgrp, pid)}
    for name, text in files.items():
        with open(os.path.join(d, name), "w") as f:
            f.write(text)


def test_probe_walks_to_roots_slurmstepd_only(tmp_path):
    root = str(tmp_path)
    _proc(root, 1, 0, "systemd")
    _proc(root, 3000, 1, "slurmstepd", "slurmstepd: [201.0]\0\0\0\0")
    _proc(root, 3100, 3000, "bash", uid=NOBODY)
    _proc(root, 5555, 3100, uid=NOBODY)  # 201's
    # this job's user names their own process slurmstepd with 201's title: not root's, not Slurm's
    _proc(root, 4000, 1, "slurmstepd", "slurmstepd: [201.0]\0", uid=NOBODY)
    _proc(root, 4444, 4000, uid=NOBODY)
    _proc(root, 3001, 1, "slurmstepd", "slurmstepd: [garbled\0")  # root's, a title naming no job: unknown
    _proc(root, 6666, 3001, uid=NOBODY)
    _proc(root, 7000, 7001, uid=NOBODY)  # a loop (no kernel makes one): unknown, and it ends
    _proc(root, 7001, 7000, uid=NOBODY)
    got = owners.read(root, [5555, 4444, 6666, 7000, 8888], 202)
    by = {p.pid: p for p in got.processes}
    assert (by[5555].job, by[5555].running) == (201, True) and by[4444].job is None
    assert by[6666].job.kind == "error" and "names no job" in by[6666].job.describe()
    assert "loops" in by[7000].job.describe() and by[8888].gone is True
    left, unknown = leftovers((5555, 4444, 6666, 7000), got)
    assert left == (4444,) and unknown is not None


def test_pgid_tracking_reads_the_process_group_only_where_slurm_conf_says_so(tmp_path):
    root = str(tmp_path)
    _proc(root, 1, 0, "systemd")
    _proc(root, 3000, 1, "slurmstepd", "slurmstepd: [201.batch]\0")
    _proc(root, 3100, 3000, "bash", uid=NOBODY)
    _proc(root, 5555, 1, uid=NOBODY, pgrp=3100)  # reparented, still in 201's step's group
    assert owners.read(root, [5555], 202).processes[0].job is None  # linuxproc (or no slurm.conf)
    os.makedirs(os.path.join(root, "etc", "slurm"))
    with open(os.path.join(root, "etc", "slurm", "slurm.conf"), "w") as f:
        f.write("ProctrackType = proctrack/pgid\n")
    assert owners.read(root, [5555], 202).processes[0].job == 201


def test_job_devices_and_the_hint_name_proctrack_when_not_cgroup(tmp_path):
    from gpugate.slurm.fragment import devices_hint

    conf = tmp_path / "etc" / "slurm"
    conf.mkdir(parents=True)
    (conf / "cgroup.conf").write_text("ConstrainDevices=no\n")
    (conf / "slurm.conf").write_text("ProctrackType=proctrack/cgroup\n")
    assert owners.job_devices(str(tmp_path)) == "not constrained: ConstrainDevices=no in /etc/slurm/cgroup.conf"
    (conf / "slurm.conf").write_text("ProctrackType=proctrack/linuxproc\n")
    want = "not constrained: ConstrainDevices=no in /etc/slurm/cgroup.conf; ProctrackType=proctrack/linuxproc in " \
           "/etc/slurm/slurm.conf (no job cgroups: a job's process is told by the slurmstepd above it)"
    assert owners.job_devices(str(tmp_path)) == want
    assert "# NOTE: on this machine " + want in devices_hint(str(tmp_path))
    (conf / "cgroup.conf").unlink()
    assert "ProctrackType=proctrack/linuxproc" in devices_hint(str(tmp_path))


def test_a_simulated_nodes_health_check_names_its_proctrack(fleet):
    import json

    from conftest import gpugate_cmd

    gpugate_cmd("sim", "set", fleet, "gpu01", "slurm.constrain_devices=no", "slurm.proctrack=pgid", check=True)
    data = json.loads(gpugate_cmd("check", "--sim", fleet, "--node", "gpu01", "--json").stdout)
    assert data["fit"] is True and data["facts"]["job_devices"].endswith(
        "; ProctrackType=proctrack/pgid in /etc/slurm/slurm.conf (no job cgroups: a job's process is told by the "
        "slurmstepd above it)")
    assert gpugate_cmd("sim", "set", fleet, "gpu01", "slurm.proctrack=sgi_job").returncode != 0


# --- the parsers (pure) -------------------------------------------------------

def test_slurmstepd_titles_as_slurm_writes_them():
    """src/slurmd/slurmstepd/slurmstepd.c (_set_job_log_prefix, ns_infinity), log.c log_build_step_id_str."""
    for title, job in (("[201.0]", 201), ("[201.batch]", 201), ("[7.extern]", 7), ("[7.interactive]", 7),
                       ("[7.TDB]", 7), ("[9.0+1]", 9), ("[9.batch stepmgr]", 9), ("[12:namespace]", 12),
                       ("[4294967293.4294967292]", 4294967293)):
        assert step_job(b"slurmstepd: " + title.encode() + b"\0\0\0") == job, title
        assert step_job(b"slurmstepd: " + title.encode() + b"   ") == job, title
    for bad in (b"", b"slurmstepd", b"/usr/sbin/slurmstepd\0", b"slurmstepd: [0.0]", b"slurmstepd: [0201.0]",
                b"slurmstepd: [201.x]", b"slurmstepd: [201.0] x", b"slurmstepd: [4294967295.0]", b"xslurmstepd: [1.0]"):
        assert step_job(bad) is None, bad


def test_status_and_stat_fields():
    assert status_fields("Name:\tx\nState:\tS\nPPid:\t3100\nUid:\t0\t0\t0\t0\n") == (3100, 0)
    assert stat_pgrp("5555 (a) b) c (d) S 1 3100 3100 0 -1\n") == 3100  # comm may hold ") "
    for text in ("Name:\tx\nUid:\t0\n", "PPid:\t-1\nUid:\t0\n", "PPid:\t1 2\nUid:\t0\n", "PPid:\t1\n"):
        with pytest.raises(ParseError):
            status_fields(text)
    with pytest.raises(ParseError):
        stat_pgrp("5555 (x) S 1\n")


@given(st.text(max_size=200))
def test_any_status_or_stat_text_is_numbers_or_a_parse_error(text):
    for parse in (status_fields, stat_pgrp, lambda t: step_job(t.encode("utf-8", "surrogatepass"))):
        try:
            parse(text)
        except ParseError:
            pass


# --- the walk: any /proc graph, cycles included -------------------------------

pids = st.integers(0, 40)
graphs = st.dictionaries(pids, st.tuples(st.one_of(st.none(), pids), st.one_of(st.none(), st.integers(1, 9))),
                         max_size=40)


@given(graph=graphs, start=pids, depth=st.integers(1, 50))
def test_the_walk_terminates_and_finds_the_nearest_slurmstepd(graph, start, depth):
    """graph: {pid: (parent or None: gone, the job its slurmstepd title names or None)}."""
    asked = []

    def parent(p):
        asked.append(p)
        return graph[p][0] if p in graph else None

    try:
        got = ancestry_job(start, parent, lambda p: graph[p][1] if p in graph else None, depth)
    except ParseError:
        got = "unknown"
    assert len(asked) <= depth + 2
    # the reference: follow the chain, remembering where it has been
    seen, current, want = {start}, parent(start), None
    while current is not None and current > 1:
        if current in seen or len(seen) > depth:
            want = "unknown"
            break
        seen.add(current)
        if graph.get(current, (None, None))[1] is not None:
            want = graph[current][1]
            break
        current = graph[current][0] if current in graph else None
    assert got == want


ppids = st.one_of(st.integers(0, 13), st.sampled_from(["-1", "../..", "1e3", "", "99999999999999999999"]))
nodes = st.dictionaries(st.integers(2, 12), st.tuples(ppids, st.booleans(), st.sampled_from(
    ["slurmstepd: [201.0]\0", "slurmstepd: [x]\0", "python3\0"])), max_size=12)


@hsettings(max_examples=60, deadline=None)
@given(graph=nodes, start=st.integers(2, 13), symlink=st.booleans())
def test_the_probe_reads_only_under_the_node_root(graph, start, symlink):
    """Any /proc a node root holds (parent pids that are no pid, loops, titles; /proc/13 a link out of
    the root to a slurmstepd's files): the probe ends, and every file it opens is below the root."""
    with tempfile.TemporaryDirectory() as outer:
        root = os.path.join(outer, "root")
        _proc(root, 1, 0, "systemd")
        for pid, (ppid, stepd, title) in graph.items():
            _proc(root, pid, ppid, "slurmstepd" if stepd else "python3", title)
        if symlink:
            _proc(outer, 666, 1, "slurmstepd", "slurmstepd: [666.0]\0")
            os.symlink(os.path.join(outer, "proc", "666"), os.path.join(root, "proc", "13"))
        opened = []
        real_open = os.open

        def spy(path, flags, *args, **kwargs):
            fd = real_open(path, flags, *args, **kwargs)
            opened.append(os.readlink("/proc/self/fd/%d" % fd))  # what was opened, links resolved
            return fd

        os.open = spy
        try:
            got = owners.read(root, [start], 202)
        finally:
            os.open = real_open
        assert len(got.processes) == 1 and got.processes[0].job != 666
        inside = os.path.realpath(root) + os.sep
        assert all(p.startswith(inside) for p in opened), opened


# --- the real kernel ------------------------------------------------------------

def test_real_processes_of_nobody_under_a_roots_slurmstepd(tmp_path):
    """This machine's kernel: a root process titled as slurmstepd does (comm slurmstepd, cmdline
    "slurmstepd: [201.0]"), a uid-65534 process under it, and one of its children double-forked to
    init: the first is 201's, the orphan no job's."""
    python = next((p for p in ("/usr/bin/python3", sys.executable) if os.access(p, os.X_OK)), None)
    if os.getuid() != 0 or python is None:
        pytest.skip("needs root (a root slurmstepd, the user's processes as uid 65534) and a python3")
    user = ("import os, sys, time\n"
            "if os.fork() == 0:\n"
            "    if os.fork() == 0:\n"
            "        print(os.getpid(), flush=True); time.sleep(60)\n"
            "    os._exit(0)\n"
            "time.sleep(0.5); print(os.getpid(), flush=True); time.sleep(60)\n")
    stepd = ("import ctypes, os, subprocess, sys, time\n"
             "ctypes.CDLL(None).prctl(15, b'slurmstepd', 0, 0, 0)\n"
             "def drop(): os.setgid(%d); os.setuid(%d)\n"
             "subprocess.Popen([%r, '-I', '-c', %r], preexec_fn=drop, cwd='/')\n"
             "time.sleep(60)\n" % (NOBODY, NOBODY, python, user))
    child = subprocess.Popen(["slurmstepd: [201.0]", "-I", "-c", stepd], executable=python, cwd="/",
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        orphan, task = int(child.stdout.readline()), int(child.stdout.readline())
        assert owners._real_uid("/proc/%d/status" % task) == NOBODY
        got = owners.read("/", [task, orphan], 202)
        by = {p.pid: p for p in got.processes}
        if isinstance(by[task].job, int) and by[task].job != 201:
            pytest.skip("this machine's own cgroup names a Slurm job")
        assert (by[task].job, by[task].running) == (201, True)
        assert by[orphan].job is None and leftovers((task, orphan), got) == ((orphan,), None)
    finally:
        os.killpg(child.pid, 9)
        child.wait()
