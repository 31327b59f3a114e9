"""Simulated HCAs and IMEX: the /sys/class/infiniband tree of a simulated
node (built from a real sysfs capture, gpugate/data/sim-infiniband-*.json)
and what its nvidia-imex-ctl prints.  Only nodes whose nodeset names an
[hca] table or imex = true get them."""

import json
import os
import shutil
from typing import Any, Dict, List, Optional

from gpugate.errors import ConfigError

_DATA = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "sim-infiniband-h100-ndr400.json")
CLASS_DIR = "sys/class/infiniband"
STATES = {"ACTIVE": ("4: ACTIVE", "5: LinkUp"), "DOWN": ("1: DOWN", "3: Disabled"),
          "POLLING": ("1: DOWN", "2: Polling"), "INIT": ("2: INIT", "5: LinkUp")}
# sysfs's text for a rate at 4X width (drivers/infiniband/core/sysfs.c prints "<Gb/s> Gb/sec (<width> <speed>)").
_SPEED = {800: "XDR", 400: "NDR", 200: "HDR", 100: "EDR", 56: "FDR", 40: "QDR"}


def rate_text(gbps: float) -> str:
    return "%g Gb/sec (4X %s)" % (gbps, _SPEED.get(int(gbps), "NDR"))


def new_hcas(expect, pin) -> Optional[List[Dict[str, Any]]]:
    want = expect.hca
    if not want:
        return None
    with open(_DATA) as handle:
        hcas = json.load(handle)["hcas"]
    types = want.get("types")
    fabric = [h for h in hcas if not types or h["hca_type"] in types]
    if want.get("count") is not None:
        for extra in fabric[want["count"]:]:
            hcas.remove(extra)
        fabric = fabric[:want["count"]]
    for hca in hcas:
        hca["fw_ver"] = pin.hca_firmware.get(hca["hca_type"], hca["fw_ver"])
    for hca in fabric:
        for port in hca["ports"]:
            if want.get("rate") is not None:
                port["rate"] = rate_text(want["rate"])
            if want.get("link_layer"):
                port["link_layer"] = want["link_layer"]
    return hcas


def converge(model: Dict[str, Any], pin) -> None:
    """The converge flashes the pinned HCA firmware (mlxfwmanager); link faults stay."""
    for hca in model.get("ib") or ():
        hca["fw_ver"] = pin.hca_firmware.get(hca["hca_type"], hca["fw_ver"])


def new_imex(node: str, expect) -> Optional[Dict[str, Any]]:
    if not expect.imex:
        return None
    return {"installed": True, "service": "READY", "domain": "UP", "nodes": [[node, "READY"]]}


def render_sysfs(root: str, hcas: Optional[List[Dict[str, Any]]], write) -> None:
    directory = os.path.join(root, CLASS_DIR)
    names = {h["name"] for h in hcas or ()}
    if os.path.isdir(directory):
        for gone in set(os.listdir(directory)) - names:
            shutil.rmtree(os.path.join(directory, gone), ignore_errors=True)
    for hca in hcas or ():
        base = os.path.join(directory, hca["name"])
        files = {"hca_type": hca["hca_type"], "fw_ver": hca["fw_ver"], "board_id": hca["board_id"]}
        for port in hca["ports"]:
            where = "ports/%d/" % port["port"]
            for key in ("state", "phys_state", "rate", "link_layer"):
                files[where + key] = port[key]
            for name, value in port["counters"].items():
                files[where + "counters/" + name] = str(value)
        for rel, text in files.items():
            path = os.path.join(base, rel)
            try:
                with open(path) as handle:
                    if handle.read() == text + "\n":
                        continue
            except OSError:
                pass
            write(path, text + "\n")


def imex_replays(imex: Optional[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """nvidia-imex-ctl -q and -N in the formats of a real IMEX 570 capture."""
    if not imex:
        return {}
    lines = ["Connectivity Table Legend:", "C - Connected - Ready for operation", "", "Nodes:"]
    lines += ["Node #%d   - %s   - %s" % (i, addr, state) for i, (addr, state) in enumerate(imex["nodes"])]
    lines += ["", "Domain State: %s" % imex["domain"]]
    return {"nvidia-imex-ctl -q": {"stdout": imex["service"] + "\n", "rc": 0},
            "nvidia-imex-ctl -N": {"stdout": "\n".join(lines) + "\n", "rc": 0}}


def _hca(model: Dict[str, Any], name: str) -> Dict[str, Any]:
    for hca in model.get("ib") or ():
        if hca["name"] == name:
            return hca
    names = ", ".join(h["name"] for h in model.get("ib") or ()) or "none (its nodeset has no [hca] table)"
    raise ConfigError("node %s has no HCA %r; its HCAs: %s" % (model["node"], name, names))


def set_key(model: Dict[str, Any], key: str, value: str) -> None:
    """ib.<dev>.state=ACTIVE|DOWN|POLLING|INIT, ib.<dev>.rate=<Gb/s>,
    ib.<dev>.link_layer=..., ib.<dev>.fw=..., ib.<dev>.gone=1,
    ib.<dev>.counter.<name>=<n>|+<n>; imex.service=..., imex.domain=...,
    imex.peer.<address>=<STATE>, imex.installed=0|1."""
    from gpugate.sim.values import parse_flag as _flag, parse_int as _int

    parts = key.split(".")
    if parts[0] == "imex":
        imex = model.get("imex")
        if imex is None:
            raise ConfigError("node %s is not an IMEX member (its nodeset has no imex = true)" % model["node"])
        if parts[1] == "installed":
            imex["installed"] = bool(_flag(value))
        elif parts[1] == "peer":
            address = ".".join(parts[2:])
            imex["nodes"] = [n for n in imex["nodes"] if n[0] != address] + [[address, value.upper()]]
        else:
            imex[parts[1]] = value.upper()
        return
    hca = _hca(model, parts[1])
    port = hca["ports"][0]
    field = parts[2]
    if field == "state":
        if value.upper() not in STATES:
            raise ConfigError("expected one of %s, got %r" % (", ".join(STATES), value))
        port["state"], port["phys_state"] = STATES[value.upper()]
    elif field == "rate":
        port["rate"] = rate_text(float(_int(value)))
    elif field == "link_layer":
        port["link_layer"] = value
    elif field == "fw":
        hca["fw_ver"] = value
    elif field == "gone":
        if _flag(value):
            model["ib"].remove(hca)
    else:  # counter.<name>
        name = ".".join(parts[3:])
        old = port["counters"].get(name, 0)
        port["counters"][name] = old + _int(value[1:]) if value.startswith("+") else _int(value)


KEYS = ("ib.<dev>.state", "ib.<dev>.rate", "ib.<dev>.link_layer", "ib.<dev>.fw", "ib.<dev>.gone",
        "ib.<dev>.counter.<name>", "imex.service", "imex.domain", "imex.peer.<address>", "imex.installed")


def known(key: str) -> bool:
    parts = key.split(".")
    if parts[0] == "imex":
        return len(parts) == 2 and parts[1] in ("service", "domain", "installed") or \
            len(parts) >= 3 and parts[1] == "peer"
    return (parts[0] == "ib" and len(parts) >= 3 and bool(parts[1])
            and (len(parts) == 3 and parts[2] in ("state", "rate", "link_layer", "fw", "gone")
                 or len(parts) == 4 and parts[2] == "counter" and parts[3].replace("_", "").isalnum()))
