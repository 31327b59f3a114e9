"""Real nodes as they are (issue 25, items 1-4): a baseline captured from a
node passes on that node whatever tools it lacks; the kernel's own files
before tools (sysfs PCI, /sys/module/nvidia/version, /proc for daemons);
nodes without systemd; `gpugate facts` before any baseline exists.

The H200 replayed here is the real one of tests/fixtures/h200-real/ (see
its SOURCE.txt): its NVML values from `nvidia-smi -q -x`, its missing tools,
and the baseline gpugate captured on it."""

import json
import os
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given, settings as hsettings, strategies as st

from conftest import DEMO_BASELINE, ROOT, gpugate_cmd
from gpugate.model.baseline import load_baseline, parse_baseline
from gpugate.model.config import parse_settings
from gpugate.errors import ConfigError
from gpugate.model.facts import UNCHECKED, ProbeFailure, to_jsonable, unchecked_facts
from gpugate.fleet.audit import UNCHECKED as AUDIT_UNCHECKED, fold
from gpugate.fleet.capture import capture, probe_baseline
from gpugate.node.check import run_check
from gpugate.node.metrics import node_families
from gpugate.probes import files
from gpugate.probes import services as services_probe
from gpugate.core.record import replace
from gpugate.sim import fleet as sim_fleet
from gpugate.sim import keys as sim_keys

try:
    import tomllib as toml
except ImportError:  # Python < 3.11
    import tomli as toml

H200 = os.path.join(ROOT, "tests", "fixtures", "h200-real")
H200_MISSING = ["dcgmi", "dkms", "lspci", "modinfo", "rpm", "systemctl"]  # not installed on that VM
# Tools a check or a capture may run (nvidia-imex-ctl: IMEX members only; all_reduce_perf: the sweep's smoke).
TOOLS = [t for t in sim_fleet.EXECUTABLES if t not in ("nvidia-imex-ctl", "all_reduce_perf")]


def _settings(fleet, baseline="/nonexistent/baseline.toml", **extra):
    return replace(parse_settings({}, "(test)"), sim_fleet=fleet, baseline=baseline, **extra)


def _set(fleet, node, **values):
    model = sim_fleet.load(fleet, node)
    for key, value in values.items():
        sim_keys.apply(model, key, value)
    sim_fleet.save(fleet, node, model)


def _capture_then_check(fleet, node, settings=None):
    """What an admin does on a new node: capture a baseline there, check the node against it."""
    settings = settings or _settings(fleet)
    facts = run_check(settings, probe_baseline(), node, "healthcheck").facts
    text = capture(node, to_jsonable(facts), "captured")
    baseline = parse_baseline(toml.loads(text), "captured")
    return text, run_check(settings, baseline, node, "healthcheck")


# --------------------------------------------------------------------------
# 1. Capture and check agree, whatever tools the node lacks.

_FLEET = {}


def _demo_fleet(tmp_path_factory):
    if not _FLEET:
        path = str(tmp_path_factory.mktemp("real") / "fleet")
        gpugate_cmd("sim", "init", path, "--nodes", "gpu01", "--baseline", DEMO_BASELINE, check=True)
        _FLEET["path"] = path
    return _FLEET["path"]


@hsettings(max_examples=20, deadline=None)
@given(missing=st.sets(st.sampled_from(TOOLS)), systemd=st.booleans())
def test_a_baseline_captured_on_a_node_passes_there_whatever_tools_it_lacks(tmp_path_factory, missing, systemd):
    fleet = _demo_fleet(tmp_path_factory)
    _set(fleet, "gpu01", absent=",".join(sorted(missing)), systemd="1" if systemd else "0")
    text, result = _capture_then_check(fleet, "gpu01")
    assert result.verdict.fit, (sorted(missing), systemd, result.verdict.reason, text)
    facts = result.facts
    # The kernel's own files answer whatever is missing; nothing reads as good that was not read.
    assert (facts.pci_gpus, facts.pci_nvswitches, facts.module_resident) == (8, 4, "580.65.06")
    assert facts.services == {"fabricmanager": "active", "persistenced": "active"}
    unchecked = dict(unchecked_facts(facts))
    assert ("module_on_disk" in unchecked) == ("modinfo" in missing)
    if "modinfo" not in missing:
        assert facts.module_on_disk == "580.65.06"


def _h200_model(fleet, node="gpu001"):
    """A simulated node replaying the real H200: NVML values from its
    `nvidia-smi -q -x`, the rest from the capture gpugate made there."""
    xml = ET.parse(os.path.join(H200, "nvidia-smi-q-x-h200-580.159.04.xml")).getroot()
    gpu = xml.find("gpu")
    with open(os.path.join(H200, "gpugate-capture-h200.toml"), "rb") as handle:
        real = parse_baseline(toml.load(handle), "h200 capture")
    model = sim_fleet.new_model(node, real)
    watts = lambda tag: int(round(float(gpu.find("gpu_power_readings/" + tag).text.split()[0]) * 1000))  # noqa: E731
    on = lambda path: int(gpu.find(path).text == "Enabled")  # noqa: E731
    g = model["nvml"]["gpus"][0]
    g.update({
        "name": gpu.find("product_name").text, "uuid": gpu.find("uuid").text, "serial": gpu.find("serial").text,
        "vbios": gpu.find("vbios_version").text, "gsp": gpu.find("gsp_firmware_version").text,
        "pci_bus_id": gpu.find("pci/pci_bus_id").text, "pci_device_id": int(gpu.find("pci/pci_device_id").text, 16),
        "pcie": {"gen": int(gpu.find("pci/pci_gpu_link_info/pcie_gen/current_link_gen").text),
                 "max_gen": int(gpu.find("pci/pci_gpu_link_info/pcie_gen/max_link_gen").text),
                 "width": int(gpu.find("pci/pci_gpu_link_info/link_widths/current_link_width").text.rstrip("x")),
                 "max_width": int(gpu.find("pci/pci_gpu_link_info/link_widths/max_link_width").text.rstrip("x"))},
        "ecc_mode": [on("ecc_mode/current_ecc"), on("ecc_mode/pending_ecc")],
        "mig": [on("mig_mode/current_mig"), on("mig_mode/pending_mig")],
        "persistence": on("persistence_mode"),
        "compute_mode": {"Default": 0}[gpu.find("compute_mode").text],
        "power_limit_mw": watts("current_power_limit"),
        "power_limits_mw": [watts("min_power_limit"), watts("max_power_limit"), watts("default_power_limit")],
        # gpu_idle is the only active reason (NVML's 0x1); no NVLink and no page retirement on one H200
        # (GetNvLinkState, GetRetiredPages: NotSupported); fabric state 0, as NVML returned there.
        "clock_event_reasons": 0x1 if gpu.find("clocks_event_reasons/clocks_event_reason_gpu_idle").text == "Active"
        else 0,
        "nvlink": [], "retired_pages_pending": None, "remapped_rows": [0, 0, 0, 0], "fabric_state": 0,
    })
    assert (g["name"], g["vbios"], g["ecc_mode"], g["clock_event_reasons"]) == \
        ("NVIDIA H200", "96.00.A5.00.1A", [1, 1], 1)
    model["nvml"]["driver"] = xml.find("driver_version").text
    model["nvml"]["cuda"] = sim_fleet._cuda_int(xml.find("cuda_version").text)
    model["module"] = {"resident": model["nvml"]["driver"], "on_disk": model["nvml"]["driver"]}
    model["image"] = None  # no /etc/cluster-image.json there
    model["packages"] = {"container_toolkit": None, "fabricmanager": None}  # dpkg-query: neither installed
    # SOURCE.txt does not say whether nvidia-persistenced ran (persistence mode was on): here it does;
    # the tests below also take it away.
    model["services"] = {"nvidia-fabricmanager": "inactive", "nvidia-persistenced": "active"}
    model["pci"] = {"gpus": 1, "nvswitches": 0}
    model["absent"] = list(H200_MISSING)
    model["systemd"] = False  # a VM without systemd
    sim_fleet.save(fleet, node, model)
    return fleet


@pytest.fixture
def h200(tmp_path):
    return _h200_model(str(tmp_path / "fleet"))


def test_the_real_h200_captured_and_checked_is_fit(h200, tmp_path):
    """The failure seen there: `probe module=missing; pci=missing;
    persistenced=missing` against the baseline captured from the same node."""
    with open(os.path.join(H200, "gpugate-check-healthcheck-h200.json")) as handle:
        seen = json.load(handle)
    assert {f["component"] for f in seen["findings"]} == {"module", "pci", "persistenced"}  # what was seen

    out = str(tmp_path / "baseline.toml")
    result = gpugate_cmd("baseline", "capture", "--sim", h200, "--node", "gpu001", "-o", out)
    assert result.returncode == 0, result.stderr
    check = gpugate_cmd("check", "--sim", h200, "--node", "gpu001", "--baseline", out, "--json")
    data = json.loads(check.stdout)
    assert check.returncode == 0 and data["fit"] is True, (data["reason"], data["findings"])
    assert data["unchecked"] == [{"fact": "module_on_disk", "why": data["facts"]["module_on_disk"]["error"]["detail"]}]
    facts = data["facts"]
    assert (facts["pci_gpus"], facts["pci_nvswitches"], facts["module_resident"]) == (1, 0, "580.159.04")
    assert facts["services"]["persistenced"] == "active"
    gpu = facts["nvml"]["gpus"][0]
    assert (gpu["retired_pages_pending"], gpu["nvlink_up"], gpu["ecc_pending"], gpu["clock_event_reasons"]) == \
        (None, [], True, 1)

    # The capture is the real one, and now says whether the node has NVSwitches (sysfs, not lspci).
    with open(os.path.join(H200, "gpugate-capture-h200.toml"), "rb") as handle:
        real = toml.load(handle)
    with open(out, "rb") as handle:
        ours = toml.load(handle)
    real["nodes"]["gpu001"]["nvswitch"] = False
    assert {k: v for k, v in ours.items() if k != "name"} == {k: v for k, v in real.items() if k != "name"}
    with open(out) as handle:
        assert "lspci" not in handle.read()


def test_h200_without_persistenced_says_how_to_tell_gpugate(h200, tmp_path):
    """No daemon in /proc and no systemd: broken, and the finding says what
    to set where the daemon runs outside this PID namespace; the site's
    `[services] persistenced = "none"` makes it unchecked, never running."""
    _set(h200, "gpu001", **{"service.nvidia-persistenced": "inactive"})
    settings = _settings(h200)
    text, result = _capture_then_check(h200, "gpu001", settings)
    (finding,) = result.verdict.findings
    assert (finding.cls, finding.component, finding.observed) == ("broken", "persistenced", "not running")
    assert '[services] persistenced = "none"' in finding.detail

    baseline = parse_baseline(toml.loads(text), "captured")
    off = replace(settings, services=dict(settings.services, persistenced="none"))
    result = run_check(off, baseline, "gpu001", "healthcheck")
    assert result.verdict.fit, result.verdict.findings
    assert result.facts.services["persistenced"].kind == UNCHECKED
    assert ("service:persistenced", '[services] persistenced = "none"') in unchecked_facts(result.facts)
    rows = {(r.component, r.value, r.status) for r in fold({"gpu001": to_jsonable(result.facts)}, baseline).rows}
    assert ("service:persistenced", "(unchecked)", AUDIT_UNCHECKED) in rows
    samples = {(s[1]["service"], s[1]["state"]): s[2] for fam in node_families("gpu001", result.verdict,
                                                                              result.facts, baseline)
               if fam[0] == "gpugate_service" for s in fam[3]}
    assert samples[("persistenced", "unchecked")] == 1 and samples[("persistenced", "running")] == 0


# --------------------------------------------------------------------------
# 2. The kernel's own files before tools.

def _device(root, address, vendor, cls):
    path = os.path.join(root, "sys/bus/pci/devices", address)
    os.makedirs(path)
    for name, value in (("vendor", vendor), ("class", cls)):
        with open(os.path.join(path, name), "w") as handle:
            handle.write(value + "\n")


def test_pci_counts_read_vendor_and_class_from_sysfs(tmp_path):
    root = str(tmp_path)
    assert files.pci_counts(root) is None  # no sysfs PCI tree: the caller falls back to lspci
    _device(root, "0000:00:00.0", "0x8086", "0x060000")  # host bridge
    _device(root, "0000:01:00.0", "0x1a03", "0x030000")  # ASPEED VGA: not NVIDIA
    _device(root, "0000:18:00.0", "0x10de", "0x030200")  # 3D controller
    _device(root, "0000:19:00.0", "0x10de", "0x030000")  # VGA
    _device(root, "0000:19:00.1", "0x10de", "0x040300")  # the GPU's audio function
    _device(root, "0000:07:00.0", "0x10de", "0x068000")  # NVSwitch: bridge, other
    assert files.pci_counts(root) == (2, 1)
    with open(os.path.join(root, "sys/bus/pci/devices/0000:18:00.0/class"), "w") as handle:
        handle.write("garbage\n")
    failure = files.pci_counts(root)
    assert isinstance(failure, ProbeFailure) and failure.kind == "error" and "class" in failure.detail


def test_the_loaded_module_is_read_from_sysfs_before_the_proc_banner(tmp_path):
    root = str(tmp_path)
    assert files.module_resident(root).kind == "missing"  # no module loaded
    os.makedirs(os.path.join(root, "proc/driver/nvidia"))
    with open(os.path.join(root, "proc/driver/nvidia/version"), "w") as handle:
        handle.write("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.20  Release Build\n")
    assert files.module_resident(root) == "570.133.20"
    os.makedirs(os.path.join(root, "sys/module/nvidia"))
    with open(os.path.join(root, "sys/module/nvidia/version"), "w") as handle:
        handle.write("580.159.04\n")
    assert files.module_resident(root) == "580.159.04"


def test_sim_lays_out_sysfs_as_the_kernel_does(h200):
    root = os.path.join(h200, "gpu001", "root")
    gpu = os.path.join(root, "sys/bus/pci/devices/0000:00:06.0")
    assert os.path.islink(gpu)
    assert [open(os.path.join(gpu, n)).read() for n in ("vendor", "device", "class")] == \
        ["0x10de\n", "0x2335\n", "0x030200\n"]
    assert open(os.path.join(root, "sys/module/nvidia/version")).read() == "580.159.04\n"
    assert not os.path.exists(os.path.join(root, "run/systemd/system"))
    assert sorted(os.listdir(os.path.join(h200, "gpu001", "bin"))) == \
        sorted(set(sim_fleet.EXECUTABLES) - set(H200_MISSING) - {"nvidia-imex-ctl", "nvidia-bug-report.sh"})


def test_a_gpu_gone_from_the_bus_is_seen_in_sysfs_without_lspci(fleet, settings_for):
    _set(fleet, "gpu01", absent="lspci", **{"pci.gpus": "7"})
    result = run_check(settings_for(fleet), load_baseline(DEMO_BASELINE), "gpu01", "healthcheck")
    assert result.facts.pci_gpus == 7
    assert [(f.cls, f.component, f.observed) for f in result.verdict.findings] == [("health", "pci_gpus", "7")]


def test_a_pinned_component_whose_tool_is_missing_stays_a_finding(fleet, settings_for):
    """dcgm is pinned by the demo baseline: no dcgmi is unknown, never good.
    modinfo pins nothing: unchecked, no finding."""
    _set(fleet, "gpu01", absent="dcgmi,modinfo")
    result = run_check(settings_for(fleet), load_baseline(DEMO_BASELINE), "gpu01", "healthcheck")
    assert {(f.cls, f.component) for f in result.verdict.findings} == {("probe", "dcgm"), ("probe", "dcgm_health")}
    assert [what for what, _ in unchecked_facts(result.facts)] == ["module_on_disk"]


# --------------------------------------------------------------------------
# 3. Nodes without systemd.

def _proc(root, pid, comm, cmdline):
    path = os.path.join(root, "proc", str(pid))
    os.makedirs(path)
    with open(os.path.join(path, "comm"), "w") as handle:
        handle.write(comm + "\n")
    with open(os.path.join(path, "cmdline"), "w") as handle:
        handle.write(cmdline)


def test_daemons_are_found_by_their_process_truncated_comm_and_program(tmp_path):
    root = str(tmp_path)
    _proc(root, 1, "tini", "/tini\0--\0slurmd\0")
    _proc(root, 40, "nvidia-persiste", "/usr/bin/nvidia-persistenced\0--user\0nvpd\0")  # comm is 15 characters
    _proc(root, 41, "nv-fabricmanage", "/bin/sh\0-c\0sleep\0")  # a process that only calls itself that
    _proc(root, 42, "nv-fabricmanage", "")  # a zombie: exited, cmdline empty
    asked = []
    units = {"persistenced": "nvidia-persistenced", "fabricmanager": "nvidia-fabricmanager"}
    assert services_probe.read(units, root, asked.append) == {"persistenced": "active",
                                                               "fabricmanager": "not running"}
    assert asked == []  # no systemd: never asked
    os.makedirs(os.path.join(root, "run/systemd/system"))
    states = services_probe.read(units, root, lambda unit: {"nvidia-fabricmanager": "failed"}[unit])
    assert states == {"persistenced": "active", "fabricmanager": "failed"}  # systemd says why
    off = services_probe.read(dict(units, fabricmanager="none"), root, asked.append)
    assert off["fabricmanager"].kind == UNCHECKED and asked == []


def test_a_stopped_service_under_systemd_is_still_broken(fleet, settings_for):
    _set(fleet, "gpu01", **{"service.nvidia-fabricmanager": "failed"})
    result = run_check(settings_for(fleet), load_baseline(DEMO_BASELINE), "gpu01", "healthcheck")
    assert [(f.cls, f.component, f.observed) for f in result.verdict.findings] == [("broken", "fabricmanager",
                                                                                   "failed")]


@pytest.mark.parametrize("value, problem", [
    ("", "systemd unit name"), ("nvidia persistenced", "systemd unit name"), ("-x", "systemd unit name"),
    (3, "expected a string"), (True, "expected a string")])
def test_bad_service_values_are_refused_with_the_key_and_what_is_allowed(value, problem):
    with pytest.raises(ConfigError) as exc:
        parse_settings({"services": {"persistenced": value}}, "gpugate.toml")
    assert "services.persistenced" in str(exc.value) and problem in str(exc.value)
    if isinstance(value, str):
        assert '"none"' in str(exc.value)
    with pytest.raises(ConfigError, match=r"services.dcgm: unknown key; allowed here: fabricmanager, persistenced"):
        parse_settings({"services": {"dcgm": "none"}}, "gpugate.toml")
    assert parse_settings({"services": {"persistenced": "none"}}, "t").services["persistenced"] == "none"


# --------------------------------------------------------------------------
# 4. `gpugate facts` before any baseline exists.

def test_facts_without_a_baseline_prints_every_fact_and_exits_0(h200, tmp_path):
    config = tmp_path / "gpugate.toml"
    config.write_text('baseline = "%s"\nstate_dir = "%s"\n[sim]\nfleet = "%s"\n'
                      % (tmp_path / "no-baseline.toml", tmp_path / "state", h200))
    for extra in (["--json"], []):
        result = gpugate_cmd("facts", "--config", str(config), "--node", "gpu001", *extra)
        assert result.returncode == 0, result.stderr
        data = json.loads(result.stdout)
        assert "baseline not found" in data["baseline_error"]
        facts = data["facts"]
        assert facts["nvml"]["gpus"][0]["name"] == "NVIDIA H200" and facts["nvml"]["gpu_count"] == 1
        assert (facts["kernel_release"], facts["pci_gpus"], facts["module_resident"]) == \
            ("6.18.44-fc-v657-gpu", 1, "580.159.04")
        assert facts["dcgm_version"]["error"]["kind"] == "missing"  # asked (it is a fact), not installed
    result = gpugate_cmd("facts", "--sim", h200, "--baseline", str(tmp_path / "nope.toml"), "--node", "gpu001",
                         "--json")
    assert result.returncode == 0 and json.loads(result.stdout)["facts"]["nvml"]["driver_version"] == "580.159.04"
    # With a baseline there is no baseline_error.
    capture = gpugate_cmd("baseline", "capture", "--sim", h200, "--node", "gpu001", "-o", str(tmp_path / "b.toml"))
    assert capture.returncode == 0, capture.stderr
    result = gpugate_cmd("facts", "--sim", h200, "--baseline", str(tmp_path / "b.toml"), "--node", "gpu001", "--json")
    assert result.returncode == 0 and json.loads(result.stdout)["baseline_error"] is None
