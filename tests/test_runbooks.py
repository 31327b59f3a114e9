"""docs/runbooks/ without a cluster: every gpugate command a runbook gives
parses as the CLI parses it, every repository file it names exists, the
index lists every runbook, and each is written for the people who run
gpugate (what it needs and what it changes first; no issue numbers).
tests/test_slurm_runbooks.py runs them on the test cluster."""

import os
import re

import pytest

import runbook_doc as doc

FILES = doc.runbook_files()
NAMES = [os.path.basename(p) for p in FILES]


def test_there_are_runbooks_and_the_index_lists_each():
    assert len(FILES) >= 5
    index = open(os.path.join(doc.RUNBOOKS, "README.md")).read()
    for name in NAMES:
        assert "](%s)" % name in index, name
    for real, _ in doc.PLACEHOLDERS:
        assert real.rstrip("/") in index, "the index's table of placeholders lacks %s" % real


@pytest.mark.parametrize("path", FILES, ids=NAMES)
def test_every_gpugate_command_parses_and_every_file_exists(path):
    problems = []
    for step, command in doc.commands_of(path, ("console", "sh", "rig")):
        where = "%s:%d: %s" % (os.path.basename(path), command.line, command.text.split("\n")[0])
        for argv in doc.gpugate_invocations(doc.on_rig(command.text)):
            problem = doc.parse_problem(argv)
            if problem:
                problems.append("%s: %s" % (where, problem))
        for name in doc.repo_paths(command.text):
            if not os.path.exists(os.path.join(doc.ROOT, name)):
                problems.append("%s: no %s in this repository" % (where, name))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", FILES, ids=NAMES)
def test_written_for_admins_needs_and_consequences_first(path):
    text = open(path).read()
    headings = re.findall(r"^## (.+)$", text, re.M)
    assert headings[:2] and headings[0].startswith("What you need"), headings
    assert headings[1].startswith("What "), headings  # what it changes / costs, before the first step
    first_block = text.find("```")
    assert first_block > text.find("## " + headings[1]), "a command comes before what it changes"
    assert not re.search(r"\bissues? #?\d+|(?<![\w/])#\d{1,4}\b", text), "issue numbers are for developers"


def test_the_extraction_reads_prompts_exits_continuations_and_hidden_steps(tmp_path, monkeypatch):
    sample = tmp_path / "x.md"
    sample.write_text("<!-- rig: gpugate sim set $FLEET gpu01 gpu.0.xid=79\nsleep 1 -->\n"
                      "<!-- rig-expect: gpu01\nxid -->\n"
                      "```console\n$ gpugate check --node gpu01   # exit 1\nsample output\n$ gpugate sweep \\\n"
                      "  --apply\n```\n```sh\n# a comment\nsystemctl enable --now gpugate-budget.timer\n```\n")
    steps = doc.steps(str(sample))
    assert [s.kind for s in steps] == ["rig", "console", "sh"]
    assert steps[0].commands[0].text.endswith("sleep 1")
    console = steps[1]
    assert console.expect == ["gpu01", "xid"]
    assert [(c.text, c.exit) for c in console.commands] == [
        ("gpugate check --node gpu01   # exit 1", 1), ("gpugate sweep \\\n  --apply", 0)]
    assert [c.text for c in steps[2].commands] == ["systemctl enable --now gpugate-budget.timer"]
    assert doc.gpugate_invocations("A=1 gpugate status | grep x && /opt/gpugate/bin/gpugate sweep -w 'gpu[1-2]'") \
        == [["status"], ["sweep", "-w", "gpu[1-2]"]]
    assert doc.parse_problem(["sweep", "--no-such-option"])
    assert doc.parse_problem(["no-such-command"])
    assert doc.parse_problem(["baseline", "check", "missing.toml"]) is None  # files need not exist
    assert doc.on_rig("cat /etc/gpugate/gpugate.toml /var/lib/gpugate/x") == "cat $RIG/gpugate.toml $RIG/state/x"
