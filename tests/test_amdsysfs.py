"""gpugate.vendors.amd.probe_sysfs on simulated AMD nodes (gpugate.vendors.amd.sim_node) and
on hand-built sysfs trees of each degraded form: every case ends as an
exact value or a ProbeFailure, never a healthy default.  The text parsers
(gpugate.vendors.amd.parse_sysfs) are property-tested on their own."""

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import SAMPLES
from gpugate.vendors.amd.facts import NOT_READ_AMD, gpu_count
from gpugate.errors import ConfigError, ParseError
from gpugate.model.facts import Pcie, ProbeFailure
from gpugate.vendors.amd import parse_sysfs as parse
from gpugate.vendors.amd import probe_sysfs
from gpugate.vendors.amd import sim_node

BAD_PAGES_CAPTURE = os.path.join(SAMPLES, "amd", "sysfs-gpu_vram_bad_pages-8R-grep-unknownGPU-dridevel.FRAGMENT.txt")
BUSES = ("1b", "3d", "4e", "5f", "9d", "bd", "cd", "dd")
PCI = "sys/devices/pci0000:00"


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        handle.write(text)


@pytest.fixture
def node(tmp_path):
    """A healthy simulated 8x MI300X: {"root", "model", "render"}."""
    model = {"amd": sim_node.new_amd(node="mi001")}
    root = str(tmp_path / "root")

    def render():
        sim_node.render(root, model["amd"], write)
        return probe_sysfs.read(root)

    return {"root": root, "model": model, "render": render}


def sim_set(node, **keys):
    for key, value in keys.items():
        assert sim_node.set_key(node["model"], key.replace("__", "."), value)
    return node["render"]()


def failure(value, kind=None, text=""):
    assert isinstance(value, ProbeFailure), value
    assert kind is None or value.kind == kind, value
    assert text in value.detail, value
    return value


# ------------------------------------------------------------ simulated node
def test_healthy_mi300x_exact(node):
    amd = node["render"]()
    assert (amd.initstate, amd.amdgpu_version, amd.rocm_version) == ("live", "6.16.13", "7.2.1")
    assert amd.pci_functions == 8 and amd.kfd_processes == () and gpu_count(amd) == 8
    model = node["model"]["amd"]["gpus"]
    for i, gpu in enumerate(amd.gpus):
        assert (gpu.index, gpu.bdf, gpu.device_id, gpu.bound) == (i, "0000:%s:00.0" % BUSES[i], "0x74a1", True)
        assert (gpu.product, gpu.vbios) == ("AMD Instinct MI300X OAM", "113-M3000108-103")
        assert (gpu.serial, gpu.unique_id) == (model[i]["serial"], model[i]["unique_id"])
        assert (gpu.compute_partition, gpu.memory_partition, gpu.power_cap_w) == ("SPX", "NPS1", 750.0)
        assert gpu.ras == {b: (0, 0, 0) for b in sim_node.RAS_BLOCKS}
        assert gpu.bad_pages == (0, 0, 0) and gpu.pcie == Pcie(5, 16, 5, 16) and gpu.pcie_replays == 0
        assert gpu.firmware == sim_node.FIRMWARE and gpu.processes == ()
    assert probe_sysfs.bus_to_gpu(amd) == {"0000:%s:00" % b: i for i, b in enumerate(BUSES)}


def test_audio_functions_and_amd_bridges_are_on_the_bus_but_not_counted(node):
    node["render"]()
    bus = os.listdir(os.path.join(node["root"], "sys/bus/pci/devices"))
    assert "0000:1b:00.1" in bus and "0000:1a:00.0" in bus and len(bus) == 24
    with open(os.path.join(node["root"], PCI, "0000:1b:00.1", "class")) as handle:
        assert handle.read() == "0x040300\n"
    assert probe_sysfs.pci_functions(node["root"]) == [("0000:%s:00.0" % b, "0x74a1") for b in BUSES]


def test_sim_keys_change_exactly_what_they_name(node):
    node["render"]()
    amd = sim_set(node, amd__gpu3__ras__umc__ue="+2", amd__gpu1__bad_pages="retired:3,pending:1",
                  amd__gpu2__pcie_width="8", amd__gpu5__pcie_replays="+7", amd__gpu6__ras__xgmi_wafl__ce="1533",
                  amd__amdgpu="6.12.12", amd__rocm="7.1.1")
    amd = sim_set(node, amd__gpu3__ras__umc__ue="+2", amd__gpu3__ras__umc__de="1")
    assert amd.gpus[3].ras["umc"] == (4, 0, 1) and amd.gpus[3].ras["gfx"] == (0, 0, 0)
    assert amd.gpus[1].bad_pages == (3, 1, 0) and amd.gpus[0].bad_pages == (0, 0, 0)
    assert amd.gpus[2].pcie == Pcie(5, 8, 5, 16) and amd.gpus[5].pcie_replays == 7
    assert amd.gpus[6].ras["xgmi_wafl"] == (0, 1533, 0)
    assert (amd.amdgpu_version, amd.rocm_version) == ("6.12.12", "7.1.1")


def test_cpx_partition_and_kfd_processes_per_gpu(node):
    node["render"]()
    amd = sim_set(node, amd__gpu0__compute_partition="CPX", amd__gpu0__memory_partition="NPS4",
                  amd__gpu0__processes="4242", amd__gpu7__processes="4242,77")
    assert (amd.gpus[0].compute_partition, amd.gpus[0].memory_partition) == ("CPX", "NPS4")
    assert amd.pci_functions == 8 and gpu_count(amd) == 8  # CPX: 8 cards more in /sys/class/drm, still 8 GPUs
    assert len(os.listdir(os.path.join(node["root"], "sys/class/drm"))) == 15
    assert amd.kfd_processes == (77, 4242)
    assert [g.processes for g in amd.gpus] == [(4242,), (), (), (), (), (), (), (77, 4242)]
    amd = sim_set(node, amd__gpu0__processes="none", amd__gpu7__processes="none", amd__gpu0__compute_partition="SPX")
    assert amd.kfd_processes == () and all(g.processes == () for g in amd.gpus)
    assert len(os.listdir(os.path.join(node["root"], "sys/class/drm"))) == 8


def test_unbound_gpu_and_driver_not_loaded(node):
    node["render"]()
    amd = sim_set(node, amd__gpu4__bound="0")
    assert amd.pci_functions == 8 and gpu_count(amd) == 7 and not amd.gpus[4].bound
    failure(amd.gpus[4].vbios, "missing", "0000:9d:00.0: not bound to amdgpu (driver: none)")
    assert not os.path.lexists(os.path.join(node["root"], PCI, "0000:9d:00.0", "driver"))
    amd = sim_set(node, amd__initstate="absent")
    failure(amd.initstate, "missing", "amdgpu is not loaded")
    failure(amd.amdgpu_version, "missing")
    assert amd.pci_functions == 8 and gpu_count(amd) == 0 and amd.kfd_processes == ()
    assert not os.path.exists(os.path.join(node["root"], "sys/module/amdgpu"))
    assert not os.path.exists(os.path.join(node["root"], "sys/class/kfd"))


def test_inbox_driver_ras_off_no_rocm_and_gpus_off_the_bus(node):
    node["render"]()
    amd = sim_set(node, amd__amdgpu="inbox", amd__gpu2__ras="off", amd__rocm="none", amd__gpus="6")
    assert amd.amdgpu_version == "inbox"
    assert amd.gpus[2].ras is None and amd.gpus[2].bad_pages is None
    failure(amd.rocm_version, "missing", "/opt/rocm/.info/version").source == "rocm"
    assert amd.pci_functions == 6 and [g.bdf[5:7] for g in amd.gpus] == list(BUSES[:6])
    assert not os.path.lexists(os.path.join(node["root"], "sys/bus/pci/devices/0000:dd:00.0"))
    assert not os.path.exists(os.path.join(node["root"], PCI, "0000:dd:00.1"))


def test_file_key_injects_garbage_and_the_probe_names_it(node):
    node["render"]()
    amd = sim_set(node, **{"amd.gpu0.file.ras/umc_err_count": "ue: lots\\nce: 0\\n",
                           "amd.gpu1.file.product_name": "", "amd.gpu1.file.vbios_version": "absent"})
    failure(amd.gpus[0].ras["umc"], "error", "ras/umc_err_count")
    assert amd.gpus[0].ras["gfx"] == (0, 0, 0)  # the other blocks still count
    assert amd.gpus[1].product is None
    failure(amd.gpus[1].vbios, "missing", "vbios_version")


def test_render_leaves_other_vendors_devices_alone(node):
    other = os.path.join(node["root"], PCI, "0000:18:00.0")
    write(os.path.join(other, "vendor"), "0x10de\n")
    os.makedirs(os.path.join(node["root"], "sys/bus/pci/devices"))
    os.symlink("../../../devices/pci0000:00/0000:18:00.0", os.path.join(node["root"], "sys/bus/pci/devices/0000:18:00.0"))
    sim_set(node, amd__gpus="2")
    assert os.path.exists(os.path.join(other, "vendor"))
    assert os.path.islink(os.path.join(node["root"], "sys/bus/pci/devices/0000:18:00.0"))


def test_sim_keys_known_and_refused():
    model = {"amd": sim_node.new_amd(node="mi002", count=2)}
    for key in ("amd.gpu3.ras.umc.ue", "amd.gpu1.bad_pages", "amd.gpu0.compute_partition", "amd.gpu2.pcie_width",
                "amd.gpu0.bound", "amd.initstate", "amd.amdgpu", "amd.rocm", "amd.gpu0.processes",
                "amd.gpu0.firmware.mec", "amd.gpu0.file.ras/features"):
        assert sim_node.known(key), key
    for key in ("amd.gpu0.ras.umc", "amd.gpu0.nvlink", "gpu.0.xid", "amd.gpu0.file.../etc/passwd", "driver"):
        assert not sim_node.known(key) and not sim_node.set_key(model, key, "1"), key
    for key, value in (("amd.gpu0.compute_partition", "XPX"), ("amd.gpu0.bad_pages", "lost:1"),
                       ("amd.gpu5.bound", "0"), ("amd.gpus", "3"), ("amd.gpu0.ras.umc.ue", "-1"),
                       ("amd.gpu0.bound", "maybe")):
        with pytest.raises(ConfigError):
            sim_node.set_key(model, key, value)
    with pytest.raises(ConfigError, match="not an AMD node"):
        sim_node.set_key({"nvml": {}}, "amd.rocm", "7.1.1")
    assert sim_node.KEYS and all(k.startswith("amd.") for k in sim_node.KEYS)


def test_new_amd_takes_the_baseline_pins():
    class Pin:
        amdgpu, rocm = "inbox", "6.3.3"
        vbios = {"AMD Instinct MI300X OAM": "113-M3000100-999"}
        amdgpu_firmware = {"AMD Instinct MI300X OAM": {"mec": "0x000000b0"}}

    model = sim_node.new_amd(Pin(), node="mi003", count=1)
    assert (model["amdgpu"], model["rocm"]) == (None, "6.3.3")
    assert model["gpus"][0]["vbios"] == "113-M3000100-999" and model["gpus"][0]["firmware"]["mec"] == "0x000000b0"


# ------------------------------------------------------ hand-built trees
def tree(tmp_path, gpus=8, device="0x74a1", cls="0x120000", bound=True, live=True, extra=None, drop=()):
    """A sysfs tree written file by file (no simulator): ``gpus`` functions,
    each with what a bound MI300X shows unless ``bound`` is False."""
    root = str(tmp_path / "tree")
    files = {}
    for i in range(gpus):
        base = "sys/bus/pci/devices/0000:%02x:00.0/" % (0x10 + i)
        files.update({base + "vendor": "0x1002\n", base + "device": device + "\n", base + "class": cls + "\n"})
        if bound and live:
            files.update({base + "drm/card%d/dev" % i: "226:%d\n" % i, base + "product_name": "AMD Instinct MI300X OAM\n",
                          base + "serial_number": "692409006566\n", base + "unique_id": "28246ce5673b4aa0\n",
                          base + "vbios_version": "113-M3000108-103\n", base + "current_compute_partition": "SPX\n",
                          base + "current_memory_partition": "NPS1\n", base + "hwmon/hwmon3/power1_cap": "750000000\n",
                          base + "hwmon/hwmon3/name": "amdgpu\n",
                          base + "ras/umc_err_count": "ue: 0\nce: 0\nde: 0\n", base + "ras/gfx_err_count": "ue: 0\nce: 0\n",
                          base + "ras/gpu_vram_bad_pages": "", base + "current_link_speed": "32.0 GT/s PCIe\n",
                          base + "max_link_speed": "32.0 GT/s PCIe\n", base + "current_link_width": "16\n",
                          base + "max_link_width": "16\n", base + "pcie_replay_count": "0\n",
                          base + "fw_version/mec_fw_version": "0x000000a6\n"})
    if live:
        files.update({"sys/module/amdgpu/initstate": "live\n", "sys/class/kfd/kfd/proc/.x": ""})
    files["opt/rocm/.info/version"] = "6.3.3-74\n"
    files.update(extra or {})
    for rel, text in files.items():
        if rel not in drop and text is not None:
            write(os.path.join(root, rel), text)
    os.makedirs(os.path.join(root, "sys/bus/pci/drivers/amdgpu"), exist_ok=True)
    for i in range(gpus if bound and live else 0):
        os.symlink("../../../bus/pci/drivers/amdgpu", os.path.join(root, "sys/bus/pci/devices/0000:%02x:00.0/driver" % (0x10 + i)))
    return root


def test_tree_healthy_and_inbox_driver(tmp_path):
    amd = probe_sysfs.read(tree(tmp_path))
    assert amd.amdgpu_version == "inbox" and amd.rocm_version == "6.3.3" and amd.pci_functions == 8
    gpu = amd.gpus[0]
    assert gpu.ras == {"umc": (0, 0, 0), "gfx": (0, 0, None)} and gpu.bad_pages == (0, 0, 0)
    assert gpu.firmware == {"mec": "0x000000a6"} and gpu.power_cap_w == 750.0
    assert probe_sysfs.read(tree(tmp_path / "b"), firmware=False).gpus[0].firmware is NOT_READ_AMD


def test_initstate_absent_with_gpus_on_the_bus(tmp_path):
    amd = probe_sysfs.read(tree(tmp_path, live=False))
    failure(amd.initstate, "missing", "/sys/module/amdgpu/initstate: absent")
    failure(amd.amdgpu_version, "missing", "not loaded")
    assert amd.pci_functions == 8 and gpu_count(amd) == 0 and amd.kfd_processes == ()
    for gpu in amd.gpus:
        for value in (gpu.product, gpu.ras, gpu.bad_pages, gpu.pcie, gpu.power_cap_w, gpu.compute_partition):
            failure(value, "missing", "not bound to amdgpu")


def test_eight_on_the_bus_none_bound(tmp_path):
    amd = probe_sysfs.read(tree(tmp_path, bound=False))
    assert amd.initstate == "live" and amd.pci_functions == 8 and gpu_count(amd) == 0
    assert all(not g.bound and isinstance(g.vbios, ProbeFailure) for g in amd.gpus)
    assert probe_sysfs.bus_to_gpu(amd)["0000:17:00"] == 7  # kernel-log lines of unbound GPUs still find them


def test_amdgpu_holds_it_but_no_drm_card(tmp_path):
    root = tree(tmp_path, gpus=1, drop=("sys/bus/pci/devices/0000:10:00.0/drm/card0/dev",))
    gpu = probe_sysfs.read(root).gpus[0]
    assert not gpu.bound
    failure(gpu.product, "missing", "no drm card")


def test_fru_empty_absent_and_corrupted(tmp_path):
    base = "sys/bus/pci/devices/0000:1%d:00.0/"
    root = tree(tmp_path, gpus=3, extra={(base % 0) + "product_name": "\n", (base % 0) + "serial_number": "",
                                          (base % 1) + "product_name": None, (base % 1) + "serial_number": None,
                                          (base % 2) + "product_name": "AMD Instinct\x01\x02MI300X\n"})
    gpus = probe_sysfs.read(root).gpus
    assert (gpus[0].product, gpus[0].serial) == (None, None)
    assert (gpus[1].product, gpus[1].serial) == (None, None)  # no FRU: newer kernels show no files
    failure(gpus[2].product, "error", "product_name")
    assert gpus[0].device_id == "0x74a1"  # the silicon, when the FRU says nothing


@pytest.mark.parametrize("text, why", [("ue: x\nce: 0\n", "unsigned integer"), ("garbage\n", "expected 'ue: N'"),
                                       ("ce: 1\n", "no ue line"), ("Query currently inaccessible\n", "GPU reset"),
                                       ("ue: 1\nue: 2\nce: 0\n", "expected 'ue: N'"), ("", "no ue line")])
def test_garbage_ras_text_is_a_failure_for_that_block(tmp_path, text, why):
    root = tree(tmp_path, gpus=1, extra={"sys/bus/pci/devices/0000:10:00.0/ras/umc_err_count": text})
    gpu = probe_sysfs.read(root).gpus[0]
    failure(gpu.ras["umc"], "error", why)
    assert gpu.ras["gfx"] == (0, 0, None)


def test_ras_absent_and_bad_pages_absent(tmp_path):
    base = "sys/bus/pci/devices/0000:10:00.0/ras/"
    gpu = probe_sysfs.read(tree(tmp_path, gpus=1, drop=(base + "umc_err_count", base + "gfx_err_count",
                                                     base + "gpu_vram_bad_pages"))).gpus[0]
    assert gpu.ras is None and gpu.bad_pages is None  # RAS not enabled: a fact
    gpu = probe_sysfs.read(tree(tmp_path / "b", gpus=1, drop=(base + "gpu_vram_bad_pages",))).gpus[0]
    assert gpu.ras == {"umc": (0, 0, 0), "gfx": (0, 0, None)}
    failure(gpu.bad_pages, "missing", "bad page retirement off")
    gpu = probe_sysfs.read(tree(tmp_path / "c", gpus=1, extra={base + "gpu_vram_bad_pages": "0x1 : 0x1000 : X\n"})).gpus[0]
    failure(gpu.bad_pages, "error", "R|P|F")


def test_aca_files_count_where_no_err_count(tmp_path):
    base = "sys/bus/pci/devices/0000:10:00.0/ras/"
    root = tree(tmp_path, gpus=1, extra={base + "aca_umc": "ue: 9\nce: 9\nde: 9\n", base + "aca_sdma": "ue: 1\nce: 2\nde: 3\n"})
    assert probe_sysfs.read(root).gpus[0].ras == {"umc": (0, 0, 0), "gfx": (0, 0, None), "sdma": (1, 2, 3)}


def test_secondary_die_without_power_cap(tmp_path):
    cap = "sys/bus/pci/devices/0000:1%d:00.0/hwmon/hwmon3/power1_cap"
    mi250 = dict(device="0x740c", cls="0x038000")
    amd = probe_sysfs.read(tree(tmp_path, gpus=2, extra={cap % 0: "560000000\n", cap % 1: None}, **mi250))
    assert amd.pci_functions == 2 and [g.power_cap_w for g in amd.gpus] == [560.0, None]
    amd = probe_sysfs.read(tree(tmp_path / "b", gpus=2, extra={cap % 1: "0\n"}, **mi250))
    assert amd.gpus[1].power_cap_w is None  # aldebaran_get_power_limit: the secondary die shows 0
    amd = probe_sysfs.read(tree(tmp_path / "c", gpus=2, extra={cap % 0: None, cap % 1: "0\n"}))  # MI300X: no excuse
    failure(amd.gpus[0].power_cap_w, "missing", "power1_cap")
    failure(amd.gpus[1].power_cap_w, "error", "PPT feature not enabled")


@pytest.mark.parametrize("value, expect", [("CPX\n", "CPX"), ("DPX\n", "DPX"), ("UNKNOWN\n", None), ("cpx\n", None)])
def test_compute_partition(tmp_path, value, expect):
    root = tree(tmp_path, gpus=1, extra={"sys/bus/pci/devices/0000:10:00.0/current_compute_partition": value})
    got = probe_sysfs.read(root).gpus[0].compute_partition
    assert got == expect if expect else failure(got, "error", "SPX/DPX/TPX/QPX/CPX")


def test_partitions_absent_on_a_gpu_that_has_none(tmp_path):
    base = "sys/bus/pci/devices/0000:10:00.0/"
    gpu = probe_sysfs.read(tree(tmp_path, gpus=1, drop=(base + "current_compute_partition",
                                                      base + "current_memory_partition"))).gpus[0]
    assert (gpu.compute_partition, gpu.memory_partition) == (None, None)


def test_unreadable_and_unknown_files_are_failures(tmp_path):
    base = "sys/bus/pci/devices/0000:10:00.0/"
    root = tree(tmp_path, gpus=1, extra={base + "current_link_speed": "Unknown\n", base + "pcie_replay_count": "-1\n",
                                         "sys/module/amdgpu/version": "6.16.13 (garbled)\n",
                                         "opt/rocm/.info/version": "seven\n"}, drop=(base + "vbios_version",))
    os.makedirs(os.path.join(root, base, "vbios_version/oops"))
    amd = probe_sysfs.read(root)
    failure(amd.gpus[0].pcie, "error", "the link is not up")
    failure(amd.gpus[0].pcie_replays, "error", "pcie_replay_count")
    failure(amd.gpus[0].vbios, "error", "not a regular file")
    failure(amd.amdgpu_version, "error", "expected a version")
    assert failure(amd.rocm_version, "error").source == "rocm"


def test_initstate_not_live_and_no_pci_sysfs(tmp_path):
    root = tree(tmp_path, gpus=1, extra={"sys/module/amdgpu/initstate": "coming\n"})
    failure(probe_sysfs.read(root).initstate, "error", "'coming', not 'live'")
    empty = str(tmp_path / "empty")
    os.makedirs(empty)
    amd = probe_sysfs.read(empty)
    failure(amd.pci_functions, "missing", "/sys/bus/pci/devices")
    assert amd.gpus == () and probe_sysfs.bus_to_gpu(amd) == {}


def test_only_instinct_classes_count(tmp_path):
    bus = "sys/bus/pci/devices/"
    extra = {}
    for bdf, vendor, device, cls in (("0000:02:00.0", "0x1a03", "0x2000", "0x030000"),  # the BMC's VGA (ASPEED)
                                     ("0000:03:00.0", "0x1002", "0x744c", "0x030000"),  # a Radeon (VGA)
                                     ("0000:10:00.1", "0x1002", "0x1640", "0x040300"),  # HD audio
                                     ("0000:0f:00.0", "0x1002", "0x14a1", "0x060400")):  # AMD PCIe switch
        extra.update({bus + bdf + "/vendor": vendor + "\n", bus + bdf + "/device": device + "\n",
                      bus + bdf + "/class": cls + "\n"})
    amd = probe_sysfs.read(tree(tmp_path, gpus=2, extra=extra))
    assert amd.pci_functions == 2 and [g.bdf for g in amd.gpus] == ["0000:10:00.0", "0000:11:00.0"]
    root = tree(tmp_path / "b", gpus=1, extra={bus + "0000:10:00.0/class": "display\n"})
    failure(probe_sysfs.read(root).pci_functions, "error", "PCI class")


def test_kfd_processes_and_topology(tmp_path):
    kfd = "sys/class/kfd/kfd/"
    topo = {kfd + "topology/nodes/0/gpu_id": "0\n", kfd + "topology/nodes/0/properties": "cpu_cores_count 64\n",
            kfd + "topology/nodes/1/gpu_id": "30381\n",
            kfd + "topology/nodes/1/properties": "simd_count 1216\nlocation_id %d\ndomain 0\n" % (0x11 << 8),
            kfd + "proc/1557458/vram_30381": "1610571776\n", kfd + "proc/1557458/pasid": "32769\n",
            kfd + "proc/99/pasid": "0\n"}
    amd = probe_sysfs.read(tree(tmp_path, gpus=2, extra=topo))
    assert amd.kfd_processes == (99, 1557458) and [g.processes for g in amd.gpus] == [(), (1557458,)]
    amd = probe_sysfs.read(tree(tmp_path / "b", gpus=2, extra=topo, drop=(kfd + "topology/nodes/1/properties",)))
    assert amd.kfd_processes == (99, 1557458)
    for gpu in amd.gpus:  # which GPU, unknown: never "none"
        failure(gpu.processes, "missing", "properties")
    amd = probe_sysfs.read(tree(tmp_path / "c", gpus=1, drop=(kfd + "proc/.x",)))
    failure(amd.kfd_processes, "missing", "absent while amdgpu is live")


def test_bad_pages_capture_parses(tmp_path):
    with open(BAD_PAGES_CAPTURE) as handle:
        text = handle.read()
    assert parse.parse_bad_pages(text) == (8, 0, 0)
    assert parse.parse_bad_page(text.splitlines()[0]) == (0x027f5d43, 0x1000, "R")
    root = tree(tmp_path, gpus=1, extra={"sys/bus/pci/devices/0000:10:00.0/ras/gpu_vram_bad_pages": text})
    assert probe_sysfs.read(root).gpus[0].bad_pages == (8, 0, 0)


# ----------------------------------------------------------- the parsers
counts = st.integers(min_value=0, max_value=2 ** 63)


@settings(max_examples=200)
@given(counts, counts, st.one_of(st.none(), counts))
def test_ras_count_roundtrip(ue, ce, de):
    text = "ue: %d\nce: %d\n" % (ue, ce) + ("de: %d\n" % de if de is not None else "")
    assert parse.parse_ras_count(text) == (ue, ce, de)


# Lines like the kernel's, and near misses: a key, a separator, a value.
near_lines = st.lists(st.tuples(st.sampled_from(("ue", "ce", "de", "UE", "0x1", "")), st.sampled_from((": ", ":", " : ", " ")),
                                st.sampled_from(("0", "7", "-1", "x", "", "0x00001000 : R", "18446744073709551615"))),
                      max_size=5).map(lambda ls: "\n".join("".join(t) for t in ls))


@settings(max_examples=400)
@given(st.one_of(st.text(max_size=80), near_lines))
def test_ras_and_bad_pages_never_guess(text):
    try:
        ue, ce, de = parse.parse_ras_count(text)
        assert "ue" in text and "ce" in text and ue >= 0 and ce >= 0 and (de is None or de >= 0)
    except ParseError:
        pass
    try:
        pages = parse.parse_bad_pages(text)
        assert sum(pages) == sum(1 for line in text.split("\n") if line.strip())
    except ParseError:
        pass


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(0, 2 ** 40), st.sampled_from((0x1000, 0x200000)), st.sampled_from("RPF")),
                max_size=40))
def test_bad_pages_roundtrip(pages):
    text = "".join("0x%08x : 0x%08x : %s\n" % page for page in pages)
    flags = [flag for _, _, flag in pages]
    assert parse.parse_bad_pages(text) == (flags.count("R"), flags.count("P"), flags.count("F"))


@given(st.sampled_from(sorted(parse.LINK_GENERATIONS.items())), st.booleans(), st.booleans())
def test_link_speed_forms(item, decimal, suffix):
    number, gen = item
    shown = number + ".0" if decimal and "." not in number else number
    assert parse.parse_link_speed("%s GT/s%s\n" % (shown, " PCIe" if suffix else "")) == gen


@settings(max_examples=300)
@given(st.text(max_size=30))
def test_link_text_is_a_generation_or_an_error(text):
    for function, valid in ((parse.parse_link_speed, range(1, 8)), (parse.parse_link_width, range(1, 33))):
        try:
            assert function(text) in valid
        except ParseError:
            pass


@settings(max_examples=300)
@given(st.text(max_size=40))
def test_versions_fru_and_hex_never_crash(text):
    for function in (lambda t: parse.parse_version(t, "v"), parse.fru_string, parse.parse_fw_version,
                     parse.parse_properties, lambda t: parse.parse_uint(t, "n")):
        try:
            function(text)
        except ParseError:
            pass


def test_location_bdf_ignores_partition_bits():
    bus = 0x9d << 8
    assert parse.location_bdf(0, bus) == parse.location_bdf(0, bus | 3) == parse.location_bdf(0, bus | 7 << 28) \
        == "0000:9d:00"
