"""docs/reference/ is complete and current: every key of the baseline and
gpugate.toml schemas, every `gpugate` command and option, every metric the
code can emit, every shipped alert, every exit code and reason class has an
entry, and no entry names something the code no longer has.

The lists come from the code (the schema tables walked recursively, the
click tree walked, the metric families found in the source), never from a
list kept here.  Conventions the pages follow, so the checks are exact:

- a key is a table row whose header's first cell is ``key`` and whose first
  cell is the dotted path in backticks (`health.dcgm_diag.verify`); a chosen
  key is written ``<name>`` (`nodes.<hostlist>.gpus`);
- a table of keys is a heading with its path in brackets (`[health.rvs]`);
- a command is a heading that is its full path in backticks
  (`gpugate sweep status`), followed by an options table (header ``option``)
  naming each option string in backticks;
- a metric is a row of a table headed ``metric``, an alert one headed ``alert``,
  an exit code one headed ``code``, a reason class one headed ``class``."""

import ast
import glob
import os
import re

import click
import pytest

from gpugate import errors
from gpugate.model import findings
from gpugate.model import influence
from gpugate.model import reason
from gpugate.model import verdict
from gpugate.vendors.amd.baseline import AMD_PIN_COMPONENTS
from gpugate.model.baseline_keys import PIN_COMPONENTS
from gpugate.model.baseline import parse_baseline
from gpugate.model.baseline_schema import BASELINE
from gpugate.cli.main import EXIT_CODES, main
from gpugate.model.config import _CONFIG, parse_settings
from gpugate.model.schema import Bool, MapOf, Table, parse_toml_bytes

from conftest import ROOT

REFERENCE = os.path.join(ROOT, "docs", "reference")
PACKAGE = os.path.join(ROOT, "gpugate")
CHOSEN = re.compile(r"<[^<>]+>")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$")
CODE = re.compile(r"`([^`]+)`")


def page(name):
    with open(os.path.join(REFERENCE, name)) as handle:
        return handle.read()


def _cells(line):
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def table_rows(text, header):
    """The first cells of every body row of the tables whose header's first
    cell is ``header``, with the line each is on."""
    rows, current, fence = [], None, False
    lines = text.split("\n")
    for number, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if fence or not line.lstrip().startswith("|"):
            current = None
            continue
        cells = _cells(line)
        if current is None:
            current = cells[0].lower()
            continue
        if set(cells[0]) <= set("-: "):
            continue  # the delimiter row
        if current == header:
            rows.append((cells[0], number))
    return rows


def codes_in(cell):
    return CODE.findall(cell)


def headings(text):
    out, fence = [], False
    for number, line in enumerate(text.split("\n")):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        m = None if fence else HEADING.match(line)
        if m:
            out.append((len(m.group(1)), m.group(2), number))
    return out


# -- the two TOML schemas ---------------------------------------------------

def schema_paths(spec, prefix=""):
    """(keys, sections): every key path of a Table, recursively; a key whose
    value is a table of known keys is a section, a table of chosen keys
    (MapOf) with known keys inside is a section at ``path.<*>``."""
    keys, sections = set(), set()
    for name, (sub, _default) in spec.fields.items():
        path = prefix + name
        if isinstance(sub, Table):
            sections.add(path)
            more_keys, more_sections = schema_paths(sub, path + ".")
        elif isinstance(sub, MapOf) and isinstance(sub.value, Table):
            sections.add(path + ".<*>")
            more_keys, more_sections = schema_paths(sub.value, path + ".<*>.")
        else:
            keys.add(path)
            continue
        keys |= more_keys
        sections |= more_sections
    return keys, sections


def documented_keys(text):
    keys = set()
    for cell, _ in table_rows(text, "key"):
        for token in codes_in(cell)[:1]:
            keys.add(CHOSEN.sub("<*>", token))
    return keys


def documented_sections(text):
    found = set()
    for _level, title, _ in headings(text):
        for token in codes_in(title):
            if token.startswith("[") and token.endswith("]"):
                found.add(CHOSEN.sub("<*>", token[1:-1]))
    return found


def _check_schema_page(spec, name):
    keys, sections = schema_paths(spec)
    text = page(name)
    doc_keys, doc_sections = documented_keys(text), documented_sections(text)
    missing = sorted(keys - doc_keys)
    assert not missing, "%s has no row for: %s" % (name, ", ".join(missing))
    stale = sorted(doc_keys - keys)
    assert not stale, "%s documents keys the schema does not have: %s" % (name, ", ".join(stale))
    missing_sections = sorted(sections - doc_sections)
    assert not missing_sections, "%s has no heading for the tables: %s" % (
        name, ", ".join("[%s]" % s for s in missing_sections))
    stale_sections = sorted(doc_sections - sections - keys)  # a table of chosen keys may have its heading
    assert not stale_sections, "%s has headings for tables the schema does not have: %s" % (
        name, ", ".join(stale_sections))
    return keys, sections


def test_every_baseline_key_has_a_reference_row():
    keys, sections = _check_schema_page(BASELINE, "baseline.md")
    # The walk found the schema, nested tables and chosen keys included.
    assert len(keys) > 100, len(keys)
    assert {"pin.driver", "health.dcgm_diag.verify", "nodes.<*>.hca.rate", "health.ib_error_rate_max",
            "health.rvs.verify", "nodes.<*>.vendor", "operator.device_plugin"} <= keys
    assert {"pin", "health", "health.dcgm_diag", "nodes.<*>", "nodes.<*>.hca"} <= sections


def test_every_gpugate_toml_key_has_a_reference_row():
    keys, sections = _check_schema_page(_CONFIG, "config.md")
    assert len(keys) > 100, len(keys)
    assert {"sweep.max_batch", "kubernetes.node_selector", "preflight.allreduce_multi", "drain_budget.max_share",
            "nhc.command", "check_ownership"} <= keys
    assert {"sweep", "kubernetes", "preflight", "drain_budget"} <= sections


def test_a_key_added_to_the_schema_fails_until_documented():
    """The checks above fail on a new key or table, nested ones included."""
    extra = Table(dict(_CONFIG.fields, brand_new=(Table({"knob": (MapOf(Table({"x": (Bool(), False)})), dict)}),
                                                  None)))
    keys, sections = schema_paths(extra)
    assert "brand_new.knob.<*>.x" in keys and {"brand_new", "brand_new.knob.<*>"} <= sections
    with pytest.raises(AssertionError, match="brand_new.knob.<\\*>.x"):
        _check_schema_page(extra, "config.md")


def toml_examples(name):
    return re.findall(r"^```toml\n(.*?)^```", page(name), re.S | re.M)


def test_the_example_files_on_the_key_pages_load():
    """Each page's TOML example is a whole file gpugate accepts as it is."""
    for name, parse in (("baseline.md", parse_baseline), ("config.md", parse_settings)):
        examples = toml_examples(name)
        assert examples, "%s has no ```toml example" % name
        for text in examples:
            parse(parse_toml_bytes(text.encode(), name), name)  # raises ConfigError when it does not load


# -- the CLI ----------------------------------------------------------------

def command_tree(command=main, path=("gpugate",)):
    yield " ".join(path), command
    if isinstance(command, click.Group):
        for name in sorted(command.commands):
            yield from command_tree(command.commands[name], path + (name,))


def cli_sections():
    """Command path -> the text of its section (its heading to the next
    command heading)."""
    text = page("cli.md")
    lines = text.split("\n")
    marks = []
    for _level, title, number in headings(text):
        tokens = codes_in(title)
        if len(tokens) == 1 and title == "`%s`" % tokens[0] and tokens[0].split()[0] == "gpugate":
            marks.append((tokens[0], number))
    sections = {}
    for i, (name, start) in enumerate(marks):
        end = marks[i + 1][1] if i + 1 < len(marks) else len(lines)
        assert name not in sections, "cli.md has two sections for %s" % name
        sections[name] = "\n".join(lines[start:end])
    return sections


def test_every_command_and_option_has_a_reference_entry():
    tree = dict(command_tree())
    assert len(tree) > 25 and {"gpugate sweep status", "gpugate baseline check", "gpugate sim replay",
                               "gpugate agent"} <= set(tree)
    sections = cli_sections()
    missing = sorted(set(tree) - set(sections))
    assert not missing, "cli.md has no section for: %s" % ", ".join(missing)
    stale = sorted(set(sections) - set(tree))
    assert not stale, "cli.md documents commands gpugate does not have: %s" % ", ".join(stale)
    problems, options = [], 0
    for path, command in sorted(tree.items()):
        section = sections[path]
        wanted = {opt for p in command.params if isinstance(p, click.Option) for opt in p.opts + p.secondary_opts}
        listed = {token.split()[0] for cell, _ in table_rows(section, "option") for token in codes_in(cell)}
        options += len(wanted)
        for opt in sorted(wanted - listed):
            problems.append("%s: option %s has no row" % (path, opt))
        for opt in sorted(o for o in listed - wanted if o.startswith("-") and o not in ("-h", "--help")):
            problems.append("%s: documents option %s it does not have" % (path, opt))
        for arg in (p for p in command.params if isinstance(p, click.Argument)):
            if (arg.metavar or arg.name).upper() not in section:  # as the usage line shows it
                problems.append("%s: argument %s is not shown" % (path, arg.name.upper()))
    assert not problems, "\n".join(problems)
    assert options > 100, options
    listed = {token for cell, _ in table_rows(page("cli.md"), "command") for token in codes_in(cell)}
    assert listed == set(tree) - {"gpugate"}, "cli.md's table of commands: %s" % sorted(listed ^ (set(tree) - {"gpugate"}))


# -- metrics and alerts -----------------------------------------------------

FAMILY_TYPES = ("gauge", "counter", "histogram", "summary")


def emitted_metrics():
    """Every metric family name the code renders: the tuples (name, type,
    help, samples) handed to gpugate.core.promtext.render, found in every module
    of the package, the name a string or a module-level string constant."""
    names = {}
    for path in glob.glob(os.path.join(PACKAGE, "**", "*.py"), recursive=True):
        with open(path) as handle:
            tree = ast.parse(handle.read(), path)
        constants = {target.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
                     and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
                     for target in node.targets if isinstance(target, ast.Name)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Tuple) and len(node.elts) == 4):
                continue
            kind = node.elts[1]
            if not (isinstance(kind, ast.Constant) and kind.value in FAMILY_TYPES):
                continue
            first = node.elts[0]
            name = first.value if isinstance(first, ast.Constant) else constants.get(getattr(first, "id", None))
            assert isinstance(name, str), "%s:%d: a metric family whose name this test cannot read" % (
                path, node.lineno)
            names[name] = os.path.relpath(path, ROOT)
    return names


def test_every_metric_has_a_reference_row():
    emitted = emitted_metrics()
    assert len(emitted) > 50, sorted(emitted)
    assert {"gpugate_node_fit", "gpugate_drain_budget_nodes", "gpugate_lock_stuck_seconds",
            "gpugate_budget_keeper_leader", "gpugate_agent_failed_checks", "gpugate_preflight_runs_total"} <= set(emitted)
    assert all(name.startswith("gpugate_") for name in emitted), sorted(emitted)
    documented = {token for cell, _ in table_rows(page("metrics.md"), "metric") for token in codes_in(cell)[:1]}
    missing = sorted(set(emitted) - documented)
    assert not missing, "metrics.md has no row for: %s" % ", ".join("%s (%s)" % (m, emitted[m]) for m in missing)
    stale = sorted(documented - set(emitted))
    assert not stale, "metrics.md documents metrics the code does not emit: %s" % ", ".join(stale)


def shipped_alerts():
    found = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "slurm_conf", "*.y*ml")) +
                       glob.glob(os.path.join(ROOT, "deploy", "**", "*.y*ml"), recursive=True)):
        with open(path) as handle:
            for name in re.findall(r"^\s*-?\s*alert:\s*([A-Za-z0-9_]+)", handle.read(), re.M):
                found[name] = os.path.relpath(path, ROOT)
    return found


def test_every_shipped_alert_has_a_reference_row():
    shipped = shipped_alerts()
    assert len(shipped) >= 20 and {"GpugateDrainHeld", "GpugateBudgetKeeperStale", "GpugateBudgetKeeperDown",
                                   "GpugateNodeAgentsNotScraped"} <= set(shipped), shipped
    documented = {token for cell, _ in table_rows(page("metrics.md"), "alert") for token in codes_in(cell)[:1]}
    missing = sorted(set(shipped) - documented)
    assert not missing, "metrics.md has no row for the alerts: %s" % ", ".join(
        "%s (%s)" % (a, shipped[a]) for a in missing)
    stale = sorted(documented - set(shipped))
    assert not stale, "metrics.md documents alerts no rule file has: %s" % ", ".join(stale)


# -- exit codes and reasons -------------------------------------------------

def exit_codes():
    """The codes the error classes, the verdict and `gpugate --help` name."""
    codes = {cls.exit_code for cls in vars(errors).values()
             if isinstance(cls, type) and issubclass(cls, errors.GpugateError)}
    codes |= {value for name, value in vars(verdict).items() if name.startswith("EXIT_") and isinstance(value, int)}
    codes |= {int(m) for m in re.findall(r"^\s+(\d+)\s", EXIT_CODES, re.M)}
    return codes


def test_every_exit_code_has_a_reference_row():
    codes = exit_codes()
    assert {0, 1, 2, 3} <= codes, codes
    documented = {int(token) for cell, _ in table_rows(page("exit-codes.md"), "code")
                  for token in codes_in(cell)[:1] if token.isdigit()}
    assert codes == documented, "exit-codes.md: code has %s, the page %s" % (sorted(codes), sorted(documented))
    text = page("exit-codes.md")
    for cls in (c for c in vars(errors).values() if isinstance(c, type) and issubclass(c, errors.GpugateError)):
        assert "`%d`" % cls.exit_code in text


def test_every_reason_class_and_component_kind_is_documented():
    text = page("reasons.md")
    classes = {token for cell, _ in table_rows(text, "class") for token in codes_in(cell)}
    wanted = set(findings.CLASSES) | {findings.PENDING, findings.NOT_RUN}
    assert len(wanted) >= 8
    assert wanted <= classes, "reasons.md has no row for the classes: %s" % sorted(wanted - classes)
    assert classes <= wanted, "reasons.md documents classes gpugate has not: %s" % sorted(classes - wanted)
    components = {token for cell, _ in table_rows(text, "component") for token in codes_in(cell)}
    # Acute, event and user-caused components, and every one the influence
    # table (which tests/test_influence_table.py holds to the judges) names.
    named = set().union(*findings.ACUTE.values()) | findings.EVENTS | findings.USER_CAUSED
    named |= {name for row in influence.ROWS for name in row.components}
    named |= set(PIN_COMPONENTS) | set(AMD_PIN_COMPONENTS)  # drift of each pin
    assert len(named) > 60 and {"xid", "operator_*", "gpu_count", "driver", "rocm"} <= named
    missing = sorted(named - components)
    assert not missing, "reasons.md has no row for the components: %s" % ", ".join(missing)
    actions = {token for cell, _ in table_rows(text, "action") for token in codes_in(cell)}
    assert set(findings.ACTIONS) == actions, (sorted(findings.ACTIONS), sorted(actions))


def test_the_reason_examples_parse_as_documented():
    """Every example reason on the page (a code span or line that starts with
    the default tag) is one gpugate reads back, with its class."""
    text = page("reasons.md")
    examples = set(re.findall(r"`(gpugate: [^`]+)`", text))
    examples |= {line.strip() for line in text.split("\n") if line.startswith("gpugate: ")}
    assert len(examples) >= 5, examples
    for example in sorted(examples):
        parsed = reason.parse(example, "gpugate:")
        assert parsed is not None and parsed.findings, example
        assert len(example.encode()) <= reason.MAX_BYTES


def test_the_index_links_every_reference_page():
    with open(os.path.join(REFERENCE, "README.md")) as handle:
        index = handle.read()
    pages = sorted(os.path.basename(p) for p in glob.glob(os.path.join(REFERENCE, "*.md")))
    assert len(pages) >= 7, pages
    for name in pages:
        if name != "README.md":
            assert "](%s)" % name in index, "docs/reference/README.md does not link %s" % name
