"""The runbooks in docs/runbooks/ as the tests read them: one source.

A runbook is Markdown an admin follows.  Its commands are read from it here
(never copied into a test), so a runbook that drifts from the code fails:

- a ```console block is run on the test cluster, in order: each line that
  starts with "$ " is a command (a line ending in "\\" goes on), the lines
  after it are sample output.  A command exits 0 unless it ends with a
  comment "# exit N" (then N).  A hidden "<!-- rig-expect: TEXT -->" just
  before the block names text (one a line) its output must hold;
- a ```sh block is a real cluster's step (systemctl, pip, ssh-keyscan, an
  editor): not run, but every gpugate command in it must parse (its
  subcommand and options exist) and every file of this repository it names
  must exist;
- a hidden "<!-- rig: COMMANDS -->" runs on the test cluster only, where it
  stands: what a real cluster does by itself (a GPU falling off the bus) or
  what a host-only step does (an edit, a timer's run).

On the test cluster the real paths stand for the rig's (PLACEHOLDERS), and
$RIG, $FLEET name the rig's directory and its simulated fleet.
"""

import os
import re
import shlex
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNBOOKS = os.path.join(ROOT, "docs", "runbooks")

# A real cluster's path -> the test cluster's ($RIG is its directory).
PLACEHOLDERS = (
    ("/etc/gpugate/gpugate.toml", "$RIG/gpugate.toml"),
    ("/etc/gpugate/baseline.toml", "$RIG/baseline.toml"),
    ("/etc/gpugate/drain-budget.key", "$RIG/drain-budget.key"),
    ("/etc/slurm/slurm.conf", "$RIG/slurm.conf"),
    ("/var/lib/gpugate/", "$RIG/state/"),
    ("/opt/gpugate/bin/gpugate", "gpugate"),
)

EXIT = re.compile(r"\s+#\s*exit\s+(\d+)\s*$")
COMMENT = re.compile(r"<!--\s*(rig|rig-expect):(.*?)-->", re.S)
FENCE = re.compile(r"^```(\w*)\s*$")


@dataclass
class Command:
    text: str            # as the runbook shows it (continuations joined)
    exit: int = 0
    line: int = 0


@dataclass
class Step:
    kind: str            # "console" (run on the rig), "rig" (hidden, rig only), "sh" (real cluster only)
    line: int
    commands: List[Command] = field(default_factory=list)
    expect: List[str] = field(default_factory=list)


def runbook_files() -> List[str]:
    return sorted(os.path.join(RUNBOOKS, name) for name in os.listdir(RUNBOOKS)
                  if name.endswith(".md") and name != "README.md")


def steps(path: str) -> List[Step]:
    """The runbook's steps in order: its console and sh blocks and its
    hidden rig comments."""
    with open(path) as handle:
        lines = handle.read().split("\n")
    out: List[Step] = []
    pending_expect: List[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = FENCE.match(line)
        if fence:
            lang, start = fence.group(1), i
            body = []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            if lang in ("console", "sh"):
                step = Step(lang, start + 1, _commands(body, lang, start + 2), pending_expect)
                out.append(step)
            pending_expect = []
            i += 1
            continue
        if line.lstrip().startswith("<!--"):
            text = line
            start = i
            while "-->" not in text and i + 1 < len(lines):
                i += 1
                text += "\n" + lines[i]
            match = COMMENT.search(text)
            if match and match.group(1) == "rig":
                # One bash script (a here-document may span lines).
                out.append(Step("rig", start + 1, [Command(match.group(2).strip(), 0, start + 1)]))
            elif match:
                pending_expect = [e.strip() for e in match.group(2).strip().split("\n") if e.strip()]
        i += 1
    return out


def _commands(body: List[str], lang: str, first_line: int) -> List[Command]:
    commands: List[Command] = []
    current: Optional[Command] = None
    for n, line in enumerate(body):
        if current is not None:
            current.text += "\n" + line
            if not line.endswith("\\"):
                commands.append(current)
                current = None
            continue
        if lang == "console":
            if not line.startswith("$ "):
                continue  # sample output
            line = line[2:]
        elif not line.strip() or line.lstrip().startswith("#"):
            continue
        current = Command(line, 0, first_line + n)
        if not line.endswith("\\"):
            commands.append(current)
            current = None
    if current is not None:
        commands.append(current)
    for c in commands:
        m = EXIT.search(c.text)
        if m:
            c.exit = int(m.group(1))
    return commands


def on_rig(text: str) -> str:
    """A runbook command with the real cluster's paths made the rig's."""
    for real, rig in PLACEHOLDERS:
        text = text.replace(real, rig)
    return text


def gpugate_invocations(text: str) -> List[List[str]]:
    """The argument lists of each gpugate command in a shell command line
    (split at pipes, &&, ||, ; and parentheses)."""
    if "\n" in text.replace("\\\n", " "):
        return [argv for line in text.replace("\\\n", " ").split("\n") for argv in gpugate_invocations(line)]
    lexer = shlex.shlex(text.replace("\\\n", " "), posix=True, punctuation_chars=";&|()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError:
        return []
    found, current = [], []
    for token in tokens + [";"]:
        if token and set(token) <= set(";&|()"):
            if current:
                found.append(current)
            current = []
        else:
            current.append(token)
    result = []
    for words in found:
        while words and re.match(r"^[A-Z_]+=", words[0]):
            words = words[1:]  # VAR=value before the command
        while words and words[0] in ("sudo", "exec", "env"):
            words = words[1:]
        if words and (words[0] == "gpugate" or words[0].endswith("/bin/gpugate")):
            result.append(words[1:])
    return result


def parse_problem(argv: List[str]) -> Optional[str]:
    """None when the gpugate CLI accepts these arguments (parsed as click
    parses them, nothing run), else click's complaint."""
    import click

    from gpugate.cli.main import main

    command, args, path = main, list(argv), ["gpugate"]
    # Files a command names need not exist here: only its words are checked.
    unchecked = (click.Path, "convert", lambda self, value, param, ctx: value)
    saved = click.Path.convert
    setattr(*unchecked)
    try:
        while True:
            ctx = command.make_context(" ".join(path), args, resilient_parsing=False)
            if not isinstance(command, click.Group):
                return None
            # click 8.2+ keeps the subcommand's words in _protected_args; 8.1 (the newest for Python 3.9)
            # in protected_args.
            words = ctx._protected_args if hasattr(ctx, "_protected_args") else ctx.protected_args
            rest = list(words or []) + list(ctx.args)
            if not rest:
                return None
            name, sub, rest = command.resolve_command(ctx, rest)
            if sub is None:
                return "no such command: %s" % name
            command, args, path = sub, rest, path + [name]
    except click.exceptions.Exit:
        return None  # --help, --version
    except click.ClickException as exc:
        return "%s: %s" % (" ".join(path), exc.format_message())
    finally:
        click.Path.convert = saved


REPO_PATH = re.compile(r"(?<![\w/.-])((?:slurm_conf|deploy|scripts|docs|bench|gpugate)/[\w./-]*[\w-])")


def repo_paths(text: str) -> List[str]:
    """Paths of this repository a command names (slurm_conf/..., deploy/...)."""
    return REPO_PATH.findall(text)


def commands_of(path: str, kinds: Tuple[str, ...] = ("console", "sh")) -> List[Tuple[Step, Command]]:
    return [(s, c) for s in steps(path) if s.kind in kinds for c in s.commands]

