"""Trust is not configurable from the thing being trusted (issue 12, item 4).

Real files, real modes and owners, real subprocesses.  Every "evil" program
here writes a marker file when it runs; a refusal is shown by the marker
never appearing, and by a message that names the path and the fix."""

import json
import os
import stat
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import DEMO_BASELINE, gpugate_cmd
from gpugate.safety import runner
from gpugate.safety import trust
from gpugate.errors import CommandError, ConfigError

NOBODY = 65534
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the rules under test are root's")


def _evil(path, marker, mode=0o755):
    """A program that leaves `marker` behind when it runs."""
    with open(path, "w") as handle:
        handle.write("#!/bin/sh\necho ran >> %s\necho '{}'\n" % marker)
    os.chmod(path, mode)
    return str(path)


def _refused_with_fix(message, culprit):
    assert culprit in message and "chown root %s; chmod go-w %s" % (culprit, culprit) in message, message


# ------------------------------------------------------------ the attack
def test_the_attack_a_world_writable_config_is_refused_and_its_command_never_runs(tmp_path):
    """The report: a world-writable gpugate.toml saying check_ownership =
    false and dcgmi = a world-writable /tmp/x made `gpugate check` run /tmp/x
    as root."""
    marker = tmp_path / "marker"
    x = _evil(tmp_path / "x", marker, mode=0o777)
    config = tmp_path / "gpugate.toml"
    config.write_text('baseline = "%s"\ncheck_ownership = false\n[commands]\ndcgmi = "%s"\n' % (DEMO_BASELINE, x))
    config.chmod(0o666)
    result = gpugate_cmd("check", "--config", str(config), "--node", "gpu01", "--json", timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    _refused_with_fix(result.stderr, str(config))
    assert not marker.exists()

    # The same file made root's: the key itself is refused, with what to do.
    config.chmod(0o644)
    result = gpugate_cmd("check", "--config", str(config), "--node", "gpu01", "--json", timeout=120)
    assert result.returncode == 2 and "check_ownership: removed" in result.stderr
    assert "chown root" in result.stderr and not marker.exists()

    # Without the key: the check runs, and the world-writable dcgmi is a
    # `probe` finding that names it, never run and never healthy.
    config.write_text('baseline = "%s"\n[commands]\ndcgmi = "%s"\n' % (DEMO_BASELINE, x))
    result = gpugate_cmd("check", "--config", str(config), "--node", "gpu01", "--json", timeout=120)
    assert result.returncode == 1, result.stderr
    out = json.loads(result.stdout)
    refused = [f for f in out["findings"] if f["class"] == "probe" and f["observed"] == "refused"]
    assert refused and not out["fit"], out["findings"]
    assert not marker.exists()


def test_a_command_owned_by_someone_else_never_runs(tmp_path):
    marker = tmp_path / "marker"
    x = _evil(tmp_path / "x", marker)
    os.chown(x, NOBODY, -1)
    with pytest.raises(CommandError) as info:
        runner.run([x, "--version"], 10)
    assert info.value.refused and not info.value.missing
    assert "owned by uid %d" % NOBODY in str(info.value)
    _refused_with_fix(str(info.value), x)
    assert not marker.exists()


# ------------------------------------------- a group-writable parent directory
def test_a_group_writable_directory_above_the_config_is_refused(tmp_path):
    etc = tmp_path / "etc"
    etc.mkdir()
    etc.chmod(0o775)
    config = etc / "gpugate.toml"
    config.write_text('baseline = "%s"\n' % DEMO_BASELINE)
    config.chmod(0o644)
    from gpugate.model.config import load_settings

    with pytest.raises(ConfigError) as info:
        load_settings(str(config))
    _refused_with_fix(str(info.value), str(etc))
    assert str(config) in str(info.value) and "writable by group or others" in str(info.value)
    etc.chmod(0o755)
    assert load_settings(str(config)).baseline == DEMO_BASELINE


def test_a_group_writable_directory_above_a_command_is_refused(tmp_path):
    marker = tmp_path / "marker"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    x = _evil(bindir / "dcgmi", marker)
    bindir.chmod(0o775)
    with pytest.raises(CommandError) as info:
        runner.run([x, "health"], 10)
    assert info.value.refused
    _refused_with_fix(str(info.value), str(bindir))
    assert not marker.exists()
    bindir.chmod(0o755)
    runner.run([x, "health"], 10)
    assert marker.read_text() == "ran\n"  # the same program, now root's alone, runs


def test_a_scripts_interpreter_is_checked_too(tmp_path):
    marker = tmp_path / "marker"
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    interpreter = _evil(shared / "sh", marker)
    script = tmp_path / "tool"
    script.write_text("#!%s\n" % interpreter)
    script.chmod(0o755)
    with pytest.raises(CommandError) as info:
        runner.run([str(script)], 10)
    assert info.value.refused and str(shared) in str(info.value)
    assert not marker.exists()


# ------------------------------------------------------------------ symlinks
def test_a_symlink_swapped_after_the_check_runs_the_checked_file(tmp_path, monkeypatch):
    good_marker, evil_marker = tmp_path / "good", tmp_path / "evil"
    good = _evil(tmp_path / "good-tool", good_marker)
    evil = _evil(tmp_path / "evil-tool", evil_marker)
    link = tmp_path / "tool"
    link.symlink_to(good)
    real = trust.open_executable

    def swap_after_check(path, *args, **kwargs):
        fd = real(path, *args, **kwargs)
        os.unlink(link)
        link.symlink_to(evil)  # the path now says evil; the fd is the checked file
        return fd
    monkeypatch.setattr(trust, "open_executable", swap_after_check)
    result = runner.run([str(link), "a b", "c"], 10)
    assert good_marker.read_text() == "ran\n" and not evil_marker.exists()
    assert result.argv == (str(link), "a b", "c")


def test_a_config_swapped_after_the_check_is_read_as_checked_or_refused(tmp_path, monkeypatch):
    from gpugate.model.schema import load_toml

    good = tmp_path / "good.toml"
    good.write_text('who = "root"\n')
    untrusted = tmp_path / "evil.toml"
    untrusted.write_text('who = "evil"\n')
    untrusted.chmod(0o666)
    os.utime(good, (0, 0))  # old: read at once (read_settled)
    link = tmp_path / "gpugate.toml"
    link.symlink_to(good)
    real = trust.open_file

    def swap_after_check(path, *args, **kwargs):
        fd = real(path, *args, **kwargs)
        if os.readlink(link) == str(good):
            os.unlink(link)
            link.symlink_to(untrusted)
        return fd
    monkeypatch.setattr(trust, "open_file", swap_after_check)
    assert load_toml(str(link), "gpugate configuration") == {"who": "root"}
    # Once it points there, the untrusted file is refused, not read.
    with pytest.raises(ConfigError) as info:
        load_toml(str(link), "gpugate configuration")
    _refused_with_fix(str(info.value), str(untrusted))


def test_symlinks_through_or_inside_an_untrusted_directory_are_refused(tmp_path):
    marker = tmp_path / "marker"
    shared = tmp_path / "shared"
    shared.mkdir()
    _evil(shared / "tool", marker)
    shared.chmod(0o777)
    through = tmp_path / "through"
    through.symlink_to(shared / "tool")  # a trusted link to an untrusted place
    inside = shared / "link"
    inside.symlink_to("/bin/true")  # a trusted target, but anyone can replace the link
    for path in (through, inside):
        with pytest.raises(CommandError) as info:
            runner.run([str(path)], 10)
        assert info.value.refused and str(shared) in str(info.value)
    assert not marker.exists()


def test_real_system_symlinks_are_followed():
    """/bin -> usr/bin, /etc/alternatives, /usr/bin/python3 -> python3.x:
    relative and absolute links from trusted directories pass."""
    for path in ("/bin/sh", "/usr/bin/env", "/bin/true"):
        fd = trust.open_executable(path)
        try:
            assert stat.S_ISREG(os.fstat(fd).st_mode) and fd >= 3
        finally:
            os.close(fd)
    assert runner.run(["/bin/sh", "-c", "echo $0 $1", "zero", "one"], 10).stdout == "zero one\n"


def test_a_symlink_loop_is_an_error_not_a_hang(tmp_path):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(CommandError) as info:
        runner.run([str(tmp_path / "a")], 10)
    assert "symbolic links" in str(info.value)


# ----------------------------------------------------------- relative paths
def test_relative_paths_are_refused_at_validation_and_by_the_runner(tmp_path, monkeypatch):
    from gpugate.model.config import parse_settings

    with pytest.raises(ConfigError) as info:
        parse_settings({"commands": {"dcgmi": "x"}}, "gpugate.toml")
    assert "commands.dcgmi" in str(info.value) and "absolute path" in str(info.value)
    for key in ("converge", "rollback", "preview", "gpugate"):
        with pytest.raises(ConfigError) as info:
            parse_settings({"sweep": {key: ["ansible-playbook", "site.yml"]}}, "gpugate.toml")
        assert "sweep.%s[0]" % key in str(info.value) and "absolute path" in str(info.value)
    marker = tmp_path / "marker"
    _evil(tmp_path / "x", marker)
    monkeypatch.chdir(tmp_path)
    for argv0 in ("x", "./x"):
        with pytest.raises(CommandError) as info:
            runner.run([argv0], 10)
        assert info.value.refused and "absolute path" in str(info.value)
    assert not marker.exists()


# ------------------------------------------------------------- sticky /tmp
def test_sticky_tmp_passes_only_for_entries_root_owns(tmp_path):
    """/tmp is 1777: others can create names there but, thanks to the sticky
    bit, cannot rename or remove root's.  pytest's own directory under /tmp
    is root's, so everything else in this file already walks through it."""
    assert os.stat("/tmp").st_mode & stat.S_ISVTX and str(tmp_path).startswith("/tmp/")
    os.close(trust.open_file(DEMO_BASELINE, "baseline"))
    theirs = tempfile.mkdtemp(prefix="gpugate-trust-", dir="/tmp")
    try:
        config = os.path.join(theirs, "gpugate.toml")
        with open(config, "w") as handle:
            handle.write("")
        os.chmod(config, 0o644)
        os.close(trust.open_file(config, "gpugate configuration"))  # root's: accepted
        os.chown(theirs, NOBODY, -1)  # someone else's entry of /tmp: they could swap it
        with pytest.raises(trust.Untrusted) as info:
            trust.open_file(config, "gpugate configuration")
        assert theirs in str(info.value) and "owned by uid %d" % NOBODY in str(info.value)
        _refused_with_fix(str(info.value), theirs)
        # A symlink right in /tmp: its target is root's, but the link is only
        # as good as its owner (nobody else can replace root's link there).
        link = theirs + "-link"
        os.symlink(DEMO_BASELINE, link)
        try:
            os.close(trust.open_file(link, "baseline"))
            os.lchown(link, NOBODY, -1)
            with pytest.raises(trust.Untrusted) as info:
                trust.open_file(link, "baseline")
            assert link in str(info.value) and "inside a directory others can write" in str(info.value)
        finally:
            os.unlink(link)
        # A state directory gpugate would create right in /tmp: others could make it first.
        with pytest.raises(trust.Untrusted) as info:
            trust.check_dir(os.path.join("/tmp", os.path.basename(theirs) + "-state"), "gpugate state")
        assert "mkdir -p -m 755" in str(info.value)
    finally:
        os.chown(theirs, 0, -1)
        for name in os.listdir(theirs):
            os.unlink(os.path.join(theirs, name))
        os.rmdir(theirs)


def test_state_and_journal_directories_others_can_write_are_refused(tmp_path):
    from gpugate.sweep.journal import Journal

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # sticky is fine on the way, never for the directory gpugate writes in
    with pytest.raises(ConfigError) as info:
        Journal(str(shared / "sweep.db"))
    _refused_with_fix(str(info.value), str(shared))
    assert not (shared / "sweep.db").exists()
    ok = tmp_path / "state"
    Journal(str(ok / "sweep.db")).close()  # created by root, root's alone (issue 24: its locks)
    assert stat.S_IMODE(os.stat(ok).st_mode) == 0o700


# --------------------------------------------------------- the rule, as a property
def _expected(dir_uid, dir_mode, file_uid, file_mode):
    """The rule in docs/how-to/install-slurm.md (step 2), written independently of gpugate.safety.trust."""
    dir_ok = dir_uid == 0 and (not dir_mode & 0o022 or dir_mode & stat.S_ISVTX)
    entry_ok = not dir_mode & 0o022 or file_uid == 0
    file_ok = file_uid == 0 and not file_mode & 0o022
    return dir_ok and entry_ok and file_ok


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(dir_uid=st.sampled_from([0, NOBODY]), dir_mode=st.integers(0, 0o7777),
       file_uid=st.sampled_from([0, NOBODY]), file_mode=st.integers(0, 0o7777))
def test_refused_iff_the_rule_says_so(tmp_path, dir_uid, dir_mode, file_uid, file_mode):
    base = tempfile.mkdtemp(dir=str(tmp_path))
    directory = os.path.join(base, "d")
    os.mkdir(directory)
    path = os.path.join(directory, "f")
    with open(path, "w") as handle:
        handle.write("x")
    os.chown(path, file_uid, -1)
    os.chmod(path, file_mode)
    os.chown(directory, dir_uid, -1)
    os.chmod(directory, dir_mode)
    try:
        fd = trust.open_file(path, "file", owners=frozenset((0,)))
    except trust.Untrusted as exc:
        assert not _expected(dir_uid, dir_mode, file_uid, file_mode), str(exc)
        assert exc.culprit in (directory, path)
    else:
        os.close(fd)
        assert _expected(dir_uid, dir_mode, file_uid, file_mode)
    finally:
        os.chmod(directory, 0o755)


# ----------------------------------------------------------- the sweep's ssh
def test_the_sweeps_ssh_is_checked_and_run_from_the_checked_file(tmp_path, monkeypatch):
    from gpugate.node import transport

    marker = tmp_path / "marker"
    ssh = tmp_path / "ssh"
    # A stand-in ssh: ClusterShell passes its options, the host, then the command.
    ssh.write_text('#!/bin/sh\necho ran >> %s\nfor a; do host=$prev; prev=$a; done\n'
                   'echo "{\\"node\\": \\"$host\\", \\"fit\\": true}"\n' % marker)
    ssh.chmod(0o755)
    monkeypatch.setattr(transport, "SSH", str(ssh))
    answers = transport.SshTransport(["/opt/gpugate/bin/gpugate"]).check(["gpu01", "gpu02"], [], 30)
    assert answers == {"gpu01": {"node": "gpu01", "fit": True}, "gpu02": {"node": "gpu02", "fit": True}}
    assert marker.read_text() == "ran\nran\n"
    marker.unlink()
    ssh.chmod(0o777)
    with pytest.raises(ConfigError) as info:
        transport.SshTransport(["/opt/gpugate/bin/gpugate"]).check(["gpu01"], [], 30)
    _refused_with_fix(str(info.value), str(ssh))
    assert not marker.exists()


def test_no_descriptor_is_left_open(tmp_path):
    before = set(os.listdir("/proc/self/fd"))
    for _ in range(20):
        runner.run(["/bin/true"], 10)
        with pytest.raises(CommandError):
            runner.run([str(tmp_path / "missing")], 10)
    assert set(os.listdir("/proc/self/fd")) <= before


def test_slurm_conf_refuses_to_name_a_program_root_cannot_vouch_for(tmp_path):
    from gpugate.slurm.fragment import vouch

    tool = tmp_path / "reboot"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert vouch([("RebootProgram", str(tool))]) == ""
    assert "does not exist" in vouch([("RebootProgram", str(tmp_path / "none"))])
    tool.chmod(0o775)
    with pytest.raises(ConfigError) as info:
        vouch([("RebootProgram", str(tool))])
    _refused_with_fix(str(info.value), str(tool))
