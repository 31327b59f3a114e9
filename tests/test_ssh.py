"""Issue 13, item 5: ssh, for real.  OpenSSH's sshd on loopback, a throwaway
key, and an ssh_config ([sweep] ssh_config) that makes each simulated node
reachable by its name; `gpugate audit` and the sweep's verification run
through ClusterShell over it, and the node side is the real `gpugate
facts/check --node NAME` against the simulated fleet."""

import json
import os
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import DEMO_BASELINE, ROOT, gpugate_cmd
from gpugate.node.transport import answer, ssh_failure
from ssh_rig import HANG_SECONDS, SshRig

NODES = {"gpu01": "ok", "gpu02": "ok", "gpu03": "ok", "gpu04": "closed", "gpu05": "mismatch", "gpu06": "hang"}
TIMEOUT = 6  # [sweep] verify_timeout: the hang's bound


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    rig = SshRig().start()
    base = tmp_path_factory.mktemp("ssh")
    fleet = str(base / "fleet")
    gpugate_cmd("sim", "init", fleet, "--nodes", "gpu[01-06]", "--baseline", DEMO_BASELINE, check=True)
    rig.fleet = fleet
    rig.ssh_conf = rig.ssh_config(NODES)
    # The remote side runs this tree's gpugate, whatever the node's cwd.
    remote = ["/usr/bin/env", "PYTHONPATH=" + ROOT, sys.executable, "-m", "gpugate"]
    rig.gpugate_conf = str(base / "gpugate.toml")
    with open(rig.gpugate_conf, "w") as handle:
        handle.write('baseline = "%s"\n[sim]\nfleet = "%s"\n[sweep]\ntransport = "ssh"\njournal = "%s/sweep.db"\n'
                     'gpugate = %s\nremote_config = "%s"\nssh_config = "%s"\nverify_timeout = %d\n'
                     'connect_timeout = 3\n'
                     % (DEMO_BASELINE, fleet, base, json.dumps(remote), rig.gpugate_conf, rig.ssh_conf, TIMEOUT))
    yield rig
    rig.stop()


def _transport(rig):
    from gpugate.model.config import load_settings
    from gpugate.node.transport import SshTransport, make

    transport = make(load_settings(rig.gpugate_conf))
    assert isinstance(transport, SshTransport)
    return transport


@pytest.mark.ssh
def test_audit_through_sshd_lists_the_unreachable_and_judges_only_the_answers(rig):
    gpugate_cmd("sim", "set", rig.fleet, "gpu03", "dcgm=3.3.5", check=True)
    try:
        started = time.monotonic()
        result = gpugate_cmd("audit", "--config", rig.gpugate_conf, "-w", "gpu[01-06]", "--json", timeout=120)
        took = time.monotonic() - started
    finally:
        gpugate_cmd("sim", "set", rig.fleet, "gpu03", "dcgm=4.2.3", check=True)
    assert result.returncode == 1, result.stderr  # gpu03 drifts
    data = json.loads(result.stdout)
    dcgm = {(r["value"], r["nodes"], r["status"]) for r in data["rows"] if r["component"] == "dcgm"}
    assert dcgm == {("4.2.3", "gpu[01-02]", "pinned"), ("3.3.5", "gpu03", "DRIFT")}  # only the answers
    why = data["unreachable"]["why"]
    assert data["unreachable"]["nodes"] == "gpu[04-06]"
    assert why["gpu04"].startswith("unreachable: ssh failed (exit 255)") and "Connection refused" in why["gpu04"]
    assert why["gpu05"].startswith("host key verification failed: gpu05's host key is not the one")
    assert "ssh-keygen -R gpu05" in why["gpu05"]
    assert why["gpu06"].startswith("timed out after %ds" % TIMEOUT)
    assert TIMEOUT <= took < TIMEOUT + 20  # the hang is bounded by the timeout, not by the node
    text = gpugate_cmd("audit", "--config", rig.gpugate_conf, "-w", "gpu[01-05]", timeout=120).stdout
    assert "UNREACHABLE" in text and "host key verification failed" in text


@pytest.mark.ssh
def test_the_sweeps_verification_over_ssh(rig):
    """The sweep's verify step calls transport.check(nodes, ["--mode", "verify"], verify_timeout)."""
    gpugate_cmd("sim", "set", rig.fleet, "gpu02", "gpu.3.xid=79", check=True)
    answers = _transport(rig).check(["gpu01", "gpu02", "gpu04", "gpu05", "gpu06"], ["--mode", "verify"], TIMEOUT)
    assert answers["gpu01"]["fit"] is True and answers["gpu01"]["node"] == "gpu01"
    assert answers["gpu01"]["mode"] == "verify" and answers["gpu01"]["facts"]["dcgm_diag"]["level"] == 3
    assert answers["gpu01"]["facts"]["dcgm_diag"]["passed_levels"] == [1]  # -r 1 first, then -r 3
    assert answers["gpu02"]["fit"] is False and "xid:gpu3=79" in answers["gpu02"]["reason"]
    # No answer is never fit: the sweep's normal failure path (retry, rollback, rma).
    for node in ("gpu04", "gpu05", "gpu06"):
        assert isinstance(answers[node], str), answers[node]
    assert "host key verification failed" in answers["gpu05"]
    assert answers["gpu06"].startswith("timed out")


@pytest.mark.ssh
def test_the_evidence_and_the_reset_over_ssh(rig):
    """Issue 28: the sweep's evidence step and reset rung run `gpugate
    evidence` and `gpugate reset-gpus` through the same transport."""
    import base64

    gpugate_cmd("sim", "set", rig.fleet, "gpu03", "gpu.2.ecc.uncorrected.volatile=2", check=True)
    transport = _transport(rig)
    got = transport.run(["gpu03", "gpu04"], ["evidence", "--bug-report-timeout", "5"], TIMEOUT, max_stdout=32 << 20)
    parts = {p["name"]: p for p in got["gpu03"]["parts"]}
    assert "DRAM Uncorrectable            : 2" in base64.b64decode(parts["nvidia-smi-q.txt"]["data"]).decode()
    assert isinstance(got["gpu04"], str)  # unreachable: the collection fails, said
    done = transport.run(["gpu03"], ["reset-gpus", "--gpu", "2"], TIMEOUT * 3)["gpu03"]
    assert done["ok"] is True and done["node"] == "gpu03", done
    assert _transport(rig).check(["gpu03"], ["--mode", "verify"], TIMEOUT)["gpu03"]["fit"] is True


@pytest.mark.ssh
def test_the_ssh_config_is_trust_checked(rig, tmp_path):
    from gpugate.core.record import replace

    from gpugate.model.config import load_settings
    from gpugate.errors import ConfigError
    from gpugate.node.transport import make

    settings = load_settings(rig.gpugate_conf)
    loose = tmp_path / "ssh_config"
    loose.write_text(open(rig.ssh_conf).read())
    os.chmod(str(loose), 0o666)
    with pytest.raises(ConfigError, match="chmod go-w"):
        make(replace(settings, sweep=dict(settings.sweep, ssh_config=str(loose))))
    assert HANG_SECONDS > TIMEOUT  # the hanging node really outlives the timeout


@pytest.mark.ssh
def test_a_node_printing_without_bound_is_killed_at_the_cap_and_answers_nothing(rig):
    """Issue 24 review: ClusterShell kept each node's whole output in the
    sweeper (root, holding its lock and reservation).  Each node's stream
    is counted as it is read, lines or not (/dev/zero has no newline), and
    over the cap (16 MiB, like runner.py's) that node's ssh is killed; the
    other nodes answer as ever.  Before: 40 MiB read and kept per node, the
    answer "no JSON answer"."""
    import resource

    from gpugate.node.transport import SshTransport

    transport = _transport(rig)
    script = ('for a; do node=$a; done; case "$node" in gpu01) exec head -c 40M /dev/zero;; '
              'gpu02) yes 0123456789abcdef | exec head -c 40M;; esac; exec "$@"')
    flood = SshTransport(["/bin/sh", "-c", script, "sh"] + transport.gpugate, transport.config,
                         ssh_config=rig.ssh_conf)
    started = time.monotonic()
    answers = flood.check(["gpu01", "gpu02", "gpu03"], [], 60)
    assert time.monotonic() - started < 30
    for node in ("gpu01", "gpu02"):
        assert isinstance(answers[node], str) and "printed more than 16 MiB on stdout; killed" in answers[node], \
            (node, str(answers[node])[:300])
    assert isinstance(answers["gpu03"], dict) and answers["gpu03"]["node"] == "gpu03", str(answers["gpu03"])[:300]
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 1 << 20  # KiB: under 1 GiB in all


# ------------------------------------------------ pure: what ssh's exit says

def test_ssh_failures_are_named():
    refused = "7: connect to host 127.0.0.1 port 2222: Connection refused\n"
    assert ssh_failure("gpu04", refused, 255) == (
        "unreachable: ssh failed (exit 255): ssh: connect to host 127.0.0.1 port 2222: Connection refused")
    changed = "@@@@\n@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\nHost key verification failed.\n"
    assert ssh_failure("gpu05", changed, 255).startswith("host key verification failed: gpu05's host key")
    assert ssh_failure("gpu01", '{"node": "gpu01", "fit": true}', 0) == ""
    assert answer("gpu01", '{"node": "gpu01", "fit": true}\n', 1) == {"node": "gpu01", "fit": True}


@given(st.text(), st.sampled_from(["", '{"node": "gpu01", "fit": true}\n']))
def test_ssh_exit_255_is_never_an_answer(noise, json_line):
    """ssh's own failure (exit 255) never reads as the node's verdict, even
    with a JSON line in the output."""
    got = answer("gpu01", noise + "\n" + json_line, 255)
    assert isinstance(got, str) and got
