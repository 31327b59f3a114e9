"""An admin finds every command's options and examples from the command
line: --help of every command has an Examples block, and click's shell
completion is there (docs/how-to/install-slurm.md: Shell completion)."""

import click

from conftest import gpugate_cmd


def _commands(command, path):
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            yield from _commands(sub, path + [name])


def test_every_command_help_has_examples():
    from gpugate.cli.main import main

    missing = []
    for path, command in _commands(main, ["gpugate"]):
        text = command.get_help(click.Context(command, info_name=path[-1]))
        if "Examples:" not in text:
            missing.append(" ".join(path))
    assert not missing, "no Examples in --help of: %s" % ", ".join(missing)
    assert len(list(_commands(main, ["gpugate"]))) > 20  # the walk reaches the subcommands


def test_shell_completion_script_and_answers():
    script = gpugate_cmd(env={"_GPUGATE_COMPLETE": "bash_source"}, check=True).stdout
    assert "_gpugate_completion" in script and "complete " in script
    answer = gpugate_cmd(env={"_GPUGATE_COMPLETE": "bash_complete", "COMP_WORDS": "gpugate sweep --ma",
                              "COMP_CWORD": "2"}, check=True).stdout
    assert "plain,--max-batch" in answer.split()  # bash_complete answers TYPE,VALUE per line
    answer = gpugate_cmd(env={"_GPUGATE_COMPLETE": "bash_complete", "COMP_WORDS": "gpugate sw",
                              "COMP_CWORD": "1"}, check=True).stdout
    assert "plain,sweep" in answer.split()
