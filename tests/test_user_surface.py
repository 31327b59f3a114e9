"""Nothing a user sees changes by accident: every command's --help and
options, the entry points, every baseline.toml and gpugate.toml key, the
drain reason's grammar and the gpugate_* metric names are gathered from the
running code (tests/user_surface.py) and compared with the snapshot in
tests/fixtures/user_surface/.  A deliberate change is recorded again with
`python3 tests/user_surface.py`, and its diff reviewed with the change."""

import difflib
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

import user_surface as surface

FILES = ("help.txt", "commands.json", "entry_points.json", "config_keys.txt", "reason_grammar.json",
         "metric_names.json")


@pytest.fixture(scope="module")
def gathered():
    # In an interpreter of its own: click caches a command's help option on
    # first use, so another test's standalone call of a subcommand (no -h
    # inherited) would change what this one sees.
    out = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "user_surface.py"), "--json"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def _snapshot(name):
    with open(os.path.join(surface.SNAPSHOT, name)) as handle:
        return handle.read()


@pytest.mark.parametrize("name", FILES)
def test_user_surface_is_unchanged(gathered, name):
    want, got = _snapshot(name), gathered[name]
    if want != got:
        diff = "".join(difflib.unified_diff(want.splitlines(True), got.splitlines(True),
                                            "snapshot/" + name, "running code/" + name))
        lines = diff.splitlines(True)
        shown = "".join(lines[:120]) + ("... %d more diff lines\n" % (len(lines) - 120) if len(lines) > 120 else "")
        pytest.fail("what users see changed (%s):\n%s\nIf this change is deliberate, record it: %s"
                    % (name, shown, surface.RECORD), pytrace=False)


def test_snapshot_is_portable_and_complete(gathered):
    assert sorted(gathered) == sorted(FILES)
    surface.check_portable(gathered)  # no checkout or temporary path in it
    commands = [line for line in gathered["help.txt"].splitlines() if line.startswith("=== gpugate")]
    assert len(commands) > 25 and "=== gpugate sweep --help ===" in commands
    keys = gathered["config_keys.txt"].splitlines()
    assert "health.drain_xids" in {k.split(" = ")[0] for k in keys} and len(keys) > 200
    grammar = json.loads(gathered["reason_grammar.json"])
    reasons = [s["reason"] for s in grammar["simulated"] if s["reason"]]
    assert len(reasons) >= 15 and all(r.startswith("gpugate: ") and len(r) <= 255 for r in reasons)
    # Every reason gpugate wrote for a simulated fault reads back as its own.
    assert all(s["parsed"] and s["parsed"]["cls"] == s["class"] for s in grammar["simulated"] if s["reason"])


def test_rendered_metric_names_are_in_the_source_list(gathered):
    names = json.loads(gathered["metric_names.json"])
    rendered = set(names["rendered_node_healthcheck"]) | set(names["rendered_controller"])
    assert len(rendered) > 40 and "gpugate_node_fit" in rendered
    assert rendered <= set(names["source_literals"]), sorted(rendered - set(names["source_literals"]))


def test_console_script_runs_the_cli():
    """`gpugate` (setup.cfg's console_scripts) resolves to the command the
    help tree was read from, whatever module it lives in."""
    assert surface.console_scripts() == {"gpugate": "main"}
    command = surface.resolve_console_script("gpugate")
    result = CliRunner().invoke(command, ["--help"], prog_name="gpugate", terminal_width=surface.WIDTH)
    assert result.exit_code == 0 and result.output == surface.help_text(())


def test_slurm_scripts_are_installed_and_answer():
    assert surface.scripts() == list(surface.SLURM_SCRIPTS)
    for script in surface.scripts():
        result = surface.run_script(os.path.join(surface.ROOT, script), ["--bogus"])
        name = os.path.basename(script)
        assert result.returncode == 2 and "%s: unknown argument '--bogus'" % name in result.stderr, result.stderr
