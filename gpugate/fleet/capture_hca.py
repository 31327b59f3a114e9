"""`gpugate baseline capture`: the HCA part of a baseline, from one known-good
node's facts (JSON form): the firmware per HCA type, and the nodeset's
fabric (the most numerous HCA type; its rate and link layer from its ports
that are up: a port down on the reference node is not taken as the norm)."""

from typing import Dict, List, Mapping, Optional, Tuple

from gpugate.model.baseline_keys import VERSION_RE


def _hcas(facts: Mapping) -> List[Mapping]:
    hcas = facts.get("hcas")
    return [h for h in hcas if isinstance(h, Mapping)] if isinstance(hcas, list) else []


def firmware(facts: Mapping) -> Tuple[Dict[str, str], List[str]]:
    """(type -> firmware, why some type is left out)."""
    seen: Dict[str, set] = {}
    for hca in _hcas(facts):
        kind, fw = hca.get("hca_type"), hca.get("fw_ver")
        if isinstance(kind, str) and isinstance(fw, str):
            seen.setdefault(kind, set()).add(fw)
    pins, skipped = {}, []
    for kind, versions in sorted(seen.items()):
        if len(versions) == 1 and VERSION_RE.match(next(iter(versions))):
            pins[kind] = next(iter(versions))
        else:
            skipped.append("hca_firmware %s: not captured (%s)" % (kind, ", ".join(sorted(versions))))
    return pins, skipped


def _up(port) -> bool:
    return isinstance(port, Mapping) and (port.get("state"), port.get("phys_state")) == ("ACTIVE", "LinkUp")


def fabric(facts: Mapping) -> Optional[str]:
    """The nodeset's hca inline table as TOML, or None without HCAs."""
    groups: Dict[str, List[Mapping]] = {}
    for hca in _hcas(facts):
        if isinstance(hca.get("hca_type"), str):
            groups.setdefault(hca["hca_type"], []).append(hca)
    if not groups:
        return None
    kind, members = max(sorted(groups.items()), key=lambda item: len(item[1]))
    ports = [p for h in members for p in h.get("ports") or () if _up(p)]
    parts = ["count = %d" % len(members), 'types = ["%s"]' % kind]
    rates = {p.get("rate") for p in ports}
    if len(rates) == 1 and isinstance(next(iter(rates)), (int, float)):
        parts.append("rate = %g" % next(iter(rates)))
    layers = {p.get("link_layer") for p in ports}
    if layers in ({"InfiniBand"}, {"Ethernet"}):
        parts.append('link_layer = "%s"' % next(iter(layers)))
    return "{ %s }" % ", ".join(parts)
