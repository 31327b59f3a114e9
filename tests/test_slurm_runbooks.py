"""Each runbook of docs/runbooks/ run on a real slurmctld and slurmds over
simulated GPU nodes: its ```console blocks and hidden rig steps, read from
the runbook (tests/runbook_doc.py says how), in order.  A runbook whose
commands drift from the code fails here."""

import os
import subprocess
import sys
import time

import pytest

import runbook_doc as doc
from conftest import make_cluster

pytestmark = pytest.mark.slurm

# Per runbook: the test cluster it runs on (conftest.make_cluster's
# arguments).  Without a [drain_budget] in extra the rig lets nodes drain
# themselves; the runbooks that show the keeper keep the default budget.
# The first install starts with no baseline anywhere (day_one), as a real one.
RIGS = {
    "morning-after-xid.md": dict(nodes=4),
    "first-install-slurm.md": dict(nodes=4, extra="[drain_budget]\nmax_share = 0.10\n", day_one=True),
    "driver-upgrade-slurm.md": dict(nodes=4, extra="[drain_budget]\nmax_share = 0.25\n",
                                    sweep={"floor": 0.5, "max_batch": 2}),
    # A proof across nodes needs the drain budget on (its pins are budgeted).
    "preflight.md": dict(nodes=2, extra="[drain_budget]\nmax_share = 0.5\n"),
}
# The runbooks the default run takes (the rest are `long`: CI runs them on
# every Slurm release).
DEFAULT = {"morning-after-xid.md"}
COMMAND_TIMEOUT = 300


def _rig_env(cluster, bindir):
    env = dict(cluster.env)
    env.update(PATH=bindir + ":" + env["PATH"], GPUGATE_CONFIG=cluster.gpugate_conf, RIG=cluster.dir,
               FLEET=cluster.fleet, PYTHON=sys.executable, PYTHONPATH=doc.ROOT)
    return env


def _gpugate_wrapper(directory):
    """`gpugate` on PATH: this checkout's, run by this interpreter."""
    bindir = os.path.join(directory, "runbook-bin")
    os.makedirs(bindir, exist_ok=True)
    path = os.path.join(bindir, "gpugate")
    with open(path, "w") as handle:
        handle.write('#!/bin/sh\nexec "%s" -m gpugate "$@"\n' % sys.executable)
    os.chmod(path, 0o755)
    return bindir


def run_runbook(name, cluster, workdir):
    """Run the runbook's console and rig steps in order."""
    path = os.path.join(doc.RUNBOOKS, name)
    env = _rig_env(cluster, _gpugate_wrapper(str(workdir)))
    for step in doc.steps(path):
        if step.kind == "sh":
            continue
        output = ""
        for command in step.commands:
            text = doc.on_rig(command.text)
            started = time.monotonic()
            result = subprocess.run(["bash", "-euo", "pipefail", "-c", text], cwd=str(workdir), env=env,
                                    capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
            output += result.stdout + result.stderr
            where = "%s:%d: %s" % (name, command.line, command.text)
            assert "Traceback" not in result.stderr, (where, result.stderr)
            assert result.returncode == command.exit, (
                "%s exited %d (the runbook says %d) after %.1fs\nstdout:\n%s\nstderr:\n%s"
                % (where, result.returncode, command.exit, time.monotonic() - started, result.stdout[-3000:],
                   result.stderr[-3000:]))
        for text in step.expect:
            assert text in output, "%s:%d: the block's output lacks %r:\n%s" % (name, step.line, text, output[-4000:])


def _params():
    for name in sorted(RIGS):
        marks = [] if name in DEFAULT else [pytest.mark.long]
        yield pytest.param(name, marks=marks, id=name[:-3])


@pytest.mark.parametrize("name", list(_params()))
def test_runbook_runs_on_the_test_cluster(name, tmp_path):
    if not os.path.exists(os.path.join(doc.RUNBOOKS, name)):
        pytest.fail("docs/runbooks/%s is gone: update RIGS" % name)
    cluster = make_cluster(tmp_path / "rig", **RIGS[name])
    work = tmp_path / "work"
    work.mkdir()
    try:
        run_runbook(name, cluster, work)
    finally:
        cluster.stop()


# Run on a real kube-apiserver by tests/test_kube_runbooks.py instead.
KUBE = {"driver-upgrade-kubernetes.md"}


def test_every_runbook_that_runs_commands_has_a_rig():
    """A runbook with console blocks is run here, or on the kube-apiserver."""
    for path in doc.runbook_files():
        if any(s.kind == "console" for s in doc.steps(path)):
            assert os.path.basename(path) in set(RIGS) | KUBE, path
