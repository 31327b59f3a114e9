"""What a user of gpugate sees, gathered from the running code: every
command's --help and options, the entry points, every key of baseline.toml
and gpugate.toml, the drain reason's grammar (real findings of simulated
faults, rendered and parsed back) and the gpugate_* metric names.

tests/test_user_surface.py compares it with the snapshot in
tests/fixtures/user_surface/.  After a deliberate change to what users see,
record the snapshot again and review its diff:

    python3 tests/user_surface.py

Nothing here names a module path: code can move between packages and the
snapshot stays the same."""

import ast
import configparser
import importlib
import json
import os
import subprocess
import sys
import tempfile
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import click  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from gpugate.model import findings as findings_mod  # noqa: E402
from gpugate.model import reason as reason_mod  # noqa: E402
from gpugate.model.baseline_keys import PIN_COMPONENTS  # noqa: E402
from gpugate.model.baseline_schema import BASELINE  # noqa: E402
from gpugate.budget.rules import Use  # noqa: E402
from gpugate.cli.main import main as cli_main  # noqa: E402
from gpugate.model.config import _CONFIG  # noqa: E402
from gpugate.model.findings import Finding  # noqa: E402
from gpugate.fleet.metrics import fleet_families, keeper_families  # noqa: E402
from gpugate.node.metrics import clock_families, kernel_log_families  # noqa: E402
from gpugate.core.promtext import render as prom_render  # noqa: E402
from gpugate.model.schema import REQUIRED, AnyOf, ListOf, MapOf, Removed, Table  # noqa: E402
from gpugate.slurm import pending as pending_mod  # noqa: E402

SNAPSHOT = os.path.join(ROOT, "tests", "fixtures", "user_surface")
RECORD = "python3 tests/user_surface.py"
WIDTH = 80
DEMO_BASELINE = os.path.join(ROOT, "gpugate", "data", "demo-baseline.toml")
MIXED_BASELINE = os.path.join(ROOT, "slurm_conf", "baseline.mixed.example.toml")
SLURM_SCRIPTS = ("healthcheck/gpugate-healthcheck", "prolog/gpugate-prolog", "epilog/gpugate-epilog")


# -- the CLI ---------------------------------------------------------------

def command_paths(command=cli_main, path=()):
    """(path, command) for the group and every command under it."""
    yield path, command
    if isinstance(command, click.Group):
        for name in sorted(command.commands):
            yield from command_paths(command.commands[name], path + (name,))


def help_text(path) -> str:
    """`gpugate PATH --help` as a terminal 80 columns wide shows it."""
    result = CliRunner().invoke(cli_main, list(path) + ["--help"], prog_name="gpugate", terminal_width=WIDTH,
                                catch_exceptions=False)
    if result.exit_code != 0:
        raise AssertionError("gpugate %s --help exited %d: %s" % (" ".join(path), result.exit_code, result.output))
    # click 8.5 shows a group that runs without a subcommand as "[COMMAND]";
    # before, "COMMAND" (commands.json says which groups do).
    return result.output.replace(" [OPTIONS] [COMMAND] [ARGS]...", " [OPTIONS] COMMAND [ARGS]...")


def help_tree() -> str:
    parts = []
    for path, _ in command_paths():
        parts.append("=== gpugate%s --help ===\n%s" % ("".join(" " + p for p in path), help_text(path)))
    return "\n".join(parts)


def _default(param):
    value = param.default
    if type(value).__name__ == "Sentinel":  # click >= 8.3 says UNSET where older ones said None
        value = None
    if getattr(param, "is_flag", False) and value is None:
        return False  # click 8.5 leaves a flag's default None; before, False: the same to a user
    if callable(value):
        return "(computed)"
    return value if value is None or isinstance(value, (bool, int, float, str)) else repr(value)


def commands() -> dict:
    """Every command's options and arguments, hidden ones included."""
    out = {}
    for path, command in command_paths():
        params = []
        for p in command.params:
            params.append({"name": p.name, "kind": type(p).__name__, "opts": list(p.opts),
                           "secondary_opts": list(p.secondary_opts), "type": str(p.type.name),
                           "choices": list(getattr(p.type, "choices", ()) or ()), "required": p.required,
                           "nargs": p.nargs, "multiple": p.multiple,
                           "is_flag": bool(getattr(p, "is_flag", False)), "hidden": bool(getattr(p, "hidden", False)),
                           "envvar": p.envvar, "default": _default(p)})
        group = isinstance(command, click.Group)
        out[" ".join(("gpugate",) + path)] = {
            "group": group, "hidden": command.hidden, "params": params,
            "invoke_without_command": command.invoke_without_command if group else None}
    return out


# -- entry points ------------------------------------------------------------

def _setup_cfg():
    parser = configparser.ConfigParser()
    parser.read(os.path.join(ROOT, "setup.cfg"))
    return parser


def console_scripts() -> dict:
    """name -> the target's callable name (its module is left out: it moves)."""
    text = _setup_cfg().get("options.entry_points", "console_scripts", fallback="")
    out = {}
    for line in text.strip().splitlines():
        name, _, target = (s.strip() for s in line.partition("="))
        out[name] = target.rpartition(":")[2]
    return out


def resolve_console_script(name: str):
    text = _setup_cfg().get("options.entry_points", "console_scripts", fallback="")
    for line in text.strip().splitlines():
        left, _, target = (s.strip() for s in line.partition("="))
        if left == name:
            module, _, attr = target.partition(":")
            return getattr(importlib.import_module(module), attr)
    raise KeyError(name)


def other_entry_points() -> dict:
    """Entry point groups other than console_scripts (none today, and the
    snapshot says so)."""
    parser = _setup_cfg()
    if not parser.has_section("options.entry_points"):
        return {}
    return {group: sorted(l.partition("=")[0].strip() for l in text.strip().splitlines())
            for group, text in parser.items("options.entry_points") if group != "console_scripts"}


def scripts() -> list:
    return [line.strip() for line in _setup_cfg().get("options", "scripts").strip().splitlines()]


def run_script(script: str, args, env=None) -> subprocess.CompletedProcess:
    """An installed Slurm script as its launcher runs it (python3 -I), with
    this tree's gpugate first on sys.path (-I ignores PYTHONPATH)."""
    code = ("import sys; sys.path.insert(0, %r); sys.argv = [%r] + %r; "
            "exec(compile(open(%r).read(), %r, 'exec'), {'__name__': '__main__'})"
            % (ROOT, script, list(args), script, script))
    return subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=120,
                          env=env if env is not None else {}, cwd=ROOT)


def entry_points() -> dict:
    out = {"console_scripts": console_scripts(), "other_groups": other_entry_points(), "scripts": {}}
    for script in scripts():
        result = run_script(os.path.join(ROOT, script), ["--help"])
        out["scripts"][os.path.basename(script)] = {"exit": result.returncode, "help": result.stdout.splitlines()}
    return out


# -- configuration keys ------------------------------------------------------

def _default_text(default) -> str:
    if default is REQUIRED:
        return "required"
    value = default() if callable(default) else default
    return json.dumps(value, sort_keys=True, default=list)


def walk_spec(spec, path: str):
    """(key path, what is allowed) for a spec and everything under it."""
    if isinstance(spec, Table):
        for name, (sub, default) in spec.fields.items():
            sub_path = "%s.%s" % (path, name) if path else name
            allowed = ("removed: " if isinstance(sub, Removed) else "") + sub.allowed
            yield sub_path, "%s; default: %s" % (allowed, _default_text(default))
            yield from walk_spec(sub, sub_path)
    elif isinstance(spec, MapOf):
        yield "%s.<key>" % path, spec.value.allowed
        yield from walk_spec(spec.value, "%s.<key>" % path)
    elif isinstance(spec, ListOf):
        yield from walk_spec(spec.item, "%s[]" % path)
    elif isinstance(spec, AnyOf):
        for sub in spec.specs:
            yield from walk_spec(sub, path)


def config_keys() -> str:
    lines = []
    for name, spec in (("baseline.toml", BASELINE), ("gpugate.toml", _CONFIG)):
        lines.append("# %s" % name)
        lines += ["%s = %s" % (key, allowed) for key, allowed in walk_spec(spec, "")]
        lines.append("")
    return "\n".join(lines)


# -- the reason grammar --------------------------------------------------------

# Simulated faults, one node each: their real findings, the reason gpugate
# drains with, and that reason parsed back.
NVIDIA_FAULTS = [
    ("healthy", []),
    ("driver drift", ["driver=550.54.15"]),
    ("xid 79", ["gpu.3.xid=79"]),
    ("xid 48 and vbios drift", ["gpu.2.xid=48", "gpu.1.vbios=96.00.11"]),
    ("ecc volatile", ["gpu.3.ecc.uncorrected.volatile=2"]),
    ("row remap failure", ["gpu.4.remapped_rows.failure=1"]),
    ("gpu lost", ["gpus=7"]),
    ("pcie width", ["gpu.1.pcie.width=8"]),
    ("nvlink down", ["gpu.1.nvlink.down=2"]),
    ("stale module", ["module.resident=550.54.15"]),
    ("sxid", ["sxid=20034"]),
    ("compute mode", ["compute_mode=prohibited"]),
    ("power limit", ["gpu.1.power_limit=500"]),
    ("fallen off the bus", ["kmsg=NVRM: GPU 0000:1b:00.0: GPU has fallen off the bus."]),
    ("fabric manager down", ["service.nvidia-fabricmanager=failed"]),
    ("many findings", ["driver=550.54.15", "dcgm=3.1.0"] +
     ["gpu.%d.vbios=96.00.%02d.00.00" % (i, i) for i in range(8)] + ["gpu.5.xid=94"]),
]
AMD_FAULTS = [
    ("amd healthy", []),
    ("amd ras", ["amd.gpu3.ras.umc.ue=+2", "amd.gpu3.log=ue:umc:2"]),
    ("amd bad pages and xgmi", ["amd.gpu1.bad_pages=pending:1", "amd.gpu5.xgmi_down=1"]),
    ("amd rocm drift", ["amd.rocm=6.1.0"]),
]


def _gpugate(*args, check=True):
    env = dict(os.environ, PYTHONPATH=ROOT)
    result = subprocess.run([sys.executable, "-m", "gpugate"] + list(args), capture_output=True, text=True,
                            timeout=120, cwd=ROOT, env=env)
    if check and result.returncode not in (0, 1):
        raise AssertionError("gpugate %s exited %d: %s" % (" ".join(args), result.returncode, result.stderr))
    return result


def _parsed(text: str):
    parsed = reason_mod.parse(text, "gpugate:")
    if parsed is None:
        return None
    return {"cls": parsed.cls, "more": parsed.more, "acute": reason_mod.acute(parsed),
            "findings": ["%s|%s|%s|%s" % (f.component, f.gpu, f.observed, f.expected) for f in parsed.findings]}


def _simulated(work: str, name: str, baseline: str, faults, *init) -> list:
    """name: how the baseline's [nodes] names them (e.g. "gpu%02d")."""
    fleet = os.path.join(work, name[:2])
    nodes = [name % (i + 1) for i in range(len(faults))]
    _gpugate("sim", "init", fleet, "--nodes", ",".join(nodes), "--baseline", baseline, *init)
    out = []
    for node, (what, assignments) in zip(nodes, faults):
        if assignments:
            _gpugate("sim", "set", fleet, node, *assignments)
        data = json.loads(_gpugate("check", "--sim", fleet, "--node", node, "--json").stdout)
        out.append({"fault": what, "set": assignments, "fit": data["fit"], "class": data.get("class"),
                    "reason": data["reason"],
                    "findings": ["%s %s gpu=%s observed=%s expected=%s action=%s" % (
                        f["class"], f["component"], f["gpu"], f["observed"], f["expected"], f["action"])
                        for f in data["findings"]],
                    "parsed": _parsed(data["reason"]) if data["reason"] else None})
    return out


def _components() -> list:
    names = set(PIN_COMPONENTS) | set(findings_mod.EVENTS) | set(findings_mod.USER_CAUSED)
    for group in findings_mod.ACUTE.values():
        names |= set(group)
    return sorted(names)


def _synthetic() -> dict:
    """Every known component rendered alone, in each check class, with a
    GPU index; values that need sanitizing; a reason too long for 255 bytes."""
    rendered = {}
    for component in _components():
        for cls in findings_mod.CHECK_CLASSES:
            f = Finding(cls=cls, component=component, observed="1", expected="0", action="investigate", gpu=2)
            rendered["%s/%s" % (cls, component)] = reason_mod.render("gpugate:", cls, [f])
    odd = [Finding(cls="drift", component="Weird Name!", observed="a;b(c)\td\n\x01", expected="x" * 100,
                   action="reconverge"),
           Finding(cls="health", component="xid", observed="79", expected="none", action="reboot", gpu=1234)]
    many = [Finding(cls="drift", component="vbios", observed="96.00.%02d.00.01" % i, expected="96.00.99.00.01",
                    action="reconverge", gpu=i) for i in range(16)]
    rendered["sanitized"] = reason_mod.render("gpugate:", "drift", odd)
    rendered["more than fits"] = reason_mod.render("gpugate:", "drift", many)
    rendered["unknown class"] = reason_mod.render("gpugate:", "nonsense", odd[:1])
    rendered["long tag"] = reason_mod.render("a very long tag indeed", "health", odd[1:])
    return rendered


PARSE_INPUTS = [
    "gpugate: drift driver=550.54.15 (want 580.65.06); vbios:gpu3=96.00.74 (want 96.00.99); +2 more",
    "gpugate: health xid:gpu3=79 (want none) : reboot issued",
    "gpugate: health xid:gpu3=79 (want none) : reboot issued : reboot complete",
    "gpugate: rma sweep=rma deferred (want resume); ecc:gpu1=2 (want 0)",
    "gpugate: rollout sweep=rollout (want 580.65.06)",
    "gpugate: probe nvml=timeout (want answer)",
    "gpugate: drift free text only",
    "gpugate: bogus driver=1 (want 2)",
    "rack maintenance",
    "gpugate:health xid=1 (want none)",
]


def reason_grammar() -> dict:
    patterns = {}
    for label, module in (("reason", reason_mod), ("pending", pending_mod)):
        for name, value in sorted(vars(module).items()):
            if isinstance(getattr(value, "pattern", None), str):
                patterns["%s %s" % (label, name)] = value.pattern
    with tempfile.TemporaryDirectory() as work:
        simulated = _simulated(work, "gpu%02d", DEMO_BASELINE, NVIDIA_FAULTS)
        simulated += _simulated(work, "mi%03d", MIXED_BASELINE, AMD_FAULTS, "--vendor", "amd")
    return {"max_bytes": reason_mod.MAX_BYTES, "classes": list(findings_mod.CLASSES),
            "check_classes": list(findings_mod.CHECK_CLASSES), "actions": list(findings_mod.ACTIONS),
            "acute": {cls: sorted(names) for cls, names in findings_mod.ACUTE.items()},
            "events": sorted(findings_mod.EVENTS), "user_caused": sorted(findings_mod.USER_CAUSED),
            "pin_components": list(PIN_COMPONENTS), "patterns": patterns,
            "simulated": simulated, "rendered": _synthetic(),
            "parsed": {text: _parsed(text) for text in PARSE_INPUTS}}


# -- metric names -------------------------------------------------------------

def source_metric_names() -> list:
    """Every string literal in the package that is a whole gpugate_* name
    (metric families; also a reservation prefix and a JSON key)."""
    names = set()
    for directory, _, files in os.walk(os.path.join(ROOT, "gpugate")):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(directory, name)) as handle:
                    tree = ast.parse(handle.read())
                for node in ast.walk(tree):
                    if isinstance(node, ast.Constant) and isinstance(node.value, str):
                        text = node.value
                        if text.startswith("gpugate_") and text.replace("_", "").isalnum() and text.islower():
                            names.add(text)
    return sorted(names)


def _types(text: str) -> set:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def _node_textfiles(work: str) -> set:
    """The textfile gpugate-healthcheck writes on a simulated healthy node
    and on one with drift and an Xid."""
    fleet, prom = os.path.join(work, "fleet"), os.path.join(work, "node.prom")
    _gpugate("sim", "init", fleet, "--nodes", "gpu01,gpu02", "--baseline", DEMO_BASELINE)
    _gpugate("sim", "set", fleet, "gpu02", "driver=550.54.15", "gpu.3.xid=79")
    config = os.path.join(work, "gpugate.toml")
    with open(config, "w") as handle:
        handle.write('baseline = "%s"\nstate_dir = "%s/state/{node}"\nlog = "file"\n'
                     '[healthcheck]\nboot_grace_seconds = 0\nprometheus_textfile = "%s"\n'
                     '[sim]\nfleet = "%s"\n[slurm]\nbin_dir = "%s/no-slurm"\n'
                     % (DEMO_BASELINE, work, prom, fleet, work))
    names = set()
    for node in ("gpu01", "gpu02"):
        result = run_script(os.path.join(ROOT, SLURM_SCRIPTS[0]), ["--config", config], env={"SLURMD_NODENAME": node})
        if result.returncode not in (0, 1) or not os.path.exists(prom):
            raise AssertionError("gpugate-healthcheck on %s exited %d: %s" % (node, result.returncode, result.stderr))
        with open(prom) as handle:
            names |= _types(handle.read())
        os.unlink(prom)
    return names


def _controller() -> set:
    def view(cls):
        return SimpleNamespace(ours=SimpleNamespace(cls=cls) if cls else None, in_service=cls is None)

    nodes = {"gpu01": view(None), "gpu02": view("drift"), "gpu03": view("rma")}
    audit = {"at": 1.0, "facts": {}, "config_errors": {"gpu05": "baseline.toml: invalid TOML"}}
    keeper = {"ok": True, "last_ok": 1.0, "drained": ["gpu02"], "given_back": [], "held": 0}
    families = (fleet_families(SimpleNamespace(nodes=nodes), {}, audit, None, {"gpu": Use("gpu", 8, 1, ("gpu02",))},
                               (3, 1.0, 2.0, 42, "stopped"), evidence={"gpu03": ""})
                + keeper_families(keeper, 1.0, {"gpu": 0}) + clock_families({"power_brake": 0.3})
                + kernel_log_families(SimpleNamespace(
                    kernel_log_lost={"records": 2000, "first": 1001, "last": 3000},
                    kernel_log_follower={"follower": "absent", "covered": False, "why": "no follower"})))
    return _types(prom_render(families))


def metric_names() -> dict:
    with tempfile.TemporaryDirectory() as work:
        node = _node_textfiles(work)
    return {"rendered_node_healthcheck": sorted(node), "rendered_controller": sorted(_controller()),
            "source_literals": source_metric_names()}


# -- the snapshot ---------------------------------------------------------------

def _json(value) -> str:
    return json.dumps(value, indent=1, sort_keys=True) + "\n"


def gather() -> dict:
    """file name -> its content, as the snapshot holds it."""
    return {"help.txt": help_tree(), "commands.json": _json(commands()), "entry_points.json": _json(entry_points()),
            "config_keys.txt": config_keys(), "reason_grammar.json": _json(reason_grammar()),
            "metric_names.json": _json(metric_names())}


def check_portable(files: dict) -> None:
    """Nothing of this checkout's or this run's paths in the snapshot."""
    for name, text in files.items():
        for where in (ROOT, os.path.join(tempfile.gettempdir(), tempfile.gettempprefix())):
            if where in text:
                raise AssertionError("%s names %s: the snapshot would differ on another machine" % (name, where))


def write(files: dict) -> None:
    check_portable(files)
    os.makedirs(SNAPSHOT, exist_ok=True)
    for name, text in sorted(files.items()):
        with open(os.path.join(SNAPSHOT, name), "w") as handle:
            handle.write(text)


if __name__ == "__main__":
    if sys.argv[1:] == ["--json"]:  # the test's: gathered in a fresh interpreter
        print(json.dumps(gather()))
        sys.exit(0)
    write(gather())
    print("wrote %s" % os.path.relpath(SNAPSHOT, ROOT))
