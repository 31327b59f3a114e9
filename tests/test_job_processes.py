"""Issue 33, item 4: a GPU process is a leftover only when no running job
owns it.  Where Slurm does not confine jobs to their GPUs
(ConstrainDevices=no), job 201's process on job 202's GPU made job 202's
epilog drain the node, acute, on every shared node.  The epilog now reads
each process's cgroup (/proc/PID/cgroup, Slurm's v2 and v1 layouts) and
whether that job still runs here (a slurmstepd of root's in its cgroup)."""

import json
import os

from hypothesis import given, settings as hsettings, strategies as st

from conftest import gpugate_cmd
from gpugate.errors import ParseError
from gpugate.model.facts import ProbeFailure
from gpugate.model.jobfacts import GpuProcess, JobProcesses
from gpugate.judges.leftover import leftovers
from gpugate.parsers.cgroup import conf_value, constrain_devices, slurm_job
from gpugate.probes import owners
from test_amd_node import MIXED, amd_fleet, check  # noqa: F401 - fixture
from test_node_side import node_env, run_entry  # noqa: F401 - fixture

NOBODY = 65534

jobs = st.integers(1, 0xFFFFFFFD)
steps = st.sampled_from(["0", "1", "batch", "extern", "interactive", "4294967292"])
slices = st.sampled_from(["system.slice", "slurm.slice", "machine.slice"])


# --- the cgroup line parser -------------------------------------------------

@given(job=jobs, step=steps, slice_=slices, node=st.sampled_from(["", "node1_"]),
       leaf=st.sampled_from(["user/task_0", "user/task_12", "slurm", ""]))
def test_v2_lines_name_the_job(job, step, slice_, node, leaf):
    path = "/%s/%sslurmstepd.scope/job_%d/step_%s/%s" % (slice_, node, job, step, leaf)
    assert slurm_job("0::%s\n" % path.rstrip("/")) == job


@given(job=jobs, uid=st.integers(0, 2 ** 31), step=steps, prepend=st.sampled_from(["slurm", "slurm_node1"]),
       task=st.sampled_from(["/task_0", "/task_3", ""]))
def test_v1_lines_name_the_job(job, uid, step, prepend, task):
    path = "/%s/uid_%d/job_%d/step_%s%s" % (prepend, uid, job, step, task)
    text = "12:devices:%s\n7:freezer:%s\n4:memory:%s\n3:cpu,cpuacct:/\n1:name=systemd:/system.slice/slurmd.service\n" \
        % (path, path, path)
    assert slurm_job(text) == job


@given(job=jobs, uid=st.integers(1, 99999))
def test_a_users_own_subtree_is_no_jobs(job, uid):
    """systemd delegates user@UID.service to the user: any name, job_N too, can be made there."""
    for path in ("/user.slice/user-%d.slice/user@%d.service/app.slice/slurmstepd.scope/job_%d/step_0" % (uid, uid, job),
                 "/user.slice/user-%d.slice/session-3.scope" % uid):
        assert slurm_job("0::%s\n" % path) is None
    assert slurm_job("1:name=systemd:/slurm/uid_%d/job_%d/step_0\n" % (uid, job)) is None  # a named hierarchy


@given(st.text(max_size=200))
def test_any_text_is_a_job_none_or_a_parse_error(text):
    try:
        value = slurm_job(text)
    except ParseError:
        return
    assert value is None or isinstance(value, int) and 0 <= value <= 0xFFFFFFFD


@given(a=jobs, b=jobs)
def test_lines_naming_two_jobs_are_unknown(a, b):
    text = "0::/system.slice/slurmstepd.scope/job_%d/step_0\n7:freezer:/slurm/uid_1/job_%d/step_0\n" % (a, b)
    if a == b:
        assert slurm_job(text) == a
    else:
        try:
            slurm_job(text)
        except ParseError:
            return
        raise AssertionError("two jobs read as one")


def test_malformed_and_empty_are_unknown_and_odd_numbers_no_job():
    for text in ("", "\n", "garbage\n", "x::/a\n", "0:/only-two\n", "0::relative\n"):
        try:
            slurm_job(text)
        except ParseError:
            continue
        raise AssertionError(text)
    for part in ("job_", "job_-1", "job_0201", "job_4294967295", "job_1e3", "job_٣"):
        assert slurm_job("0::/system.slice/slurmstepd.scope/%s/step_0\n" % part) is None
    assert slurm_job("0::/init.scope\n") is None
    assert slurm_job("0::/system.slice/slurmstepd.scope/job_7/step_0/user/task_0") == 7  # no final newline


def test_cgroup_conf_constrain_devices():
    assert constrain_devices("ConstrainCores=yes\nConstrainDevices=yes\n") is True
    assert constrain_devices("constraindevices = YES  # GPUs\n") is True
    assert constrain_devices("ConstrainDevices=yes\nConstrainDevices=no\n") is False  # the last wins
    assert constrain_devices("#ConstrainDevices=yes\n") is False
    assert constrain_devices("") is False  # Slurm's default
    # Slurm's booleans (parse_value.c s_p_handle_boolean): yes, up, true, 1; no, down, false, 0.
    for word in ("true", "True", "1", "up"):
        assert constrain_devices("ConstrainDevices=%s\n" % word) is True
    for word in ("no", "false", "0", "down"):
        assert constrain_devices("ConstrainDevices=%s\n" % word) is False


@given(st.text(max_size=300))
def test_cgroup_conf_any_text_is_a_bool(text):
    assert constrain_devices(text) in (True, False)


words = st.text(st.characters(whitelist_categories=("L", "N", "P", "S"), blacklist_characters='#"'), min_size=1,
                max_size=30)


@given(key=st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,20}", fullmatch=True), value=words,
       before=st.sampled_from(["", "NodeName=gpu01 ", "X = y  "]), space=st.sampled_from(["", " ", "\t"]))
def test_slurm_conf_values_read_as_slurm_reads_them(key, value, before, space):
    line = "%s%s%s=%s%s  # comment" % (before, key.upper(), space, space, value)
    assert conf_value(line, key.lower()) == value
    assert conf_value('%s="%s %s"' % (key, value, value), key) == "%s %s" % (value, value)
    assert conf_value(line + "\n%s=last" % key, key) == "last"  # the last one wins


def test_devices_need_task_cgroup_and_the_cgroup_plugin(tmp_path):
    conf = tmp_path / "etc" / "slurm"
    conf.mkdir(parents=True)
    (conf / "cgroup.conf").write_text("ConstrainDevices=yes\n")
    assert owners.job_devices(str(tmp_path)) == "constrained"
    (conf / "slurm.conf").write_text("ProctrackType=proctrack/cgroup TaskPlugin = task/affinity\n")
    assert owners.job_devices(str(tmp_path)) == \
        "not constrained: TaskPlugin=task/affinity (no task/cgroup) in /etc/slurm/slurm.conf"
    (conf / "slurm.conf").write_text("TaskPlugin=task/affinity,task/cgroup\n")
    assert owners.job_devices(str(tmp_path)) == "constrained"
    (conf / "cgroup.conf").write_text("ConstrainDevices=yes\nCgroupPlugin=disabled\n")
    assert owners.job_devices(str(tmp_path)).startswith("not constrained")
    (conf / "cgroup.conf").unlink()
    (conf / "cgroup.conf").mkdir()  # unreadable: unknown, never "constrained"
    assert owners.job_devices(str(tmp_path)).kind == "error"


# --- the judge (pure) ---------------------------------------------------------

def test_only_processes_no_running_job_owns_are_leftovers():
    fail = ProbeFailure("processes", "error", "/proc/9/cgroup: Permission denied")
    owned = JobProcesses(202, (GpuProcess(1, 201, True), GpuProcess(2, 202, False), GpuProcess(3, None),
                               GpuProcess(4, 200, False), GpuProcess(5, gone=True), GpuProcess(6, 201, True)))
    assert leftovers((1, 6), owned) == ((), None)  # another running job's
    assert leftovers((2, 3, 4), owned) == ((2, 3, 4), None)  # this job's, no job's, an ended job's
    assert leftovers((5,), owned) == ((), None)  # exited meanwhile
    assert leftovers((7,), owned) == ((7,), None)  # not looked at: never another job's
    assert leftovers((1,), None) == ((1,), None)  # facts of an older gpugate
    unknown = JobProcesses(202, (GpuProcess(9, fail), GpuProcess(8, 201, fail)))
    assert leftovers((9,), unknown) == ((), fail)
    assert leftovers((8,), unknown) == ((), fail)
    assert leftovers((9, 3), JobProcesses(202, unknown.processes + (GpuProcess(3, None),))) == ((3,), fail)


# --- the probe on a node's file-system root ----------------------------------

def _proc(root, pid, cgroup, comm="python3", uid=None):
    """A process in a node root's /proc; uid: its real uid (default: the
    owner of that /proc, as root is on a node)."""
    d = os.path.join(root, "proc", str(pid))
    os.makedirs(d, exist_ok=True)
    uid = os.stat(os.path.join(root, "proc")).st_uid if uid is None else uid
    for name, text in (("cgroup", cgroup), ("comm", comm + "\n"), ("status", "Name:\t%s\nUid:\t%d\t%d\t%d\t%d\n"
                                                                      % (comm, uid, uid, uid, uid))):
        with open(os.path.join(d, name), "w") as f:
            f.write(text)


def test_probe_reads_owners_and_running_jobs(tmp_path):
    root = str(tmp_path)
    _proc(root, 1, "0::/init.scope\n", "systemd")
    _proc(root, 5555, "0::/system.slice/slurmstepd.scope/job_201/step_0/user/task_0\n")
    _proc(root, 3000, "0::/system.slice/slurmstepd.scope/job_201/step_batch/slurm\n", "slurmstepd")
    _proc(root, 6666, "0::/system.slice/slurmstepd.scope/job_200/step_0/user/task_0\n")
    # job 200 ended; its user's process calls itself slurmstepd (non-dumpable, or a setuid program
    # run through a link of that name, its /proc files are root's): not Slurm's, its real uid is nobody's
    _proc(root, 6667, "0::/system.slice/slurmstepd.scope/job_200/step_0/user/task_1\n", "slurmstepd", uid=NOBODY)
    os.makedirs(os.path.join(root, "proc", "7777", "cgroup"))  # unreadable as a file
    got = owners.read(root, [5555, 6666, 7777, 8888], 202)
    by = {p.pid: p for p in got.processes}
    assert got.job == 202 and by[5555].job == 201 and by[5555].running is True
    assert by[6666].job == 200 and by[6666].running is False
    assert by[7777].job.kind == "error" and by[8888].gone is True
    assert leftovers((5555, 6666, 8888), got) == ((6666,), None)


def test_no_process_table_is_unknown_never_gone(tmp_path):
    got = owners.read(str(tmp_path), [5555], 202)
    assert got.processes[0].job.kind == "missing" and leftovers((5555,), got)[1] is not None


# --- the attack, through the epilog slurmd runs ---------------------------------

def _sim(env, *assignments):
    gpugate_cmd("sim", "set", env["fleet"], "gpu01", *assignments, check=True)


def _epilog(env, job, gpus):
    result = run_entry("epilog", env, extra_env={"SLURM_JOB_ID": str(job), "SLURM_JOB_GPUS": gpus})
    log = [json.loads(line) for line in open(os.path.join(env["state"], "gpu01", "gpugate.log"))]
    return result.returncode, log[-1]["reason"]


def test_another_running_jobs_process_on_this_jobs_gpu_drains_nothing(node_env):  # noqa: F811
    """Job 201 (nobody's) and job 202 share gpu01 with ConstrainDevices=no; 201's
    process sits on 202's GPU 1 when 202 ends: 202's epilog leaves the node in service."""
    assert run_entry("healthcheck", node_env).returncode == 0
    for layout in ("v2", "v1"):
        _sim(node_env, "slurm.constrain_devices=no", "slurm.cgroup=" + layout, "slurm.jobs=201",
             "gpu.1.processes=5555", "slurm.process.5555=201")
        os.chown(os.path.join(node_env["fleet"], "gpu01", "root", "proc", "5555"), NOBODY, NOBODY)  # nobody's
        assert _epilog(node_env, 202, "1") == (0, None), layout


def test_a_real_leftover_still_drains(node_env):  # noqa: F811
    assert run_entry("healthcheck", node_env).returncode == 0
    cases = [("slurm.process.5555=202", "slurm.jobs=201"),  # this job's own
             ("slurm.process.5555=none", "slurm.jobs=201"),  # in no job
             ("slurm.process.5555=200", "slurm.jobs=201")]  # a job that has ended here
    for case in cases:
        _sim(node_env, "gpu.1.processes=5555", *case)
        code, reason = _epilog(node_env, 202, "1")
        assert code == 1 and "broken processes:gpu1=1 left [pid 5555] (want none)" in reason, case


def test_an_amd_nodes_kfd_processes_follow_the_same_rule(amd_fleet):  # noqa: F811
    gpugate_cmd("sim", "set", amd_fleet, "mi001", "amd.gpu0.processes=4242", "slurm.process.4242=201",
                "slurm.jobs=201", check=True)
    assert check(amd_fleet, mode="epilog")["fit"] is True
    gpugate_cmd("sim", "set", amd_fleet, "mi001", "slurm.jobs=none", check=True)  # 201 has ended
    assert check(amd_fleet, mode="epilog")["reason"] == "gpugate: broken processes=1 left [pid 4242] (want none)"


def test_the_health_check_reads_whether_devices_are_constrained(fleet):
    data = json.loads(gpugate_cmd("check", "--sim", fleet, "--node", "gpu01", "--json").stdout)
    assert data["facts"]["job_devices"] == "constrained"
    gpugate_cmd("sim", "set", fleet, "gpu01", "slurm.constrain_devices=no", check=True)
    gpugate_cmd("sim", "set", fleet, "gpu02", "slurm.constrain_devices=absent", check=True)
    data = json.loads(gpugate_cmd("check", "--sim", fleet, "--node", "gpu01", "--json").stdout)
    assert data["fit"] is True  # a fact to show, never a finding
    assert data["facts"]["job_devices"] == "not constrained: ConstrainDevices=no in /etc/slurm/cgroup.conf"
    data = json.loads(gpugate_cmd("check", "--sim", fleet, "--node", "gpu02", "--json").stdout)
    assert data["facts"]["job_devices"].startswith("not constrained: no cgroup.conf")


def test_the_audit_and_slurm_conf_say_devices_are_not_constrained(tmp_path):
    from gpugate.fleet.audit import PINNED, UNPINNED, fold, to_text
    from gpugate.slurm.fragment import devices_hint

    no = "not constrained: ConstrainDevices=no in /etc/slurm/cgroup.conf"
    audit = fold({"gpu01": {"job_devices": "constrained"}, "gpu02": {"job_devices": no},
                  "gpu03": {"job_devices": {"error": {"kind": "error"}}}, "gpu04": {}})
    rows = {(r.value, r.status): r.nodes for r in audit.rows if r.component == "job_devices"}
    assert rows == {("constrained", PINNED): ("gpu01",), (no, UNPINNED): ("gpu02",),
                    ("(unreadable: error)", "unreadable"): ("gpu03",)}
    assert not audit.drift and no in to_text(audit)
    assert "ConstrainDevices=yes" in devices_hint(str(tmp_path)) and "NOTE" not in devices_hint(str(tmp_path))
    os.makedirs(str(tmp_path / "etc" / "slurm"))
    (tmp_path / "etc" / "slurm" / "cgroup.conf").write_text("ConstrainDevices=no\n")
    assert "# NOTE: on this machine " + no in devices_hint(str(tmp_path))
    (tmp_path / "etc" / "slurm" / "cgroup.conf").write_text("ConstrainDevices=yes\n")
    assert "NOTE" not in devices_hint(str(tmp_path))


def test_the_owners_survive_the_json_round_trip():
    """`gpugate facts --json` and the audit keep facts as JSON; the judge reads them back."""
    from gpugate.model.facts import NodeFacts, from_jsonable, to_jsonable

    fail = ProbeFailure("processes", "error", "pid 9: lines name different jobs (1, 2)")
    owned = JobProcesses(202, (GpuProcess(1, 201, True), GpuProcess(9, fail), GpuProcess(5, gone=True)))
    facts = NodeFacts(node="gpu01", mode="epilog", collected_at=0.0, gpu_processes=owned, job_devices="constrained")
    back = from_jsonable(json.loads(json.dumps(to_jsonable(facts))))
    assert back.gpu_processes == owned and back.job_devices == "constrained"
    assert leftovers((1, 9, 5), back.gpu_processes) == ((), fail)


def test_every_real_cgroup_file_on_this_machine_parses():
    """The kernel's own /proc/PID/cgroup forms (v1, v2 or hybrid, whatever this machine runs) are never
    a parse error: only what no kernel writes is unknown."""
    seen = 0
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open("/proc/%s/cgroup" % pid) as handle:
                text = handle.read()
        except OSError:  # ended meanwhile
            continue
        value = slurm_job(text)
        assert value is None or isinstance(value, int)
        seen += 1
    assert seen > 0


def test_a_users_non_dumpable_process_named_slurmstepd_is_not_root_s(tmp_path):
    """The real kernel: a process of uid 65534 names itself slurmstepd (PR_SET_NAME) and makes itself
    non-dumpable (PR_SET_DUMPABLE 0), so its /proc/PID files are root's; its real uid in /proc/PID/status
    stays nobody's (a setuid program it runs through a link named slurmstepd: euid 0, real uid its own)."""
    import subprocess
    import sys

    import pytest

    python = next((p for p in ("/usr/bin/python3", sys.executable) if os.access(p, os.X_OK)), None)
    if os.getuid() != 0 or python is None:
        pytest.skip("needs root (to run the user's process as uid 65534) and a system python3")
    code = ("import ctypes, sys, time; libc = ctypes.CDLL(None); libc.prctl(15, b'slurmstepd', 0, 0, 0); "
            "libc.prctl(4, 0, 0, 0, 0); print('ready', flush=True); time.sleep(60)")
    child = subprocess.Popen([python, "-I", "-c", code], cwd="/", stdout=subprocess.PIPE, text=True,
                             preexec_fn=lambda: (os.setgid(NOBODY), os.setuid(NOBODY)))
    try:
        assert child.stdout.readline().strip() == "ready"
        here = "/proc/%d" % child.pid
        assert open(here + "/comm").read().strip() == "slurmstepd"
        assert os.stat(here + "/status").st_uid == 0  # what an owner check of its /proc files would trust
        assert owners._real_uid(here + "/status") == NOBODY
    finally:
        child.kill()
        child.wait()
