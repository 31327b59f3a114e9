import os
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO_BASELINE = os.path.join(ROOT, "gpugate", "data", "demo-baseline.toml")
EXAMPLE_BASELINE = os.path.join(ROOT, "slurm_conf", "baseline.example.toml")
# Real tool outputs the tests parse, each with NAME.src.txt (or SOURCE.txt
# in a directory) saying where it came from: in the repository, so a bare
# clone runs every test (../shared/samples is where they were collected).
SAMPLES = os.path.join(ROOT, "tests", "fixtures")


def _worker_ports():
    """pytest-xdist workers (gw0, gw1, ...) share one loopback: each gets its
    own block of ports for the Slurm clusters it starts (testbed.free_ports),
    below Linux's ephemeral range (32768-) that the ssh rig's port 0 draws from."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and worker[2:].isdigit() and "GPUGATE_TESTBED_PORTS" not in os.environ:
        first = 17000 + 1500 * (int(worker[2:]) % 10)
        os.environ["GPUGATE_TESTBED_PORTS"] = "%d-%d" % (first, first + 1499)


_worker_ports()


def gpugate_cmd(*args, check=False, timeout=120, env=None):
    """Run the installed `gpugate` command as an admin would."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "gpugate"] + list(args), capture_output=True,
                          text=True, timeout=timeout, check=check, env=full_env)


def sim_config(directory, fleet_dir, extra=""):
    """gpugate.toml for a simulated fleet audited through the local
    transport; the journal (and so audit.json) in ``directory``."""
    path = os.path.join(str(directory), "gpugate.toml")
    with open(path, "w") as handle:
        handle.write('baseline = "%s"\n[sim]\nfleet = "%s"\n[sweep]\ntransport = "local"\n'
                     'journal = "%s/sweep.db"\ngpugate = ["%s", "-m", "gpugate"]\n%s'
                     % (DEMO_BASELINE, fleet_dir, directory, sys.executable, extra))
    return path


@pytest.fixture(autouse=True)
def _own_umask():
    """Each test starts with the umask the run began with: gpugate's entry
    points set 077 for their process, and a test that calls one in process
    must not leave it to the next (a 0700 directory it makes would lock the
    unprivileged users of later tests out)."""
    umask = os.umask(0o022)
    os.umask(umask)
    yield
    os.umask(umask)


@pytest.fixture
def fleet(tmp_path):
    """A simulated fleet of three healthy nodes matching the demo baseline."""
    path = str(tmp_path / "fleet")
    result = gpugate_cmd("sim", "init", path, "--nodes", "gpu[01-03]", "--baseline", DEMO_BASELINE)
    assert result.returncode == 0, result.stderr
    return path


@pytest.fixture
def settings_for():
    """Settings for a simulated fleet (no gpugate.toml needed)."""
    from gpugate.core.record import replace

    from gpugate.model.config import parse_settings

    def make(fleet_dir, baseline=DEMO_BASELINE, **extra):
        base = parse_settings({}, "(test)")
        return replace(base, sim_fleet=fleet_dir, baseline=baseline, **extra)
    return make


def require_vendored(path, what):
    """``path`` (a third-party source tarball from ../shared/vendor, which a
    bare clone has not beside it), or skip saying so; under CI (CI=true),
    which lays shared/ beside its clone, its absence fails the run."""
    if path:
        return path
    message = ("%s: no tarball in ../shared/vendor/ beside this checkout (a bare clone has none; "
               "put the source there to run this test)" % what)
    if os.environ.get("CI") == "true":
        pytest.fail(message + "; CI=true: CI must have it", pytrace=False)
    pytest.skip(message)


def _require_slurm():
    if not (os.path.exists("/usr/sbin/slurmctld") and os.path.exists("/usr/sbin/munged")):
        if os.environ.get("GPUGATE_REQUIRE_SLURM"):
            pytest.fail("Slurm is not installed (apt-get install slurm-wlm slurmctld slurmd munge)")
        pytest.skip("Slurm is not installed (apt-get install slurm-wlm slurmctld slurmd munge)")


def make_cluster(directory, nodes=4, interval=5, extra="", partitions=None, baseline=None, sweep=None, gpus=0,
                 cpus=1, day_one=False):
    """Write and boot a test cluster; the caller stops it.  day_one: the
    baseline file is removed before any daemon starts (a first install: the
    simulated nodes run its stack, but no health check has ever loaded a
    baseline, so there is no last good copy either)."""
    from gpugate.testbed import Cluster

    _require_slurm()
    cluster = Cluster(str(directory), nodes=nodes, health_interval=interval, partitions=partitions, sweep=sweep,
                      gpus=gpus, cpus=cpus)
    if "[drain_budget]" not in extra:
        # Most scenarios drain several drifted nodes of a small partition;
        # the budget has its own tests (test_slurm_budget.py).
        extra = "[drain_budget]\nmax_share = 1.0\n" + extra
    from gpugate.testbed.files import NoDeviceNodes

    try:
        with open(baseline or DEMO_BASELINE) as handle:
            cluster.write(handle.read(), extra)
    except NoDeviceNodes as exc:  # a rig with GPU GRES only (gpus=N): said, not failed
        pytest.skip(str(exc))
    if day_one:
        os.remove(cluster.baseline)
    try:
        cluster.start()
    except Exception:
        cluster.stop()
        raise
    return cluster


def run_entry(cluster, mode, node, job=None, timeout=120):
    """What slurmd runs, now: the shim, no environment but the node (and
    job), in slurmd's working directory (its log directory).  Returns the
    result and how long it took."""
    env = {"SLURMD_NODENAME": node}
    if job:
        env.update(SLURM_JOB_ID=job, SLURM_JOB_UID="0", SLURM_JOB_USER="root")
    started = time.monotonic()
    result = subprocess.run([cluster.path("bin", mode)], env=env, capture_output=True, text=True, timeout=timeout,
                            cwd=cluster.path("log"))
    return result, time.monotonic() - started


def check_now(cluster, *nodes):
    """The health check of each node at once, as slurmd runs it, instead of
    waiting for slurmd's next HealthCheckInterval tick.  A run that finds
    slurmd's own check still running leaves (verdict skipped): wait for
    the outcome with wait_for, calling this again, not for this alone."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, len(nodes))) as pool:
        list(pool.map(lambda node: run_entry(cluster, "healthcheck", node), nodes))
    return False


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, request):
    """A real cluster for one test module; the module's CLUSTER dict sets
    nodes, interval (HealthCheckInterval) and extra gpugate.toml text."""
    params = dict(getattr(request.module, "CLUSTER", {}))
    c = make_cluster(tmp_path_factory.mktemp("cluster"), **params)
    yield c
    c.stop()
