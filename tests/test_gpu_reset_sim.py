"""The reset rung on a simulated node (issue 28): `gpugate reset-gpus` and
`gpugate evidence` run the node's tools (nvidia-smi -r, systemctl,
nvidia-bug-report.sh) through the real subprocess path, and the simulated
node answers with a reset's real semantics."""

import base64
import gzip
import json
import os

from conftest import DEMO_BASELINE, gpugate_cmd

from gpugate.node import gpureset
from gpugate.vendors.nvidia import reset as nvidia_reset
from gpugate.node.evidence import collect
from gpugate.sim import fleet as sim_fleet


def sim_set(fleet, node, *assignments):
    result = gpugate_cmd("sim", "set", fleet, node, *assignments)
    assert result.returncode == 0, result.stderr


def check(fleet, tmp_path, node="gpu01"):
    config = _config(fleet, tmp_path)
    result = gpugate_cmd("check", "-c", config, "--sim", fleet, "--node", node, "--mode", "verify", "--json")
    return json.loads(result.stdout)


def _config(fleet, tmp_path):
    path = str(tmp_path / "gpugate.toml")
    with open(path, "w") as handle:
        handle.write('baseline = "%s"\nstate_dir = "%s/state/{node}"\n[sim]\nfleet = "%s"\n'
                     % (DEMO_BASELINE, tmp_path, fleet))
    return path


def reset(fleet, tmp_path, *gpus, node="gpu01"):
    args = ["reset-gpus", "-c", _config(fleet, tmp_path), "--sim", fleet, "--node", node, "--json"]
    for gpu in gpus:
        args += ["--gpu", str(gpu)]
    result = gpugate_cmd(*args)
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


def test_a_reset_clears_what_it_clears_and_the_verification_after_it_passes(fleet, tmp_path):
    sim_set(fleet, "gpu01", "gpu.2.ecc.uncorrected.volatile=3", "gpu.2.remapped_rows.pending=1", "gpu.2.xid=48",
            "gpu.2.recovery_action=1")
    assert not check(fleet, tmp_path)["fit"]
    out = reset(fleet, tmp_path, 2)
    assert out["ok"], out
    # An NVSwitch (HGX) node: the whole baseboard together (no -i), services stopped and started again.
    assert out["all"] and out["nvswitches"] == 4
    said = {s["step"]: s["detail"] for s in out["steps"]}
    assert "nvidia-persistenced" in said["stop"] and "nvidia-fabricmanager" in said["stop"]
    assert "GPU 00000000:3A:00.0 was successfully reset." in said["reset"]
    model = sim_fleet.load(fleet, "gpu01")
    gpu = model["nvml"]["gpus"][2]
    assert gpu["ecc_uncorrected"]["volatile"] == 0 and gpu["remapped_rows"][2] == 0 and gpu["recovery_action"] == 0
    assert model["services"] == {"nvidia-fabricmanager": "active", "nvidia-persistenced": "active"}
    # The Xid 48 line is still in the kernel log: the verification judges only what came after the reset.
    data = check(fleet, tmp_path)
    assert data["fit"], data["reason"]


def test_a_process_on_a_gpu_refuses_the_reset_before_anything_is_stopped(fleet, tmp_path):
    sim_set(fleet, "gpu01", "gpu.1.processes=4242")
    out = reset(fleet, tmp_path)
    assert not out["ok"] and "1 process(es) on the GPUs" in out["error"]
    assert [s["step"] for s in out["steps"]] == ["processes"]
    assert sim_fleet.load(fleet, "gpu01")["services"]["nvidia-persistenced"] == "active"


def test_nvidia_smi_refuses_a_held_gpu_with_the_drivers_words(fleet):
    """nvidia-smi -r while persistenced holds the GPUs: the text and exit
    code NVIDIA/NVSentinel#1690 recorded."""
    from gpugate.safety.runner import run

    result = run([os.path.join(fleet, "gpu01", "bin", "nvidia-smi"), "-r", "-i", "0"], 30, ok_codes=range(256))
    assert result.rc == 255
    assert result.stdout.startswith("The following GPUs could not be reset:\n  GPU 00000000:18:00.0: In use by "
                                    "another client\n")
    assert "Please first kill all processes using this device" in result.stdout


def test_a_gpu_off_the_bus_is_not_recoverable_by_reset(fleet, tmp_path):
    sim_set(fleet, "gpu01", "gpu.2.xid=79")
    out = reset(fleet, tmp_path)
    assert not out["ok"] and "exited 15" in out["error"] and "GPU is lost" in out["error"]
    # The services are started again whatever happened.
    assert sim_fleet.load(fleet, "gpu01")["services"]["nvidia-persistenced"] == "active"
    assert not os.path.exists(str(tmp_path / "state" / "gpu01" / gpureset.MARKER))


def test_an_interrupted_reset_leaves_nothing_stopped(fleet, tmp_path):
    """A reset killed after it stopped persistenced: the next run starts it again."""
    os.makedirs(str(tmp_path / "state" / "gpu01"))
    with open(str(tmp_path / "state" / "gpu01" / nvidia_reset.STOPPED), "w") as handle:
        json.dump({"units": ["nvidia-persistenced"]}, handle)
    sim_set(fleet, "gpu01", "service.nvidia-persistenced=inactive")
    out = reset(fleet, tmp_path)
    assert out["ok"], out
    assert sim_fleet.load(fleet, "gpu01")["services"]["nvidia-persistenced"] == "active"
    assert not os.path.exists(str(tmp_path / "state" / "gpu01" / nvidia_reset.STOPPED))


def test_the_evidence_parts_bug_report_absent_by_default(fleet, tmp_path, settings_for):
    sim_set(fleet, "gpu01", "gpu.2.xid=48")
    settings = settings_for(fleet, state_dir_template=str(tmp_path / "{node}"))
    out = collect(settings, "gpu01", 1 << 20, 30)
    parts = {p["name"]: p for p in out["parts"]}
    assert "Xid (PCI:0000:3a:00): 48" in base64.b64decode(parts["kernel.log"]["data"]).decode()
    assert "==============NVSMI LOG==============" in base64.b64decode(parts["nvidia-smi-q.txt"]["data"]).decode()
    assert parts["nvidia-bug-report.log.gz"]["error"].startswith("not installed")
    assert "error" in parts["gpugate-last.json"]  # no health check ran here yet: said, not hidden
    sim_set(fleet, "gpu01", "bug_report=1")
    parts = {p["name"]: p for p in collect(settings, "gpu01", 1 << 20, 30)["parts"]}
    log = gzip.decompress(base64.b64decode(parts["nvidia-bug-report.log.gz"]["data"])).decode()
    assert "Xid (PCI:0000:3a:00): 48" in log


def _own_bug_report(fleet, script):
    """gpu01's nvidia-bug-report.sh replaced by ``script`` (sh)."""
    path = os.path.join(fleet, "gpu01", "bin", "nvidia-bug-report.sh")
    if os.path.lexists(path):
        os.unlink(path)
    with open(path, "w") as handle:
        handle.write("#!/bin/sh\n" + script)
    os.chmod(path, 0o755)


def test_a_bug_report_that_writes_no_file_is_an_error_never_its_banner(fleet, tmp_path, settings_for):
    """The real tool prints a banner and writes its log; where it writes none
    (a full disk, not root), the banner is not the report: an error says so."""
    _own_bug_report(fleet, 'echo "nvidia-bug-report.sh will now collect information about your"\n'
                           'echo "system and create the file \'$2.gz\' in the current directory."\n'
                           'echo "ERROR: cannot write $2.gz" >&2\nexit 1\n')
    settings = settings_for(fleet, state_dir_template=str(tmp_path / "{node}"))
    parts = {p["name"]: p for p in collect(settings, "gpu01", 1 << 20, 30)["parts"]}
    assert "nvidia-bug-report.log" not in parts
    error = parts["nvidia-bug-report.log.gz"]["error"]
    assert error.startswith("exit 1, no report written: ERROR: cannot write /") and error.endswith(".log.gz")
    assert "data" not in parts["nvidia-bug-report.log.gz"]
    _own_bug_report(fleet, 'echo "Complete."\n')  # exit 0, no file, nothing on stderr
    parts = {p["name"]: p for p in collect(settings, "gpu01", 1 << 20, 30)["parts"]}
    assert parts["nvidia-bug-report.log.gz"]["error"] == "exit 0, no report written: Complete."


def test_a_large_bug_report_is_read_no_further_than_the_bundle_holds(fleet, tmp_path, settings_for):
    """A 256 MiB report (sparse: no disk used) in a 1 MiB bundle: read within
    the cap (before, up to 16 GiB were read, then cut)."""
    import tracemalloc

    _own_bug_report(fleet, 'truncate -s 256M "$2.gz"\n')
    settings = settings_for(fleet, state_dir_template=str(tmp_path / "{node}"))
    tracemalloc.start()
    try:
        out = collect(settings, "gpu01", 1 << 20, 30)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    part = {p["name"]: p for p in out["parts"]}["nvidia-bug-report.log.gz"]
    assert part["truncated"] and 0 < part["bytes"] < 1 << 20
    assert peak < 16 << 20, peak
