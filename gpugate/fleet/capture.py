"""Baseline capture.  Pure: facts in, TOML text out.

``capture`` writes a baseline from one known-good node's facts (the runbook's
"populate the pins and the VBIOS from a known-good node").  The review of a
change (``diff``) is in review.py.
"""

import time
from typing import Dict, List, Mapping, Optional, Tuple

from gpugate.model.baseline_keys import PIN_COMPONENTS
from gpugate.errors import ConfigError
from gpugate.fleet.tomltext import _comment, _error, _stamp, _toml_str, _toml_value, _version_or_why

def _capture_pins(facts: Mapping) -> Tuple[Dict[str, str], Dict[str, str], Dict[str, str]]:
    """(pins, vbios per product, why each missing component is left out)."""
    pins: Dict[str, str] = {}
    skipped: Dict[str, str] = {}

    def take(component, value):
        version, why = _version_or_why(value)
        if version is None:
            skipped[component] = why
        else:
            pins[component] = version

    take("kernel", facts.get("kernel_release"))
    nvml = facts.get("nvml")
    nvml_why = _error(nvml)
    gpus: List[Mapping] = []
    if nvml_why or not isinstance(nvml, Mapping):
        for component in ("driver", "cuda_driver", "gsp_firmware", "vbios"):
            skipped[component] = nvml_why or "NVML unreadable"
    else:
        take("driver", nvml.get("driver_version"))
        take("cuda_driver", nvml.get("cuda_driver_version"))
        gpus = [g for g in nvml.get("gpus") or () if isinstance(g, Mapping)]
        _capture_gsp(gpus, pins, skipped)

    packages = facts.get("packages")
    packages_why = _error(packages)
    for role in ("fabricmanager", "container_toolkit"):
        if packages_why or not isinstance(packages, Mapping):
            skipped[role] = "packages: %s" % (packages_why or "unreadable")
            continue
        pkg = packages.get(role)
        if pkg is None:
            skipped[role] = "not installed"
        elif _error(pkg):
            skipped[role] = _error(pkg)
        else:
            take(role, pkg.get("version") if isinstance(pkg, Mapping) else None)
    take("dcgm", facts.get("dcgm_version"))
    image = facts.get("image")
    if _error(image):
        skipped["image"] = "/etc/cluster-image.json: %s" % _error(image) if image is None else _error(image)
    elif not isinstance(image, Mapping) or image.get("version") is None:
        skipped["image"] = "the image record has no version"
    else:
        take("image", image.get("version"))

    fm, driver = pins.get("fabricmanager"), pins.get("driver")
    if fm and driver and fm != driver:
        raise ConfigError("%s: fabricmanager %s differs from driver %s (Fabric Manager only runs with the "
                          "driver of the same version): not a good reference node"
                          % (facts.get("node") or "node", fm, driver))
    vbios = _capture_vbios(facts, gpus, skipped) if gpus else {}
    return pins, vbios, skipped


def _capture_gsp(gpus, pins, skipped) -> None:
    values = {}
    for gpu in gpus:
        value = gpu.get("gsp_firmware")
        if value is None:
            continue  # this GPU has no GSP
        if _error(value):
            skipped["gsp_firmware"] = "gpu%s: %s" % (gpu.get("index"), _error(value))
            return
        values.setdefault(str(value), []).append(gpu.get("index"))
    if len(values) > 1:
        raise ConfigError("GPUs disagree on the GSP firmware (%s): not a good reference node"
                          % "; ".join("gpu%s=%s" % (",".join(map(str, idx)), v) for v, idx in sorted(values.items())))
    if not values:
        skipped["gsp_firmware"] = "no GPU reports GSP firmware"
        return
    (gsp,) = values
    if gsp == pins.get("driver"):
        skipped["gsp_firmware"] = "equals the driver (the default)"
        return
    version, why = _version_or_why(gsp)
    if version is None:
        skipped["gsp_firmware"] = why
    else:
        pins["gsp_firmware"] = version


def _capture_vbios(facts, gpus, skipped) -> Dict[str, str]:
    per_product: Dict[str, Dict[str, List[int]]] = {}
    problems = []
    for gpu in gpus:
        name, vbios = gpu.get("name"), gpu.get("vbios")
        if not isinstance(name, str):
            problems.append("gpu%s: product %s" % (gpu.get("index"), _error(name) or "unreadable"))
            continue
        version, why = _version_or_why(vbios)
        if version is None:
            problems.append("gpu%s: %s" % (gpu.get("index"), why))
            continue
        per_product.setdefault(name, {}).setdefault(version, []).append(gpu.get("index"))
    disagree = {p: v for p, v in per_product.items() if len(v) > 1}
    if disagree:
        detail = "; ".join(
            "%s: %s" % (product, ", ".join("gpu%s=%s" % (",".join(map(str, idx)), ver)
                                           for ver, idx in sorted(versions.items())))
            for product, versions in sorted(disagree.items()))
        raise ConfigError("%s: GPUs of one product disagree on the VBIOS (%s): not a good reference node"
                          % (facts.get("node") or "node", detail))
    if problems:
        skipped["vbios"] = "; ".join(problems)
    return {product: next(iter(versions)) for product, versions in sorted(per_product.items())}


def _capture_shape(facts: Mapping) -> Tuple[Dict[str, object], Dict[str, str]]:
    """The [nodes."<node>"] section: what this node looks like."""
    shape: Dict[str, object] = {}
    skipped: Dict[str, str] = {}
    nvml = facts.get("nvml")
    if _error(nvml) or not isinstance(nvml, Mapping):
        for key in ("gpus", "product", "mig", "persistence") + _SETTINGS:
            skipped[key] = _error(nvml) or "NVML unreadable"
    else:
        gpus = [g for g in nvml.get("gpus") or () if isinstance(g, Mapping)]
        count = nvml.get("gpu_count")
        if isinstance(count, int) and not isinstance(count, bool) and 0 <= count <= 64:
            shape["gpus"] = count
        elif isinstance(count, int) and not isinstance(count, bool):
            skipped["gpus"] = "%d GPUs: a baseline allows 0 to 64" % count
        else:
            skipped["gpus"] = _error(count) or "no GPU count"
        names = {g.get("name") for g in gpus}
        if not gpus:
            skipped["product"] = "no GPUs"
        elif not all(isinstance(n, str) for n in names):
            skipped["product"] = "a GPU's product is unreadable"
        elif len(names) > 1:
            skipped["product"] = "mixed products: %s" % ", ".join(sorted(names))
        else:
            shape["product"] = next(iter(names))
        mig = [g.get("mig_enabled") for g in gpus]
        if any(m is True for m in mig):
            shape["mig"] = True
        elif mig and all(isinstance(m, bool) for m in mig):
            shape["mig"] = False
        else:
            skipped["mig"] = "unsupported or unreadable" if gpus else "no GPUs"
        persistence = [g.get("persistence_mode") for g in gpus]
        if persistence and all(isinstance(p, bool) for p in persistence):
            shape["persistence"] = all(persistence)
        else:
            skipped["persistence"] = "unreadable" if gpus else "no GPUs"
        _capture_settings(gpus, shape, skipped)
    switches = facts.get("pci_nvswitches")
    if isinstance(switches, int) and not isinstance(switches, bool):
        shape["nvswitch"] = switches > 0
    else:
        skipped["nvswitch"] = "lspci: %s" % (_error(switches) or "unreadable")
    order = ("gpus", "product", "nvswitch", "mig", "persistence") + _SETTINGS
    return {k: shape[k] for k in order if k in shape}, skipped


_SETTINGS = ("ecc", "compute_mode", "power_limit_watts")


def _capture_settings(gpus, shape, skipped) -> None:
    """ECC, compute mode and power limit, when every GPU reads the same."""
    from gpugate.model.baseline_schema import COMPUTE_MODES
    from gpugate.judges.settings import COMPUTE_MODE_NAMES

    modes = [COMPUTE_MODE_NAMES.get(g.get("compute_mode")) for g in gpus]
    limits = [g.get("power_limit_mw") for g in gpus]
    for key, values, ok in (
            ("ecc", [g.get("ecc_enabled") for g in gpus], lambda v: isinstance(v, bool)),
            ("compute_mode", modes, lambda v: v in COMPUTE_MODES),
            ("power_limit_watts", [round(v / 1000) if isinstance(v, int) else None for v in limits],
             lambda v: isinstance(v, int) and v > 0)):
        if not gpus:
            skipped[key] = "no GPUs"
        elif not all(ok(v) for v in values):
            skipped[key] = "unsupported or unreadable on a GPU"
        elif len(set(values)) > 1:
            skipped[key] = "the GPUs differ: %s" % ", ".join(str(v) for v in values)
        else:
            shape[key] = values[0]


def probe_baseline(current=None, node: Optional[str] = None, root: Optional[str] = None):
    """A baseline that only decides what the probes read, for reading a
    node's facts (capture; `gpugate facts` before any baseline exists): the
    site's when it loaded and names the node, else an empty one; DCGM asked
    either way (its version is a fact, and the probes ask it only when
    pinned).  A node no section names is read as the vendor its PCI bus
    shows (AMD Instinct functions and no NVIDIA GPU: AMD's probes).  Never
    for judging."""
    from gpugate.model.baseline import parse_baseline
    from gpugate.core.record import replace

    if node and root and (current is None or not current.covers(node)) and _amd_bus(root):
        return parse_baseline({"pin": {}, "nodes": {node: {"vendor": "amd"}}}, "(facts only: an AMD node)")
    current = current or parse_baseline({"pin": {"driver": "0"}}, "(facts only: no baseline)")
    return current if current.pin.dcgm is not None else current.with_pin(replace(current.pin, dcgm="0"))


def _amd_bus(root: str) -> bool:
    from gpugate.vendors.amd.probe_sysfs import pci_functions
    from gpugate.probes.files import pci_counts

    amd, nvidia = pci_functions(root), pci_counts(root)
    return isinstance(amd, list) and bool(amd) and not (isinstance(nvidia, tuple) and nvidia[0])


def capture(node: str, facts: Mapping, name: str, now: Optional[float] = None, nodes: Optional[str] = None) -> str:
    """TOML text of a baseline built from one known-good node's facts; its
    [nodes."..."] section is keyed by ``nodes`` (a hostlist, see
    section_key) when given, else by the node alone.

    Raises ConfigError when the node cannot be a reference (GPUs of one
    product on different VBIOS or GSP firmware, Fabric Manager on another
    version than the driver)."""
    if isinstance(facts.get("amd"), Mapping):  # an AMD node (gpugate.vendors.amd.capture)
        from gpugate.vendors.amd.capture import capture_amd

        text = capture_amd(node, facts, name, now, section=nodes or node)
        _self_check(text, node)
        return text
    pins, vbios, skipped = _capture_pins(facts)
    shape, shape_skipped = _capture_shape(facts)
    if "driver" not in pins:
        raise ConfigError("%s: no driver version to pin (%s): a baseline needs pin.driver"
                          % (node, skipped.get("driver", "not collected")))
    collected = facts.get("collected_at")
    lines = [
        "# gpugate baseline captured from node %s by `gpugate baseline capture`." % node,
        "# Facts collected %s (mode %s); written %s."
        % (_stamp(collected) if collected is not None else "at an unknown time", facts.get("mode") or "?",
           _stamp(time.time() if now is None else now)),
        "# Review it, keep it in git, and run `gpugate baseline diff OLD NEW` before pushing it.",
        "",
        "name = %s" % _toml_str(name),
        "",
        "[pin]",
    ]
    for component in PIN_COMPONENTS:
        if component in pins:
            lines.append("%s = %s" % (component, _toml_str(pins[component])))
        elif component in skipped:
            if component == "gsp_firmware" and skipped[component].startswith("equals the driver"):
                lines.append(_comment("gsp_firmware: not pinned (equals the driver, the default)"))
            else:
                lines.append(_comment("%s: not captured (%s)" % (component, skipped[component])))
        else:
            lines.append(_comment("%s: not captured" % component))
    lines += ["", "[pin.vbios]"]
    for product, version in vbios.items():
        lines.append("%s = %s" % (_toml_str(product), _toml_str(version)))
    if "vbios" in skipped:
        lines.append(_comment("vbios: not captured (%s)" % skipped["vbios"]))
    elif not vbios:
        lines.append(_comment("vbios: not captured (no GPUs)"))
    from gpugate.fleet import capture_hca

    hca_pins, hca_skipped = capture_hca.firmware(facts)
    if hca_pins or hca_skipped:
        lines += ["", "[pin.hca_firmware]"] + ["%s = %s" % (_toml_str(k), _toml_str(v)) for k, v in hca_pins.items()]
        lines += [_comment(why) for why in hca_skipped]
    lines += ["", "[nodes.%s]" % _toml_str(nodes or node)]
    for key, value in shape.items():
        lines.append("%s = %s" % (key, _toml_value(value)))
    hca_table = capture_hca.fabric(facts)
    if hca_table:
        lines.append("hca = %s" % hca_table)
    for key, why in shape_skipped.items():
        lines.append(_comment("%s: not captured (%s)" % (key, why)))
    lines += ["",
              "# No [health] section: the default health policy applies",
              "# (see slurm_conf/baseline.example.toml for every key).", ""]
    text = "\n".join(lines)
    _self_check(text, node)
    return text


def _self_check(text: str, node: str) -> None:
    """What we write must load: a capture that gpugate would refuse is an error here, not on the fleet."""
    from gpugate.model.baseline import parse_baseline
    from gpugate.model.schema import parse_toml_bytes
    where = "captured baseline from %s" % node
    try:
        data = parse_toml_bytes(text.encode("utf-8"), where)
    except ConfigError as exc:
        raise ConfigError("%s; please report it" % exc) from None
    parse_baseline(data, where)
