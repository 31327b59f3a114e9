"""scripts/real-node-check end to end on a simulated node (--sim): the
capture, the fit check, the exact reasons for a wrong driver pin and a wrong
GPU count, the timed entry points, the report; nothing written outside its
temporary directory, and no Slurm call with anything to run."""

import glob
import os
import subprocess
import sys

from conftest import DEMO_BASELINE, ROOT, gpugate_cmd

SCRIPT = os.path.join(ROOT, "scripts", "real-node-check")
NODE = "rncheck01"  # a name no other test's last good copies use


def _run(tmp_path, *args):
    env = dict(os.environ, TMPDIR=str(tmp_path))
    env.pop("GPUGATE_CONFIG", None)
    # The environment this test runs in has gpugate installed (scripts/setup): used as it is.
    return subprocess.run([sys.executable, SCRIPT, "--venv", sys.prefix] + list(args), capture_output=True,
                          text=True, timeout=300, env=env)


def test_a_simulated_node_passes_and_the_wrong_pins_give_the_exact_reasons(tmp_path):
    fleet = str(tmp_path / "fleet")
    gpugate_cmd("sim", "init", fleet, "--nodes", NODE, "--baseline", DEMO_BASELINE, check=True)
    out = str(tmp_path / "report.txt")
    before = set(os.listdir(str(tmp_path)))
    result = _run(tmp_path, "--sim", fleet, NODE, "--repeat", "2", "--out", out)
    assert result.returncode == 0, result.stdout + result.stderr
    text = open(out).read()
    assert "ok   gpugate check: the node is fit on its own baseline" in text
    # The demo node runs driver 580.65.06 on 8 GPUs; the script itself
    # failed on a finding missing or not expected (Fabric Manager moves with
    # the driver where the capture pins it).
    assert "ok   gpugate check, wrong driver pin: drift driver=580.65.06 (want 999.99.99)" in text
    assert "reason: gpugate: drift driver=580.65.06 (want 999.99.99); gsp_firmware=580.65.06 (want 999.99.99)" in text
    assert "ok   gpugate check, wrong GPU count: health gpu_count=8 (want 9)" in text
    assert "reason: gpugate: health pci_gpus=8 (want 9); gpu_count=8 (want 9)" in text
    for row in ("interpreter", "import pynvml", "NVML init (simulated)", "health check", "prolog hot", "prolog cold",
                "epilog"):
        assert "\n" + row + " " in text, row
    assert "ok   the hot prolog reused the health check's verdict" in text
    assert "ok   no Slurm call reached Slurm" in text
    assert "PASSED: " in text and "FAIL " not in text
    # Only its temporary directory is new here (TMPDIR), and its venv is the one given.
    (work,) = [os.path.join(str(tmp_path), d) for d in set(os.listdir(str(tmp_path))) - before
               if d.startswith("gpugate-real-node-check-")]
    assert {"baseline.toml", "baseline-wrong-driver-pin.toml", "baseline-wrong-GPU-count.toml", "gpugate.toml",
            "check-fit.json", "no-slurm", "state"} <= set(os.listdir(work))
    assert os.listdir(os.path.join(work, "no-slurm")) == []
    assert not glob.glob("/var/lib/gpugate/last-good/%s-*" % NODE)  # the entry points' copies, removed


def test_an_unknown_simulated_node_is_refused(tmp_path):
    result = _run(tmp_path, "--sim", str(tmp_path / "nofleet"), NODE)
    assert result.returncode == 2 and "no simulated node" in result.stderr
    assert not glob.glob(str(tmp_path / "gpugate-real-node-check-*"))


def test_help_says_what_it_writes_and_how_to_install_without_an_index():
    result = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for words in ("--wheelhouse", "Writes only in its temporary directory", "Never drains", "--sim FLEET NODE"):
        assert words in result.stdout, words


def _script():
    from importlib.machinery import SourceFileLoader
    from importlib.util import module_from_spec, spec_from_loader

    loader = SourceFileLoader("real_node_check", SCRIPT)
    module = module_from_spec(spec_from_loader("real_node_check", loader))
    loader.exec_module(module)
    return module


def test_the_edits_touch_only_their_section():
    script = _script()
    text = ('[pin]\ndriver = "580.1"\ncuda_driver = "13.0"\n\n[pin.vbios]\n"X" = "1"\n\n'
            '[nodes."gpu01"]\ngpus = 8\n# gpus = 8 in a comment\n')
    assert script._pin(text) == {"driver": "580.1", "cuda_driver": "13.0"}
    edited, count = script._set_in_section(text, "pin", {"driver": "999.99.99", "fabricmanager": "999.99.99"})
    assert count == 1 and 'driver = "999.99.99"' in edited and "fabricmanager" not in edited
    edited, count = script._set_in_section(text, 'nodes."gpu01"', {"gpus": 9})
    assert count == 1 and "\ngpus = 9\n# gpus = 8 in a comment" in edited
    assert script._set_in_section(text, 'nodes."gpu02"', {"gpus": 9}) == (text, 0)
    assert script._matches(("drift", "gsp_firmware", "580.1", "999"), ("drift", "gsp_firmware", None, "999"))
    assert not script._matches(("drift", "kernel", "6.1", "999"), ("drift", "gsp_firmware", None, "999"))
