"""gpugate.toml's Kubernetes settings, and the controller commands not built
for Kubernetes yet refusing clearly (issue 37): no API server needed."""

import os
import subprocess
import sys

import pytest

from gpugate.model.config import ConfigError, parse_settings

DEMO_BASELINE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpugate", "data",
                             "demo-baseline.toml")


def test_the_kubernetes_table_is_validated():
    s = parse_settings({"scheduler": "kubernetes", "kubernetes": {"server": "https://10.0.0.1:6443",
                                                                  "node_selector": "nvidia.com/gpu.present=true"}},
                       "(test)")
    assert s.scheduler == "kubernetes" and s.kubernetes["lease_seconds"] == 60.0
    assert s.kubernetes["token_file"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    paired = parse_settings({"scheduler": "slurm+kubernetes", "kubernetes": {"node_name": "{node}.example.com"}},
                            "(test)")
    assert paired.scheduler == "slurm+kubernetes" and paired.kubernetes["node_name"] == "{node}.example.com"
    for bad, why in (({"scheduler": "nomad"}, "scheduler"), ({"kubernetes": {"server": "10.0.0.1"}}, "https://"),
                     ({"kubernetes": {"lease_seconds": 10}}, "lease_seconds"),
                     ({"kubernetes": {"token_file": "token"}}, "token_file"),
                     ({"kubernetes": {"bogus": 1}}, "bogus"),
                     # Slurm on Kubernetes: the Node of a Slurm node, {node} its Slurm name.
                     ({"kubernetes": {"node_name": "gpu01"}}, "node_name"),
                     ({"kubernetes": {"node_name": "{node}.{zone}"}}, "node_name"),
                     ({"kubernetes": {"node_name": "{node}/x"}}, "node_name")):
        with pytest.raises(ConfigError) as info:
            parse_settings(bad, "(test)")
        assert why in str(info.value), info.value


@pytest.mark.parametrize("argv", [["audit"], ["smoke", "-w", "gpu01"]])
def test_controller_commands_not_built_for_kubernetes_refuse_and_say_so(tmp_path, argv):
    config = tmp_path / "gpugate.toml"
    config.write_text('scheduler = "kubernetes"\nbaseline = "%s"\n[sweep]\njournal = "%s/sweep.db"\n'
                      'smoke = ["/bin/true"]\n' % (DEMO_BASELINE, tmp_path))
    cmd = [sys.executable, "-m", "gpugate"] + argv[:1] + ["--config", str(config)] + argv[1:]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert "acts on Slurm only so far" in out.stderr and "docs/explanation/kubernetes.md" in out.stderr, out.stderr


def test_sweep_force_is_refused_on_kubernetes_before_anything_is_read(tmp_path):
    """--force cancels Slurm jobs; on Kubernetes nothing may bypass a PodDisruptionBudget."""
    config = tmp_path / "gpugate.toml"
    config.write_text('scheduler = "kubernetes"\nbaseline = "%s"\n[sweep]\njournal = "%s/sweep.db"\n'
                      '[kubernetes]\nserver = "https://127.0.0.1:1"\n' % (DEMO_BASELINE, tmp_path))
    out = subprocess.run([sys.executable, "-m", "gpugate", "sweep", "--config", str(config), "--apply", "--force"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert "PodDisruptionBudget is never bypassed" in out.stderr, out.stderr
    assert not os.path.exists(tmp_path / "sweep.db")
