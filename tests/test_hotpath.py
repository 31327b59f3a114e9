"""The prolog's hot path stays small: an import audit, no timing.

The prolog runs before every job; most of its time is Python importing
modules (bench/bench_prolog.py measures it).  These tests run the prolog as
the entry point does (gpugate.node.entry.main, only slurmd's variables) in a
fresh interpreter and list what it imported: what only a drain, a tool, the
health check or a TOML parse needs must not be loaded on the healthy path."""

import ast
import json
import os
import subprocess
import sys

import pytest

from conftest import DEMO_BASELINE, ROOT
from gpugate.vendors.nvidia.pynvml_loader import _WRAPPER_ASSIGNMENTS

# Loaded by the prolog's healthy path, they would cost every job: the TOML
# parser (the kept parse is reused), OpenSSL's hashes, typing, the Slurm
# commands and what runs tools (subprocess, threads), click, ClusterShell,
# NVML's binding or the simulated node's (loaded in the forked reader only),
# dataclasses and inspect (gpugate.core.record), pickle and signal (gpugate.safety.forked),
# contextlib (gpugate.node.act), json, re, enum and functools (gpugate.core.jsontext,
# gpugate.core.lazyre).
NOT_ON_THE_HOT_PATH = {
    "dataclasses", "inspect", "pickle", "signal", "contextlib", "tomllib", "tomli", "hashlib", "_hashlib", "typing", "subprocess", "threading", "concurrent.futures",
    "json", "re", "enum", "functools",
    "random", "logging", "datetime", "click", "ClusterShell", "ClusterShell.NodeSet", "pynvml", "ctypes",
    "gpugate.sim", "gpugate.vendors.nvidia.nvml_sim", "gpugate.safety.runner", "gpugate.budget.rules", "gpugate.slurm.commands",
    "gpugate.probes.commands", "gpugate.parsers.system", "gpugate.parsers.dcgm", "gpugate.cli",
}
# Every gpugate module the hot prolog loads today.  A new one is a cost on
# every job: load it lazily where it is needed, or raise this knowingly.
# 42: the prolog judges the job's GPUs' runtime settings (judges.settings)
# and its fresh kernel-log events (judges.xids), both checks it must run;
# 43: the NVML reader's own small module (node.prolog_reader), which the
# entry script forks before anything else loads; 44: gpugate.core.jsontext, the
# JSON of the prolog's files without the json package (re, enum: ~4 ms);
# 45: gpugate.safety.safeio (os, stat, errno only), the prolog's job file written
# through a random O_EXCL|O_NOFOLLOW temporary name and its state read capped;
# 46: gpugate.model.iblimits, the [health] IB keys the baseline's table holds (it
# imports only gpugate.model.schema; kept apart to hold baseline.py under 400 lines);
# 47: gpugate.model.config_kube, gpugate.toml's [kubernetes] table (it imports only
# gpugate.model.schema; kept apart to hold config.py under 400 lines); 48:
# gpugate.model.config_preflight, the [preflight] table, likewise; 49-53: the
# packages those modules live in (gpugate.core, .safety, .model, .vendors,
# .vendors.nvidia): their __init__s are docstrings only, no import each.
MAX_GPUGATE_MODULES = 53
# Loaded here because the node is simulated ([sim] fleet: which generation of
# its files the run reads), never on a real node's prolog: not counted.
SIMULATED_NODE_ONLY = {"gpugate.model.simview"}

# What the interpreter loaded at start (site, .pth files, an editable
# install's finder) is the environment's, not the prolog's.
_RUN = """
import sys
before = set(sys.modules)
from gpugate.node.entry import main
code = main("prolog", ["--config", sys.argv[1]])
loaded = sorted(set(sys.modules) - before)
import json
print(json.dumps({"code": code, "modules": loaded}))
"""


@pytest.fixture
def node(fleet, tmp_path):
    config = tmp_path / "gpugate.toml"
    config.write_text('baseline = "%s"\nstate_dir = "%s/state/{node}"\nlog = "file"\n'
                      '[sim]\nfleet = "%s"\n[slurm]\nbin_dir = "%s/no-slurm-here"\n'
                      % (DEMO_BASELINE, tmp_path, fleet, tmp_path))
    return {"config": str(config), "state": str(tmp_path / "state")}


def _prolog(node, name="gpu01", job="7"):
    env = {"SLURMD_NODENAME": name, "SLURM_JOB_ID": job, "SLURM_JOB_GPUS": "0,1,2,3"}
    out = subprocess.run([sys.executable, "-c", _RUN, node["config"]], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    with open(os.path.join(node["state"], name, "gpugate.log")) as handle:
        result["log"] = json.loads(handle.readlines()[-1])
    return result


def _healthcheck(node, name="gpu01"):
    script = os.path.join(os.path.dirname(sys.executable), "gpugate-healthcheck")
    argv = [script] if os.path.exists(script) else [sys.executable, os.path.join(ROOT, "healthcheck",
                                                                                  "gpugate-healthcheck")]
    subprocess.run(argv + ["--config", node["config"]], env={"SLURMD_NODENAME": name}, capture_output=True,
                   timeout=120, check=False)


def test_the_hot_prolog_loads_nothing_it_does_not_need(node):
    _healthcheck(node)
    _healthcheck(node)  # a fresh fit verdict to reuse
    result = _prolog(node)
    assert result["code"] == 0 and result["log"]["verdict"] == "fit" and result["log"]["reused"] is True
    assert "nvml" in result["log"]["durations"]  # NVML of the job's GPUs is still read
    loaded = set(result["modules"])
    assert not loaded & NOT_ON_THE_HOT_PATH, sorted(loaded & NOT_ON_THE_HOT_PATH)
    ours = sorted(m for m in loaded if m.startswith("gpugate") and m not in SIMULATED_NODE_ONLY)
    assert len(ours) <= MAX_GPUGATE_MODULES, " ".join(ours)


def test_the_cold_prolog_parses_no_toml_once_the_parse_is_kept(node):
    first = _prolog(node, "gpu02", "8")  # no verdict to reuse: the baseline is loaded and kept
    assert first["log"]["reused"] is False and first["log"]["verdict"] == "fit"
    second = _prolog(node, "gpu02", "9")
    assert second["code"] == 0 and second["log"]["verdict"] == "fit"
    # The node's kept view of the baseline: no TOML, no ClusterShell to
    # expand the [nodes."..."] hostlists (with it subprocess and logging).
    loaded = set(second["modules"])
    assert not loaded & NOT_ON_THE_HOT_PATH, sorted(loaded & NOT_ON_THE_HOT_PATH)


def test_the_kept_view_follows_the_baseline_text_and_the_gpugate_version(node, tmp_path):
    from gpugate import __version__
    from gpugate.model.baseline import load_baseline
    from gpugate.node import lastgood

    baseline = str(tmp_path / "baseline.toml")
    with open(DEMO_BASELINE) as handle:
        text = handle.read()
    with open(baseline, "w") as handle:
        handle.write(text)
    config = open(node["config"]).read().replace(DEMO_BASELINE, baseline)
    with open(node["config"], "w") as handle:
        handle.write(config)
    assert _prolog(node, "gpu02", "20")["log"]["reused"] is False
    view_path = os.path.join(lastgood.directory(node["config"], "gpu02"), lastgood.BASELINE + lastgood.RESOLVED)
    view = json.load(open(view_path))
    assert view["text"] == text and view["version"] == __version__ and view["node"] == "gpu02"
    fresh = json.loads(json.dumps(load_baseline(baseline).resolved_for("gpu02")))
    assert view["view"] == fresh  # what a fresh parse resolves
    # A new baseline text: parsed, validated and resolved again.
    changed = text.replace('name = "', 'name = "v2-', 1)
    assert changed != text
    with open(baseline, "w") as handle:
        handle.write(changed)
    os.utime(baseline, (1, 1))
    assert _prolog(node, "gpu02", "21")["log"]["verdict"] == "fit"
    view = json.load(open(view_path))
    assert view["text"] == changed and view["view"]["name"].startswith("v2-")
    # A view made by another version, or damaged: not used, made again.
    for damage in ({**view, "version": "0.0.0", "view": {**view["view"], "name": "stale"}},
                   {**view, "view": {"name": "no pins"}}):
        with open(view_path, "w") as handle:
            json.dump(damage, handle)
        result = _prolog(node, "gpu02", "22")
        # validated again (the kept parse of the same text, ClusterShell for its hostlists)
        assert result["log"]["verdict"] == "fit" and "ClusterShell.NodeSet" in result["modules"]
        assert json.load(open(view_path)) == view


def test_a_changed_file_is_parsed_again_and_a_damaged_kept_parse_is_ignored(node, tmp_path):
    from gpugate.node import lastgood

    _prolog(node, "gpu02", "10")
    where = lastgood.directory(node["config"], "gpu02")
    kept = os.path.join(where, lastgood.CONFIG + lastgood.PARSED)
    assert json.load(open(kept))["text"] == open(node["config"]).read()
    # A changed gpugate.toml: its own parse, and the parse kept follows it.
    text = open(node["config"]).read() + '\n[prolog]\nverdict_max_age_seconds = 0\n'
    with open(node["config"], "w") as handle:
        handle.write(text)
    os.utime(node["config"], (1, 1))  # settled: no wait for a file written this instant
    assert _prolog(node, "gpu02", "11")["log"]["verdict"] == "fit"
    assert json.load(open(kept))["text"] == text
    assert json.load(open(kept))["toml"]["prolog"] == {"verdict_max_age_seconds": 0}
    # A kept parse that is not JSON: parsed again, rewritten.
    with open(kept, "w") as handle:
        handle.write("{not json")
    assert _prolog(node, "gpu02", "12")["log"]["verdict"] == "fit"
    assert json.load(open(kept))["text"] == text


def test_a_kept_parse_is_still_validated(node):
    """The kept parse stands in for the TOML parser only: an invalid value in
    it is refused like one in the file (and the last good copy judges)."""
    from gpugate.node import lastgood

    _prolog(node, "gpu02", "13")
    where = lastgood.directory(node["config"], "gpu02")
    kept = os.path.join(where, lastgood.CONFIG + lastgood.PARSED)
    data = json.load(open(kept))
    data["toml"]["log"] = "nowhere"
    with open(kept, "w") as handle:
        json.dump(data, handle)
    result = _prolog(node, "gpu02", "14")
    assert result["code"] == 0 and result["log"]["verdict"] == "fit"
    assert "log: expected one of" in result["log"]["config_error"]


def test_no_module_loads_the_standard_dataclasses():
    """gpugate.core.record stands in for dataclasses: `import dataclasses`
    loads inspect, ast, dis and tokenize, about 11 ms of every prolog."""
    for where, _, names in os.walk(os.path.join(ROOT, "gpugate")):
        for name in names:
            if name.endswith(".py"):
                tree = ast.parse(open(os.path.join(where, name)).read())
                for node in ast.walk(tree):
                    if isinstance(node, ast.Import):
                        assert all(a.name != "dataclasses" for a in node.names), os.path.join(where, name)
                    elif isinstance(node, ast.ImportFrom):
                        assert node.module != "dataclasses", os.path.join(where, name)


def test_the_entry_point_imports_no_mode_at_import_time():
    """entry.py picks the mode's module at run time; prolog and epilog take
    the job's GPUs from node.jobenv, not from entry (no import cycle)."""
    for name in ("prolog.py", "epilog.py"):
        source = open(os.path.join(ROOT, "gpugate", "node", name)).read()
        assert "from .entry import" not in source
    out = subprocess.run([sys.executable, "-c", "import sys, gpugate.node.entry as e; "
                          "print(sorted(m for m in sys.modules if m.startswith('gpugate')))"],
                         capture_output=True, text=True, timeout=60, check=True)
    assert "gpugate.node.prolog" not in out.stdout and "gpugate.node.epilog" not in out.stdout


def test_the_import_audit_sees_what_it_forbids(node):
    """The audit is not vacuous: the health check does load what the
    prolog must not."""
    out = subprocess.run([sys.executable, "-c", _RUN.replace('"prolog"', '"healthcheck"'), node["config"]],
                         env={"SLURMD_NODENAME": "gpu03"}, capture_output=True, text=True, timeout=120)
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1])["modules"])
    assert {"subprocess", "gpugate.probes.commands"} <= loaded



def _session_ends(argv, env, seconds=20.0):
    """Run argv in a session of its own; True when every process of the
    session (the prolog's forked NVML reader too) is gone soon after it ends."""
    import signal
    import time

    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    proc.wait(timeout=120)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    return False


def test_the_early_nvml_reader_leaves_when_the_configuration_fails(tmp_path):
    """The prolog forks its NVML reader before it loads gpugate.toml: when
    that fails (first install, nothing kept), the reader reads nothing and
    leaves; no process stays behind."""
    bad = tmp_path / "gpugate.toml"
    bad.write_text('baseline = "relative.toml"\n')
    argv = [sys.executable, "-c", "import sys; from gpugate.node.entry import main; "
            "sys.exit(main('prolog', ['--config', sys.argv[1]]))", str(bad)]
    assert _session_ends(argv, {"SLURMD_NODENAME": "gpu77", "SLURM_JOB_ID": "1"})


def test_the_early_nvml_reader_reads_what_it_is_sent_and_nothing_when_cancelled():
    from gpugate.safety.forked import OK, Forked

    reader = Forked(lambda orders: orders["gpus"] + [len(orders["node"])], prepare=lambda: None)
    reader.send({"gpus": [0, 3], "node": "gpu01"})
    assert reader.result(30) == (OK, [0, 3, 5])
    reader.cancel()  # after the answer: nothing to do
    idle = Forked(lambda orders: 1 / 0, prepare=lambda: None)
    idle.cancel()
    idle.cancel()
    for _ in range(200):
        try:
            pid, _ = os.waitpid(idle.pid, os.WNOHANG)
        except ChildProcessError:
            break
        if pid:
            break
        import time

        time.sleep(0.05)
    else:
        raise AssertionError("the cancelled reader is still running")


def test_the_nvml_reading_loads_nothing_of_gpugates():
    """The prolog's reader is forked before gpugate's records are defined:
    what it runs must not define them again (it answers with stand-ins)."""
    out = subprocess.run([sys.executable, "-c", "import sys; b = set(sys.modules); import gpugate.vendors.nvidia.nvmlread; "
                          "print(sorted(set(sys.modules) - b))"], capture_output=True, text=True, timeout=60,
                         check=True)
    assert "dataclasses" not in out.stdout and "gpugate.model.facts" not in out.stdout, out.stdout


def test_the_readers_stand_ins_become_the_facts_records():
    from gpugate.model import facts
    from gpugate.vendors.nvidia import nvmlread
    from gpugate.vendors.nvidia.probe_nvml import facts_of

    fail = nvmlread.ProbeFailure("nvml.vbios", "nvml", "Unknown Error", 999)
    value = nvmlread.NvmlFacts("580.65.06", "13.0", 1, (nvmlread.GpuFacts(
        0, "H100", "GPU-1", "1", "00000000:18:00.0", fail, None, True, 0, 0, None,
        nvmlread.RemappedRows(0, 0, False, False), (True, False), nvmlread.Pcie(5, 16, 5, 16), 0, True, False,
        3, 0, processes=()),))
    got = facts_of(value)
    assert isinstance(got, facts.NvmlFacts) and isinstance(got.gpus[0], facts.GpuFacts)
    assert got.gpus[0].vbios == facts.ProbeFailure("nvml.vbios", "nvml", "Unknown Error", 999)
    assert got.gpus[0].pcie == facts.Pcie(5, 16, 5, 16) and got.gpus[0].nvlink_up == (True, False)


def test_pynvml_loads_without_ctypes_util_string_or_threading_and_is_the_same_module():
    """gpugate.vendors.nvidia.pynvml_loader: the stand-ins live only while pynvml loads;
    afterwards the real modules import, pynvml answers through them, and it
    defined the same names (its error classes are named with capwords) and
    the same kind of lock."""
    code = ("import sys, json; before = set(sys.modules); from gpugate.vendors.nvidia.pynvml_loader import import_pynvml; "
            "p = import_pynvml(); loaded = sorted(m for m in ('ctypes.util', 'string', 're', 'subprocess', "
            "'threading', 'functools', 'collections') if m in sys.modules and m not in before); "
            "import ctypes.util, string, threading; "
            "lock = p.libLoadLock; acquired = lock.acquire(blocking=False); held = lock.locked(); lock.release(); "
            "print(json.dumps([loaded, ctypes.util.__file__.endswith('util.py'), string.__file__.endswith('.py'), "
            "p.find_library('c') == ctypes.util.find_library('c'), p.string.ascii_letters == string.ascii_letters, "
            "import_pynvml() is p, sorted(n for n in dir(p) if not n.startswith('__')), "
            "type(lock) is type(threading.Lock()) and acquired and held and not lock.locked(), "
            "p.threading.Thread is threading.Thread and sys.modules['threading'] is threading]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    loaded, util_real, string_real, find_same, string_same, same, names, lock_same, threading_real = \
        json.loads(out.stdout)
    # Elsewhere the real functools loads, and 3.14's ctypes loads sysconfig, which
    # makes a threading.RLock: the stand-in hands it the real module.
    assert set(loaded) <= {"collections", "functools", "threading"}
    assert util_real and string_real and find_same and string_same and same and lock_same and threading_real
    if sys.version_info[:2] in _WRAPPER_ASSIGNMENTS:
        assert not {"functools", "collections"} & set(loaded)  # functools stood in too
    if sys.version_info[:2] <= (3, 13):
        assert loaded == []
    plain = subprocess.run([sys.executable, "-c", "import json, pynvml; print(json.dumps(sorted("
                            "n for n in dir(pynvml) if not n.startswith('__'))))"],
                           capture_output=True, text=True, timeout=60, check=True)
    assert names == json.loads(plain.stdout) and "NVMLError_GpuIsLost" in names
    # Modules already loaded are used as they are: no stand-in.
    code = ("import sys, ctypes.util, string, threading; real = (ctypes.util, string, threading); "
            "from gpugate.vendors.nvidia.pynvml_loader import import_pynvml; p = import_pynvml(); "
            "print(sys.modules['ctypes.util'] is real[0] and p.string is real[1] and p.threading is real[2])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "True"


_WRAPPED = ("import json, sys; %s; "
            "print(json.dumps(sorted([n, f.__name__, f.__qualname__, f.__doc__, f.__module__, f.__wrapped__.__qualname__, "
            "sorted(f.__dict__), repr(getattr(f, '__annotations__', None)), repr(getattr(f, '__type_params__', None))] "
            "for n, f in vars(p).items() if callable(f) and hasattr(f, '__wrapped__'))))")


def test_pynvml_wrapped_functions_are_the_same_with_the_stand_in_wraps():
    """pynvml decorates some 30 functions with functools.wraps at import:
    with the stand-in they carry the same names, docs and __wrapped__."""
    ours = subprocess.run([sys.executable, "-c", _WRAPPED % "from gpugate.vendors.nvidia.pynvml_loader import import_pynvml; "
                           "p = import_pynvml()"], capture_output=True, text=True, timeout=60, check=True)
    plain = subprocess.run([sys.executable, "-c", _WRAPPED % "import pynvml as p"], capture_output=True, text=True,
                           timeout=60, check=True)
    wrapped = json.loads(ours.stdout)
    assert len(wrapped) >= 20 and wrapped == json.loads(plain.stdout)


def test_the_stand_in_wraps_copies_what_this_pythons_functools_copies():
    import functools

    from gpugate.vendors.nvidia.pynvml_loader import _wraps

    if sys.version_info[:2] not in _WRAPPER_ASSIGNMENTS:
        pytest.skip("this Python gets the real functools while pynvml loads")
    assert _WRAPPER_ASSIGNMENTS[sys.version_info[:2]] == functools.WRAPPER_ASSIGNMENTS
    assert functools.WRAPPER_UPDATES == ("__dict__",)

    def inner(a: int) -> str:
        """Doc."""
    inner.marker = 1

    def made(decorate):
        def wrapper(*args):
            return inner(*args)
        return decorate(wrapper)
    ours, theirs = made(_wraps(inner)), made(functools.wraps(inner))
    for attr in functools.WRAPPER_ASSIGNMENTS + ("__dict__", "__wrapped__"):
        assert getattr(ours, attr) == getattr(theirs, attr), attr


def test_capwords_is_the_standard_one():
    import string

    from gpugate.vendors.nvidia.pynvml_loader import _capwords

    for text, sep in (("NVML_ERROR_GPU_IS_LOST", "_"), ("hello  wide world", None), ("", None), ("a_b", "_"),
                      ("ERROR__DOUBLE", "_"), (" lead trail ", " "), ("mIxEd cAsE", None)):
        assert _capwords(text, sep) == string.capwords(text, sep)


def test_a_reader_answer_that_is_not_plain_values_is_an_error_not_a_crash():
    from gpugate.safety.forked import ERROR, OK, Forked

    plain = Forked(lambda: {"a": (1, 2.5, None, True, b"x", "t", [frozenset({3})])})
    assert plain.result(30) == (OK, {"a": (1, 2.5, None, True, b"x", "t", [frozenset({3})])})
    odd = Forked(lambda: object())
    state, text = odd.result(30)
    assert state == ERROR and "unserialisable answer" in text
    dead = Forked(lambda: os._exit(3))
    state, text = dead.result(30)
    assert state == ERROR and "the reader died" in text


def test_a_fit_node_with_a_pending_rollout_asks_no_controller_where_slurm_runs_the_checks(tmp_path):
    """During a rollout a fit verdict carries notes (pending findings): the
    Kubernetes node agent reads its Node to name them in its condition; a
    Slurm prolog (slurm, and Slurm on Kubernetes) still asks nothing."""
    from gpugate.model.config import parse_settings
    from gpugate.model.findings import PENDING, RECONVERGE, Finding
    from gpugate.node.act import act
    from gpugate.core.record import replace
    from gpugate.model.verdict import decide

    verdict = decide([Finding(PENDING, "driver", "580.65.06", "590.48.01", RECONVERGE)], "gpugate:")
    assert verdict.fit and verdict.notes
    for scheduler in ("slurm", "slurm+kubernetes"):
        settings = replace(parse_settings({"scheduler": scheduler}, "(test)"),
                           state_dir_template=str(tmp_path / scheduler / "{node}"))
        (tmp_path / scheduler / "gpu01").mkdir(parents=True)
        outcome = act(settings, "gpu01", verdict)
        assert outcome["rpc"] is False and outcome["ok"], (scheduler, outcome)
