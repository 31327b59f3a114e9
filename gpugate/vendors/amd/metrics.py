"""An AMD node's pinned components for the textfile metrics
(gpugate.node.metrics.component_states): kernel and image as on NVIDIA
nodes, amdgpu, ROCm and amd-smi, and VBIOS and IFWI per product.  Pure."""

from gpugate.model.facts import failed, unchecked

MATCHES, DIFFERS, UNREADABLE, UNCHECKED = "matches", "differs", "unreadable", "unchecked"


def _value_state(value) -> str:
    if isinstance(value, str):
        return MATCHES
    return UNCHECKED if unchecked(value) else UNREADABLE


def _gpu_state(amd, read, pins) -> str:
    """Every bound GPU of a pinned product must have a value; none pinned: unchecked."""
    gpus = [g for g in amd.gpus if g.bound]
    if not gpus:
        return UNREADABLE
    compared = [g for g in gpus if isinstance(g.product, str) and g.product in pins]
    if not compared:
        return UNCHECKED
    states = {_value_state(read(g)) for g in compared}
    return UNREADABLE if UNREADABLE in states else UNCHECKED if UNCHECKED in states else MATCHES


def amd_component_states(verdict, facts, baseline, expect=None) -> dict:
    pin, amd = baseline.pin, facts.amd
    whole = failed(amd)
    states = {"kernel": MATCHES if isinstance(facts.kernel_release, str) else UNREADABLE,
              "image": MATCHES if isinstance(facts.image, dict) and isinstance(facts.image_version, str) else UNREADABLE}
    for component, field in (("amdgpu", "amdgpu_version"), ("rocm", "rocm_version"), ("amd_smi", "amd_smi_version")):
        states[component] = UNREADABLE if whole else _value_state(getattr(amd, field))
    states["vbios"] = UNREADABLE if whole else _gpu_state(amd, lambda g: g.vbios, pin.vbios)
    states["ifwi"] = UNREADABLE if whole else _gpu_state(amd, lambda g: g.ifwi, pin.ifwi)
    differs = {f.component for f in list(verdict.findings) + list(verdict.notes) if f.cls in ("drift", "pending")}
    unknown = {f.component for f in verdict.findings if f.cls == "probe"}
    pinned = [c for c in ("kernel", "image", "amdgpu", "rocm", "amd_smi") if pin.get(c) is not None]
    pinned += [c for c in ("vbios", "ifwi") if getattr(pin, c)]
    out = {}
    for c in pinned:
        state = UNREADABLE if c in unknown else states[c]
        out[c] = DIFFERS if state == MATCHES and c in differs else state
    return out
