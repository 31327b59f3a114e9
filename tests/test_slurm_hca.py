"""A real slurmd runs gpugate's health check on simulated nodes with HCAs:
a port the node had ACTIVE going down drains it at once, with the port in
the reason; its healthy peer stays in service."""

import pytest

from gpugate.model import reason as reasons

from conftest import DEMO_BASELINE, check_now, make_cluster

pytestmark = pytest.mark.slurm
INTERVAL = 5
# The demo baseline, plus an NDR400 InfiniBand fabric of eight ConnectX-7 on both nodes.
HCA = '\n[nodes."gpu[01-02]".hca]\ncount = 8\ntypes = ["MT4129"]\nrate = 400\nlink_layer = "InfiniBand"\n'


@pytest.fixture(scope="module")
def ibcluster(tmp_path_factory):
    directory = tmp_path_factory.mktemp("ibcluster")
    baseline = directory / "baseline-ib.toml"
    with open(DEMO_BASELINE) as handle:
        baseline.write_text(handle.read() + HCA)
    c = make_cluster(directory, nodes=2, interval=INTERVAL, baseline=str(baseline),
                     extra="[drain_budget]\nmax_share = 1.0\njitter_seconds = 0\n[budgets]\nhealthcheck = 8\n")
    yield c
    c.stop()


def _fit_checks(cluster, node):
    return [r for r in cluster.log_records(node) if r.get("mode") == "healthcheck" and r.get("verdict") == "fit"]


def test_hca_port_down_drains_with_the_port_in_the_reason(ibcluster):
    c = ibcluster
    # One fit check first: the node's own record of its ACTIVE ports.
    # Each check run now as slurmd runs it, not at slurmd's next tick.
    c.wait_for(lambda: _fit_checks(c, "gpu01") or check_now(c, "gpu01"), 2 * INTERVAL + 15,
               "a fit health check on gpu01")
    c.sim("set", "FLEET", "gpu01", "ib.mlx5_4.state=DOWN")
    c.wait_for(lambda: "drain" in c.state("gpu01") or check_now(c, "gpu01"), 2 * INTERVAL + 15, "gpu01 drained")
    reason = c.reason("gpu01")
    assert reason == "gpugate: health ib_port=mlx5_4/1 DOWN/Disabled (want ACTIVE/LinkUp as before)"
    assert reasons.acute(reasons.parse(reason, "gpugate:"))  # outside the drain budget
    assert c.state("gpu02") == "idle" and c.reason("gpu02") == ""
    assert _fit_checks(c, "gpu02")  # its HCAs were read and judged fit


def test_error_counter_burst_drains_between_two_checks(ibcluster):
    c = ibcluster
    seen = len(_fit_checks(c, "gpu02"))
    # The two checks run now as slurmd runs them, not at slurmd's next ticks.
    c.wait_for(lambda: len(_fit_checks(c, "gpu02")) > seen or check_now(c, "gpu02"), 2 * INTERVAL + 15,
               "another fit check on gpu02")
    c.sim("set", "FLEET", "gpu02", "ib.mlx5_7.counter.symbol_error=+500")
    c.wait_for(lambda: "drain" in c.state("gpu02") or check_now(c, "gpu02"), 2 * INTERVAL + 15, "gpu02 drained")
    # 500 in minutes spends more than an hour's allowance ([health] ib_error_rate_max, 120 per hour).
    assert c.reason("gpu02") == "gpugate: health ib_errors=mlx5_7/1 symbol_error over its rate (want <= 120 per hour)"
