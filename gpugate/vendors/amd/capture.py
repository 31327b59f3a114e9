"""Baseline capture from a known-good AMD Instinct node (`gpugate baseline
capture --node mi001`): the pins (kernel, image, amdgpu, ROCm, amd-smi),
VBIOS and IFWI per product, and the node's nodeset (vendor = "amd", GPU
count, product, device id, partitions, power cap).  Pure: facts in, TOML
text out; what could not be read is a comment saying why, never a guess."""

import time
from typing import Dict, List, Mapping, Optional, Tuple

from gpugate.errors import ConfigError
from gpugate.fleet.tomltext import _comment, _error, _stamp, _toml_str, _toml_value, _version_or_why

_PINS = (("kernel", None), ("image", None), ("amdgpu", "amdgpu_version"), ("rocm", "rocm_version"),
         ("amd_smi", "amd_smi_version"))
_SHAPE = ("vendor", "gpus", "product", "device_id", "compute_partition", "memory_partition", "power_limit_watts")


def _pins(facts: Mapping, amd: Mapping) -> Tuple[Dict[str, str], Dict[str, str]]:
    pins, skipped = {}, {}
    image = facts.get("image")
    sources = {"kernel": facts.get("kernel_release"),
               "image": image.get("version") if isinstance(image, Mapping) and "error" not in image else image}
    for component, key in _PINS:
        value = amd.get(key) if key else sources[component]
        version, why = _version_or_why(value)
        if version is None:
            skipped[component] = why if component != "image" or image is not None else \
                "/etc/cluster-image.json: not collected"
        else:
            pins[component] = version
    return pins, skipped


def _per_product(node: str, gpus: List[Mapping], key: str, skipped: Dict[str, str]) -> Dict[str, str]:
    """VBIOS or IFWI per product: every GPU of a product on one version, or
    the node is no reference."""
    seen: Dict[str, Dict[str, List[int]]] = {}
    problems = []
    for gpu in gpus:
        product = gpu.get("product")
        if not isinstance(product, str) or not product:
            problems.append("gpu%s: product %s" % (gpu.get("index"), _error(product) or "unreadable (FRU empty)"))
            continue
        version, why = _version_or_why(gpu.get(key))
        if version is None:
            problems.append("gpu%s: %s" % (gpu.get("index"), why))
            continue
        seen.setdefault(product, {}).setdefault(version, []).append(gpu.get("index"))
    for product, versions in seen.items():
        if len(versions) > 1:
            raise ConfigError("%s: GPUs of %s disagree on the %s (%s): not a good reference node" % (
                node, product, key.upper(), ", ".join("gpu%s=%s" % (",".join(map(str, idx)), v)
                                                        for v, idx in sorted(versions.items()))))
    if problems:
        skipped[key] = "; ".join(problems)
    return {product: next(iter(versions)) for product, versions in sorted(seen.items())}


def _shape(amd: Mapping, gpus: List[Mapping]) -> Tuple[Dict[str, object], Dict[str, str]]:
    shape: Dict[str, object] = {"vendor": "amd"}
    skipped: Dict[str, str] = {}
    shape["gpus"] = len(gpus)
    functions = amd.get("pci_functions")
    if isinstance(functions, int) and functions != len(gpus):
        skipped["gpus"] = "%d GPUs on the bus, %d driven by amdgpu: not a good reference node" % (functions, len(gpus))
        del shape["gpus"]
    for key, field, ok in (("product", "product", lambda v: isinstance(v, str) and v),
                           ("device_id", "device_id", lambda v: isinstance(v, str) and v.startswith("0x")),
                           ("compute_partition", "compute_partition", lambda v: isinstance(v, str)),
                           ("memory_partition", "memory_partition", lambda v: isinstance(v, str)),
                           ("power_limit_watts", "power_cap_w", lambda v: isinstance(v, (int, float)) and v > 0)):
        values = [g.get(field) for g in gpus]
        if key == "power_limit_watts":
            values = [round(v) if isinstance(v, (int, float)) else v for v in values]
        if not gpus:
            skipped[key] = "no GPUs"
        elif not all(ok(v) for v in values):
            skipped[key] = "not supported or unreadable on a GPU"
        elif len(set(values)) > 1:
            skipped[key] = "the GPUs differ: %s" % ", ".join(str(v) for v in values)
        else:
            shape[key] = values[0]
    return shape, skipped


def capture_amd(node: str, facts: Mapping, name: str, now: Optional[float] = None,
                section: Optional[str] = None) -> str:
    amd = facts["amd"]
    if "error" in amd:
        raise ConfigError("%s: the AMD facts could not be read (%s): not a good reference node" % (node, _error(amd)))
    if amd.get("initstate") != "live":
        raise ConfigError("%s: amdgpu is not loaded (%s): not a good reference node"
                          % (node, _error(amd.get("initstate")) or amd.get("initstate")))
    gpus = [g for g in amd.get("gpus") or () if isinstance(g, Mapping) and g.get("bound")]
    pins, skipped = _pins(facts, amd)
    vbios = _per_product(node, gpus, "vbios", skipped)
    ifwi = _per_product(node, gpus, "ifwi", skipped)
    shape, shape_skipped = _shape(amd, gpus)
    collected = facts.get("collected_at")
    lines = [
        "# gpugate baseline captured from AMD node %s by `gpugate baseline capture`." % node,
        "# Facts collected %s (mode %s); written %s." % (
            _stamp(collected) if collected is not None else "at an unknown time", facts.get("mode") or "?",
            _stamp(time.time() if now is None else now)),
        "# Review it, keep it in git, and run `gpugate baseline diff OLD NEW` before pushing it.",
        "", "name = %s" % _toml_str(name), "", "[pin]"]
    for component, _ in _PINS:
        if component in pins:
            lines.append("%s = %s" % (component, _toml_str(pins[component])))
        else:
            lines.append(_comment("%s: not captured (%s)" % (component, skipped.get(component, "not collected"))))
    for table, values, key in (("vbios", vbios, "vbios"), ("ifwi", ifwi, "ifwi")):
        lines += ["", "[pin.%s]" % table] + ["%s = %s" % (_toml_str(p), _toml_str(v)) for p, v in values.items()]
        if key in skipped:
            lines.append(_comment("%s: not captured (%s)" % (key, skipped[key])))
    lines += ["", "[nodes.%s]" % _toml_str(section or node)]
    lines += ["%s = %s" % (k, _toml_value(shape[k])) for k in _SHAPE if k in shape]
    lines += [_comment("%s: not captured (%s)" % (k, why)) for k, why in shape_skipped.items()]
    lines += ["", "# No [health] section: the default health policy applies",
              "# (see slurm_conf/baseline.mixed.example.toml for the AMD keys).", ""]
    return "\n".join(lines)
