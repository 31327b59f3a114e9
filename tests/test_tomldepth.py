"""A TOML file's nesting is measured before the parser recurses into it
(gpugate.core.tomldepth): strings and comments full of brackets count for
nothing, every real bracket counts, and a file nested past the limit is a
clear ConfigError under any recursion limit, never a crash."""
import json
import subprocess
import sys

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpugate.core import tomldepth
from gpugate.errors import ConfigError
from gpugate.model.schema import parse_toml_bytes

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - 3.9/3.10
    import tomli as tomllib

# Text that would fool a scanner that does not know TOML's strings.
TRICKY = st.text(alphabet="[]{}\"'#\\ ab\n\t", max_size=12)


def _basic(s):
    return json.dumps(s)  # JSON's escapes are TOML basic-string escapes


def _literal(s):
    return "'%s'" % s if "'" not in s and "\n" not in s else _basic(s)


def _multiline_basic(s):
    body = s.replace("\\", "\\\\").replace('"', '\\"')
    if body.endswith('\\"'):  # a quote of its own just before the closing three: '"""a""""'
        body = body[:-2] + '"'
    return '"""%s"""' % body


def _multiline_literal(s):
    return "'''%s'''" % s if "'''" not in s else _multiline_basic(s)


STRING_FORMS = st.sampled_from([_basic, _literal, _multiline_basic, _multiline_literal])


def _values():
    leaves = st.one_of(st.integers(-5, 5), st.tuples(STRING_FORMS, TRICKY))
    return st.recursive(
        leaves,
        lambda inner: st.one_of(st.lists(inner, max_size=3),
                                st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=2)),
        max_leaves=12)


def _toml(value):
    """An inline TOML value and what it parses to."""
    if isinstance(value, tuple):
        form, s = value
        text = form(s)
        return text, tomllib.loads("v = " + text)["v"]
    if isinstance(value, list):
        parts = [_toml(v) for v in value]
        return "[%s]" % ", ".join(p[0] for p in parts), [p[1] for p in parts]
    if isinstance(value, dict):
        parts = {k: _toml(v) for k, v in value.items()}
        return "{%s}" % ", ".join("%s = %s" % (k, p[0]) for k, p in parts.items()), \
            {k: p[1] for k, p in parts.items()}
    return str(value), value


def _depth(value):
    if isinstance(value, (list, dict)):
        children = value.values() if isinstance(value, dict) else value
        return 1 + max((_depth(c) for c in children), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(value=_values(), comment=TRICKY)
@example(value=[(_multiline_literal, "a''"), [[1]]], comment="")   # a'' then the closing three: five quotes
@example(value=[(_multiline_basic, 'a"'), [[1]]], comment="")
@example(value=[(_basic, 'a\\'), [[1]]], comment="")             # an escaped backslash, then the closing quote
def test_the_scan_counts_exactly_the_brackets_toml_nests(value, comment):
    text, parsed = _toml(value)
    document = "# %s\nv = %s # %s\n" % (comment.replace("\n", " "), text, comment.replace("\n", " "))
    assert tomllib.loads(document)["v"] == parsed
    assert tomldepth.bracket_depth(document) == _depth(parsed)
    # value_depth counts the document's own table too.
    assert tomldepth.value_depth(tomllib.loads(document)) == 1 + _depth(parsed)


@given(depth=st.integers(1, 200))
def test_any_nesting_past_the_limit_is_refused_and_any_within_it_parses(depth):
    data = b"v = " + b"[" * depth + b"1" + b"]" * depth
    if depth <= tomldepth.MAX_DEPTH - 1:  # the document's table counts as one more
        assert tomldepth.value_depth(parse_toml_bytes(data, "f.toml")) == depth + 1
    else:
        with pytest.raises(ConfigError, match="f.toml: invalid TOML: .*nested deeper than 32"):
            parse_toml_bytes(data, "f.toml")


def test_strings_that_look_deep_are_not():
    deep_looking = "[" * 1000 + "{" * 1000
    for text in ['v = "%s"' % deep_looking, "v = '%s'" % deep_looking, 'v = """\n%s\n"""' % deep_looking,
                 "v = '''%s'''" % deep_looking, "# %s\nv = 1" % deep_looking,
                 'v = "\\"%s"' % deep_looking, 'v = """a""""\nw = "%s"' % deep_looking]:
        assert parse_toml_bytes(text.encode(), "f.toml")


@pytest.mark.parametrize("name", ["baseline.example.toml", "baseline.mixed.example.toml", "gpugate.example.toml"])
def test_the_shipped_examples_are_far_within_the_limit(name):
    from pathlib import Path
    example = Path(__file__).resolve().parent.parent / "slurm_conf" / name
    text = example.read_text()
    assert 1 <= tomldepth.bracket_depth(text) <= 4
    assert tomldepth.value_depth(parse_toml_bytes(text.encode(), str(example))) <= 5


DEEP = [
    "b'v = ' + b'[' * 100000 + b']' * 100000",
    "b'v = ' + b'{b = ' * 5000 + b'1' + b'}' * 5000",
    "b'[' + b'a.' * 5000 + b'b]'",
    "b'v = 1\\n' + b'a.' * 5000 + b'b = 1'",
]


@pytest.mark.parametrize("limit", [60, 1000, 10 ** 6])
def test_deep_files_are_a_config_error_under_any_recursion_limit(limit):
    # In a child, so a crash fails this test alone.  Before the scan, the
    # parser recursed as deep as the file or the limit went: the inline
    # tables raised RecursionError at 1000, and under Python 3.9 an xdist
    # worker running them after Hypothesis had raised the limit crashed.
    code = (
        "import sys\n"
        "from gpugate.model.schema import parse_toml_bytes\n"
        "from gpugate.errors import ConfigError\n"
        "sys.setrecursionlimit(%d)\n"
        "for data in [%s]:\n"
        "    try:\n"
        "        parse_toml_bytes(data, 'deep.toml')\n"
        "        print('parsed')\n"
        "    except ConfigError as exc:\n"
        "        print(exc)\n" % (limit, ", ".join(DEEP)))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert len(lines) == len(DEEP)
    assert all(line.startswith("deep.toml: invalid TOML: ") for line in lines), lines
    # Brackets never reach the parser; dotted keys may be refused by it first
    # (tomli: "TOML key has more than the allowed N parts").
    assert all("nested deeper than 32" in line for line in lines[:2]), lines
