"""The documented commands work as typed on a fresh machine (no /etc/gpugate):
docs/how-to/baseline-rollout.md's dry run, line by line."""

import os
import re
import shlex
import subprocess
import sys

from conftest import ROOT


def readme_block(heading: str) -> str:
    with open(os.path.join(ROOT, "docs", "how-to", "baseline-rollout.md")) as handle:
        text = handle.read()
    section = text.split("\n## " + heading + "\n", 1)[1]
    return re.search(r"```sh\n(.*?)```", section, re.S).group(1)


def test_dry_run_section_runs_verbatim(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "GPUGATE_CONFIG"}
    for line in readme_block("Dry-run a baseline against simulated nodes").splitlines():
        argv = shlex.split(line, comments=True)
        # Only the paths move into tmp_path; every word else is the page's.
        argv = [a.replace("/tmp/fleet", str(tmp_path / "fleet"))
                 .replace("/etc/gpugate/baseline.toml", str(tmp_path / "baseline.toml"))
                 .replace("new-baseline.toml", str(tmp_path / "new-baseline.toml"))
                 .replace("slurm_conf/", os.path.join(ROOT, "slurm_conf") + "/") for a in argv]
        if argv[0] == "gpugate":
            argv = [sys.executable, "-m", "gpugate"] + argv[1:]
        result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        # check and explain exit 1 for an unfit node; 2 would be a command that does not work.
        unfit = "gpu002" in argv or "gpu003" in argv
        want = 1 if argv[3:4] in (["check"], ["explain"]) and unfit else 0
        assert result.returncode == want, (line, result.stdout, result.stderr)
    assert "FIT" in result.stdout or "unfit" in result.stdout


def test_sim_fleet_baseline_precedence(tmp_path):
    from conftest import DEMO_BASELINE, gpugate_cmd

    fleet = str(tmp_path / "fleet")
    gpugate_cmd("sim", "init", fleet, "--nodes", "gpu[01-02]", "--baseline", DEMO_BASELINE, check=True)
    env = {"GPUGATE_CONFIG": ""}

    def judged_by(*extra, env=env):
        out = gpugate_cmd("check", "--sim", fleet, "--node", "gpu01", "--json", *extra, env=env)
        assert out.returncode == 0, out.stderr
        import json

        return json.loads(out.stdout)["baseline"]["path"]

    assert judged_by() == DEMO_BASELINE  # the fleet's, not /etc/gpugate/baseline.toml
    other = tmp_path / "other.toml"
    other.write_text(open(DEMO_BASELINE).read())
    assert judged_by("--baseline", str(other)) == str(other)
    config = tmp_path / "gpugate.toml"
    config.write_text('baseline = "%s"\n' % other)
    assert judged_by("--config", str(config)) == str(other)  # a named gpugate.toml wins over the fleet
    assert judged_by(env={"GPUGATE_CONFIG": str(config)}) == str(other)
